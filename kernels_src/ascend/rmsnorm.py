"""RMSNorm forward for Ascend: out = round(x') * rstd * (weight * out_scale), x' = round(x + residual).

A block takes `rows` tokens of one batch into the Unified Buffer (x, and the residual when given), adds the
residual in x's dtype, sums the squares in fp32 a chunk of columns at a time (a SIMT reduction per chunk, the
chunks' sums added in order), forms rstd = rsqrt(mean + eps) and writes the scaled rows, x' and rstd back.
Tokens and batch are dynamic; eps and out_scale are runtime scalars. Same declaration, arguments and rounding
order as the CUDA kernel (kernels_src/norm/rmsnorm.py); the fp32 sum runs in another order, so rstd may differ
from it in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, split_block, tensor
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.ascend.rms import batch_rows, chunks, inverse_rms
from kernels_src.ascend.tile import chunk, rows_per_block
from tkaot._quant.kernels import RMSNORM

DECL = RMSNORM
THREADS = 128


def build(hidden: int, dtype: str, with_weight: bool, with_residual: bool, with_rstd: bool):
    return rmsnorm_kernel(hidden, hidden, dtype, with_weight, with_residual, with_rstd)


def rmsnorm_kernel(hidden, width: int, dtype: str, with_weight: bool, with_residual: bool, with_rstd: bool):
    """The kernel for rows of `hidden` columns (an int, or the generic kernel's runtime value) in tiles `width`
    columns wide (hidden itself, or the widest row the generic kernel takes)."""
    elem = 2 if dtype == "bfloat16" else 4
    rows = rows_per_block(width * elem, 3 if with_residual else 2)
    cols = chunk(width)
    num_chunks = chunks(hidden, cols)

    num_tokens, batch = T.dynamic("num_tokens"), T.dynamic("batch")
    shape = (batch, num_tokens, hidden)

    @T.prim_func
    def rmsnorm(
        x: batch_rows("x", shape, dtype),
        weight: tensor(dtype, hidden),
        residual: batch_rows("residual", shape, dtype),
        out: batch_rows("out", shape, dtype),
        residual_out: batch_rows("residual_out", shape, dtype),
        rstd: fp32(batch, num_tokens),
        eps: T.float32,
        out_scale: T.float32,
    ):
        tiles = T.ceildiv(num_tokens, rows)
        with T.Kernel(batch * tiles) as block:
            b, row = split_block(block, tiles, rows)
            x_ub = T.alloc_shared((rows, width), dtype)
            res_ub = T.alloc_shared((rows, width), dtype)
            out_ub = T.alloc_shared((rows, width), dtype)
            w_ub = T.alloc_shared((width,), dtype)
            rstd_ub = T.alloc_shared((rows,), T.float32)
            T.copy(x[b, row : row + rows, 0:hidden], x_ub[:, 0:hidden])
            if with_residual:
                T.copy(residual[b, row : row + rows, 0:hidden], res_ub[:, 0:hidden])
            if with_weight:
                T.copy(weight[0:hidden], w_ub[0:hidden])
            with T.SimtVF(threads=THREADS):
                inv_rms = inverse_rms(x_ub, res_ub, rows, cols, hidden, eps, with_residual)
                T.copy(inv_rms, rstd_ub)
                for k in T.serial(num_chunks):
                    for i, j in T.Parallel(rows, cols):
                        v = T.cast(x_ub[i, k * cols + j], "float32") * inv_rms[i]
                        if with_weight:
                            out_ub[i, k * cols + j] = T.cast(v * (T.cast(w_ub[k * cols + j], "float32") * out_scale), dtype)
                        else:
                            out_ub[i, k * cols + j] = T.cast(v * out_scale, dtype)
            T.copy(out_ub[:, 0:hidden], out[b, row : row + rows, 0:hidden])
            if with_residual:
                T.copy(x_ub[:, 0:hidden], residual_out[b, row : row + rows, 0:hidden])
            if with_rstd:
                T.copy(rstd_ub, rstd[b, row : row + rows])

    return rmsnorm
