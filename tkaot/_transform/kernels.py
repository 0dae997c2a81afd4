"""Declarations of the kernels behind tkaot.transform (tkaot/_decl.py): rotary position embedding."""

from __future__ import annotations

from tkaot._decl import Axis, KernelDecl

ROTARY = KernelDecl(
    name="rotary",
    source="kernels_src.transform.rotary",
    axes=(
        Axis("rot_dim", int, choices=(64, 128)),
        Axis("dtype", str, choices=("bfloat16", "float32")),
        Axis("interleaved", bool, choices=(False, True)),
    ),
    params=("x", "cos_sin_cache", "positions", "has_positions", "conjugate", "seqlen_offset"),
    dims=(
        "batch", "seqlen", "num_heads", "cache_rows", "x_batch_stride", "x_stride", "x_head_stride", "cache_stride",
        "positions_batch_stride", "positions_stride",
    ),
    ops=("tkaot.transform.apply_rotary",),
)  # fmt: skip

KERNELS = (ROTARY,)
