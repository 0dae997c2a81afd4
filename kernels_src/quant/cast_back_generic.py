"""The generic cast back: cast_back with the row width `hidden` a runtime value.

It serves the calls whose specialised cast_back variant is not built, and writes the same
bytes: every element is cast_back.dequantized of its data and its block's scale factor, the
one expression both kernels use; the vectors are as wide (cast_back.vector_elems, which
depends on the dtypes and the block, never on hidden). Only which thread holds which vectors
differs, and no element depends on another.

The tiling does not depend on hidden: a CTA of 128 threads holds two row slots of
SEG_THREADS threads; each thread takes one vector of a row segment for ROWS tokens spaced
two apart. The grid's x runs along the row segments (consecutive CTAs cover one band of
rows, as the specialised "hidden" walk does) and y, then z, down the token blocks, so no
thread divides by a runtime value. A row's last segment may reach past its end: those
threads load and store nothing (hidden is a multiple of 64, so of the vector width).
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant import common
from kernels_src.quant.cast_back import TILING, check_static, dequantized, sf_layout, vector_elems
from tkaot._quant.kernels import CAST_BACK_GENERIC

DECL = CAST_BACK_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

THREADS = 128
SEG_THREADS = 64  # threads a row segment: a row of 7168 E4M3 values is 14 segments of 8-element vectors
ROWS = 4  # tokens a thread (the specialised tiling's 4, so as many loads in flight)
GRID_YZ = 65535  # the most CTAs a grid's y (and z) dimension holds


def build(in_dtype, in_block, in_sf, out_dtype):
    bm, bk = common.block_shape(in_block)
    check_static(max(64, bk), in_dtype, in_block, in_sf, out_dtype)  # the specialised kernel's rules, narrowest row
    fp4_in = in_dtype == "e2m1"
    per_byte = 2 if fp4_in else 1
    storage = "uint8" if fp4_in else "float8_e4m3"
    vec = vector_elems(in_dtype, in_block, TILING.vec_bytes)  # as in the specialised kernel
    per_channel = bk == 1
    regs = vec // per_byte
    slots = THREADS // SEG_THREADS
    rows_per_cta = slots * ROWS

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    sf_stride = T.dynamic("sf_stride")
    sf_in = sf_layout(in_sf, in_block, hidden)
    sf_rows = num_tokens if bm == 1 else T.ceildiv(num_tokens, bm)
    segs = T.ceildiv(hidden, SEG_THREADS * vec)
    token_blocks = T.ceildiv(num_tokens, rows_per_cta)

    @T.prim_func
    def cast_back_generic(
        # Packed E2M1 rows are declared `hidden` bytes wide, twice their width: a dim must stand alone in some
        # extent to be bound, and nothing reads x's extent (addresses go by x_stride, every access is in the row)
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), storage],
        x_sf: T.StridedTensor[sf_in.shape(sf_rows), (sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden), out_dtype],
    ):
        with T.Kernel(segs, T.min(token_blocks, GRID_YZ), T.ceildiv(token_blocks, GRID_YZ), threads=THREADS) as (bx, by, bz):
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(x_stride % 16 == 0)
            T.assume(hidden % 64 == 0)  # as declared (cast_back's hidden axis): the output rows vectorize
            tid = T.get_thread_binding()
            first_row = (bz * GRID_YZ + by) * rows_per_cta + tid // SEG_THREADS
            col = (bx * SEG_THREADS + tid % SEG_THREADS) * vec  # this thread's vector, in every one of its rows
            x_reg = T.alloc_local((ROWS, regs), storage)
            if per_channel:
                scale = T.alloc_local((ROWS, vec), "float32")
            else:
                scale = T.alloc_local((ROWS,), "float32")
            o_reg = T.alloc_local((vec,), out_dtype)
            if col < hidden:  # the vector is in the row: all of it, or none (hidden is a multiple of vec)
                for u in T.unroll(ROWS):
                    token = first_row + u * slots
                    if token < num_tokens:
                        for j in T.vectorized(regs):
                            x_reg[u, j] = x[token, col // per_byte + j]
                        if per_channel:
                            for j in T.unroll(vec):
                                scale[u, j] = common.decode_sf(x_sf[sf_in.index(token // bm, col + j)], sf_in.kind)
                        else:
                            scale[u] = common.decode_sf(x_sf[sf_in.index(token // bm, col // bk)], sf_in.kind)
                for u in T.unroll(ROWS):
                    token = first_row + u * slots
                    if token < num_tokens:
                        for j in T.unroll(vec):
                            o_reg[j] = dequantized(in_dtype, out_dtype, x_reg, u, j, scale[u, j] if per_channel else scale[u])
                        for j in T.vectorized(vec):
                            out[token, col + j] = o_reg[j]

    return cast_back_generic
