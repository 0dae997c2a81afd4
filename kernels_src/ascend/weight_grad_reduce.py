"""RMSNorm backward, pass 2, for Ascend: weight_grad = sum of the partial rows (+ weight_grad's own values when
`accumulate`), rounded once to weight_grad's dtype.

One SIMT thread a column, in the CUDA kernel's order (kernels_src/norm/weight_grad_reduce.py): chain k adds rows
k, k + CHAINS, k + 2 * CHAINS, ... in order, the chains are added in order 0 .. CHAINS - 1, then weight_grad's own
fp32 value, so the same partials give the same bits. The partials are read from global memory directly (their
count is a runtime value, like hidden); weight_grad goes through the Unified Buffer.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import unsupported as unsupported
from tkaot._quant.kernels import WEIGHT_GRAD_REDUCE

DECL = WEIGHT_GRAD_REDUCE
COLUMNS = 1024  # columns a block
THREADS = 256
CHAINS = 8  # the CUDA kernel's row groups


def build(dtype: str):
    num_partials, hidden = T.dynamic("num_partials"), T.dynamic("hidden")

    @T.prim_func
    def weight_grad_reduce(
        partials: T.Tensor[(num_partials, hidden), T.float32],
        weight_grad: T.Tensor[(hidden,), dtype],
        accumulate: T.int32,
    ):
        with T.Kernel(T.ceildiv(hidden, COLUMNS)) as block:
            first = block * COLUMNS
            wg_ub = T.alloc_shared((COLUMNS,), dtype)
            if accumulate != 0:
                T.copy(weight_grad[first : first + COLUMNS], wg_ub)
            with T.SimtVF(threads=THREADS):
                chain = T.alloc_local((CHAINS,), T.float32)
                total = T.alloc_local((1,), T.float32)
                for j in T.Parallel(COLUMNS):
                    for k in T.unroll(CHAINS):
                        chain[k] = T.float32(0)
                        if first + j < hidden:
                            for p in T.serial(T.ceildiv(num_partials - k, CHAINS)):
                                chain[k] = chain[k] + partials[p * CHAINS + k, first + j]
                    total[0] = chain[0]
                    for k in T.unroll(1, CHAINS):
                        total[0] = total[0] + chain[k]
                    if accumulate != 0:
                        total[0] = total[0] + T.Cast("float32", wg_ub[j])
                    wg_ub[j] = T.Cast(dtype, total[0])
            T.copy(wg_ub, weight_grad[first : first + COLUMNS])

    return weight_grad_reduce
