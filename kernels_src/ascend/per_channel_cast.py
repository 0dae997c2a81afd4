"""Per-channel cast to FP8 E4M3 for Ascend: one scale factor per channel for every `block_m` tokens.

A block takes one m block (block_m rows) by a segment of channels into the Unified Buffer. In a SIMT region one
thread a channel takes the maximum magnitude down its rows (rows past the last token count as zero), forms the
scale factor with the CUDA kernels' expressions (kernels_src/quant/common.py) and stores it straight to
out_sf (packed UE8M0: four consecutive m blocks of a channel in one word, the unused bytes of the last word
zeroed); then every element is scaled and rounded. An E4M3 input with per-token scale factors in blocks of
`in_block` is decoded as data * in_sf in fp32 first, then cast as (data * in_sf) * inv, as on CUDA
(kernels_src/quant/per_channel_cast.py).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import whole_row_build
from kernels_src.ascend.quant_in import BYTES, STORAGE
from kernels_src.ascend.tile import segment
from kernels_src.quant import common
from tkaot._quant.kernels import PER_CHANNEL_CAST

DECL = PER_CHANNEL_CAST
REQUIRES: dict[str, int] = {}
THREADS = 128
PACK = 4
TILE = 128  # rows of a generic tile: the largest m block
MIN_IN_BLOCK = 32  # the narrowest input scale block, and the smallest m block


def unsupported(hidden, in_dtype, in_block, in_sf, block_m, sf) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if in_dtype == "e4m3" and hidden % common.block_shape(in_block)[1]:
        return f"hidden={hidden} is not a multiple of the input block {in_block}"
    return None


def per_channel_cast_kernel(hidden, width, in_dtype, in_block, in_sf, block_m, sf):
    """The kernel for rows of `hidden` columns and m blocks of `block_m` tokens: ints (and the input's scale block
    `in_block` a string), a tile of one m block by the widest segment that divides the row (width None); or the
    generic kernel's runtime values (in_block then the block's index among the axis's choices, block_m 32 or 128,
    hidden a multiple of 128), a tile of up to TILE rows (one m block) by `width` columns."""
    generic = width is not None
    storage, _ = STORAGE[in_dtype]
    quantized_in = in_dtype == "e4m3"
    packed = sf == "ue8m0"
    if generic:
        rows = TILE  # room for the largest m block
        bk_shift = 3 + 2 * in_block  # log2 of the input scale block's width: 5 (1 x 32) or 7 (1 x 128)
        segs = hidden // width
        in_blocks = width // MIN_IN_BLOCK  # room for the most input scale blocks a tile row spans
        sf_in = common.SfLayout.from_input(in_sf if quantized_in else "fp32", hidden >> bk_shift if quantized_in else 1)
    else:
        rows = block_m
        bk = common.block_shape(in_block)[1] if quantized_in else hidden
        width = segment(hidden, min(bk, 128), block_m * (BYTES[storage] + 1 + (4 / bk if quantized_in else 0)))
        segs = hidden // width
        in_blocks = max(width // bk, 1)  # input scale blocks a segment's row spans
        sf_in = common.SfLayout.from_input(in_sf if quantized_in else "fp32", hidden // bk)

    num_tokens = T.dynamic("num_tokens")
    in_sf_stride = T.dynamic("in_sf_stride")
    m_blocks = (num_tokens + block_m - 1) // block_m
    sf_shape = ((m_blocks + 3) // 4, hidden * 4) if packed else (m_blocks, hidden)
    if generic:
        # x's leading extent only binds block_m and its stride in_block (a dim must stand alone in some extent or
        # stride to be bound); x is read at [0, row, col]
        x_type = T.StridedTensor[(block_m, num_tokens, hidden), (in_block, hidden, 1), storage]
    else:
        x_type = T.Tensor[(num_tokens, hidden), storage]

    def in_block_of(c):
        # the input scale block of the tile's column c
        return c >> bk_shift if generic else c // bk

    def scale_live(row, i, q):
        # the tile's row i is a token of the m block, and its input scale block q starts in the tile
        if generic:
            return T.And(T.And(i < block_m, row + i < num_tokens), q * (1 << bk_shift) < width)
        return row + i < num_tokens

    def value(x_ub, scale_ub, i, c):
        """The fp32 value of element (i, c) of the tile: data * in_sf for E4M3 inputs."""
        if quantized_in:
            return T.Cast("float32", x_ub[i, c]) * scale_ub[i, in_block_of(c)]
        return T.Cast("float32", x_ub[i, c])

    @T.prim_func
    def per_channel_cast(
        x: x_type,
        x_sf: T.StridedTensor[sf_in.shape(num_tokens), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden), T.float8_e4m3fn],
        out_sf: T.Tensor[sf_shape, common.SF_DTYPE[sf]],
    ):
        if generic:
            # as the op checks: whole tiles of columns, m blocks of 32 or 128, input scale blocks of 32 or 128
            T.assume(T.And(hidden > 0, hidden % width == 0))
            T.assume(T.And(block_m >= MIN_IN_BLOCK, block_m <= TILE))
            T.assume(T.And(in_block >= 0, in_block <= 2))
        with T.Kernel(T.ceildiv(num_tokens, block_m) * segs) as block:
            mb = block // segs
            row = mb * block_m
            col = block % segs * width
            x_ub = T.alloc_shared((rows, width), storage)
            out_ub = T.alloc_shared((rows, width), T.float8_e4m3fn)
            inv_ub = T.alloc_shared((width,), T.float32)
            scale_ub = T.alloc_shared((rows, in_blocks), T.float32)
            if generic:
                T.copy(x[0, row : row + block_m, col : col + width], x_ub[0:block_m, :])
            else:
                T.copy(x[row : row + block_m, col : col + width], x_ub)
            with T.SimtVF(threads=THREADS):
                amax = T.alloc_local((1,), T.float32)
                if quantized_in:
                    for i, q in T.Parallel(rows, in_blocks):
                        stored_in = x_sf[sf_in.index(row + i, in_block_of(col) + q)]
                        scale_ub[i, q] = T.if_then_else(scale_live(row, i, q), common.decode_sf(stored_in, sf_in.kind), T.float32(0))
                for c in T.Parallel(width):
                    amax[0] = T.float32(0)
                    for i in T.serial(block_m):
                        amax[0] = T.max(amax[0], T.if_then_else(row + i < num_tokens, T.abs(value(x_ub, scale_ub, i, c)), T.float32(0)))
                    stored, inv = common.scale_factor(amax[0], "e4m3", sf)
                    inv_ub[c] = inv
                    if packed:
                        out_sf[mb // PACK, (col + c) * PACK + mb % PACK] = stored
                        if mb == m_blocks - 1:
                            for p in T.serial(PACK - 1):
                                if mb % PACK + p + 1 < PACK:
                                    out_sf[mb // PACK, (col + c) * PACK + mb % PACK + p + 1] = T.uint8(0)
                    else:
                        out_sf[mb, col + c] = stored
                for i, c in T.Parallel(rows, width):
                    out_ub[i, c] = common.to_e4m3(value(x_ub, scale_ub, i, c) * inv_ub[c])
            if generic:
                T.copy(out_ub[0:block_m, :], out[row : row + block_m, col : col + width])
            else:
                T.copy(out_ub, out[row : row + block_m, col : col + width])

    return per_channel_cast


build = whole_row_build(DECL, unsupported, per_channel_cast_kernel)
