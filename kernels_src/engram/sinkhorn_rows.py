"""A Sinkhorn row in registers: x = row_scale * matrix[row] * col_scale over head_dim columns, and its sum of squares.

The row is spread over `threads` threads in 8-column vectors, vector i of the row on thread
i % threads, and squared and summed with T.reduce_sum over that layout: with TileKernels' thread
count for the head_dim (128, 64 or 32 threads, the most that divide it in 8-column vectors) the
norms come out the same bits.
"""

import tilelang.language as T

from kernels_src.tensors import fp32

VEC = 8


def threads_for(head_dim: int) -> int:
    """The most threads (128, 64 or 32) that split head_dim into whole 8-column vectors each."""
    for threads in (128, 64, 32):
        if head_dim % (threads * VEC) == 0:
            return threads
    raise ValueError(f"head_dim {head_dim} is not a multiple of {32 * VEC}")


def sinkhorn_types(head_dim):
    """The Sinkhorn row kernels' (step and finalize; the Ascend finalize too) runtime row count and argument types: the
    (num_rows, head_dim) fp32 matrix, the (num_rows,) fp32 values a row and the (head_dim,) fp32 values a column."""
    num_rows = T.dynamic("num_rows")
    return num_rows, fp32(num_rows, head_dim), fp32(num_rows), fp32(head_dim)


def row_layout(head_dim: int, threads: int):
    """Column -> (thread, register) of a row spread in 8-column vectors."""

    def place(col):
        return (col // VEC) % threads, (col // (threads * VEC)) * VEC + col % VEC

    return T.Fragment((head_dim,), forward_fn=place)


@T.macro
def load_row(matrix, row, scale, col_scale, x, squares, norm):
    """x = scale * matrix[row] * col_scale (fragments), norm[0] = sum of x^2."""
    for col in T.Parallel(matrix.shape[1]):
        x[col] = scale * matrix[row, col] * col_scale[col]
        squares[col] = x[col] * x[col]
    T.reduce_sum(squares, norm)
