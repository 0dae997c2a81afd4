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


def _fp8_channel_pair():
    x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda")
    return {"x": tkaot.quant.per_channel_cast(x, "e4m3", 128)}


PARTIAL = HIDDEN + 64  # a row ending in a partial 128-channel group (the generic kernel's alone)


def _bf16_partial():
    return {"x": torch.randn(TOKENS, PARTIAL, dtype=torch.bfloat16, device="cuda")}


def _case(label: str, make, moved: int, op: str, *args, reference: bool = True, **kwargs) -> Case:
    """The case `label`: tkaot's `op`, TileKernels' and (unless reference=False) the pure-torch reference's,
    each called with a["x"] and the same arguments; `moved` is the fewest bytes the op moves."""
    ours, torch_ref = getattr(tkaot.quant, op), getattr(ref, op)
    return Case(
        op=label,
        shape=f"{TOKENS}x{HIDDEN} {'e4m3' if make in (_fp8_pair, _fp8_channel_pair) else 'bf16'}",
        bytes=moved,
        make=make,
        tkaot=lambda a: ours(a["x"], *args, **kwargs),
        torch=(lambda a: torch_ref(a["x"], *args, **kwargs)) if reference else None,
        tile_kernels=lambda tk, a: getattr(tk.quant, op)(a["x"], *args, **kwargs),
    )


def cases() -> list[Case]:
    n = TOKENS * HIDDEN
    return [
        _case("per_token_cast e4m3/128", _bf16, 2 * n + n + 4 * n // 128, "per_token_cast", "e4m3", 128),
        _case(
            "per_token_cast e4m3/128 ue8m0 col", _bf16, 2 * n + n + n // 128, "per_token_cast", "e4m3", 128, reference=False, **DEEPGEMM_SF
        ),
        _case("per_token_cast e2m1/32", _bf16, 2 * n + n // 2 + 4 * n // 32, "per_token_cast", "e2m1", 32),
        _case("per_token_cast_back e4m3/128", _fp8_pair, n + 4 * n // 128 + 2 * n, "per_token_cast_back", "bf16", 128),
        _case("per_block_cast e4m3/128x128", _bf16, 2 * n + n + 4 * n // (128 * 128), "per_block_cast", "e4m3", (128, 128)),
        _case("per_channel_cast e4m3/128", _bf16, 2 * n + n + 4 * n // 128, "per_channel_cast", "e4m3", 128),
        _case("cast_back e4m3/128x1", _fp8_channel_pair, n + 4 * n // 128 + 2 * n, "cast_back", "bf16", (128, 1)),
        Case(
            op="per_token_cast e4m3/128 partial group",
            shape=f"{TOKENS}x{PARTIAL} bf16",
            bytes=3 * TOKENS * PARTIAL + 4 * TOKENS * -(-PARTIAL // 128),
            make=_bf16_partial,
            tkaot=lambda a: tkaot.quant.per_token_cast(a["x"], "e4m3", 128),
            torch=lambda a: ref.per_token_cast(a["x"], "e4m3", 128),
            tile_kernels=lambda tk, a: tk.quant.per_token_cast(a["x"], "e4m3", 128),
        ),
    ]
