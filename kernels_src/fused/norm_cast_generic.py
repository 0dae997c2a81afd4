"""The generic RMSNorm + per-token E4M3 cast: norm_cast with the row width `hidden` a runtime value.

It serves the calls whose specialised norm_cast variant is not built, and writes the same bytes: one
kernel body (kernels_src/fused/norm_cast.py) over a row split that the kernel computes from hidden as
row_split does for the specialised one (kernels_src/norm/row_sum.py, RuntimeSplit). Each thread holds
the same vectors of its row, sums their squares in the same two chains, reduces the row's sum by the
same shuffles and warp order, and rounds, scales and casts each vector by the same instructions; a
thread's vectors past its count are zeros the sum skips and nothing writes. A block holds
128 / row_threads rows and the tiling's blocks an SM, as the specialised kernel's does. The default tiling
branches on the width: rows over all 128 threads (hidden > 2048) take a body whose split has its shift a
constant, the narrower rows the runtime split's (RuntimeSplit.width_classes).
"""

import tilelang.language as T

from kernels_src.fused.norm_cast import TILINGS, norm_cast_kernel
from kernels_src.norm.row_sum import RuntimeSplit
from tkaot._quant.kernels import NORM_CAST_GENERIC

DECL = NORM_CAST_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)
MULTIPLE = 32  # norm_cast's hidden axis: a multiple of 32 (whole groups)


def build(dtype: str, sf: str, tiling: str):
    # The default tiling (calls without a residual) has a body for each width class: the common widths' shift a
    # constant (H200, 8192x7168 e4m3/32, one runtime-split body: 68.3 µs, 1.41x the specialised kernel). The residual
    # tiling keeps the one body (1.12x): its build stays one body's
    by_width = not TILINGS[tiling].residual
    return norm_cast_kernel(RuntimeSplit(T.dynamic("hidden"), dtype, MULTIPLE), dtype, sf, tiling, by_width=by_width)
