"""The generic lossless FP4 -> FP8 re-quantisation: per_block_cast_lossless with the row width `hidden`, the input and
output blocks and the output sf layout runtime values.

It serves the calls whose specialised per_block_cast_lossless variant is not built, and writes
the same bytes: an output block's exponent is the largest input exponent inside it (a maximum,
order-free), and each element is converted by the specialised kernel's code
(per_block_cast_lossless: the PRMT table for shifts from -5, the fp32 path below) with the same
shift, e_in - e_out. Only which thread holds which codes differs.

The tiling is the specialised kernel's for blocks of 32 codes or more (a CTA of 256 threads, a
128 x 128 tile, 32 codes a thread and pass), each vector taken as two halves of 16 codes, each
with its own input exponent and output block, so 16-code blocks (in or out) need no other
tiling: where the output block is 32 codes wide or more, both halves of a vector are in it and
fold their exponents first. The lanes of an output block reduce with warp shuffles (their count
depends on the block: uniform branches), then one lane per warp and block folds it into shared
memory with an atomic max, as the specialised kernel does.

The blocks and the layout reach the kernel as their indices among the axes' choices (in_block
1x16 ... 128x128, out_block 1x16 ... 128x128, sf_layout row/col); x's three leading dims (extent 1)
only bind them, by their strides (a dim must stand alone in some extent or stride to be bound, and
before a buffer whose shape reads it), and x is declared `hidden` words wide to bind hidden (it is
hidden / 8: every access is in the row). x is read at [0, 0, 0, row, word].
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from kernels_src.quant.per_block_cast_lossless import (
    NUM_THREADS,
    TILE,
    WORD,
    check_static,
    e4m3_words,
    input_exponent,
    output_exponent,
)
from tkaot._quant.kernels import PER_BLOCK_CAST_LOSSLESS, PER_BLOCK_CAST_LOSSLESS_GENERIC

DECL = PER_BLOCK_CAST_LOSSLESS_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

VEC = 32  # codes a thread vector (four words), as in the specialised kernel for input blocks 32 codes wide or more
HALF = 16  # codes a half vector: the narrowest block
MAX_BLOCKS = TILE * (TILE // HALF)  # output blocks in a tile (of 1 x 16)


def block_shifts(choices: tuple[str, ...], index):
    """(log2 rows, log2 codes) of the block choices[index], index a runtime value: nibble `index` of a constant word
    of each (no branch, and a short expression wherever the shifts are used)."""
    tables = [0, 0]
    for n, text in enumerate(choices):
        for side, size in enumerate(common.block_shape(text)):
            tables[side] |= (size.bit_length() - 1) << (4 * n)
    return tuple(T.Cast("int32", (T.uint32(table) >> T.Cast("uint32", 4 * index)) & T.uint32(15)) for table in tables)


def build(in_sf, sf):
    check_static(TILE, "1x16", in_sf, "128x128", sf, "row")
    in_words, out_words = VEC // 8, VEC // 4
    half_in = HALF // 8  # words a half vector
    tpr = TILE // VEC  # threads across a tile row
    rows_per_pass = NUM_THREADS // tpr
    passes = TILE // rows_per_pass
    in_blocks = PER_BLOCK_CAST_LOSSLESS.axis("in_block").choices
    out_blocks = PER_BLOCK_CAST_LOSSLESS.axis("out_block").choices
    sf_dtype = common.SF_DTYPE["ue8m0" if sf == "ue8m0" else "fp32"]
    packed = sf == "ue8m0"
    in_kind, _, in_col = in_sf.partition("_")

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")  # in words
    in_sf_stride = T.dynamic("in_sf_stride")
    sf_stride = T.dynamic("sf_stride")
    in_block = T.dynamic("in_block")
    out_block = T.dynamic("out_block")
    sf_layout = T.dynamic("sf_layout")
    ibm_shift, ibk_shift = block_shifts(in_blocks, in_block)
    obm_shift, obk_shift = block_shifts(out_blocks, out_block)
    sf_in = common.SfLayout.from_input(in_sf, hidden >> ibk_shift)
    in_sf_rows = (num_tokens + (1 << ibm_shift) - 1) >> ibm_shift
    out_sf_rows = (num_tokens + (1 << obm_shift) - 1) >> obm_shift
    out_k_blocks = hidden >> obk_shift
    # bounds of either layout's indices: rows (m or k blocks), columns (k or m blocks, four bytes a word packed)
    sf_rows = out_sf_rows + out_k_blocks
    sf_cols = 4 * (out_sf_rows + out_k_blocks)

    def sf_at(m, k):
        """(i, j): out_sf[i, j] holds the scale factor of output block (m, k) in the runtime layout."""
        return common.runtime_sf_index(m, k, sf_layout, packed)

    def tile_block(local_row, tile_code):
        """The shared-memory slot of the output block holding (local_row, tile_code) of the tile."""
        return (local_row >> obm_shift) * (TILE >> obk_shift) + (tile_code >> obk_shift)

    @T.prim_func
    def per_block_cast_lossless_generic(
        x: T.StridedTensor[(1, 1, 1, num_tokens, hidden), (in_block, out_block, sf_layout, x_stride, 1), WORD],
        x_sf: T.StridedTensor[sf_in.shape(in_sf_rows), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden // 4), WORD],
        out_sf: T.StridedTensor[(sf_rows, sf_cols), (sf_stride, 1), sf_dtype],
    ):
        with T.Kernel(hidden // TILE, T.ceildiv(num_tokens, TILE), threads=NUM_THREADS) as (kb, mb):
            kernel_entry()
            T.assume(x_stride % 4 == 0)
            T.assume(hidden % TILE == 0)  # as the op checks
            tid = T.get_thread_binding()
            lane = tid % 32
            tile_code = tid % tpr * VEC  # this thread's first code in the tile's row
            col = kb * TILE + tile_code
            x_reg = T.alloc_local((passes, in_words), WORD)
            e_in = T.alloc_local((passes, 2), WORD)
            o_reg = T.alloc_local((out_words,), WORD)
            e_max = T.alloc_var(WORD)
            shift = T.alloc_var("int32")
            block_exp = T.alloc_shared((MAX_BLOCKS,), WORD)
            lanes_k = 1 << T.min(T.max(obk_shift - 5, 0), 2)  # lanes of a tile row in one output block (by 32 codes)
            lanes_m = 1 << T.min(obm_shift, 3)  # rows of a warp in one output block

            for i in T.unroll(MAX_BLOCKS // NUM_THREADS):
                block_exp[i * NUM_THREADS + tid] = T.uint32(0)

            for p in T.unroll(passes):
                row = mb * TILE + p * rows_per_pass + tid // tpr
                if row < num_tokens:
                    for j in T.vectorized(in_words):
                        x_reg[p, j] = x[0, 0, 0, row, col // 8 + j]
                    for h in T.unroll(2):
                        e_in[p, h] = input_exponent(in_kind, x_sf[sf_in.index(row >> ibm_shift, (col + h * HALF) >> ibk_shift)])
                else:
                    for h in T.unroll(2):
                        e_in[p, h] = T.uint32(0)
            T.sync_threads()

            # Per half: a 32-code-wide (or wider) output block holds both halves, which fold first; then the lanes
            # along the row, and the rows of the warp, in one output block
            for p in T.unroll(passes):
                for h in T.unroll(2):
                    e_max = e_in[p, h]
                    if obk_shift > 4:
                        e_max = T.max(e_in[p, 0], e_in[p, 1])
                    for s in T.unroll(2):
                        if (1 << s) < lanes_k:
                            e_max = T.max(e_max, T.shfl_xor(e_max, 1 << s))
                    for s in T.unroll(3):
                        if (1 << s) < lanes_m:
                            e_max = T.max(e_max, T.shfl_xor(e_max, tpr << s))
                    if lane % lanes_k == 0 and lane // tpr % lanes_m == 0:
                        T.atomic_max(block_exp[tile_block(p * rows_per_pass + tid // tpr, tile_code + h * HALF)], e_max)
            T.sync_threads()

            for p in T.unroll(passes):
                row = mb * TILE + p * rows_per_pass + tid // tpr
                if row < num_tokens:
                    for h in T.unroll(2):
                        e_max = block_exp[tile_block(p * rows_per_pass + tid // tpr, tile_code + h * HALF)]
                        shift = T.Cast("int32", e_in[p, h]) - T.Cast("int32", output_exponent(e_max))
                        e4m3_words(x_reg, p, h * half_in, half_in, shift, o_reg)
                    for j in T.vectorized(out_words):
                        out[row, col // 4 + j] = o_reg[j]

            # One thread per output block of the tile writes its scale factor
            for i in T.unroll(MAX_BLOCKS // NUM_THREADS):
                b = i * NUM_THREADS + tid
                if b < (TILE >> obm_shift) * (TILE >> obk_shift):
                    m = mb * (TILE >> obm_shift) + (b >> (7 - obk_shift))
                    k = kb * (TILE >> obk_shift) + b % (TILE >> obk_shift)
                    if m < out_sf_rows:
                        if packed:
                            i_sf, j_sf = sf_at(m, k)
                            out_sf[i_sf, j_sf] = T.Cast("uint8", output_exponent(block_exp[b]))
                            if k == out_k_blocks - 1:  # the unused bytes of the row's last word
                                for pad in T.unroll(1, common.UE8M0_PACK):
                                    partial = out_k_blocks % common.UE8M0_PACK  # k blocks in the last word
                                    if partial != 0 and partial + pad <= common.UE8M0_PACK:
                                        i_sf, j_sf = sf_at(m, k + pad)
                                        out_sf[i_sf, j_sf] = T.uint8(0)
                        else:
                            i_sf, j_sf = sf_at(m, k)
                            out_sf[i_sf, j_sf] = common.f32_from_bits(output_exponent(block_exp[b]) << T.uint32(23))

    return per_block_cast_lossless_generic
