"""The Engram gate's weight gradients for Ascend: grad_weight_hidden += sum_p partial[p] * weight_embed and
grad_weight_embed += sum_p partial[p] * weight_hidden, the partials summed in order p = 0, 1, ...

One SIMT thread a column, as on CUDA (kernels_src/engram/grad_w_reduce.py): it runs down the partials in row
order, so every sum is the CUDA kernel's, then accumulates both gradients in place: the weights and gradients of a
block's columns go through the Unified Buffer, the partials are read from global memory directly (their count,
a runtime value like the element count, has no bound a tile could hold).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, stage, sum_column, tensor
from kernels_src.ascend.common import unsupported as unsupported
from tkaot._engram.kernels import GRAD_W_REDUCE

DECL = GRAD_W_REDUCE
COLUMNS = 1024  # columns a block
THREADS = 256


def build(dtype: str, tiling: str):  # the tiling is the CUDA kernel's (its grid): one layout here
    num_partials, numel = T.dynamic("num_partials"), T.dynamic("numel")
    weights, grads = tensor(dtype, numel), fp32(numel)

    @T.prim_func
    def engram_grad_w_reduce(
        grad_w_partial: fp32(num_partials, numel),
        weight_hidden: weights,
        weight_embed: weights,
        grad_weight_hidden: grads,
        grad_weight_embed: grads,
    ):
        with T.Kernel(T.ceildiv(numel, COLUMNS)) as block:
            first = block * COLUMNS
            wh_ub = stage(weight_hidden[first : first + COLUMNS], (COLUMNS,), dtype)
            we_ub = stage(weight_embed[first : first + COLUMNS], (COLUMNS,), dtype)
            gh_ub = stage(grad_weight_hidden[first : first + COLUMNS], (COLUMNS,), T.float32)
            ge_ub = stage(grad_weight_embed[first : first + COLUMNS], (COLUMNS,), T.float32)
            with T.SimtVF(threads=THREADS):
                acc = T.alloc_local((1,), T.float32)
                for j in T.Parallel(COLUMNS):
                    sum_column(acc, grad_w_partial, first, j)
                    gh_ub[j] = gh_ub[j] + acc[0] * T.Cast("float32", we_ub[j])
                    ge_ub[j] = ge_ub[j] + acc[0] * T.Cast("float32", wh_ub[j])
            T.copy(gh_ub, grad_weight_hidden[first : first + COLUMNS])
            T.copy(ge_ub, grad_weight_embed[first : first + COLUMNS])

    return engram_grad_w_reduce
