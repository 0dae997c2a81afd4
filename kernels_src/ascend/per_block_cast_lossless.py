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

from kernels_src.ascend.tile import segment
from kernels_src.quant import common
from tkaot._quant.kernels import PER_BLOCK_CAST_LOSSLESS

DECL = PER_BLOCK_CAST_LOSSLESS
REQUIRES: dict[str, int] = {}
THREADS = 128
HEADROOM = 6  # E4M3's largest binade (256) over E2M1's (4): 2**6
WORD = "uint32"
FP8 = "float8_e4m3fn"


def unsupported(hidden, in_block, in_sf, out_block, sf, sf_layout) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    ibm, ibk = common.block_shape(in_block)
    obm, obk = common.block_shape(out_block)
    if obm % ibm or obk % ibk:
        return f"out_block={out_block} is not a multiple of in_block={in_block} in both dimensions"
    return None


def build(hidden, in_block, in_sf, out_block, sf, sf_layout):
    why = unsupported(hidden, in_block, in_sf, out_block, sf, sf_layout)
    if why:
        raise ValueError(f"{DECL.name} for Ascend: {why}")
    ibm, ibk = common.block_shape(in_block)
    obm, obk = common.block_shape(out_block)
    rows = max(obm, 32)
    # a column's bytes in the tile: half a byte of codes, one E4M3 byte, the input exponents
    width = segment(hidden, 128, rows * (1.5 + 4 / ibk))
    segs = hidden // width
    blocks_m, blocks_k = rows // obm, width // obk  # output blocks in a tile
    in_k = width // ibk  # input blocks across a tile
    sf_in = common.SfLayout.from_input(in_sf, hidden // ibk)
    sf_out = common.SfLayout("ue8m0" if sf == "ue8m0" else "fp32", sf_layout, hidden // obk)
    out_k_blocks = hidden // obk

    num_tokens = T.dynamic("num_tokens")
    x_stride, in_sf_stride, sf_stride = T.dynamic("x_stride"), T.dynamic("in_sf_stride"), T.dynamic("sf_stride")
    in_sf_rows = num_tokens if ibm == 1 else T.ceildiv(num_tokens, ibm)
    out_sf_rows = num_tokens if obm == 1 else T.ceildiv(num_tokens, obm)

    def exponent(stored):
        """The biased exponent (uint32) of a stored power-of-two input scale factor."""
        if sf_in.kind == "ue8m0":
            return T.Cast(WORD, stored)
        return (common.f32_bits(stored) >> T.uint32(23)) & T.uint32(0xFF)

    def converted(x_ub, e_ub, eo_ub, i, b, n):
        """Element 2b + n of row i as E4M3: its code times 2**shift, shift = its block's e_in - e_out."""
        c = 2 * b + n
        shift = T.Cast("int32", e_ub[i, c // ibk]) - T.Cast("int32", eo_ub[i // obm, c // obk])
        # 2**shift as fp32; a shift past the bottom gives 0 (no E4M3 value survives it)
        factor = T.if_then_else(shift > -127, common.pow2_of_biased_exponent(shift + 127), T.float32(0))
        code = T.Cast("uint32", x_ub[i, b]) >> T.uint32(4 * n)
        return common.to_e4m3(common.e2m1_value(code) * factor)

    @T.prim_func
    def per_block_cast_lossless(
        x: T.StridedTensor[(num_tokens, hidden // 8), (x_stride, 1), WORD],
        x_sf: T.StridedTensor[sf_in.shape(in_sf_rows), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden // 4), WORD],
        out_sf: T.StridedTensor[sf_out.shape(out_sf_rows), (sf_stride, 1), sf_out.dtype],
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows) * segs) as block:
            row = block // segs * rows
            col = block % segs * width
            # byte views of the words (they keep the parameters' names, which the launch spec maps to the op's)
            x = T.StridedTensor((num_tokens, hidden // 2), (x_stride * 4, 1), "uint8", data=x.data)
            out = T.Tensor((num_tokens, hidden), FP8, data=out.data)
            x_ub = T.alloc_shared((rows, width // 2), "uint8")
            out_ub = T.alloc_shared((rows, width), FP8)
            e_ub = T.alloc_shared((rows, in_k), WORD)  # each input block's exponent
            eo_ub = T.alloc_shared((blocks_m, blocks_k), WORD)  # each output block's e_out
            T.copy(x[row : row + rows, col // 2 : (col + width) // 2], x_ub)
            with T.SimtVF(threads=THREADS):
                largest = T.alloc_var(WORD)
                for i, q in T.Parallel(rows, in_k):
                    e_ub[i, q] = T.uint32(0)
                    if row + i < num_tokens:
                        e_ub[i, q] = exponent(x_sf[sf_in.index((row + i) // ibm, col // ibk + q)])
                for b in T.Parallel(blocks_m * blocks_k):
                    bm, bk = b // blocks_k, b % blocks_k
                    largest = T.uint32(0)
                    for i in T.serial(obm):
                        for q in T.serial(obk // ibk):
                            largest = T.max(largest, e_ub[bm * obm + i, bk * (obk // ibk) + q])
                    largest = T.if_then_else(largest >= T.uint32(HEADROOM), largest - T.uint32(HEADROOM), T.uint32(0))
                    eo_ub[bm, bk] = largest
                    m, k = (row + bm * obm) // obm, col // obk + bk
                    if m < out_sf_rows:
                        if sf == "ue8m0":
                            out_sf[sf_out.index(m, k)] = T.Cast("uint8", largest)
                            if sf_out.pad > 0 and k == out_k_blocks - 1:
                                for p in T.serial(sf_out.pad):
                                    out_sf[sf_out.index(m, out_k_blocks + p)] = T.uint8(0)
                        else:
                            out_sf[sf_out.index(m, k)] = common.f32_from_bits(largest << T.uint32(23))
                for i, b in T.Parallel(rows, width // 2):
                    # the byte's two codes, the lower-indexed element in the low nibble
                    out_ub[i, 2 * b] = converted(x_ub, e_ub, eo_ub, i, b, 0)
                    out_ub[i, 2 * b + 1] = converted(x_ub, e_ub, eo_ub, i, b, 1)
            T.copy(out_ub, out[row : row + rows, col : col + width])

    return per_block_cast_lossless
