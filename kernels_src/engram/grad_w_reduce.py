"""The gate's weight gradients from the backward's partials:
grad_weight_hidden += sum_p partial[p] * weight_embed, grad_weight_embed += sum_p partial[p] * weight_hidden.

The partials are summed in order p = 0, 1, ... (kernels_src/engram/column_sums.py), then each
gradient is accumulated in place. Partial count and element count (hc_mult * hidden) are runtime.
"""

import tilelang.language as T

from kernels_src.engram.column_sums import THREADS, column_sum
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._engram.kernels import GRAD_W_REDUCE

DECL = GRAD_W_REDUCE  # the declaration this module builds (tkaot/_engram/kernels.py)


def build(dtype: str):
    num_partials = T.dynamic("num_partials")
    numel = T.dynamic("numel")

    @T.prim_func
    def engram_grad_w_reduce(
        grad_w_partial: T.Tensor[(num_partials, numel), T.float32],
        weight_hidden: T.Tensor[(numel,), dtype],
        weight_embed: T.Tensor[(numel,), dtype],
        grad_weight_hidden: T.Tensor[(numel,), T.float32],
        grad_weight_embed: T.Tensor[(numel,), T.float32],
    ):
        with T.Kernel(T.ceildiv(numel, THREADS), threads=THREADS) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            col = block * THREADS + T.get_thread_binding()
            acc = T.alloc_local((1,), T.float32)
            wh = T.alloc_var(T.float32)
            we = T.alloc_var(T.float32)
            if col < numel:
                column_sum(grad_w_partial, col, acc)
                wh = weight_hidden[col]
                we = weight_embed[col]
                grad_weight_hidden[col] = grad_weight_hidden[col] + acc[0] * we
                grad_weight_embed[col] = grad_weight_embed[col] + acc[0] * wh

    return engram_grad_w_reduce
