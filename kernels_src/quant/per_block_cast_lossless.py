"""Lossless re-quantisation of block-scaled FP4 E2M1 data to FP8 E4M3 with larger scale blocks.

Every input scale factor must be a power of two (UE8M0 bytes, or fp32 powers of
two), so each value is code * 2**(e_in - 127) for its block's biased exponent
e_in. An output block takes the largest e_in among the input blocks inside it
and sets e_out = max(that - 6, 0); each element is then stored as
E4M3(code * 2**(e_in - e_out)). E2M1 magnitudes are 0.5 .. 6 and E4M3 holds
them exactly for shifts e_in - e_out in [-8, 6], so the cast is exact whenever
no input block is more than 2**14 below its output block's largest (the op
refuses spreads over 2**11, as TileKernels does; a shift below -126 stores 0).
Out-of-range rows take no part in the maximum.

A CTA takes a 128 x 128 tile (any output block divides it): each thread loads
its 16-byte (or 8-byte, for 16-wide input blocks) vectors of packed codes and
the exponent of each vector's input block, lanes sharing an output block
reduce the exponents with warp shuffles, one lane per warp and block folds its
maximum into shared memory with an atomic max, and after one barrier every
thread converts and stores its vectors while one thread per output block
writes the block's scale factor (fp32 2**(e_out - 127), or the UE8M0 byte
e_out; unused bytes of a packed int32 are written as 0).

The conversion: a vector shares one shift s, and for s in [-5, 6] (every shift
the op's check lets through) every E4M3 result is a normal number whose bits
are an affine function of the code: magnitude code m >= 2 gives (m << 2) +
((s + 6) << 3), code 1 gives (s + 6) << 3, code 0 gives 0. The eight bytes of
that table sit in two words, and one byte permute (PRMT) looks four codes up at
once; the sign bit moves from bit 3 of a code to bit 7 of its byte. Other
shifts (reachable only while a CUDA graph is captured, when the op cannot check
values) take the general path: decode to fp32, multiply by 2**s, round to E4M3.
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from tkaot._quant.kernels import PER_BLOCK_CAST_LOSSLESS

DECL = PER_BLOCK_CAST_LOSSLESS  # the declaration this module builds (tkaot/_quant/kernels.py)


TILE = 128  # rows and channels of a CTA's tile
NUM_THREADS = 256
SHIFT_HEADROOM = 6  # E4M3's largest binade (256) over E2M1's (4): 2**6
MIN_TABLE_SHIFT = -5  # the smallest shift whose results are all E4M3 normals (0.5 * 2**-5 = 2**-6)
WORD = "uint32"  # data moves as words: eight E2M1 codes in, four E4M3 bytes out


def check_static(hidden, in_block, in_sf, out_block, sf, sf_layout) -> None:
    """Raise ValueError for a combination no kernel supports (each axis alone is checked by its declaration)."""
    ibm, ibk = common.block_shape(in_block)
    obm, obk = common.block_shape(out_block)
    if obm % ibm or obk % ibk:
        raise ValueError(f"{DECL.name}: out_block={out_block} is not a multiple of in_block={in_block} in both dimensions")


def byte_perm(lo, hi, selector):
    """PRMT: byte n of the result is byte (nibble n of selector) of the eight bytes hi:lo (selector nibbles < 8)."""
    return T.call_extern(WORD, "__byte_perm", lo, hi, selector)


# The table's two words: base = the E4M3 bits of 2**(shift - 1) (code 1's value) copied into the bytes of codes
# 1..3 and 4..7, plus m << 2 for codes m >= 2 (their mantissa bit and exponent step); code 0 stays 0
TABLE_SPLAT = (0x01010100, 0x01010101)
TABLE_OFFSETS = (0x0C080000, 0x1C181410)


def e4m3_table(shift):
    """(lo, hi): the E4M3 bytes of magnitude codes 0..3 and 4..7 times 2**shift, for shift in [-5, 6]."""
    base = T.Cast(WORD, shift + 6) << T.uint32(3)
    return tuple(base * T.uint32(splat) + T.uint32(offset) for splat, offset in zip(TABLE_SPLAT, TABLE_OFFSETS))


def e4m3_lookup(codes, lo, hi):
    """Four E2M1 codes, one in the low nibble of each byte -> their E4M3 bytes, from the table (lo, hi)."""
    mag = codes & T.uint32(0x07070707)
    nibbles = mag | (mag >> T.uint32(4))  # bytes 0 and 2 now hold two selector nibbles each
    selector = (nibbles & T.uint32(0xFF)) | ((nibbles >> T.uint32(8)) & T.uint32(0xFF00))
    return byte_perm(lo, hi, selector) | ((codes & T.uint32(0x08080808)) << T.uint32(4))


EVEN_CODES = 0x0F0F0F0F  # of a word's eight codes (low nibble first), codes 0, 2, 4, 6 are the low nibbles
INTERLEAVE = (0x5140, 0x7362)  # PRMT selectors: bytes of codes 0-3, then 4-7, from (even, odd) looked up


def input_exponent(kind: str, stored):
    """The biased exponent (uint32) of a stored power-of-two input scale factor (a UE8M0 byte, or fp32)."""
    if kind == "ue8m0":
        return T.Cast(WORD, stored)
    return (common.f32_bits(stored) >> T.uint32(23)) & T.uint32(0xFF)


def output_exponent(largest):
    """An output block's biased exponent from the largest input exponent inside it: max(largest - 6, 0)."""
    return T.if_then_else(largest >= T.uint32(SHIFT_HEADROOM), largest - T.uint32(SHIFT_HEADROOM), T.uint32(0))


@T.macro
def e4m3_words(x_reg, p, first, words, shift, o_reg):
    """x_reg[p, first:first + words] (eight E2M1 codes a word) times 2**shift into o_reg[2 * first:2 * (first + words)]
    (four E4M3 bytes a word): by the table for shifts from MIN_TABLE_SHIFT, else through fp32."""
    factor = T.alloc_var("float32")
    table_lo = T.alloc_var(WORD)
    table_hi = T.alloc_var(WORD)
    even = T.alloc_var(WORD)
    odd = T.alloc_var(WORD)
    if shift >= MIN_TABLE_SHIFT:
        table_lo, table_hi = e4m3_table(shift)
        for w in T.unroll(words):
            even = e4m3_lookup(x_reg[p, first + w] & T.uint32(EVEN_CODES), table_lo, table_hi)
            odd = e4m3_lookup((x_reg[p, first + w] >> T.uint32(4)) & T.uint32(EVEN_CODES), table_lo, table_hi)
            o_reg[2 * (first + w)] = byte_perm(even, odd, T.uint32(INTERLEAVE[0]))
            o_reg[2 * (first + w) + 1] = byte_perm(even, odd, T.uint32(INTERLEAVE[1]))
    else:
        # 2**shift as fp32; a shift past the bottom gives 0 (no E4M3 value survives it)
        factor = T.if_then_else(shift > -127, common.pow2_of_biased_exponent(shift + 127), T.float32(0))
        for w in T.unroll(2 * words):
            o_reg[2 * first + w] = T.uint32(0)
            for n in T.unroll(4):
                code = x_reg[p, (2 * first + w) // 2] >> T.uint32(4 * ((2 * first + w) % 2 * 4 + n))
                fp8 = T.reinterpret(common.to_e4m3(common.e2m1_value(code) * factor), "uint8")
                o_reg[2 * first + w] = o_reg[2 * first + w] | (T.Cast(WORD, fp8) << T.uint32(8 * n))


def build(hidden, in_block, in_sf, out_block, sf, sf_layout):
    check_static(hidden, in_block, in_sf, out_block, sf, sf_layout)
    ibm, ibk = common.block_shape(in_block)
    obm, obk = common.block_shape(out_block)
    vec = min(32, ibk)  # codes per vector: 16 bytes, inside one input block
    in_words, out_words = vec // 8, vec // 4
    tpr = TILE // vec  # threads across a tile row
    rows_per_pass = NUM_THREADS // tpr
    passes = TILE // rows_per_pass
    rows_per_warp = 32 // tpr
    lanes_k = min(obk // vec, tpr)  # lanes of one tile row sharing an output block
    lanes_m = min(obm, rows_per_warp)  # rows of one warp sharing an output block
    blocks_m, blocks_k = TILE // obm, TILE // obk  # output blocks in a tile
    num_blocks = blocks_m * blocks_k
    sf_in = common.SfLayout.from_input(in_sf, hidden // ibk)
    sf_out = common.SfLayout("ue8m0" if sf == "ue8m0" else "fp32", sf_layout, hidden // obk)
    out_k_blocks = hidden // obk

    num_tokens = T.dynamic("num_tokens")
    x_stride = T.dynamic("x_stride")  # in words
    in_sf_stride = T.dynamic("in_sf_stride")
    sf_stride = T.dynamic("sf_stride")
    in_sf_rows = num_tokens if ibm == 1 else (num_tokens + ibm - 1) // ibm
    out_sf_rows = num_tokens if obm == 1 else (num_tokens + obm - 1) // obm

    @T.prim_func
    def per_block_cast_lossless(
        x: T.StridedTensor[(num_tokens, hidden // 8), (x_stride, 1), WORD],
        x_sf: T.StridedTensor[sf_in.shape(in_sf_rows), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden // 4), WORD],
        out_sf: T.StridedTensor[sf_out.shape(out_sf_rows), (sf_stride, 1), sf_out.dtype],
    ):
        with T.Kernel(hidden // TILE, T.ceildiv(num_tokens, TILE), threads=NUM_THREADS) as (kb, mb):
            kernel_entry()
            T.assume(x_stride % 4 == 0)
            tid = T.get_thread_binding()
            lane = tid % 32
            col = kb * TILE + tid % tpr * vec  # first code of this thread's vectors
            x_reg = T.alloc_local((passes, in_words), WORD)
            e_in = T.alloc_local((passes,), WORD)
            o_reg = T.alloc_local((out_words,), WORD)
            e_max = T.alloc_var(WORD)
            shift = T.alloc_var("int32")
            block_exp = T.alloc_shared((num_blocks,), WORD)

            for i in T.unroll((num_blocks + NUM_THREADS - 1) // NUM_THREADS):
                if i * NUM_THREADS + tid < num_blocks:
                    block_exp[i * NUM_THREADS + tid] = T.uint32(0)

            for p in T.unroll(passes):
                row = mb * TILE + p * rows_per_pass + tid // tpr
                if row < num_tokens:
                    for j in T.vectorized(in_words):
                        x_reg[p, j] = x[row, col // 8 + j]
                    e_in[p] = input_exponent(sf_in.kind, x_sf[sf_in.index(row // ibm, col // ibk)])
                else:
                    e_in[p] = T.uint32(0)
            T.sync_threads()

            # Lane bits below lanes_k (along the row) and the row bits below lanes_m name lanes of one block
            for p in T.unroll(passes):
                e_max = e_in[p]
                for s in T.unroll(lanes_k.bit_length() - 1):
                    e_max = T.max(e_max, T.shfl_xor(e_max, 1 << s))
                for s in T.unroll(lanes_m.bit_length() - 1):
                    e_max = T.max(e_max, T.shfl_xor(e_max, tpr << s))
                if lane % lanes_k == 0 and lane // tpr % lanes_m == 0:
                    local_row = p * rows_per_pass + tid // tpr
                    T.atomic_max(block_exp[local_row // obm * blocks_k + tid % tpr * vec // obk], e_max)
            T.sync_threads()

            for p in T.unroll(passes):
                row = mb * TILE + p * rows_per_pass + tid // tpr
                if row < num_tokens:
                    e_max = block_exp[(p * rows_per_pass + tid // tpr) // obm * blocks_k + tid % tpr * vec // obk]
                    shift = T.Cast("int32", e_in[p]) - T.Cast("int32", output_exponent(e_max))
                    e4m3_words(x_reg, p, 0, in_words, shift, o_reg)
                    for j in T.vectorized(out_words):
                        out[row, col // 4 + j] = o_reg[j]

            # One thread per output block of the tile writes its scale factor
            for i in T.unroll((num_blocks + NUM_THREADS - 1) // NUM_THREADS):
                b = i * NUM_THREADS + tid
                if b < num_blocks:
                    m = mb * blocks_m + b // blocks_k
                    k = kb * blocks_k + b % blocks_k
                    if m < out_sf_rows:
                        if sf == "ue8m0":
                            out_sf[sf_out.index(m, k)] = T.Cast("uint8", output_exponent(block_exp[b]))
                            if sf_out.pad > 0:
                                if k == out_k_blocks - 1:
                                    for q in T.unroll(sf_out.pad):
                                        out_sf[sf_out.index(m, out_k_blocks + q)] = T.uint8(0)
                        else:
                            out_sf[sf_out.index(m, k)] = common.f32_from_bits(output_exponent(block_exp[b]) << T.uint32(23))

    return per_block_cast_lossless
