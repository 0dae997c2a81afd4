"""The generic cast back: cast_back with the row width `hidden` a runtime value.

It serves the calls whose specialised cast_back variant is not built, and writes the same
bytes: every element is cast_back.dequantized of its data and its block's scale factor, the
one expression both kernels use; the vectors are as wide (cast_back.vector_elems, which
depends on the dtypes and the block, never on hidden). Only which thread holds which vectors
differs, and no element depends on another.

The input block is a runtime value too (RUNTIME_AXES: the variants that differ only in it share one
cubin, each manifest entry fixing its index among the axis's choices): the vectors are as wide for
every block (16 bytes of E2M1 codes or 8 of E4M3, never more than a block, since per-token blocks are
16 or more wide), a token's block row and a column's block are shifts by the block's log2 sides, and
per-channel blocks (m x 1: a scale factor an element), which the row-major scale factors alone take,
go through their own branch.

The tiling does not depend on hidden: a CTA of 128 threads holds two row slots of
SEG_THREADS threads; each thread takes one vector of a row segment for ROWS tokens spaced
two apart. The grid's x runs along the row segments (consecutive CTAs cover one band of
rows, as the specialised "hidden" walk does) and y, then z, down the token blocks, so no
thread divides by a runtime value. A row's last segment may reach past its end: those
threads load and store nothing (hidden is a multiple of 64, so of the vector width).
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from kernels_src.quant.cast_back import TILING, check_static, dequantized, vector_elems
from kernels_src.quant.segments import ROWS, SLOTS, THREADS, segment_dims, segment_grid, segment_place
from tkaot._quant.kernels import CAST_BACK_BLOCKS, CAST_BACK_GENERIC

DECL = CAST_BACK_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

# Taken at run time, so the default set's 200 variants of this kernel are 24 cubins
RUNTIME_AXES = ("in_block",)
# A scale factor's place depends on the runtime block, which no bound the compiler can prove holds: TileLang's guard
# around each such load is left out (each load is under the kernel's own token and row guards)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}
SHIFT_BITS = 3  # bits a block side's log2 takes in BLOCK_SHIFTS


def _block_shifts() -> tuple[int, int]:
    """The log2 of each block's rows and of its columns, SHIFT_BITS a block in the axis's choice order: (rows, columns)."""
    rows = cols = 0
    for i, block in enumerate(CAST_BACK_BLOCKS):
        bm, bk = common.block_shape(block)
        rows |= (bm.bit_length() - 1) << (SHIFT_BITS * i)
        cols |= (bk.bit_length() - 1) << (SHIFT_BITS * i)
    return rows, cols


BLOCK_SHIFTS = _block_shifts()


def build(in_dtype, in_sf, out_dtype):
    check_static(128, in_dtype, "1x128", in_sf, out_dtype)  # the specialised kernel's rules (the block's own at launch)
    fp4_in = in_dtype == "e2m1"
    per_byte = 2 if fp4_in else 1
    storage = "uint8" if fp4_in else "float8_e4m3"
    vec = vector_elems(in_dtype, "1x16", TILING.vec_bytes)  # every block's (as in the specialised kernel)
    assert all(vector_elems(in_dtype, b, TILING.vec_bytes) == vec for b in CAST_BACK_BLOCKS)
    per_channel_in = not in_sf.endswith("_col")  # per-channel blocks take row-major scale factors only
    regs = vec // per_byte

    num_tokens, hidden, x_stride, sf_stride = segment_dims()
    in_block = T.dynamic("in_block")
    # The scale factors of either kind of block (a per-channel block's UE8M0 pack four token blocks a word): the
    # buffer leads with a unit dim binding the runtime block; its other extents bound every block's indices
    per_block = common.SfLayout.from_input(in_sf, hidden)
    per_channel_sf = common.SfLayout.from_input(in_sf, hidden, pack_m=True) if per_channel_in else None
    sf_shape, sf_strides = (in_block, num_tokens + hidden, 4 * (num_tokens + hidden)), (1, sf_stride, 1)
    grid = segment_grid(num_tokens, hidden, vec)

    def sf_at(layout, token, m_shift, k):
        """x_sf's index of the scale factor of token's block row and block column k."""
        return (0, *layout.index(T.shift_right(token, m_shift), k))

    def per_channel(k_shift):
        """Whether the runtime block is one column wide (never, with column-major scale factors)."""
        return per_channel_in and k_shift == 0

    @T.prim_func
    def cast_back_generic(
        # Packed E2M1 rows are declared `hidden` bytes wide, twice their width: a dim must stand alone in some
        # extent to be bound, and nothing reads x's extent (addresses go by x_stride, every access is in the row)
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), storage],
        x_sf: T.StridedTensor[sf_shape, sf_strides, per_block.dtype],
        out: T.Tensor[(num_tokens, hidden), out_dtype],
    ):
        with T.Kernel(*grid, threads=THREADS) as (bx, by, bz):
            kernel_entry()
            T.assume(x_stride % 16 == 0)
            T.assume(hidden % 64 == 0)  # as declared (cast_back's hidden axis): the output rows vectorize
            tid = T.get_thread_binding()
            first_row, col = segment_place(bx, by, bz, tid, vec)  # this thread's vector, in every one of its rows
            # The block's log2 sides, held in variables (expressions of the runtime block cost the compiler's
            # simplifier seconds a kernel); a per-channel block is one column wide
            m_shift = T.alloc_var("int32")
            m_shift = T.bitwise_and(T.shift_right(BLOCK_SHIFTS[0], in_block * SHIFT_BITS), (1 << SHIFT_BITS) - 1)
            k_shift = T.alloc_var("int32")
            k_shift = T.bitwise_and(T.shift_right(BLOCK_SHIFTS[1], in_block * SHIFT_BITS), (1 << SHIFT_BITS) - 1)
            x_reg = T.alloc_local((ROWS, regs), storage)
            scale = T.alloc_local((ROWS, vec if per_channel_in else 1), "float32")
            o_reg = T.alloc_local((vec,), out_dtype)
            if col < hidden:  # the vector is in the row: all of it, or none (hidden is a multiple of vec)
                for u in T.unroll(ROWS):
                    token = first_row + u * SLOTS
                    if token < num_tokens:
                        for j in T.vectorized(regs):
                            x_reg[u, j] = x[token, col // per_byte + j]
                        if per_channel(k_shift):  # a scale factor an element
                            for j in T.unroll(vec):
                                scale[u, j] = common.decode_sf(x_sf[sf_at(per_channel_sf, token, m_shift, col + j)], per_channel_sf.kind)
                        else:
                            at = sf_at(per_block, token, m_shift, T.shift_right(col, k_shift))
                            scale[u, 0] = common.decode_sf(x_sf[at], per_block.kind)
                for u in T.unroll(ROWS):
                    token = first_row + u * SLOTS
                    if token < num_tokens:
                        if per_channel(k_shift):
                            for j in T.unroll(vec):
                                o_reg[j] = dequantized(in_dtype, out_dtype, x_reg, u, j, scale[u, j])
                        else:
                            for j in T.unroll(vec):
                                o_reg[j] = dequantized(in_dtype, out_dtype, x_reg, u, j, scale[u, 0])
                        for j in T.vectorized(vec):
                            out[token, col + j] = o_reg[j]

    return cast_back_generic
