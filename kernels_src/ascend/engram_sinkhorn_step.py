"""One Sinkhorn row step for Ascend: for each row, n = ||row_scale * matrix[row] * col_scale||, row_norm = n,
row_scale *= 1 / (n + eps), and each partial's column sums of squares of the normalised rows into
col_sumsq_partial[p].

Block p takes rows [p * ceil(R / P), (p + 1) * ceil(R / P)) of the R rows, P = num_partials (both runtime), as on
CUDA (kernels_src/engram/sinkhorn_step.py), one row at a time in order, so the partials are deterministic: the row
is copied into the Unified Buffer, a SIMT region forms x and its sum of squares (T.reduce_sum), writes the
row's norm and new scale to global memory and adds the normalised squares to the block's column sums, which go
out at the end. head_dim is static. The sum of squares runs in another order than the CUDA kernel's, so the
norms may differ from it in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, stage
from kernels_src.ascend.common import unsupported as unsupported
from tkaot._engram.kernels import SINKHORN_STEP

DECL = SINKHORN_STEP
THREADS = 128


def build(head_dim: int):
    num_rows, num_partials = T.dynamic("num_rows"), T.dynamic("num_partials")
    per_row = fp32(num_rows)

    @T.prim_func
    def engram_sinkhorn_step(
        matrix: fp32(num_rows, head_dim),
        row_scale: per_row,
        col_scale: fp32(head_dim),
        row_norm: per_row,
        col_sumsq_partial: fp32(num_partials, head_dim),
        eps: T.float32,
    ):
        with T.Kernel(num_partials) as part:
            x_ub = T.alloc_shared((1, head_dim), T.float32)
            cs_ub = stage(col_scale[0:head_dim], (head_dim,), T.float32)
            sums_ub = T.alloc_shared((head_dim,), T.float32)
            with T.SimtVF(threads=THREADS):
                for c in T.Parallel(head_dim):
                    sums_ub[c] = T.float32(0)
            per = T.ceildiv(num_rows, num_partials)
            for row in T.serial(T.min(per * part, num_rows), T.min(per * (part + 1), num_rows)):
                T.copy(matrix[row : row + 1, :], x_ub)
                with T.SimtVF(threads=THREADS):
                    squares = T.alloc_fragment((1, head_dim), T.float32)
                    norm = T.alloc_fragment((1,), T.float32)
                    scale = row_scale[row]
                    for i, c in T.Parallel(1, head_dim):
                        x_ub[i, c] = scale * x_ub[i, c] * cs_ub[c]
                        squares[i, c] = x_ub[i, c] * x_ub[i, c]
                    T.reduce_sum(squares, norm, dim=1)
                    for i, c in T.Parallel(1, head_dim):
                        n = T.sqrt(norm[0])
                        inverse = T.float32(1) / (n + eps)
                        x_ub[i, c] = x_ub[i, c] * inverse
                        sums_ub[c] = sums_ub[c] + x_ub[i, c] * x_ub[i, c]
                        if c == 0:
                            row_norm[row] = n
                            row_scale[row] = scale * inverse
            T.copy(sums_ub, col_sumsq_partial[part, :])

    return engram_sinkhorn_step
