"""The gate's weight gradients from the backward's partials:
grad_weight_hidden += sum_p partial[p] * weight_embed, grad_weight_embed += sum_p partial[p] * weight_hidden.

The partials are summed in order p = 0, 1, ... (kernels_src/engram/column_sums.py), then each
gradient is accumulated in place. Partial count and element count (hc_mult * hidden) are runtime.
One thread a column; a thread issues the loads of `rows` partials before it adds them, so the kernel is a
round trip to memory a `rows` partials (4 rows at a time took 33 round trips for 132 partials, 1.46x
TileKernels' time). Tiling "t<threads>r<rows>": threads a CTA (columns a CTA) and rows in flight a thread.
"""

import re

import tilelang.language as T

from kernels_src.engram.column_sums import column_sum_batched
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import GRAD_W_REDUCE

DECL = GRAD_W_REDUCE  # the declaration this module builds (tkaot/_engram/kernels.py)


def parse_tiling(tiling: str) -> tuple[int, int]:
    """Tiling "t<threads>r<rows>": threads a CTA (a multiple of 32, at most 1024), partials a thread loads ahead of
    its adds (1-160: a register each)."""
    match = re.fullmatch(r"t(\d+)r(\d+)", tiling)
    if match is None:
        raise ValueError(f"engram_grad_w_reduce tiling {tiling!r} is not t<threads>r<rows>")
    threads, rows = int(match[1]), int(match[2])
    if not (threads % 32 == 0 and 32 <= threads <= 1024 and 1 <= rows <= 160):
        raise ValueError(f"engram_grad_w_reduce tiling {tiling!r}: threads a multiple of 32 in [32, 1024], rows 1-160")
    return threads, rows


def build(dtype: str, tiling: str):
    threads, rows = parse_tiling(tiling)
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
        with T.Kernel(T.ceildiv(numel, threads), threads=threads) as block:
            kernel_entry()  # kernels_src/pdl.py: before any memory access
            col = block * threads + T.get_thread_binding()
            acc = T.alloc_local((1,), T.float32)
            rows_ahead = T.alloc_local((rows,), T.float32)
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
