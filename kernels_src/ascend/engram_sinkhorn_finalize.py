"""The final Sinkhorn matrix for Ascend: out[row] = x * alpha / (||x|| + eps), x = row_scale[row] * matrix[row] *
col_scale.

A block copies `rows` rows and the column scales into the Unified Buffer; a SIMT region forms x and its sum of
squares a row at a time (T.reduce_sum), then scales the row; the rows are copied back. head_dim is static, rows
are runtime. The sum of squares runs in another order than the CUDA kernel's, so the norm may differ from it in
the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import stage
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.ascend.tile import rows_per_block
from kernels_src.engram.sinkhorn_rows import sinkhorn_types
from tkaot._engram.kernels import SINKHORN_FINALIZE

DECL = SINKHORN_FINALIZE
THREADS = 128


def build(head_dim: int):
    rows = rows_per_block(head_dim * 4, 2)
    num_rows, matrices, per_row, per_col = sinkhorn_types(head_dim)

    @T.prim_func
    def engram_sinkhorn_finalize(matrix: matrices, row_scale: per_row, col_scale: per_col, out: matrices, eps: T.float32, alpha: T.float32):
        with T.Kernel(T.ceildiv(num_rows, rows)) as block:
            first = block * rows
            m_ub = stage(matrix[first : first + rows, :], (rows, head_dim), T.float32)
            cs_ub = stage(col_scale[0:head_dim], (head_dim,), T.float32)
            rs_ub = stage(row_scale[first : first + rows], (rows,), T.float32)
            with T.SimtVF(threads=THREADS):
                squares = T.alloc_fragment((rows, head_dim), T.float32)
                norm = T.alloc_fragment((rows,), T.float32)
                for i, c in T.Parallel(rows, head_dim):
                    m_ub[i, c] = rs_ub[i] * m_ub[i, c] * cs_ub[c]
                    squares[i, c] = m_ub[i, c] * m_ub[i, c]
                T.reduce_sum(squares, norm, dim=1)
                for i, c in T.Parallel(rows, head_dim):
                    m_ub[i, c] = m_ub[i, c] * (alpha / (T.sqrt(norm[i]) + eps))
            T.copy(m_ub, out[first : first + rows, :])

    return engram_sinkhorn_finalize
