"""The generic per-channel cast for Ascend: per_channel_cast with the row width `hidden`, the token block `block_m`
(32 or 128) and, for E4M3 inputs, their scale block `in_block` (1 x 32 or 1 x 128) runtime values.

The Ascend per_channel_cast's builder (kernels_src/ascend/per_channel_cast.py) with those runtime values: a block
takes one m block (up to 128 rows, copies clipped to the block) by SEGMENT columns (hidden is a multiple of 128).
in_block reaches the kernel as its index among the axis's choices (0 "none", 1 "1x32", 2 "1x128"), so the input
scale block is 2**(3 + 2 * in_block) channels wide; x's leading dim only binds block_m and in_block (as on CUDA).
Every value is the specialised kernel's expression (data * in_sf, then * inv), each channel's amax the maximum
over the same rows, so both write the same bytes.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.per_channel_cast import REQUIRES, per_channel_cast_kernel
from tkaot._quant.kernels import PER_CHANNEL_CAST_GENERIC

DECL = PER_CHANNEL_CAST_GENERIC
REQUIRES = dict(REQUIRES)
SEGMENT = 128  # columns a block takes: every row width is a multiple of it


def unsupported(in_dtype, in_sf, sf) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(in_dtype, in_sf, sf):
    return per_channel_cast_kernel(T.dynamic("hidden"), SEGMENT, in_dtype, T.dynamic("in_block"), in_sf, T.dynamic("block_m"), sf)
