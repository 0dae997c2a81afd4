"""Sinkhorn column sums of squares for Ascend: col_sumsq[c] = sum_p partial[p, c], in order p = 0, 1, ...

One SIMT thread a column runs down the partials in row order, so every sum is the CUDA kernel's
(kernels_src/engram/sinkhorn_step_reduce.py). Partial count and head_dim are runtime values; the partials are
read from global memory directly, the sums go out through the Unified Buffer.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import sum_column, tensor
from kernels_src.ascend.common import unsupported as unsupported
from tkaot._engram.kernels import SINKHORN_STEP_REDUCE

DECL = SINKHORN_STEP_REDUCE
COLUMNS = 1024  # columns a block
THREADS = 256


def build(dtype: str, tiling: str):  # the tiling is the CUDA kernel's (its staging): one layout here
    num_partials, head_dim = T.dynamic("num_partials"), T.dynamic("head_dim")

    @T.prim_func
    def engram_sinkhorn_step_reduce(col_sumsq_partial: tensor(dtype, num_partials, head_dim), col_sumsq: tensor(dtype, head_dim)):
        with T.Kernel(T.ceildiv(head_dim, COLUMNS)) as block:
            first = block * COLUMNS
            sums_ub = T.alloc_shared((COLUMNS,), dtype)
            with T.SimtVF(threads=THREADS):
                acc = T.alloc_local((1,), T.float32)
                for j in T.Parallel(COLUMNS):
                    sum_column(acc, col_sumsq_partial, first, j)
                    sums_ub[j] = acc[0]
            T.copy(sums_ub, col_sumsq[first : first + COLUMNS])

    return engram_sinkhorn_step_reduce
