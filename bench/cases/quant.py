"""Quantization cast cases at 8192x7168 bf16 (DeepSeek-V3's hidden size, a prefill batch)."""

import torch

import tkaot
from bench.cases import Case
from tkaot.reference import quant as ref

TOKENS, HIDDEN = 8192, 7168
DEEPGEMM_SF = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)


def _bf16():
    return {"x": torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")}


def _fp8_pair():
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
    data, sf = tkaot.quant.per_token_cast(x, "e4m3", 128)
    return {"x": (data, sf)}


def cases() -> list[Case]:
    n = TOKENS * HIDDEN
    shape = f"{TOKENS}x{HIDDEN} bf16"
    out = [
        Case(
            op="per_token_cast e4m3/128",
            shape=shape,
            bytes=2 * n + n + 4 * n // 128,
            make=_bf16,
            tkaot=lambda a: tkaot.quant.per_token_cast(a["x"], "e4m3", 128),
            torch=lambda a: ref.per_token_cast(a["x"], "e4m3", 128),
            tile_kernels=lambda tk, a: tk.quant.per_token_cast(a["x"], "e4m3", 128),
        ),
        Case(
            op="per_token_cast e4m3/128 ue8m0 col",
            shape=shape,
            bytes=2 * n + n + n // 128,
            make=_bf16,
            tkaot=lambda a: tkaot.quant.per_token_cast(a["x"], "e4m3", 128, **DEEPGEMM_SF),
            tile_kernels=lambda tk, a: tk.quant.per_token_cast(a["x"], "e4m3", 128, **DEEPGEMM_SF),
        ),
        Case(
            op="per_token_cast e2m1/32",
            shape=shape,
            bytes=2 * n + n // 2 + 4 * n // 32,
            make=_bf16,
            tkaot=lambda a: tkaot.quant.per_token_cast(a["x"], "e2m1", 32),
            torch=lambda a: ref.per_token_cast(a["x"], "e2m1", 32),
            tile_kernels=lambda tk, a: tk.quant.per_token_cast(a["x"], "e2m1", 32),
        ),
        Case(
            op="per_token_cast_back e4m3/128",
            shape=f"{TOKENS}x{HIDDEN} e4m3",
            bytes=n + 4 * n // 128 + 2 * n,
            make=_fp8_pair,
            tkaot=lambda a: tkaot.quant.per_token_cast_back(a["x"], "bf16", 128),
            torch=lambda a: ref.per_token_cast_back(a["x"], "bf16", 128),
            tile_kernels=lambda tk, a: tk.quant.per_token_cast_back(a["x"], "bf16", 128),
        ),
        Case(
            op="per_block_cast e4m3/128x128",
            shape=shape,
            bytes=2 * n + n + 4 * n // (128 * 128),
            make=_bf16,
            tkaot=lambda a: tkaot.quant.per_block_cast(a["x"], "e4m3", (128, 128)),
            torch=lambda a: ref.per_block_cast(a["x"], "e4m3", (128, 128)),
            tile_kernels=lambda tk, a: tk.quant.per_block_cast(a["x"], "e4m3", (128, 128)),
        ),
        Case(
            op="per_channel_cast e4m3/128",
            shape=shape,
            bytes=2 * n + n + 4 * n // 128,
            make=_bf16,
            tkaot=lambda a: tkaot.quant.per_channel_cast(a["x"], "e4m3", 128),
            torch=lambda a: ref.per_channel_cast(a["x"], "e4m3", 128),
            tile_kernels=lambda tk, a: tk.quant.per_channel_cast(a["x"], "e4m3", 128),
        ),
    ]
    return out
