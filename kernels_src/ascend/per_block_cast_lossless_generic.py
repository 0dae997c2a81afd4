"""The generic lossless FP4 -> FP8 re-quantisation for Ascend: per_block_cast_lossless with the row width `hidden`,
the input and output blocks and the output sf layout runtime values.

The Ascend per_block_cast_lossless's builder (kernels_src/ascend/per_block_cast_lossless.py) with those runtime
values: a block takes a tile of 128 rows by SEGMENT columns (hidden is a multiple of 128), which holds whole input
and output blocks of every size the declaration has; each block side is a runtime log2, picked from a constant
word by the block's index among the axis's choices (as on CUDA), and the tile's output blocks are dealt one a
thread. An output block's exponent is the largest input exponent inside it (a maximum, order-free) and every
element is converted by the specialised kernel's expression with the same shift, so both write the same bytes.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.per_block_cast_lossless import REQUIRES, per_block_cast_lossless_kernel
from tkaot._quant.kernels import PER_BLOCK_CAST_LOSSLESS_GENERIC

DECL = PER_BLOCK_CAST_LOSSLESS_GENERIC
REQUIRES = dict(REQUIRES)
SEGMENT = 128  # columns (codes) a block takes: the widest block, which every row width is a multiple of


def unsupported(in_sf, sf) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(in_sf, sf):
    in_block, out_block, sf_layout = T.dynamic("in_block"), T.dynamic("out_block"), T.dynamic("sf_layout")
    return per_block_cast_lossless_kernel(T.dynamic("hidden"), SEGMENT, in_block, in_sf, out_block, sf, sf_layout)
