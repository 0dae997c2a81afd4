"""Sinkhorn column sums of squares from the step's per-CTA partials: col_sumsq[c] = sum_p partial[p, c], in order p =
0, 1, ... (kernels_src/engram/column_sums.py). Partial count and head_dim are runtime values."""

import tilelang.language as T

from kernels_src.engram.column_sums import THREADS, column_sum
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import SINKHORN_STEP_REDUCE

DECL = SINKHORN_STEP_REDUCE  # the declaration this module builds (tkaot/_engram/kernels.py)


def build(dtype: str):
    num_partials = T.dynamic("num_partials")
    head_dim = T.dynamic("head_dim")

    @T.prim_func
    def engram_sinkhorn_step_reduce(
        col_sumsq_partial: T.Tensor[(num_partials, head_dim), dtype],
        col_sumsq: T.Tensor[(head_dim,), dtype],
    ):
        with T.Kernel(T.ceildiv(head_dim, THREADS), threads=THREADS) as block:
            kernel_entry()
            col = block * THREADS + T.get_thread_binding()
            acc = T.alloc_local((1,), T.float32)
            if col < head_dim:
                column_sum(col_sumsq_partial, col, acc)
                col_sumsq[col] = acc[0]

    return engram_sinkhorn_step_reduce
