"""Column sums over a stack of per-CTA partials, row 0 first: the fixed order of tkaot.engram's reductions
(kernels_src/engram/grad_w_reduce.py stages its rows but adds them in the same order).

One thread a column, so the sum of every column runs through the rows in order and the result
does not depend on how the columns are spread over threads. Rows and columns are runtime values.
"""

import tilelang.language as T

THREADS = 128
UNROLL = 4  # rows whose loads are issued together; the adds still run in row order


@T.macro
def column_sum(partial, col, acc):
    """acc[0] = partial[0, col] + partial[1, col] + ..., added in row order."""
    acc[0] = 0.0
    for i in T.serial(partial.shape[0] // UNROLL):
        for u in T.unroll(UNROLL):
            acc[0] += partial[i * UNROLL + u, col]
    for i in T.serial(partial.shape[0] // UNROLL * UNROLL, partial.shape[0]):
        acc[0] += partial[i, col]
