"""The final Sinkhorn matrix: out[row] = x * alpha / (||x|| + eps), x = row_scale[row] * matrix[row] * col_scale.

One CTA a row (rows are runtime); head_dim is static (kernels_src/engram/sinkhorn_rows.py).
"""

import tilelang.language as T

from kernels_src.engram.sinkhorn_rows import load_row, row_layout, sinkhorn_types, threads_for
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import SINKHORN_FINALIZE

DECL = SINKHORN_FINALIZE  # the declaration this module builds (tkaot/_engram/kernels.py)


def build(head_dim: int):
    threads = threads_for(head_dim)
    num_rows, matrices, per_row, per_col = sinkhorn_types(head_dim)

    @T.prim_func
    def engram_sinkhorn_finalize(matrix: matrices, row_scale: per_row, col_scale: per_col, out: matrices, eps: T.float32, alpha: T.float32):
        with T.Kernel(num_rows, threads=threads) as row:
            kernel_entry()
            scale = T.alloc_var(T.float32)
            factor = T.alloc_var(T.float32)
            norm = T.alloc_fragment((1,), T.float32)
            x = T.alloc_fragment((head_dim,), T.float32)
            squares = T.alloc_fragment((head_dim,), T.float32)
            layout = row_layout(head_dim, threads)
            T.annotate_layout({x: layout, squares: layout})

            scale = row_scale[row]
            load_row(matrix, row, scale, col_scale, x, squares, norm)
            factor = alpha / (T.sqrt(norm[0]) + eps)
            for col in T.Parallel(head_dim):
                out[row, col] = x[col] * factor

    return engram_sinkhorn_finalize
