"""Dequantize E4M3 or packed E2M1 data with block scale factors: out = round(data * sf) in bf16 or fp32.

A CTA takes a few tokens by one segment of their row (see tiling.RowTiling;
consecutive CTAs go along the row, so the CTAs resident at once stream one
contiguous band of rows); each thread loads all its input vectors (16 bytes, or
vec_bytes, fewer when a scale block is narrower) and their scale factors first,
then writes each vector's outputs with 16-byte stores. Addresses are constant
offsets plus a multiple of the row stride, and one cubin serves every token count.

Per-channel blocks (m x 1, per_channel_cast's) give every element of a vector its own
scale factor; their UE8M0 scale factors pack four token blocks a word.
"""

from dataclasses import replace

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from kernels_src.quant.tiling import RowTiling
from tkaot._quant.kernels import CAST_BACK

DECL = CAST_BACK  # the declaration this module builds (tkaot/_quant/kernels.py)


# threads per CTA, tokens per thread, vectors of a row per thread; the tuning knob (bench/tuning/tune_quant.py).
# H200 (bench/tuning/tune_quant.py): t128r4c1v8h 45.5 µs at 8192 x 7168 e4m3/128 -> bf16;
# 8-byte fp8 loads make each bf16 store one coalesced 16-byte store (16-byte loads: 77-78 µs)
TILING = RowTiling(128, 4, 1, vec_bytes=8, walk="hidden")


def check_static(hidden, in_dtype, in_block, in_sf, out_dtype) -> None:
    bm, bk = common.block_shape(in_block)
    if hidden % bk:
        raise ValueError(f"{DECL.name}: hidden={hidden} is not a multiple of the block width {bk} (in_block={in_block})")
    if bk == 1 and in_sf.endswith("_col"):
        raise ValueError(f"{DECL.name}: per-channel blocks ({in_block}) take row-major scale factors only (in_sf={in_sf})")


def vector_elems(in_dtype: str, in_block: str, vec_bytes: int) -> int:
    """Elements a thread vector: vec_bytes of input, fewer where a scale block is narrower; per-channel blocks (one
    channel wide) keep the full width, every element scaled by its own scale factor."""
    bk = common.block_shape(in_block)[1]
    full = vec_bytes * (2 if in_dtype == "e2m1" else 1)
    return full if bk == 1 else min(full, bk)


def sf_layout(in_sf: str, in_block: str, hidden):
    """The input scale factors' layout (per-channel blocks pack UE8M0 along tokens)."""
    bk = common.block_shape(in_block)[1]
    return common.SfLayout.from_input(in_sf, hidden // bk, pack_m=bk == 1)


def dequantized(in_dtype: str, out_dtype: str, x_reg, u, j, scale):
    """Element j of vector u of x_reg (E4M3, or E2M1 codes two a byte) times its scale factor, rounded to out_dtype:
    the one expression of every cast back (specialised and generic), so both round alike."""
    if in_dtype == "e2m1":
        return T.Cast(out_dtype, common.e2m1_value(T.Cast("uint32", x_reg[u, j // 2]) >> T.uint32(4 * (j % 2))) * scale)
    return T.Cast(out_dtype, T.Cast("float32", x_reg[u, j]) * scale)


def build(hidden, in_dtype, in_block, in_sf, out_dtype, tiling: RowTiling | None = None):
    check_static(hidden, in_dtype, in_block, in_sf, out_dtype)
    fp4_in = in_dtype == "e2m1"
    per_byte = 2 if fp4_in else 1
    storage = "uint8" if fp4_in else "float8_e4m3"
    bm, bk = common.block_shape(in_block)
    tiling = tiling or TILING
    vec = vector_elems(in_dtype, in_block, tiling.vec_bytes)
    per_channel = bk == 1  # a scale factor an element, not a vector
    regs = vec // per_byte
    vecs_per_row = hidden // vec
    if vecs_per_row % tiling.cols:
        tiling = replace(tiling, rows=tiling.rows * tiling.cols, cols=1)
    num_threads, cols = tiling.threads, tiling.cols
    tpr = tiling.threads_per_row(vecs_per_row)
    slots = num_threads // tpr
    segs = vecs_per_row // (tpr * cols)
    rows_per_cta = slots * tiling.rows
    vecs_per_thread = tiling.rows * cols
    sf_in = sf_layout(in_sf, in_block, hidden)

    num_tokens = T.dynamic("num_tokens")
    x_stride = T.dynamic("x_stride")
    sf_stride = T.dynamic("sf_stride")
    sf_rows = num_tokens if bm == 1 else (num_tokens + bm - 1) // bm

    @T.prim_func
    def cast_back(
        x: T.StridedTensor[(num_tokens, hidden // per_byte), (x_stride, 1), storage],
        x_sf: T.StridedTensor[sf_in.shape(sf_rows), (sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden), out_dtype],
    ):
        with T.Kernel(*tiling.grid(T.ceildiv(num_tokens, rows_per_cta), segs), threads=num_threads) as (gx, gy):
            kernel_entry()
            T.assume(x_stride % 16 == 0)
            tid = T.get_thread_binding()
            first_row, first_vec = tiling.origin(gx, gy, tid, tpr, segs)
            x_reg = T.alloc_local((vecs_per_thread, regs), storage)
            if per_channel:
                scale = T.alloc_local((vecs_per_thread, vec), "float32")
            else:
                scale = T.alloc_local((vecs_per_thread,), "float32")
            o_reg = T.alloc_local((vec,), out_dtype)
            # vector u is row u // cols, column u % cols of the thread's tile
            for u in T.unroll(vecs_per_thread):
                token = first_row + u // cols * slots
                col = (first_vec + u % cols * tpr) * vec
                if token < num_tokens:
                    for j in T.vectorized(regs):
                        x_reg[u, j] = x[token, col // per_byte + j]
                    if per_channel:
                        for j in T.unroll(vec):
                            scale[u, j] = common.decode_sf(x_sf[sf_in.index(token // bm, col + j)], sf_in.kind)
                    else:
                        scale[u] = common.decode_sf(x_sf[sf_in.index(token // bm, col // bk)], sf_in.kind)
            for u in T.unroll(vecs_per_thread):
                token = first_row + u // cols * slots
                col = (first_vec + u % cols * tpr) * vec
                if token < num_tokens:
                    for j in T.unroll(vec):
                        o_reg[j] = dequantized(in_dtype, out_dtype, x_reg, u, j, scale[u, j] if per_channel else scale[u])
                    for j in T.vectorized(vec):
                        out[token, col + j] = o_reg[j]

    return cast_back
