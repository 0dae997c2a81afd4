"""The row RMS of the Ascend norm kernels (rmsnorm, norm_cast and their generic tiers), written once.

`inverse_rms` runs in a kernel's SIMT region over a Unified Buffer tile of rows: it adds the residual tile in
place (x' = round(x + residual), in x's dtype) where asked, sums the squares of x' in fp32 a chunk of `cols`
columns at a time (a SIMT reduction per chunk, the chunks' sums added in order) and returns the fragment of
rsqrt(mean + eps), one a row. `hidden` is the row width: an int (the specialised kernels: whole chunks), or a
runtime value (the generic ones: chunks of `cols` up to the row's end, the columns past it adding zeros), so a
row whose width is a multiple of `cols` is summed in the same order by both.
"""

from tilelang.ascend import language as T


def batch_strides(name: str):
    """The dynamic (batch stride, row stride) of a (batch, tokens, hidden) tensor the norm ops pass."""
    return T.dynamic(f"{name}_batch_stride"), T.dynamic(f"{name}_stride")


def batch_rows(name: str, shape, dtype):
    """The type of a (batch, tokens, hidden) tensor the norm ops pass, strided by its own dynamic strides
    (batch_strides), as a factory for a prim_func annotation."""
    return lambda: T.StridedTensor[shape, (*batch_strides(name), 1), dtype]


def chunks(hidden, cols: int):
    """How many chunks of `cols` columns cover a row of `hidden`."""
    return hidden // cols if isinstance(hidden, int) else T.ceildiv(hidden, cols)


def mean_divisor(hidden):
    return hidden if isinstance(hidden, int) else T.cast(hidden, "float32")


def inverse_rms(x_ub, res_ub, rows: int, cols: int, hidden, eps, with_residual):
    """Emit the sum of squares (adding res_ub into x_ub first when `with_residual`: a bool or a runtime flag) and
    return the fragment of each row's inverse RMS."""
    num_chunks = chunks(hidden, cols)
    whole = isinstance(hidden, int)
    return _inverse_rms(x_ub, res_ub, rows, cols, num_chunks, whole, hidden, mean_divisor(hidden), eps, with_residual)


@T.macro
def _inverse_rms(x_ub, res_ub, rows, cols, num_chunks, whole, hidden, divisor, eps, with_residual):
    squares = T.alloc_fragment((rows, cols), T.float32)
    part = T.alloc_fragment((rows,), T.float32)
    inv_rms = T.alloc_fragment((rows,), T.float32)
    T.clear(inv_rms)
    for k in T.serial(num_chunks):
        for i, j in T.Parallel(rows, cols):
            if with_residual:
                x_ub[i, k * cols + j] = x_ub[i, k * cols + j] + res_ub[i, k * cols + j]
            if whole:
                squares[i, j] = T.cast(x_ub[i, k * cols + j], "float32") * T.cast(x_ub[i, k * cols + j], "float32")
            else:
                squares[i, j] = T.if_then_else(
                    k * cols + j < hidden, T.cast(x_ub[i, k * cols + j], "float32") * T.cast(x_ub[i, k * cols + j], "float32"), 0
                )
        T.reduce_sum(squares, part, dim=1)
        for i in T.Parallel(rows):
            inv_rms[i] += part[i]
    for i in T.Parallel(rows):
        inv_rms[i] = T.rsqrt(inv_rms[i] / divisor + eps)
    return inv_rms
