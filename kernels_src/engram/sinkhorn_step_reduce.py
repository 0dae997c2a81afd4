"""Sinkhorn column sums of squares from the step's per-CTA partials: col_sumsq[c] = sum_p partial[p, c], added in
order p = 0, 1, ... from 0.0. Partial count and head_dim are runtime values.

Tiling "t<threads>r<rows><s|d>": four columns a thread (kernels_src/engram/column_sums.py), `rows` partials copied by
cp.async at a time, in a loop, into one buffer ("s": copy a batch, wait, add it) or two ("d": the next batch in flight
while this one is added); the adds from shared memory run in unrolled runs (column_sums.ordered_sums). The step writes
PARTIALS_PER_SM partials an SM (396 on an H200), so each column's sum is one long chain: the loads must be many and in
flight together, and the code small (the copies unrolled ran to hundreds of KB of instructions and twice the time).
Shipped tiling and its measurements: tkaot/_engram/kernels.py (SINKHORN_STEP_REDUCE_TILINGS).
"""

import tilelang.language as T

from kernels_src.engram.column_sums import ALIGNED16_SOURCE, COLS, in_fours, ordered_sums, parse_tiling, staging
from kernels_src.engram.column_sums import PASS_CONFIGS as PASS_CONFIGS  # no barriers: the build reads it here
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import SINKHORN_STEP_REDUCE

DECL = SINKHORN_STEP_REDUCE  # the declaration this module builds (tkaot/_engram/kernels.py)


def build(dtype: str, tiling: str):
    threads, rows, double = parse_tiling("engram_sinkhorn_step_reduce", tiling)
    num_partials = T.dynamic("num_partials")
    head_dim = T.dynamic("head_dim")
    width = threads * COLS  # columns a CTA

    sums = ordered_sums(rows, double)  # acc = this thread's column sums, from 0.0 in row order

    @T.prim_func
    def engram_sinkhorn_step_reduce(
        col_sumsq_partial: T.Tensor[(num_partials, head_dim), dtype],
        col_sumsq: T.Tensor[(head_dim,), dtype],
    ):
        with T.Kernel(T.ceildiv(head_dim, width), threads=threads) as block:
            kernel_entry(ALIGNED16_SOURCE)  # kernels_src/pdl.py: before any memory access
            tid = T.get_thread_binding()
            col = (block * threads + tid) * COLS
            stash, other, acc = staging(rows, double, width)
            vectors = T.alloc_var(T.int32)  # 1: this thread's columns move as 16-byte copies
            vectors = T.if_then_else(in_fours(head_dim, col, col_sumsq_partial[0, 0], col_sumsq[0]), 1, 0)
            if col < head_dim:
                if vectors != 0:
                    sums(col_sumsq_partial, stash, other, tid, col, acc, True)
                    T.assume(col + COLS <= head_dim)
                    for j in T.vectorized(COLS):
                        col_sumsq[col + j] = acc[j]
                else:
                    sums(col_sumsq_partial, stash, other, tid, col, acc, False)
                    for j in T.unroll(COLS):
                        if col + j < head_dim:
                            col_sumsq[col + j] = acc[j]

    return engram_sinkhorn_step_reduce
