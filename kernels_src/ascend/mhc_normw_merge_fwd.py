"""mHC norm-weight merge, forward, for Ascend: out_fn[i, k] = fn[i, k] * normw[k].

A block takes one row's run of `SPAN` columns and the matching weights into the Unified Buffer, multiplies them in
a SIMT region and copies the products back (the last run's copies stop at n). Both sizes are runtime values.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import split_block, stage
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.mhc.common import normw_merge_fwd_kernel
from tkaot._mhc.kernels import NORMW_MERGE_FWD

DECL = NORMW_MERGE_FWD
SPAN = 4096  # columns a block
THREADS = 256


def build(dtype: str):
    @T.macro
    def body(m, n, fn, normw, out_fn):
        runs = T.ceildiv(n, SPAN)
        with T.Kernel(m * runs) as block:
            row, first = split_block(block, runs, SPAN)
            fn_ub = stage(fn[row : row + 1, first : first + SPAN], (1, SPAN), T.float32)
            w_ub = stage(normw[first : first + SPAN], (SPAN,), T.float32)
            with T.SimtVF(threads=THREADS):
                for i, k in T.Parallel(1, SPAN):
                    fn_ub[i, k] = fn_ub[i, k] * w_ub[k]
            T.copy(fn_ub, out_fn[row : row + 1, first : first + SPAN])

    return normw_merge_fwd_kernel(body)
