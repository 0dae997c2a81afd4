"""The gate's weight gradients from the backward's partials:
grad_weight_hidden += sum_p partial[p] * weight_embed, grad_weight_embed += sum_p partial[p] * weight_hidden.

Each column's partials are summed in order p = 0, 1, ..., then each gradient is accumulated in place. Partial
count and element count (hc_mult * hidden) are runtime. Tiling "t<threads>r<rows>s": four columns a thread, the
partials staged by cp.async into shared memory (`rows` of them at once, 16 bytes a row a thread), so the loads in
flight hold no register: 148 rows (a B200's SM count) take every partial of a one-CTA-an-SM backward in one round
trip. A 16-byte copy needs the partials, the gradients and the weights on 16-byte boundaries and numel a multiple
of 4; where one is not (tested in the kernel), or past numel's last whole four, a thread stages and sums its columns
one 4-byte copy at a time (kernels_src/engram/column_sums.py, shared with engram_sinkhorn_step_reduce).

Measured on the H200 at 132x4x7168 beside TileKernels (6.81 µs, 2026-12-02,
f014b86:bench/results/2026-12-02-H200-s15-tune_engram6.log): t56r148s 6.50 µs, against 7.63 for t224r132 (shipped
before: one thread a column, `rows` loads in registers), t64r148s 6.58, t32r148s 7.87.
"""

import re

import tilelang.language as T

from kernels_src.engram.column_sums import ALIGNED16_SOURCE, COLS, SMEM_BYTES, aligned, stage
from kernels_src.engram.column_sums import PASS_CONFIGS as PASS_CONFIGS  # no barriers: the build reads it here
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import GRAD_W_REDUCE

DECL = GRAD_W_REDUCE  # the declaration this module builds (tkaot/_engram/kernels.py)


def parse_tiling(tiling: str) -> tuple[int, int]:
    """Tiling "t<threads>r<rows>s": threads a CTA (a multiple of 8 in [32, 1024]; COLS columns each, so t56 covers
    224 columns a CTA) and partials staged at a time (1-160, within the shared memory)."""
    match = re.fullmatch(r"t(\d+)r(\d+)s", tiling)
    if match is None:
        raise ValueError(f"engram_grad_w_reduce tiling {tiling!r} is not t<threads>r<rows>s")
    threads, rows = int(match[1]), int(match[2])
    if not (threads % 8 == 0 and 32 <= threads <= 1024 and 1 <= rows <= 160):
        raise ValueError(f"engram_grad_w_reduce tiling {tiling!r}: threads a multiple of 8 in [32, 1024], rows 1-160")
    if rows * threads * COLS * 4 > SMEM_BYTES:
        raise ValueError(f"engram_grad_w_reduce tiling {tiling!r}: rows x threads x 16 bytes above {SMEM_BYTES}")
    return threads, rows


def build(dtype: str, tiling: str):
    threads, rows = parse_tiling(tiling)
    num_partials = T.dynamic("num_partials")
    numel = T.dynamic("numel")
    width = threads * COLS  # columns a CTA

    @T.prim_func
    def engram_grad_w_reduce(
        grad_w_partial: T.Tensor[(num_partials, numel), T.float32],
        weight_hidden: T.Tensor[(numel,), dtype],
        weight_embed: T.Tensor[(numel,), dtype],
        grad_weight_hidden: T.Tensor[(numel,), T.float32],
        grad_weight_embed: T.Tensor[(numel,), T.float32],
    ):
        with T.Kernel(T.ceildiv(numel, width), threads=threads) as block:
            kernel_entry(ALIGNED16_SOURCE)  # kernels_src/pdl.py: before any memory access
            tid = T.get_thread_binding()
            col = (block * threads + tid) * COLS
            stash = T.alloc_shared((rows, width), T.float32)
            acc = T.alloc_local((COLS,), T.float32)
            wh = T.alloc_local((COLS,), T.float32)
            we = T.alloc_local((COLS,), T.float32)
            gh = T.alloc_local((COLS,), T.float32)
            ge = T.alloc_local((COLS,), T.float32)
            vectors = T.alloc_var(T.int32)  # 1: this thread's columns move as 16-byte copies
            vectors = T.if_then_else(
                T.And(T.And(numel % COLS == 0, col + COLS <= numel),
                      aligned(grad_w_partial[0, 0], weight_hidden[0], weight_embed[0], grad_weight_hidden[0], grad_weight_embed[0])),
                1, 0,
            )  # fmt: skip
            if col < numel:
                T.clear(acc)
                for i in T.serial(T.ceildiv(num_partials, rows)):
                    if vectors != 0:
                        stage(grad_w_partial, stash, i * rows, tid, col, rows, True)
                    else:
                        stage(grad_w_partial, stash, i * rows, tid, col, rows, False)
                    if i == 0:  # the weights and the gradients' old values: in flight with the first partials
                        if vectors != 0:
                            T.assume(col + COLS <= numel)
                            for j in T.vectorized(COLS):
                                wh[j] = weight_hidden[col + j]
                            for j in T.vectorized(COLS):
                                we[j] = weight_embed[col + j]
                            for j in T.vectorized(COLS):
                                gh[j] = grad_weight_hidden[col + j]
                            for j in T.vectorized(COLS):
                                ge[j] = grad_weight_embed[col + j]
                        else:
                            for j in T.unroll(COLS):
                                if col + j < numel:
                                    wh[j] = weight_hidden[col + j]
                                    we[j] = weight_embed[col + j]
                                    gh[j] = grad_weight_hidden[col + j]
                                    ge[j] = grad_weight_embed[col + j]
                    T.ptx_wait_group(0)
                    for u in T.serial(T.min(rows, num_partials - i * rows)):
                        for j in T.vectorized(COLS):
                            acc[j] += stash[u, tid * COLS + j]
                if vectors != 0:
                    T.assume(col + COLS <= numel)
                    for j in T.vectorized(COLS):
                        grad_weight_hidden[col + j] = gh[j] + acc[j] * we[j]
                    for j in T.vectorized(COLS):
                        grad_weight_embed[col + j] = ge[j] + acc[j] * wh[j]
                else:
                    for j in T.unroll(COLS):
                        if col + j < numel:
                            grad_weight_hidden[col + j] = gh[j] + acc[j] * we[j]
                            grad_weight_embed[col + j] = ge[j] + acc[j] * wh[j]

    return engram_grad_w_reduce
