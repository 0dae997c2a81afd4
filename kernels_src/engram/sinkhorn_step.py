"""One Sinkhorn row step: for each row, n = ||row_scale * matrix[row] * col_scale||, row_norm = n,
row_scale /= (n + eps) (as a multiplication by 1 / (n + eps)), and each CTA's column sums of squares of the normalised
rows into col_sumsq_partial[cta] (rows in order, so the partials are deterministic).

CTA p takes rows [p * ceil(R / P), (p + 1) * ceil(R / P)) of the R rows, P = num_partials (both
runtime); head_dim is static (kernels_src/engram/sinkhorn_rows.py).
"""

import tilelang.language as T

from kernels_src.engram.sinkhorn_rows import load_row, row_layout, sinkhorn_types, threads_for
from kernels_src.pdl import kernel_entry
from kernels_src.tensors import fp32
from tkaot._engram.kernels import SINKHORN_STEP

DECL = SINKHORN_STEP  # the declaration this module builds (tkaot/_engram/kernels.py)


def build(head_dim: int):
    threads = threads_for(head_dim)
    num_rows, matrices, per_row, per_col = sinkhorn_types(head_dim)
    num_partials = T.dynamic("num_partials")

    @T.prim_func
    def engram_sinkhorn_step(
        matrix: matrices,
        row_scale: per_row,
        col_scale: per_col,
        row_norm: per_row,
        col_sumsq_partial: fp32(num_partials, head_dim),
        eps: T.float32,
    ):
        with T.Kernel(num_partials, threads=threads) as part:
            kernel_entry()
            tid = T.get_thread_binding()
            scale = T.alloc_var(T.float32)
            inverse = T.alloc_var(T.float32)
            norm = T.alloc_fragment((1,), T.float32)
            col_scale_row = T.alloc_fragment((head_dim,), T.float32)
            col_sums = T.alloc_fragment((head_dim,), T.float32)
            x = T.alloc_fragment((head_dim,), T.float32)
            squares = T.alloc_fragment((head_dim,), T.float32)
            layout = row_layout(head_dim, threads)
            T.annotate_layout({col_scale_row: layout, col_sums: layout, x: layout, squares: layout})

            T.clear(col_sums)
            T.copy(col_scale, col_scale_row, disable_tma=True)
            per = T.ceildiv(num_rows, num_partials)
            for row in T.serial(T.min(per * part, num_rows), T.min(per * (part + 1), num_rows)):
                scale = row_scale[row]
                load_row(matrix, row, scale, col_scale_row, x, squares, norm)
                inverse = T.sqrt(norm[0])
                if tid == 0:
                    row_norm[row] = inverse
                inverse = 1.0 / (inverse + eps)
                if tid == 0:
                    row_scale[row] = scale * inverse
                for col in T.Parallel(head_dim):
                    x[col] *= inverse
                    col_sums[col] += x[col] * x[col]
            T.copy(col_sums, col_sumsq_partial[part, :], disable_tma=True)

    return engram_sinkhorn_step
