"""mHC norm-weight merge, backward, for Ascend, accumulating as the CUDA kernel does
(kernels_src/mhc/normw_merge_bwd.py): fn_grad[i, k] += out_fn_grad[i, k] * normw[k];
normw_grad[k] += sum over i of out_fn_grad[i, k] * fn[i, k], the rows in order from zero, added once at the end.

One SIMT thread a column walks the rows in order (so every sum is the CUDA kernel's), reading and updating the
rows in global memory directly (the row count has no bound a tile could hold); a block's weights and weight
gradients go through the Unified Buffer. Both sizes are runtime values.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import stage
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.mhc.common import normw_merge_bwd_kernel
from tkaot._mhc.kernels import NORMW_MERGE_BWD

DECL = NORMW_MERGE_BWD
COLUMNS = 1024  # columns a block
THREADS = 256


def build(dtype: str):
    @T.macro
    def body(m, n, fn, normw, out_fn_grad, fn_grad, normw_grad):
        with T.Kernel(T.ceildiv(n, COLUMNS)) as block:
            first = block * COLUMNS
            w_ub = stage(normw[first : first + COLUMNS], (COLUMNS,), T.float32)
            wg_ub = stage(normw_grad[first : first + COLUMNS], (COLUMNS,), T.float32)
            with T.SimtVF(threads=THREADS):
                total = T.alloc_local((1,), T.float32)
                for j in T.Parallel(COLUMNS):
                    k = first + j
                    total[0] = T.float32(0)
                    if k < n:
                        for i in T.serial(m):
                            fn_grad[i, k] = fn_grad[i, k] + out_fn_grad[i, k] * w_ub[j]
                            total[0] = total[0] + out_fn_grad[i, k] * fn[i, k]
                    wg_ub[j] = wg_ub[j] + total[0]
            T.copy(wg_ub, normw_grad[first : first + COLUMNS])

    return normw_merge_bwd_kernel(body)
