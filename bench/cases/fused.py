"""Fused inference cases: SwiGLU (bf16 out, + per-token FP8 cast, + the MoE options), rotary embedding,
RMSNorm + per-token FP8 cast (with and without a residual)."""

import torch

import tkaot
from bench.cases import Case


def _rotary_cache(rows: int, rot_dim: int) -> torch.Tensor:
    half = rot_dim // 2
    inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32, device="cuda") / half)
    angles = torch.arange(rows, dtype=torch.float32, device="cuda")[:, None] * inv_freq
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


def _swiglu_cases() -> list[Case]:
    tokens, width = 8192, 4096  # x is (tokens, 2 * intermediate): intermediate 2048
    hidden = width // 2

    def make():
        return {"x": torch.randn(tokens, width, dtype=torch.bfloat16, device="cuda")}

    def make_moe():
        weights = torch.rand(tokens, dtype=torch.float32, device="cuda")
        return {**make(), "moe": dict(topk_weights=weights, routed_scaling_factor=2.5, clamp_value=7.0)}

    def torch_swiglu(a):
        return torch.nn.functional.silu(a["x"][:, :hidden]) * a["x"][:, hidden:]

    return [
        Case(
            op="swiglu_forward_and_per_token_cast",
            shape=f"{tokens}x{width} bf16 -> e4m3/128",
            bytes=tokens * width * 2 + tokens * hidden + tokens * (hidden // 128) * 4,
            make=make,
            tkaot=lambda a: tkaot.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128),
            torch=torch_swiglu,
            tile_kernels=lambda tk, a: tk.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128),
        ),
        Case(
            op="swiglu_forward",
            shape=f"{tokens}x{width} bf16 -> bf16",
            bytes=tokens * width * 2 + tokens * hidden * 2,
            make=make,
            tkaot=lambda a: tkaot.quant.swiglu_forward(a["x"], "bf16"),
            torch=torch_swiglu,
            tile_kernels=lambda tk, a: tk.quant.swiglu_forward(a["x"], "bf16"),
        ),
        # An MoE expert's rows: per-row routing weights times the routed scaling factor, activations clamped
        Case(
            op="swiglu_forward_and_per_token_cast",
            shape=f"{tokens}x{width} bf16 -> e4m3/128, weights, clamp",
            bytes=tokens * width * 2 + tokens * 4 + tokens * hidden + tokens * (hidden // 128) * 4,
            make=make_moe,
            tkaot=lambda a: tkaot.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128, **a["moe"]),
            tile_kernels=lambda tk, a: tk.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128, **a["moe"]),
        ),
    ]


def _rotary_cases() -> list[Case]:
    tokens, heads, rot_dim = 8192, 64, 64
    cache = _rotary_cache(tokens, rot_dim)

    key_heads = 8  # a key of fewer heads (grouped-query attention), rotated in the same call

    def make():
        return {"q": torch.randn(tokens, heads, rot_dim, dtype=torch.bfloat16, device="cuda"), "cache": cache}

    def make_key():
        return {**make(), "k": torch.randn(tokens, key_heads, rot_dim, dtype=torch.bfloat16, device="cuda")}

    return [
        Case(
            op="apply_rotary",
            shape=f"{tokens}x{heads}x{rot_dim} bf16",
            bytes=2 * tokens * heads * rot_dim * 2 + tokens * rot_dim * 4,
            make=make,
            tkaot=lambda a: tkaot.transform.apply_rotary(a["q"], a["cache"]),
            tile_kernels=lambda tk, a: tk.transform.apply_rotary(a["q"], a["cache"]),
        ),
        Case(
            op="apply_rotary",
            shape=f"{tokens}x{heads}x{rot_dim} bf16 + key {tokens}x{key_heads}x{rot_dim}",
            bytes=2 * tokens * (heads + key_heads) * rot_dim * 2 + tokens * rot_dim * 4,
            make=make_key,
            tkaot=lambda a: tkaot.transform.apply_rotary(a["q"], a["cache"], key=a["k"]),
            tile_kernels=lambda tk, a: tk.transform.apply_rotary(a["q"], a["cache"], key=a["k"]),
        ),
    ]


def _norm_cast_cases() -> list[Case]:
    tokens, hidden = 8192, 7168

    def make():
        return {
            "x": torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda"),
            "w": torch.randn(hidden, dtype=torch.bfloat16, device="cuda"),
        }

    def make_residual():
        return {**make(), "r": torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")}

    return [
        Case(
            op="norm_forward_and_per_token_cast",
            shape=f"{tokens}x{hidden} bf16 -> e4m3/32",
            bytes=tokens * hidden * 2 + tokens * hidden + tokens * (hidden // 32) * 4 + hidden * 2,
            make=make,
            tkaot=lambda a: tkaot.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32),
            tile_kernels=lambda tk, a: tk.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32),
        ),
        # A decoder layer's pre-norm: x + residual, the sum written back as the next residual
        Case(
            op="norm_forward_and_per_token_cast",
            shape=f"{tokens}x{hidden} bf16 + residual -> e4m3/32",
            bytes=tokens * hidden * 2 * 3 + tokens * hidden + tokens * (hidden // 32) * 4 + hidden * 2,
            make=make_residual,
            tkaot=lambda a: tkaot.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32, residual=a["r"]),
            tile_kernels=lambda tk, a: tk.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32, residual=a["r"]),
        ),
    ]


def cases() -> list[Case]:
    return _swiglu_cases() + _rotary_cases() + _norm_cast_cases()
