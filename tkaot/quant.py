"""tkaot.quant: TileKernels-compatible normalisation, SwiGLU and quantisation ops.

The ops live in tkaot/_quant/ (one module each: norm, norm_cast, swiglu, casts, weight_casts, and the
backward ops: norm_backward, swiglu_backward) and load on first use,
so `import tkaot.quant` costs almost nothing until an op is called.
"""

from __future__ import annotations

from tkaot._lazy import lazy_family

_MODULES = {
    "tkaot._quant.norm": ("norm_forward",),
    "tkaot._quant.norm_cast": ("norm_forward_and_per_token_cast",),
    "tkaot._quant.swiglu": ("swiglu_forward", "swiglu_forward_and_per_token_cast"),
    "tkaot._quant.casts": (
        "cast", "cast_back", "per_block_cast", "per_block_cast_with_precomputed_sf", "per_block_cast_with_sf_only",
        "per_channel_cast", "per_token_cast_and_cast_back", "per_token_cast", "per_token_cast_back",
        "per_token_cast_with_precomputed_sf", "per_token_cast_with_sf_only", "unpack_from_e2m1fn_x2",
    ),
    "tkaot._quant.weight_casts": ("batched_transpose_weight_sf", "per_block_cast_lossless"),
    "tkaot._quant.norm_backward": ("norm_backward",),
    "tkaot._quant.swiglu_backward": ("swiglu_backward", "swiglu_backward_and_per_token_cast"),
}  # fmt: skip
__getattr__, __dir__, __all__ = lazy_family("quant", _MODULES, globals())
