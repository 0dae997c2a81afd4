"""Column sums over a stack of per-CTA partials, row 0 first: the fixed order both reductions of tkaot.engram use.

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


@T.macro
def column_sum_batched(partial, col, acc, rows_ahead):
    """column_sum with the loads of `rows_ahead` rows (a local buffer of that length) issued before their adds: a
    few round trips to memory for the whole column, where column_sum waits on one every UNROLL rows."""
    acc[0] = 0.0
    for i in T.serial(T.ceildiv(partial.shape[0], rows_ahead.shape[0])):
        for u in T.unroll(rows_ahead.shape[0]):
            if i * rows_ahead.shape[0] + u < partial.shape[0]:
                rows_ahead[u] = partial[i * rows_ahead.shape[0] + u, col]
        for u in T.unroll(rows_ahead.shape[0]):
            if i * rows_ahead.shape[0] + u < partial.shape[0]:
                acc[0] += rows_ahead[u]
