"""Lossless re-quantisation of block-scaled FP4 E2M1 data to FP8 E4M3 with larger scale blocks, for Ascend.

The rule of the CUDA kernel (kernels_src/quant/per_block_cast_lossless.py): every input scale factor is a power
of two, so a value is code * 2**(e_in - 127) for its input block's biased exponent e_in; an output block takes the
largest e_in of the input blocks inside it (rows past the last token take no part), sets
e_out = max(that - 6, 0), and each element becomes E4M3(code * 2**(e_in - e_out)) (0 for a shift below -126). The
scale factor written is fp32 2**(e_out - 127), or the UE8M0 byte e_out (unused bytes of a packed word 0).

A block takes `rows` tokens (a whole output block of rows) by a segment of the row into the Unified Buffer. In a
SIMT region threads read each (row, input block)'s exponent from x_sf, then one thread an output block forms
e_out and writes its scale factor straight to out_sf, then every element is decoded, scaled by 2**shift in fp32
(exact: E4M3 holds every such product the op lets through) and rounded, which is the value the CUDA kernel's
byte table gives. Data and outputs are declared as words, as on CUDA, and read and written through byte views.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import split_block, whole_row_build
from kernels_src.ascend.quant_in import Side, block_sides
from kernels_src.ascend.tile import segment
from kernels_src.quant import common
from tkaot._quant.kernels import PER_BLOCK_CAST_LOSSLESS

DECL = PER_BLOCK_CAST_LOSSLESS
REQUIRES: dict[str, int] = {}
THREADS = 128
HEADROOM = 6  # E4M3's largest binade (256) over E2M1's (4): 2**6
WORD = "uint32"
FP8 = "float8_e4m3fn"
TILE = 128  # rows of a generic tile: the largest block side
MIN_CODES = 16  # the narrowest block
IN_BLOCKS = PER_BLOCK_CAST_LOSSLESS.axis("in_block").choices
OUT_BLOCKS = PER_BLOCK_CAST_LOSSLESS.axis("out_block").choices


def unsupported(hidden, in_block, in_sf, out_block, sf, sf_layout) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    ibm, ibk = common.block_shape(in_block)
    obm, obk = common.block_shape(out_block)
    if obm % ibm or obk % ibk:
        return f"out_block={out_block} is not a multiple of in_block={in_block} in both dimensions"
    return None


def per_block_cast_lossless_kernel(hidden, width, in_block, in_sf, out_block, sf, sf_layout):
    """The kernel for rows of `hidden` columns: ints and the blocks and layout as strings, a tile of a whole output
    block of rows (at least 32) by the widest segment that divides the row (width None); or the generic kernel's
    runtime values (the blocks and the layout their indices among the axes' choices, hidden a multiple of 128), a
    tile of TILE rows by `width` columns, which holds whole input and output blocks of every size."""
    generic = width is not None
    if generic:
        (ibm, ibk), (obm, obk) = block_sides(IN_BLOCKS, in_block), block_sides(OUT_BLOCKS, out_block)
        rows = TILE
        segs = hidden // width
        slots_m, slots_k = rows, width // MIN_CODES  # room for the most output blocks a tile holds
        ek = Side(MIN_CODES)  # the tile's input exponents are kept a chunk of 16 codes (the narrowest block) each
        out_kind = "ue8m0" if sf == "ue8m0" else "fp32"
    else:
        (ibm, ibk), (obm, obk) = (Side(n) for n in common.block_shape(in_block)), (Side(n) for n in common.block_shape(out_block))
        rows = max(obm.size, 32)
        # a column's bytes in the tile: half a byte of codes, one E4M3 byte, the input exponents
        width = segment(hidden, 128, rows * (1.5 + 4 / ibk.size))
        segs = hidden // width
        slots_m, slots_k = rows // obm.size, width // obk.size  # output blocks in a tile
        ek = ibk  # the tile's input exponents are kept an input block each
        sf_out = common.SfLayout("ue8m0" if sf == "ue8m0" else "fp32", sf_layout, hidden // obk.size)
    in_k = width // ek.size  # input exponents across a tile
    sf_in = common.SfLayout.from_input(in_sf, ibk.div(hidden))
    out_k_blocks = obk.div(hidden)

    num_tokens = T.dynamic("num_tokens")
    x_stride, in_sf_stride, sf_stride = T.dynamic("x_stride"), T.dynamic("in_sf_stride"), T.dynamic("sf_stride")
    if generic:
        in_sf_rows = ibm.div(num_tokens + ibm.extent - 1)
        out_sf_rows = obm.div(num_tokens + obm.extent - 1)
        packed = sf == "ue8m0"
        # x's three leading extents (1) only bind the blocks and the layout, by their strides, and x is declared
        # `hidden` words wide to bind hidden (a dim must stand alone in some extent or stride to be bound); out_sf's
        # extents bound the indices of either layout
        x_shape, x_strides = (1, 1, 1, num_tokens, hidden), (in_block, out_block, sf_layout, x_stride, 1)
        bound = out_sf_rows + out_k_blocks
        sf_shape = (bound, common.UE8M0_PACK * bound)

        def sf_index(m, k):
            col = sf_layout != 0
            if packed:
                pack = common.UE8M0_PACK
                return T.if_then_else(col, k // pack, m), T.if_then_else(col, m * pack + k % pack, k)
            return T.if_then_else(col, k, m), T.if_then_else(col, m, k)

        pad = (common.UE8M0_PACK - out_k_blocks % common.UE8M0_PACK) % common.UE8M0_PACK if packed else 0
        most_pad = common.UE8M0_PACK - 1 if packed else 0
        sf_dtype = common.SF_DTYPE[out_kind]
    else:
        in_sf_rows = num_tokens if ibm.size == 1 else T.ceildiv(num_tokens, ibm.size)
        out_sf_rows = num_tokens if obm.size == 1 else T.ceildiv(num_tokens, obm.size)
        x_shape, x_strides = (num_tokens, hidden // 8), (x_stride, 1)
        sf_shape, sf_index, sf_dtype = sf_out.shape(out_sf_rows), sf_out.index, sf_out.dtype
        pad = most_pad = sf_out.pad

    def bounded(index, extent):
        # (generic) an index of the tile the modulo does not change: it bounds it for TileLang's barrier analysis
        return index % extent if generic else index

    def exponent(stored):
        """The biased exponent (uint32) of a stored power-of-two input scale factor."""
        if sf_in.kind == "ue8m0":
            return T.Cast(WORD, stored)
        return (common.f32_bits(stored) >> T.uint32(23)) & T.uint32(0xFF)

    def shift_of(e_ub, eo_ub, i, c):
        # e_in - e_out of element (i, c) of the tile (or, of a generic tile, of its 16-code chunk c // 16)
        return T.Cast("int32", e_ub[i, ek.div(c)]) - T.Cast("int32", eo_ub[obm.div(i), obk.div(c)])

    def converted(x_ub, e_ub, eo_ub, shift_ub, i, b, n):
        """Element 2b + n of row i as E4M3: its code times 2**shift, shift = its block's e_in - e_out."""
        c = 2 * b + n
        # (generic: the shifts of each 16-code chunk, formed beforehand, so no runtime block side indexes this loop)
        shift = shift_ub[i, c // MIN_CODES] if generic else shift_of(e_ub, eo_ub, i, c)
        # 2**shift as fp32; a shift past the bottom gives 0 (no E4M3 value survives it)
        factor = T.if_then_else(shift > -127, common.pow2_of_biased_exponent(shift + 127), T.float32(0))
        code = T.Cast("uint32", x_ub[i, b]) >> T.uint32(4 * n)
        return common.to_e4m3(common.e2m1_value(code) * factor)

    def in_block_index(col, q):
        # the input block (along the row) of the tile's q-th input exponent
        return ibk.div(col + ek.mul(q)) if generic else ibk.div(col) + q

    def block_in_tile(bm, bk):
        # (generic) output block (bm, bk) of the slots is in the tile
        return T.And(obm.mul(bm) < rows, obk.mul(bk) < width)

    @T.prim_func
    def per_block_cast_lossless(
        x: T.StridedTensor[x_shape, x_strides, WORD],
        x_sf: T.StridedTensor[sf_in.shape(in_sf_rows), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden // 4), WORD],
        out_sf: T.StridedTensor[sf_shape, (sf_stride, 1), sf_dtype],
    ):
        if generic:
            # as the op checks: whole tiles of columns
            T.assume(T.And(hidden > 0, hidden % width == 0))
        with T.Kernel(T.ceildiv(num_tokens, rows) * segs) as block:
            row, col = split_block(block, segs, width, rows)
            # byte views of the words (they keep the parameters' names, which the launch spec maps to the op's)
            x = T.StridedTensor((num_tokens, hidden // 2), (x_stride * 4, 1), "uint8", data=x.data)
            out = T.Tensor((num_tokens, hidden), FP8, data=out.data)
            x_ub = T.alloc_shared((rows, width // 2), "uint8")
            out_ub = T.alloc_shared((rows, width), FP8)
            e_ub = T.alloc_shared((rows, in_k), WORD)  # each input block's exponent
            eo_ub = T.alloc_shared((slots_m, slots_k), WORD)  # each output block's e_out
            shift_ub = T.alloc_shared((rows, in_k), "int32") if generic else None  # each 16-code chunk's e_in - e_out
            T.copy(x[row : row + rows, col // 2 : (col + width) // 2], x_ub)
            with T.SimtVF(threads=THREADS):
                largest = T.alloc_var(WORD)
                for i, q in T.Parallel(rows, in_k):
                    e_ub[i, q] = T.uint32(0)
                    if row + i < num_tokens:
                        e_ub[i, q] = exponent(x_sf[sf_in.index(ibm.div(row + i), in_block_index(col, q))])
                for b in T.Parallel(slots_m * slots_k):
                    bm, bk = b // slots_k, b % slots_k
                    if not generic or block_in_tile(bm, bk):
                        largest = T.uint32(0)
                        for i in T.serial(obm.extent):
                            for q in T.serial(obk.over(ek)):
                                largest = T.max(largest, e_ub[bounded(obm.mul(bm) + i, rows), bounded(bk * obk.over(ek) + q, in_k)])
                        largest = T.if_then_else(largest >= T.uint32(HEADROOM), largest - T.uint32(HEADROOM), T.uint32(0))
                        eo_ub[bm, bk] = largest
                        m, k = obm.div(row + obm.mul(bm)), obk.div(col) + bk
                        if m < out_sf_rows:
                            if sf == "ue8m0":
                                out_sf[sf_index(m, k)] = T.Cast("uint8", largest)
                                if most_pad > 0 and k == out_k_blocks - 1:
                                    for p in T.serial(most_pad):
                                        if not generic or p < pad:
                                            out_sf[sf_index(m, out_k_blocks + p)] = T.uint8(0)
                            else:
                                out_sf[sf_index(m, k)] = common.f32_from_bits(largest << T.uint32(23))
                if generic:
                    for i, q in T.Parallel(rows, in_k):
                        shift_ub[i, q] = shift_of(e_ub, eo_ub, i, q * MIN_CODES)
                for i, b in T.Parallel(rows, width // 2):
                    # the byte's two codes, the lower-indexed element in the low nibble
                    out_ub[i, 2 * b] = converted(x_ub, e_ub, eo_ub, shift_ub, i, b, 0)
                    out_ub[i, 2 * b + 1] = converted(x_ub, e_ub, eo_ub, shift_ub, i, b, 1)
            T.copy(out_ub, out[row : row + rows, col : col + width])

    return per_block_cast_lossless


build = whole_row_build(DECL, unsupported, per_block_cast_lossless_kernel)
