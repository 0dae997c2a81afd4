"""RMSNorm backward, pass 1, for Ascend: x_grad of each row, and each block's fp32 share of the weight gradient.

The math of the CUDA kernel (kernels_src/norm/rmsnorm_backward.py): with xhat = x * rstd, g = out_grad * out_scale
and gw = g * weight (g without a weight),
    x_grad = (gw - xhat * (sum(xhat * gw) / hidden)) * rstd  (+ residual_out_grad)
    partials[block] = sum over the block's rows of xhat * g

The grid is the op's num_blocks blocks (tkaot/_quant/norm_backward.py sizes the partials by it); block b takes
tiles of `rows` tokens b, b + num_blocks, ... (tile by tile) into the Unified Buffer. A SIMT region forms each
row's dot product a chunk of columns at a time (T.reduce_sum, the chunks' sums added in order), adds the tile's
rows to the block's weight gradient in row order, then overwrites the out_grad tile with x_grad, which goes back
by DMA; the block's weight-gradient row goes to partials[block] at the end. Pass 2 adds the partials in a fixed
order, so the result does not depend on timing; the dot products and partials are summed in another order than
CUDA's, so results may differ from it in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, tensor
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.ascend.rms import chunks, mean_divisor
from kernels_src.ascend.tile import chunk, rows_per_block
from tkaot._quant.kernels import RMSNORM_BACKWARD

DECL = RMSNORM_BACKWARD
THREADS = 128


def build(hidden: int, dtype: str):
    return rmsnorm_backward_kernel(hidden, hidden, dtype)


def rmsnorm_backward_kernel(hidden, width: int, dtype: str):
    """The kernel for rows of `hidden` columns (an int, or the generic kernel's runtime value) in tiles `width`
    columns wide (hidden itself, or the widest row the generic kernel takes): copies clipped to the row, the
    chunks of columns up to the row's end (rms.py's chunks), the tiles' columns past it zeros."""
    whole = isinstance(hidden, int)
    elem = 2 if dtype == "bfloat16" else 4
    rows = rows_per_block(width * elem, 3)  # x, out_grad (then x_grad), residual_out_grad
    cols = chunk(width)
    num_chunks = chunks(hidden, cols)
    divisor = T.float32(hidden) if whole else mean_divisor(hidden)

    num_tokens, num_blocks = T.dynamic("num_tokens"), T.dynamic("num_blocks")
    og_stride, x_stride, rg_stride = T.dynamic("out_grad_stride"), T.dynamic("x_stride"), T.dynamic("residual_out_grad_stride")

    def live(token, c):
        # element (token, c) exists: its token, and (a runtime width) its column in the row
        return token < num_tokens if whole else T.And(token < num_tokens, c < hidden)

    @T.prim_func
    def rmsnorm_backward(
        out_grad: T.StridedTensor[(num_tokens, hidden), (og_stride, 1), dtype],
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), dtype],
        weight: tensor(dtype, hidden),
        rstd: fp32(num_tokens),
        residual_out_grad: T.StridedTensor[(num_tokens, hidden), (rg_stride, 1), dtype],
        x_grad: tensor(dtype, num_tokens, hidden),
        partials: fp32(num_blocks, hidden),
        out_scale: T.float32,
        has_weight: T.int32,
        has_residual: T.int32,
    ):
        if not whole:
            T.assume(T.And(hidden > 0, hidden <= width))  # as the op checks
        with T.Kernel(num_blocks) as block:
            x_ub = T.alloc_shared((rows, width), dtype)
            g_ub = T.alloc_shared((rows, width), dtype)  # out_grad, then x_grad
            rg_ub = T.alloc_shared((rows, width), dtype)
            w_ub = T.alloc_shared((width,), dtype)
            dw_ub = T.alloc_shared((width,), T.float32)
            rstd_ub = T.alloc_shared((rows,), T.float32)
            if not whole:
                # columns past a row's end hold zeros, which no copy overwrites: their products add nothing to the
                # dot products and their x_grad stays zero (copies are clipped to the row)
                with T.SimtVF(threads=THREADS):
                    for i, c in T.Parallel(rows, width):
                        x_ub[i, c] = T.cast(0, dtype)
                        g_ub[i, c] = T.cast(0, dtype)
                        rg_ub[i, c] = T.cast(0, dtype)
                    for c in T.Parallel(width):
                        w_ub[c] = T.cast(0, dtype)
            if has_weight != 0:
                T.copy(weight[0:hidden], w_ub[0:hidden])
            with T.SimtVF(threads=THREADS):
                for c in T.Parallel(width):
                    dw_ub[c] = T.float32(0)
            for it in T.serial(T.ceildiv(num_tokens, num_blocks * rows)):
                row = (it * num_blocks + block) * rows
                if row < num_tokens:  # the last round may leave a block without rows
                    T.copy(x[row : row + rows, 0:hidden], x_ub[:, 0:hidden])
                    T.copy(out_grad[row : row + rows, 0:hidden], g_ub[:, 0:hidden])
                    T.copy(rstd[row : row + rows], rstd_ub)
                    if has_residual != 0:
                        T.copy(residual_out_grad[row : row + rows, 0:hidden], rg_ub[:, 0:hidden])
                    with T.SimtVF(threads=THREADS):
                        prods = T.alloc_fragment((rows, cols), T.float32)
                        part = T.alloc_fragment((rows,), T.float32)
                        mean = T.alloc_fragment((rows,), T.float32)
                        T.clear(mean)
                        for k in T.serial(num_chunks):
                            for i, j in T.Parallel(rows, cols):
                                c = k * cols + j
                                g = T.cast(g_ub[i, c], "float32") * out_scale
                                gw = T.if_then_else(has_weight != 0, g * T.cast(w_ub[c], "float32"), g)
                                prods[i, j] = T.cast(x_ub[i, c], "float32") * rstd_ub[i] * gw
                            T.reduce_sum(prods, part, dim=1)
                            for i in T.Parallel(rows):
                                mean[i] += part[i]
                        for i in T.Parallel(rows):
                            mean[i] = mean[i] / divisor
                        if has_weight != 0:
                            # the tile's rows in order (rows past the last token hold no data)
                            for c in T.Parallel(width):
                                for i in T.serial(rows):
                                    if live(row + i, c):
                                        xh = T.cast(x_ub[i, c], "float32") * rstd_ub[i]
                                        dw_ub[c] = dw_ub[c] + xh * (T.cast(g_ub[i, c], "float32") * out_scale)
                        for k in T.serial(num_chunks):
                            for i, j in T.Parallel(rows, cols):
                                c = k * cols + j
                                xh = T.cast(x_ub[i, c], "float32") * rstd_ub[i]
                                g = T.cast(g_ub[i, c], "float32") * out_scale
                                gw = T.if_then_else(has_weight != 0, g * T.cast(w_ub[c], "float32"), g)
                                dx = (gw - xh * mean[i]) * rstd_ub[i]
                                g_ub[i, c] = T.cast(T.if_then_else(has_residual != 0, dx + T.cast(rg_ub[i, c], "float32"), dx), dtype)
                    T.copy(g_ub[:, 0:hidden], x_grad[row : row + rows, 0:hidden])
            if has_weight != 0:
                T.copy(dw_ub[0:hidden], partials[block, 0:hidden])

    return rmsnorm_backward
