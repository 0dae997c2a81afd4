"""The generic per-block cast for Ascend: per_block_cast with the row width `hidden`, the scale block (block_m x
block_k, each 32 or 128) and the sf layout runtime values.

The Ascend per_block_cast's builder (kernels_src/ascend/per_block_cast.py) with those runtime values: a block takes
a tile of 128 rows (whole m blocks of either side) by SEGMENT columns (whole k blocks of either side; hidden is a
multiple of 128). Each row's maximum is taken over 32 columns, then one thread a scale block of the tile takes the
maximum over its rows and columns' maxima, forms the scale factor with the CUDA kernels' expressions and stores it
at its place in the runtime layout (out_sf read and written at [0, 0, i, j], as on CUDA). An amax is a maximum,
nothing is summed, so every scale factor and value is the specialised kernel's on the same inputs.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.per_block_cast import REQUIRES, per_block_cast_kernel
from tkaot._quant.kernels import PER_BLOCK_CAST_GENERIC

DECL = PER_BLOCK_CAST_GENERIC
REQUIRES = dict(REQUIRES)
SEGMENT = 128  # columns a block takes: the largest block side, which every row width is a multiple of


def unsupported(in_dtype, fmt, sf, mode) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(in_dtype, fmt, sf, mode):
    block_m, block_k, sf_layout = T.dynamic("block_m"), T.dynamic("block_k"), T.dynamic("sf_layout")
    return per_block_cast_kernel(T.dynamic("hidden"), SEGMENT, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode)
