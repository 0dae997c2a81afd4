"""Rotary position embedding, in place, on (batch, seqlen, num_heads, rot_dim) views.

Each head row of `rot_dim` elements is handled by `rot_dim / 2 / vec` threads;
a thread owns `vec` rotation pairs, so every access to x is one 16-byte
vector: NeoX style reads `vec` elements from each half of the row, GPT-J
(interleaved) style reads `2 * vec` adjacent elements. Head rows are
flattened over (seqlen, num_heads), so one cubin serves every head count.

Runtime flags instead of static axes, to keep the variant count small:
`has_positions` (else the position is the token index), `conjugate` (negates
sin). Positions are read as int32 words with a runtime element stride, so
int64 positions are read through their low word (stride 2).

Launched with programmatic dependent launch (kernels_src/pdl.py): the kernel
waits for the grids before it at entry.
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._transform.kernels import ROTARY

DECL = ROTARY  # the declaration this module builds (tkaot/_transform/kernels.py)


NUM_THREADS = 256


def _tiling(rot_dim: int, dtype: str) -> tuple[int, int]:
    """(elements per 16-byte vector, threads per head row)."""
    vec = 16 // (2 if dtype == "bfloat16" else 4)
    return vec, rot_dim // 2 // vec


class RotaryDims:
    """The kernel's dynamic dims, as its signature binds them (both backends' kernels take this signature)."""

    def __init__(self):
        self.batch, self.seqlen, self.num_heads = T.dynamic("batch"), T.dynamic("seqlen"), T.dynamic("num_heads")
        self.cache_rows = T.dynamic("cache_rows")
        self.x_bstride, self.x_stride = T.dynamic("x_batch_stride"), T.dynamic("x_stride")
        self.x_hstride, self.cache_stride = T.dynamic("x_head_stride"), T.dynamic("cache_stride")
        self.pos_bstride, self.pos_stride = T.dynamic("positions_batch_stride"), T.dynamic("positions_stride")


def rotary_kernel(rot_dim: int, dtype: str, rotate):
    """The rotary PrimFunc: the declaration's arguments, passed with the dims (RotaryDims) to `rotate`, a macro that
    holds the kernel (this module's, or the Ascend one's)."""
    d = RotaryDims()

    @T.prim_func
    def rotary(
        x: T.StridedTensor[(d.batch, d.seqlen, d.num_heads, rot_dim), (d.x_bstride, d.x_stride, d.x_hstride, 1), dtype],
        cos_sin_cache: T.StridedTensor[(d.cache_rows, rot_dim), (d.cache_stride, 1), T.float32],
        positions: T.StridedTensor[(d.batch, d.seqlen), (d.pos_bstride, d.pos_stride), T.int32],
        has_positions: T.int32,
        conjugate: T.int32,
        seqlen_offset: T.int32,
    ):
        rotate(x, cos_sin_cache, positions, has_positions, conjugate, seqlen_offset, d)

    return rotary


def build(rot_dim: int, dtype: str, interleaved: bool):
    vec, row_threads = _tiling(rot_dim, dtype)
    half = rot_dim // 2
    rows_per_block = NUM_THREADS // row_threads

    @T.macro
    def rotate(x, cos_sin_cache, positions, has_positions, conjugate, seqlen_offset, dims):
        batch, seqlen, num_heads = dims.batch, dims.seqlen, dims.num_heads
        with T.Kernel(T.ceildiv(seqlen * num_heads, rows_per_block), batch, threads=NUM_THREADS) as (block, b):
            kernel_entry()
            # Callers guarantee 16-byte aligned head rows and cache rows
            T.assume(dims.x_bstride % vec == 0)
            T.assume(dims.x_stride % vec == 0)
            T.assume(dims.x_hstride % vec == 0)
            T.assume(dims.cache_stride % 4 == 0)
            T.assume(num_heads > 0)
            tid = T.get_thread_binding()
            part = tid % row_threads
            row = block * rows_per_block + tid // row_threads
            first = T.alloc_local((vec,), dtype)
            second = T.alloc_local((vec,), dtype)
            pair = T.alloc_local((2 * vec,), dtype)
            cos = T.alloc_local((vec,), T.float32)
            sin = T.alloc_local((vec,), T.float32)
            pos = T.alloc_var(T.int32)
            token = T.alloc_var(T.int32)
            head = T.alloc_var(T.int32)
            if row < seqlen * num_heads:
                token = row // num_heads
                head = row - token * num_heads
                T.assume(0 <= token and token < seqlen)
                T.assume(0 <= head and head < num_heads)
                if has_positions != 0:
                    pos = positions[b, token] + seqlen_offset
                else:
                    pos = token + seqlen_offset
                for j in T.vectorized(vec):
                    cos[j] = cos_sin_cache[pos, part * vec + j]
                for j in T.vectorized(vec):
                    sin[j] = cos_sin_cache[pos, half + part * vec + j]
                if conjugate != 0:
                    for j in T.vectorized(vec):
                        sin[j] = -sin[j]
                if interleaved:
                    for j in T.vectorized(2 * vec):
                        pair[j] = x[b, token, head, part * 2 * vec + j]
                    for j in T.unroll(vec):
                        first[j] = pair[2 * j]
                        second[j] = pair[2 * j + 1]
                else:
                    for j in T.vectorized(vec):
                        first[j] = x[b, token, head, part * vec + j]
                    for j in T.vectorized(vec):
                        second[j] = x[b, token, head, half + part * vec + j]
                for j in T.unroll(vec):
                    a = T.cast(first[j], T.float32)
                    c = T.cast(second[j], T.float32)
                    first[j] = T.cast(a * cos[j] - c * sin[j], dtype)
                    second[j] = T.cast(a * sin[j] + c * cos[j], dtype)
                if interleaved:
                    for j in T.unroll(vec):
                        pair[2 * j] = first[j]
                        pair[2 * j + 1] = second[j]
                    for j in T.vectorized(2 * vec):
                        x[b, token, head, part * 2 * vec + j] = pair[j]
                else:
                    for j in T.vectorized(vec):
                        x[b, token, head, part * vec + j] = first[j]
                    for j in T.vectorized(vec):
                        x[b, token, head, half + part * vec + j] = second[j]

    return rotary_kernel(rot_dim, dtype, rotate)
