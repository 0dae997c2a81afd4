"""RMSNorm fused with the per-token E4M3 cast (groups of 32 columns) for Ascend.

y = round_dtype((s * rstd) * (weight * out_scale)), s = round_dtype(x + residual), then each group of 32 outputs
of a row gets its scale factor from the CUDA kernels' expressions (kernels_src/quant/common.py) and the values
are rounded to E4M3, as a per-token cast of y would. A block takes `rows` tokens of one batch into the Unified
Buffer; a SIMT region sums the squares a chunk of columns at a time (as the Ascend rmsnorm does), forms y, the
scale factors (threads dealt (row, group) pairs) and the E4M3 values; the rows go back with DMA copies.

Weight, residual, rstd and the extra bf16 output are runtime flags, as on CUDA; both tilings of the declaration
build this one kernel (on CUDA they differ in register use only). Scale factors are written row-major
(sf_group_stride is one scale factor) or column-major (sf_stride is one): the kernel picks the copy from
sf_group_stride at run time, the only two layouts the op passes. The fp32 sum runs in another order than
CUDA's, so rstd (and through it y) may differ from it in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.tile import chunk, rows_per_block
from kernels_src.quant.common import scale_factor
from tkaot._quant.kernels import NORM_CAST

DECL = NORM_CAST
REQUIRES: dict[str, int] = {}
THREADS = 128
GROUP = 32
PACK = 4  # packed UE8M0: four exponent bytes a word


def unsupported(hidden, dtype, sf, tiling) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(hidden: int, dtype: str, sf: str, tiling: str):
    elem = 2 if dtype == "bfloat16" else 4
    packed = sf == "ue8m0"
    groups = hidden // GROUP
    words = -(-groups // PACK)
    sf_cols = words * PACK if packed else groups  # scale-factor elements a row holds (packed: bytes)
    sf_dtype = "uint8" if packed else "float32"
    unit = PACK if packed else 1  # sf_group_stride of a row-major layout
    bf16_own = dtype != "bfloat16"  # an fp32 row's bf16 copy needs its own tile; a bf16 y is that copy
    # tiles of a row: x, residual (then y), the bf16 copy, E4M3 values, fp32 inverse scales
    rows = rows_per_block(hidden * (2 * elem + (2 if bf16_own else 0) + 1) + groups * 12, 1)
    cols = chunk(hidden)
    num_chunks = hidden // cols

    batch, num_tokens = T.dynamic("batch"), T.dynamic("num_tokens")
    x_bstride, x_stride = T.dynamic("x_batch_stride"), T.dynamic("x_stride")
    res_bstride, res_stride = T.dynamic("residual_batch_stride"), T.dynamic("residual_stride")
    rout_bstride, rout_stride = T.dynamic("residual_out_batch_stride"), T.dynamic("residual_out_stride")
    out_bstride, out_stride = T.dynamic("out_batch_stride"), T.dynamic("out_stride")
    ob_bstride, ob_stride = T.dynamic("out_bf16_batch_stride"), T.dynamic("out_bf16_stride")
    sf_bstride, sf_stride, sf_gstride = T.dynamic("sf_batch_stride"), T.dynamic("sf_stride"), T.dynamic("sf_group_stride")
    shape = (batch, num_tokens, hidden)
    if packed:
        sf_shape, sf_strides = (batch, num_tokens, words, PACK), (sf_bstride, sf_stride, sf_gstride, 1)
    else:
        sf_shape, sf_strides = (batch, num_tokens, groups), (sf_bstride, sf_stride, sf_gstride)

    @T.prim_func
    def norm_cast(
        x: T.StridedTensor[shape, (x_bstride, x_stride, 1), dtype],
        weight: T.Tensor[(hidden,), dtype],
        residual: T.StridedTensor[shape, (res_bstride, res_stride, 1), dtype],
        residual_out: T.StridedTensor[shape, (rout_bstride, rout_stride, 1), dtype],
        out: T.StridedTensor[shape, (out_bstride, out_stride, 1), T.float8_e4m3fn],
        out_sf: T.StridedTensor[sf_shape, sf_strides, sf_dtype],
        out_bf16: T.StridedTensor[shape, (ob_bstride, ob_stride, 1), T.bfloat16],
        rstd: T.Tensor[(batch, num_tokens), T.float32],
        eps: T.float32,
        out_scale: T.float32,
        has_weight: T.int32,
        has_residual: T.int32,
        has_rstd: T.int32,
        has_out_bf16: T.int32,
    ):
        tiles = T.ceildiv(num_tokens, rows)
        with T.Kernel(batch * tiles) as block:
            b = block // tiles
            row = block % tiles * rows
            x_ub = T.alloc_shared((rows, hidden), dtype)
            y_ub = T.alloc_shared((rows, hidden), dtype)  # the residual, then y
            yb_ub = T.alloc_shared((rows, hidden), T.bfloat16) if bf16_own else y_ub
            out_ub = T.alloc_shared((rows, hidden), T.float8_e4m3fn)
            w_ub = T.alloc_shared((hidden,), dtype)
            rstd_ub = T.alloc_shared((rows,), T.float32)
            inv_ub = T.alloc_shared((rows, groups), T.float32)
            sf_ub = T.alloc_shared((rows, sf_cols), sf_dtype)  # row-major layout
            sf_t = T.alloc_shared((sf_cols // unit, rows * unit), sf_dtype)  # column-major layout
            T.copy(x[b, row : row + rows, :], x_ub)
            if has_residual != 0:
                T.copy(residual[b, row : row + rows, :], y_ub)
            if has_weight != 0:
                T.copy(weight[0:hidden], w_ub)
            with T.SimtVF(threads=THREADS):
                squares = T.alloc_fragment((rows, cols), T.float32)
                part = T.alloc_fragment((rows,), T.float32)
                inv_rms = T.alloc_fragment((rows,), T.float32)
                T.clear(inv_rms)
                for k in T.serial(num_chunks):
                    for i, j in T.Parallel(rows, cols):
                        c = k * cols + j
                        if has_residual != 0:
                            x_ub[i, c] = x_ub[i, c] + y_ub[i, c]
                        squares[i, j] = T.cast(x_ub[i, c], "float32") * T.cast(x_ub[i, c], "float32")
                    T.reduce_sum(squares, part, dim=1)
                    for i in T.Parallel(rows):
                        inv_rms[i] += part[i]
                for i in T.Parallel(rows):
                    inv_rms[i] = T.rsqrt(inv_rms[i] / hidden + eps)
                T.copy(inv_rms, rstd_ub)
                for k in T.serial(num_chunks):
                    for i, j in T.Parallel(rows, cols):
                        c = k * cols + j
                        scale = T.if_then_else(has_weight != 0, T.cast(w_ub[c], "float32") * out_scale, out_scale)
                        y_ub[i, c] = T.cast(T.cast(x_ub[i, c], "float32") * inv_rms[i] * scale, dtype)
                        if bf16_own:
                            yb_ub[i, c] = T.cast(y_ub[i, c], T.bfloat16)
                amax = T.alloc_local((1,), T.float32)  # each thread's running maximum
                # (row, group) pairs dealt round-robin to all threads: one uniform loop, no partial barrier
                for t in T.Parallel(THREADS):
                    for w in T.serial(T.ceildiv(rows * groups, THREADS)):
                        pair = w * THREADS + t
                        if pair < rows * groups:
                            i, g = pair // groups, pair % groups
                            amax[0] = T.float32(0)
                            for j in T.serial(GROUP):
                                amax[0] = T.max(amax[0], T.abs(T.cast(y_ub[i, g * GROUP + j], "float32")))
                            stored, inv = scale_factor(amax[0], "e4m3", sf)
                            inv_ub[i, g] = inv
                            if sf_gstride == unit:
                                sf_ub[i, g] = stored
                            else:
                                sf_t[g // unit, i * unit + g % unit] = stored
                            if packed and groups % PACK and g == groups - 1:
                                for p in T.serial(PACK - groups % PACK):
                                    if sf_gstride == unit:
                                        sf_ub[i, groups + p] = T.uint8(0)
                                    else:
                                        sf_t[words - 1, i * unit + groups % PACK + p] = T.uint8(0)
                for k in T.serial(num_chunks):
                    for i, j in T.Parallel(rows, cols):
                        c = k * cols + j
                        out_ub[i, c] = T.cast(T.cast(y_ub[i, c], "float32") * inv_ub[i, c // GROUP], T.float8_e4m3fn)
            T.copy(out_ub, out[b, row : row + rows, :])
            if has_residual != 0:
                T.copy(x_ub, residual_out[b, row : row + rows, :])
            if has_rstd != 0:
                T.copy(rstd_ub, rstd[b, row : row + rows])
            if has_out_bf16 != 0:
                T.copy(yb_ub, out_bf16[b, row : row + rows, :])
            # views of out_sf's memory (they keep the parameter's name, which the launch spec maps to the op's out_sf)
            if sf_gstride == unit:
                out_sf = T.StridedTensor((batch, num_tokens, sf_cols), (sf_bstride, sf_stride, 1), sf_dtype, data=out_sf.data)
                T.copy(sf_ub, out_sf[b, row : row + rows, :])
            else:  # column-major: sf_stride is one scale factor (one word, packed)
                out_sf = T.StridedTensor(
                    (batch, words if packed else groups, num_tokens * unit), (sf_bstride, sf_gstride, 1), sf_dtype, data=out_sf.data
                )
                T.copy(sf_t, out_sf[b, :, row * unit : (row + rows) * unit])

    return norm_cast
