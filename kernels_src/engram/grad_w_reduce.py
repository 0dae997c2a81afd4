"""The gate's weight gradients from the backward's partials:
grad_weight_hidden += sum_p partial[p] * weight_embed, grad_weight_embed += sum_p partial[p] * weight_hidden.

Each column's partials are summed in order p = 0, 1, ..., then each gradient is accumulated in place. Partial
count and element count (hc_mult * hidden) are runtime. Tiling "t<threads>r<rows><s|d>": four columns a thread, the
partials copied by cp.async into shared memory `rows` at a time, into one buffer or two in turn
(kernels_src/engram/column_sums.py, shared with engram_sinkhorn_step_reduce); a thread's weights and old gradients are
loaded first, in flight with its first partials. Shipped tiling and its measurements: tkaot/_engram/kernels.py
(GRAD_W_REDUCE_TILINGS).
"""

import tilelang.language as T

from kernels_src.engram.column_sums import ALIGNED16_SOURCE, COLS, in_fours, ordered_sums, parse_tiling, staging
from kernels_src.engram.column_sums import PASS_CONFIGS as PASS_CONFIGS  # no barriers: the build reads it here
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import GRAD_W_REDUCE

DECL = GRAD_W_REDUCE  # the declaration this module builds (tkaot/_engram/kernels.py)


def build(dtype: str, tiling: str):
    threads, rows, double = parse_tiling("engram_grad_w_reduce", tiling)
    num_partials = T.dynamic("num_partials")
    numel = T.dynamic("numel")
    width = threads * COLS  # columns a CTA
    sums = ordered_sums(rows, double)

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
            stash, other, acc = staging(rows, double, width)
            wh = T.alloc_local((COLS,), T.float32)
            we = T.alloc_local((COLS,), T.float32)
            gh = T.alloc_local((COLS,), T.float32)
            ge = T.alloc_local((COLS,), T.float32)
            vectors = T.alloc_var(T.int32)  # 1: this thread's columns move as 16-byte copies
            vectors = T.if_then_else(
                in_fours(numel, col, grad_w_partial[0, 0], weight_hidden[0], weight_embed[0], grad_weight_hidden[0], grad_weight_embed[0]),
                1, 0,
            )  # fmt: skip
            if col < numel:
                if vectors != 0:  # the weights and the gradients' old values first: in flight with the partials
                    T.assume(col + COLS <= numel)
                    for j in T.vectorized(COLS):
                        wh[j] = weight_hidden[col + j]
                    for j in T.vectorized(COLS):
                        we[j] = weight_embed[col + j]
                    for j in T.vectorized(COLS):
                        gh[j] = grad_weight_hidden[col + j]
                    for j in T.vectorized(COLS):
                        ge[j] = grad_weight_embed[col + j]
                    sums(grad_w_partial, stash, other, tid, col, acc, True)
                    for j in T.vectorized(COLS):
                        grad_weight_hidden[col + j] = gh[j] + acc[j] * we[j]
                    for j in T.vectorized(COLS):
                        grad_weight_embed[col + j] = ge[j] + acc[j] * wh[j]
                else:
                    for j in T.unroll(COLS):
                        if col + j < numel:
                            wh[j] = weight_hidden[col + j]
                            we[j] = weight_embed[col + j]
                            gh[j] = grad_weight_hidden[col + j]
                            ge[j] = grad_weight_embed[col + j]
                    sums(grad_w_partial, stash, other, tid, col, acc, False)
                    for j in T.unroll(COLS):
                        if col + j < numel:
                            grad_weight_hidden[col + j] = gh[j] + acc[j] * we[j]
                            grad_weight_embed[col + j] = ge[j] + acc[j] * wh[j]

    return engram_grad_w_reduce
