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
    params=("query", "key", "cos_sin_cache", "positions", "has_positions", "conjugate", "seqlen_offset"),
    dims=(
        "batch", "seqlen", "q_heads", "k_heads", "cache_rows", "query_batch_stride", "query_stride", "query_head_stride",
        "key_batch_stride", "key_stride", "key_head_stride", "cache_stride", "positions_batch_stride", "positions_stride",
    ),
    ops=("tkaot.transform.apply_rotary",),
)  # fmt: skip

KERNELS = (ROTARY,)
