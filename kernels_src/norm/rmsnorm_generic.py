"""The generic RMSNorm: rmsnorm with the row width `hidden` a runtime value.

It serves the calls whose specialised rmsnorm variant is not built, and writes the same bytes: one
kernel body (kernels_src/norm/rmsnorm.py) over a row split that the kernel computes from hidden as
row_split does for the specialised one (kernels_src/norm/row_sum.py, RuntimeSplit). Each thread
holds the same vectors of its row, sums their squares in the same two chains, and the row's sum is
reduced by the same shuffles and warp order; a thread's vectors past its count are zeros the sum skips.
A block holds 128 / row_threads rows, as the specialised kernel's does.
"""

import tilelang.language as T

from kernels_src.norm.rmsnorm import rmsnorm_kernel
from kernels_src.norm.row_sum import RuntimeSplit
from tkaot._quant.kernels import RMSNORM_GENERIC

DECL = RMSNORM_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)
MULTIPLE = 16  # rmsnorm's hidden axis: a multiple of 16


def build(dtype: str, with_weight: bool, with_residual: bool, with_rstd: bool):
    return rmsnorm_kernel(RuntimeSplit(T.dynamic("hidden"), dtype, MULTIPLE), dtype, with_weight, with_residual, with_rstd)
