"""Sinkhorn column sums of squares from the step's per-CTA partials: col_sumsq[c] = sum_p partial[p, c], added in
order p = 0, 1, ... from 0.0. Partial count and head_dim are runtime values.

Tiling "t<threads>r<rows><s|d>": four columns a thread (kernels_src/engram/column_sums.py), `rows` partials copied by
cp.async at a time, in a loop, into one buffer ("s": copy a batch, wait, add it) or two ("d": the next batch in flight
while this one is added); the adds from shared memory run in unrolled runs of ADD_UNROLL. The step writes
PARTIALS_PER_SM partials an SM (396 on an H200), so each column's sum is one long chain: the loads must be many and in
flight together, and the code small (the copies unrolled ran to hundreds of KB of instructions and twice the time).
Shipped tiling and its measurements: tkaot/_engram/kernels.py (SINKHORN_STEP_REDUCE_TILINGS).
"""

import re

import tilelang.language as T

from kernels_src.engram.column_sums import ALIGNED16_SOURCE, COLS, SMEM_BYTES, aligned, stage_rows
from kernels_src.engram.column_sums import PASS_CONFIGS as PASS_CONFIGS  # no barriers: the build reads it here
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import SINKHORN_STEP_REDUCE

DECL = SINKHORN_STEP_REDUCE  # the declaration this module builds (tkaot/_engram/kernels.py)

ADD_UNROLL = 8  # staged rows added per unrolled run (their shared-memory loads issued together)


def parse_tiling(tiling: str) -> tuple[int, int, bool]:
    """(threads a CTA: a multiple of 8 in [8, 1024]; partials staged at a time: 1-512; two buffers)."""
    match = re.fullmatch(r"t(\d+)r(\d+)([sd])", tiling)
    if match is None:
        raise ValueError(f"engram_sinkhorn_step_reduce tiling {tiling!r} is not t<threads>r<rows><s|d>")
    threads, rows, double = int(match[1]), int(match[2]), match[3] == "d"
    if not (threads % 8 == 0 and 8 <= threads <= 1024 and 1 <= rows <= 512):
        raise ValueError(f"engram_sinkhorn_step_reduce tiling {tiling!r}: threads a multiple of 8 in [8, 1024], rows 1-512")
    if (1 + double) * rows * threads * COLS * 4 > SMEM_BYTES:
        raise ValueError(f"engram_sinkhorn_step_reduce tiling {tiling!r}: buffers x rows x threads x 16 bytes above {SMEM_BYTES}")
    return threads, rows, double


def build(dtype: str, tiling: str):
    threads, rows, double = parse_tiling(tiling)
    num_partials = T.dynamic("num_partials")
    head_dim = T.dynamic("head_dim")
    width = threads * COLS  # columns a CTA
    batches = T.ceildiv(num_partials, rows)

    def count(batch):
        """The rows of batch `batch` (the last one may be short)."""
        return T.min(rows, num_partials - batch * rows)

    @T.macro
    def copy(partial, stash, batch, tid, col, vectors):
        stage_rows(partial, stash, batch * rows, count(batch), tid, col, vectors)

    @T.macro
    def add(stash, batch, tid, acc):
        """acc += the staged rows of `batch`, in row order."""
        rows_here = count(batch)
        for run in T.serial(rows_here // ADD_UNROLL):
            for k in T.unroll(ADD_UNROLL):
                for j in T.vectorized(COLS):
                    acc[j] += stash[run * ADD_UNROLL + k, tid * COLS + j]
        for u in T.serial(rows_here // ADD_UNROLL * ADD_UNROLL, rows_here):
            for j in T.vectorized(COLS):
                acc[j] += stash[u, tid * COLS + j]

    @T.macro
    def next_batch(partial, now, then, i, tid, col, acc, vectors):
        """With two buffers: batch i + 1's copy into `then` issued, then batch i (in `now`) waited for and added."""
        if i < batches:
            if i + 1 < batches:
                copy(partial, then, i + 1, tid, col, vectors)
                T.ptx_wait_group(1)
            else:
                T.ptx_wait_group(0)
            add(now, i, tid, acc)

    @T.macro
    def sums(partial, stash, other, tid, col, acc, vectors):
        """acc = this thread's column sums, from 0.0 in row order."""
        T.clear(acc)
        if double:  # even batches in stash, odd ones in other
            copy(partial, stash, 0, tid, col, vectors)
            for pair in T.serial(T.ceildiv(batches, 2)):
                next_batch(partial, stash, other, pair * 2, tid, col, acc, vectors)
                next_batch(partial, other, stash, pair * 2 + 1, tid, col, acc, vectors)
        else:
            for i in T.serial(batches):
                copy(partial, stash, i, tid, col, vectors)
                T.ptx_wait_group(0)
                add(stash, i, tid, acc)

    @T.prim_func
    def engram_sinkhorn_step_reduce(
        col_sumsq_partial: T.Tensor[(num_partials, head_dim), dtype],
        col_sumsq: T.Tensor[(head_dim,), dtype],
    ):
        with T.Kernel(T.ceildiv(head_dim, width), threads=threads) as block:
            kernel_entry(ALIGNED16_SOURCE)  # kernels_src/pdl.py: before any memory access
            tid = T.get_thread_binding()
            col = (block * threads + tid) * COLS
            stash = T.alloc_shared((rows, width), T.float32)
            other = T.alloc_shared((rows if double else 1, width), T.float32)  # the second buffer ("d")
            acc = T.alloc_local((COLS,), T.float32)
            vectors = T.alloc_var(T.int32)  # 1: this thread's columns move as 16-byte copies
            vectors = T.if_then_else(
                T.And(T.And(head_dim % COLS == 0, col + COLS <= head_dim), aligned(col_sumsq_partial[0, 0], col_sumsq[0])), 1, 0
            )
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
