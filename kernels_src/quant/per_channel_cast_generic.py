"""The generic per-channel cast: per_channel_cast with the row width `hidden`, the token block `block_m` (32 or 128)
and, for E4M3 inputs, their scale block `in_block` (1 x 32 or 1 x 128) runtime values.

It serves the calls whose specialised per_channel_cast variant is not built, and writes the same
bytes: it is the specialised kernel's body (kernels_src/quant/per_channel_cast.py per_channel_kernel) in
its tiling (a CTA of 256 threads takes block_m rows by 8 column vectors, 32 rows at a time), with the
number of 32-row passes (1 or 4) a uniform runtime bound on loops unrolled for 4. Every value is the
same expression (data * in_sf, then * inv), each channel's amax the maximum over the same rows
(order-free), its scale factor common.scale_factor of it.

in_block reaches the kernel as its index among the axis's choices (0 "none", 1 "1x32", 2 "1x128"),
so the input scale block is 2**(3 + 2 * in_block) channels wide. x's leading dim only binds block_m
(its extent) and in_block (its stride): a dim must stand alone in some extent or stride to be
bound; x is read at [0, row, col].
"""

import tilelang.language as T

from kernels_src.quant import common
from kernels_src.quant.per_channel_cast import STORAGE, TILING, Rows, check_static, per_channel_kernel
from tkaot._quant.kernels import PER_CHANNEL_CAST_GENERIC

DECL = PER_CHANNEL_CAST_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

MAX_BLOCK_M = 128


def build(in_dtype, in_sf, sf):
    quantized_in = in_dtype == "e4m3"
    in_block = "1x128" if quantized_in else "none"  # any block the input may have: checked like the specialised kernel
    check_static(MAX_BLOCK_M, in_dtype, in_block, in_sf, MAX_BLOCK_M, sf)
    num_threads, col_vecs = TILING  # the specialised kernel's
    slots = num_threads // col_vecs  # rows read at once

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    in_sf_stride = T.dynamic("in_sf_stride")
    block_m = T.dynamic("block_m")
    in_block_index = T.dynamic("in_block")
    bk_shift = 3 + 2 * in_block_index  # log2 of the input scale block's width: 5 (1 x 32) or 7 (1 x 128)
    rows = Rows(
        hidden=hidden,
        block_m=block_m,
        num_tokens=num_tokens,
        m_blocks=T.ceildiv(num_tokens, block_m),
        x=T.StridedTensor[(block_m, num_tokens, hidden), (in_block_index, hidden, 1), STORAGE[in_dtype][0]],
        x_lead=(0,),
        sf_in=common.SfLayout.from_input(in_sf if quantized_in else "fp32", hidden >> bk_shift if quantized_in else 1),
        in_sf_stride=in_sf_stride,
        in_sf_col=lambda col: col >> bk_shift,
        passes=MAX_BLOCK_M // slots,  # a uniform runtime bound on loops unrolled for 4
        generic=True,
    )
    return per_channel_kernel(rows, in_dtype, sf, TILING).with_attr("global_symbol", "per_channel_cast_generic")
