"""RMSNorm forward for Ascend: out = round(x') * rstd * (weight * out_scale), x' = round(x + residual).

A block takes `rows` tokens of one batch into the Unified Buffer (x, and the residual when given), adds the
residual in x's dtype, sums the squares in fp32 a chunk of columns at a time (a SIMT reduction per chunk, the
chunks' sums added in order), forms rstd = rsqrt(mean + eps) and writes the scaled rows, x' and rstd back.
Tokens and batch are dynamic; eps and out_scale are runtime scalars. Same declaration, arguments and rounding
order as the CUDA kernel (kernels_src/norm/rmsnorm.py); the fp32 sum runs in another order, so rstd may differ
from it in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.tile import chunk, rows_per_block
from tkaot._quant.kernels import RMSNORM

DECL = RMSNORM
REQUIRES: dict[str, int] = {}
THREADS = 128


def unsupported(hidden, dtype, with_weight, with_residual, with_rstd) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(hidden: int, dtype: str, with_weight: bool, with_residual: bool, with_rstd: bool):
    elem = 2 if dtype == "bfloat16" else 4
    rows = rows_per_block(hidden * elem, 3 if with_residual else 2)
    cols = chunk(hidden)
    num_chunks = hidden // cols

    num_tokens, batch = T.dynamic("num_tokens"), T.dynamic("batch")
    x_stride, x_bstride = T.dynamic("x_stride"), T.dynamic("x_batch_stride")
    out_stride, out_bstride = T.dynamic("out_stride"), T.dynamic("out_batch_stride")
    res_stride, res_bstride = T.dynamic("residual_stride"), T.dynamic("residual_batch_stride")
    rout_stride, rout_bstride = T.dynamic("residual_out_stride"), T.dynamic("residual_out_batch_stride")
    shape = (batch, num_tokens, hidden)

    @T.prim_func
    def rmsnorm(
        x: T.StridedTensor[shape, (x_bstride, x_stride, 1), dtype],
        weight: T.Tensor[(hidden,), dtype],
        residual: T.StridedTensor[shape, (res_bstride, res_stride, 1), dtype],
        out: T.StridedTensor[shape, (out_bstride, out_stride, 1), dtype],
        residual_out: T.StridedTensor[shape, (rout_bstride, rout_stride, 1), dtype],
        rstd: T.Tensor[(batch, num_tokens), T.float32],
        eps: T.float32,
        out_scale: T.float32,
    ):
        tiles = T.ceildiv(num_tokens, rows)
        with T.Kernel(batch * tiles) as block:
            b = block // tiles
            row = block % tiles * rows
            x_ub = T.alloc_shared((rows, hidden), dtype)
            res_ub = T.alloc_shared((rows, hidden), dtype)
            out_ub = T.alloc_shared((rows, hidden), dtype)
            w_ub = T.alloc_shared((hidden,), dtype)
            rstd_ub = T.alloc_shared((rows,), T.float32)
            T.copy(x[b, row : row + rows, :], x_ub)
            if with_residual:
                T.copy(residual[b, row : row + rows, :], res_ub)
            if with_weight:
                T.copy(weight[0:hidden], w_ub)
            with T.SimtVF(threads=THREADS):
                squares = T.alloc_fragment((rows, cols), T.float32)
                part = T.alloc_fragment((rows,), T.float32)
                inv_rms = T.alloc_fragment((rows,), T.float32)
                T.clear(inv_rms)
                for k in T.serial(num_chunks):
                    for i, j in T.Parallel(rows, cols):
                        if with_residual:
                            x_ub[i, k * cols + j] = x_ub[i, k * cols + j] + res_ub[i, k * cols + j]
                        squares[i, j] = T.cast(x_ub[i, k * cols + j], "float32") * T.cast(x_ub[i, k * cols + j], "float32")
                    T.reduce_sum(squares, part, dim=1)
                    for i in T.Parallel(rows):
                        inv_rms[i] += part[i]
                for i in T.Parallel(rows):
                    inv_rms[i] = T.rsqrt(inv_rms[i] / hidden + eps)
                T.copy(inv_rms, rstd_ub)
                for k in T.serial(num_chunks):
                    for i, j in T.Parallel(rows, cols):
                        v = T.cast(x_ub[i, k * cols + j], "float32") * inv_rms[i]
                        if with_weight:
                            out_ub[i, k * cols + j] = T.cast(v * (T.cast(w_ub[k * cols + j], "float32") * out_scale), dtype)
                        else:
                            out_ub[i, k * cols + j] = T.cast(v * out_scale, dtype)
            T.copy(out_ub, out[b, row : row + rows, :])
            if with_residual:
                T.copy(x_ub, residual_out[b, row : row + rows, :])
            if with_rstd:
                T.copy(rstd_ub, rstd[b, row : row + rows])

    return rmsnorm
