"""Rotary position embedding, in place, on (batch, seqlen, heads, rot_dim) views of query and key, in one launch.

Each head row of `rot_dim` elements is handled by `rot_dim / 2 / vec` threads;
a thread owns `vec` rotation pairs, so every access to a row is one 16-byte
vector: NeoX style reads `vec` elements from each half of the row, GPT-J
(interleaved) style reads `2 * vec` adjacent elements. Head rows are
flattened over (seqlen, q_heads + k_heads): a row's head index below q_heads
names a query head, else a key head, so one grid rotates both tensors (each
with its own pointer and strides, the same cos / sin rows) and one cubin
serves every head count.

One kernel serves the query-only call too: it passes k_heads = 0 (and a null
key, never read), so its rows are all query rows and what it pays is the
head's compare against q_heads and five more launch arguments. A second
kernel for query and key (same axes) would double the variants and cubins
for that; so this one kernel, one variant per (rot_dim, dtype, interleaved).
The per-row body (`rotate_row`) is one macro taking the tensor, emitted once
for query and once for key: the same arithmetic per element either way.

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
        self.batch, self.seqlen = T.dynamic("batch"), T.dynamic("seqlen")
        self.q_heads, self.k_heads = T.dynamic("q_heads"), T.dynamic("k_heads")
        self.cache_rows = T.dynamic("cache_rows")
        self.q_bstride, self.q_stride = T.dynamic("query_batch_stride"), T.dynamic("query_stride")
        self.q_hstride = T.dynamic("query_head_stride")
        self.k_bstride, self.k_stride = T.dynamic("key_batch_stride"), T.dynamic("key_stride")
        self.k_hstride, self.cache_stride = T.dynamic("key_head_stride"), T.dynamic("cache_stride")
        self.pos_bstride, self.pos_stride = T.dynamic("positions_batch_stride"), T.dynamic("positions_stride")


def rotary_kernel(rot_dim: int, dtype: str, rotate):
    """The rotary PrimFunc: the declaration's arguments, passed with the dims (RotaryDims) to `rotate`, a macro that
    holds the kernel (this module's, or the Ascend one's)."""
    d = RotaryDims()

    @T.prim_func
    def rotary(
        query: T.StridedTensor[(d.batch, d.seqlen, d.q_heads, rot_dim), (d.q_bstride, d.q_stride, d.q_hstride, 1), dtype],
        key: T.StridedTensor[(d.batch, d.seqlen, d.k_heads, rot_dim), (d.k_bstride, d.k_stride, d.k_hstride, 1), dtype],
        cos_sin_cache: T.StridedTensor[(d.cache_rows, rot_dim), (d.cache_stride, 1), T.float32],
        positions: T.StridedTensor[(d.batch, d.seqlen), (d.pos_bstride, d.pos_stride), T.int32],
        has_positions: T.int32,
        conjugate: T.int32,
        seqlen_offset: T.int32,
    ):
        rotate(query, key, cos_sin_cache, positions, has_positions, conjugate, seqlen_offset, d)

    return rotary


def build(rot_dim: int, dtype: str, interleaved: bool):
    vec, row_threads = _tiling(rot_dim, dtype)
    half = rot_dim // 2
    rows_per_block = NUM_THREADS // row_threads

    @T.macro
    def rotate_row(x, b, token, h, part, cos, sin):
        """Head row (b, token, h) of x, its pairs of this thread's `part` rotated by (cos, sin)."""
        T.assume(0 <= token and token < x.shape[1])  # the macro's own names for the row: the caller's facts restated
        T.assume(0 <= h and h < x.shape[2])
        first = T.alloc_local((vec,), dtype)
        second = T.alloc_local((vec,), dtype)
        pair = T.alloc_local((2 * vec,), dtype)
        if interleaved:
            for j in T.vectorized(2 * vec):
                pair[j] = x[b, token, h, part * 2 * vec + j]
            for j in T.unroll(vec):
                first[j] = pair[2 * j]
                second[j] = pair[2 * j + 1]
        else:
            for j in T.vectorized(vec):
                first[j] = x[b, token, h, part * vec + j]
            for j in T.vectorized(vec):
                second[j] = x[b, token, h, half + part * vec + j]
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
                x[b, token, h, part * 2 * vec + j] = pair[j]
        else:
            for j in T.vectorized(vec):
                x[b, token, h, part * vec + j] = first[j]
            for j in T.vectorized(vec):
                x[b, token, h, half + part * vec + j] = second[j]

    @T.macro
    def rotate(query, key, cos_sin_cache, positions, has_positions, conjugate, seqlen_offset, dims):
        batch, seqlen, q_heads, k_heads = dims.batch, dims.seqlen, dims.q_heads, dims.k_heads
        with T.Kernel(T.ceildiv(seqlen * (q_heads + k_heads), rows_per_block), batch, threads=NUM_THREADS) as (block, b):
            kernel_entry()
            # Callers guarantee 16-byte aligned head rows and cache rows
            T.assume(dims.q_bstride % vec == 0)
            T.assume(dims.q_stride % vec == 0)
            T.assume(dims.q_hstride % vec == 0)
            T.assume(dims.k_bstride % vec == 0)
            T.assume(dims.k_stride % vec == 0)
            T.assume(dims.k_hstride % vec == 0)
            T.assume(dims.cache_stride % 4 == 0)
            T.assume(q_heads >= 0 and k_heads >= 0 and q_heads + k_heads > 0)
            tid = T.get_thread_binding()
            part = tid % row_threads
            row = block * rows_per_block + tid // row_threads
            cos = T.alloc_local((vec,), T.float32)
            sin = T.alloc_local((vec,), T.float32)
            pos = T.alloc_var(T.int32)
            token = T.alloc_var(T.int32)
            head = T.alloc_var(T.int32)
            if row < seqlen * (q_heads + k_heads):
                token = row // (q_heads + k_heads)
                head = row - token * (q_heads + k_heads)
                T.assume(0 <= token and token < seqlen)
                T.assume(0 <= head and head < q_heads + k_heads)
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
                if head < q_heads:
                    rotate_row(query, b, token, head, part, cos, sin)
                else:
                    rotate_row(key, b, token, head - q_heads, part, cos, sin)

    return rotary_kernel(rot_dim, dtype, rotate)
