"""The gate's weight gradients from the backward's partials:
grad_weight_hidden += sum_p partial[p] * weight_embed, grad_weight_embed += sum_p partial[p] * weight_hidden.

The partials are summed in order p = 0, 1, ... (kernels_src/engram/column_sums.py), then each
gradient is accumulated in place. Partial count and element count (hc_mult * hidden) are runtime.
A thread issues the loads of ROWS_AHEAD rows before it adds them: a round trip to memory for 66 rows,
where 4 rows at a time took 33 round trips for 132 partials (and 1.46x TileKernels' time).
"""

import tilelang.language as T

from kernels_src.engram.column_sums import THREADS, column_sum_batched
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._engram.kernels import GRAD_W_REDUCE

DECL = GRAD_W_REDUCE  # the declaration this module builds (tkaot/_engram/kernels.py)

ROWS_AHEAD = 66  # 132 partials (an H200's SMs) in two round trips


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
            rows_ahead = T.alloc_local((ROWS_AHEAD,), T.float32)
            wh = T.alloc_var(T.float32)
            we = T.alloc_var(T.float32)
            gh = T.alloc_var(T.float32)
            ge = T.alloc_var(T.float32)
            if col < numel:
                # the weights and the gradients' old values first: in flight with the partials
                wh = weight_hidden[col]
                we = weight_embed[col]
                gh = grad_weight_hidden[col]
                ge = grad_weight_embed[col]
                column_sum_batched(grad_w_partial, col, acc, rows_ahead)
                grad_weight_hidden[col] = gh + acc[0] * we
                grad_weight_embed[col] = ge + acc[0] * wh

    return engram_grad_w_reduce
