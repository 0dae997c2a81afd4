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

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, split_block, tensor
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.ascend.rms import batch_rows, batch_strides, chunks, inverse_rms
from kernels_src.ascend.tile import chunk, rows_per_block
from kernels_src.fused import norm_cast_args
from kernels_src.quant.common import scale_factor
from tkaot._quant.kernels import NORM_CAST

DECL = NORM_CAST
THREADS = 128
GROUP = 32
PACK = 4  # packed UE8M0: four exponent bytes a word


def build(hidden: int, dtype: str, sf: str, tiling: str):
    return norm_cast_kernel(hidden, hidden, dtype, sf)


def norm_cast_kernel(hidden, width: int, dtype: str, sf: str):
    """The kernel for rows of `hidden` columns (an int, or the generic kernel's runtime value) in tiles `width`
    columns wide (hidden itself, or the widest row the generic kernel takes)."""
    elem = 2 if dtype == "bfloat16" else 4
    packed = sf == "ue8m0"
    groups = hidden // GROUP
    words = T.ceildiv(groups, PACK) if isinstance(groups, T.PrimExpr) else -(-groups // PACK)
    sf_cols = words * PACK if packed else groups  # scale-factor elements a row holds (packed: bytes)
    tile_groups = width // GROUP
    tile_sf_cols = -(-tile_groups // PACK) * PACK if packed else tile_groups
    sf_dtype = "uint8" if packed else "float32"
    unit = PACK if packed else 1  # sf_group_stride of a row-major layout
    bf16_own = dtype != "bfloat16"  # an fp32 row's bf16 copy needs its own tile; a bf16 y is that copy
    # tiles of a row: x, residual (then y), the bf16 copy, E4M3 values, fp32 inverse scales
    rows = rows_per_block(width * (2 * elem + (2 if bf16_own else 0) + 1) + tile_groups * 12, 1)
    cols = chunk(width)
    num_chunks = chunks(hidden, cols)

    batch, num_tokens = T.dynamic("batch"), T.dynamic("num_tokens")
    sf_bstride, sf_stride = batch_strides("sf")
    sf_gstride = T.dynamic("sf_group_stride")
    shape = (batch, num_tokens, hidden)
    if packed:
        sf_shape, sf_strides = (batch, num_tokens, words, PACK), (sf_bstride, sf_stride, sf_gstride, 1)
    else:
        sf_shape, sf_strides = (batch, num_tokens, groups), (sf_bstride, sf_stride, sf_gstride)

    @T.macro
    def group_scale(y_ub, inv_ub, sf_ub, sf_t, amax, i, g):
        # group g of row i: its amax, scale factor (stored in either layout) and inverse
        amax[0] = T.float32(0)
        for j in T.serial(GROUP):
            amax[0] = T.max(amax[0], T.abs(T.cast(y_ub[i, g * GROUP + j], "float32")))
        stored, inv = scale_factor(amax[0], "e4m3", sf)
        inv_ub[i, g] = inv
        if sf_gstride == unit:
            sf_ub[i, g] = stored
        else:
            sf_t[g // unit, i * unit + g % unit] = stored
        if packed and isinstance(groups, int) and groups % PACK and g == groups - 1:
            for p in T.serial(PACK - groups % PACK):
                if sf_gstride == unit:
                    sf_ub[i, groups + p] = T.uint8(0)
                else:
                    sf_t[words - 1, i * unit + groups % PACK + p] = T.uint8(0)

    tiles = T.ceildiv(num_tokens, rows)

    @T.macro
    def kernel(
        x, weight, residual, residual_out, out, out_sf, out_bf16, rstd, eps, out_scale, has_weight, has_residual, has_rstd, has_out_bf16
    ):
        with T.Kernel(batch * tiles) as block:
            b, row = split_block(block, tiles, rows)
            x_ub = T.alloc_shared((rows, width), dtype)
            y_ub = T.alloc_shared((rows, width), dtype)  # the residual, then y
            yb_ub = T.alloc_shared((rows, width), T.bfloat16) if bf16_own else y_ub
            out_ub = T.alloc_shared((rows, width), T.float8_e4m3fn)
            w_ub = T.alloc_shared((width,), dtype)
            rstd_ub = T.alloc_shared((rows,), T.float32)
            inv_ub = T.alloc_shared((rows, tile_groups), T.float32)
            sf_ub = T.alloc_shared((rows, tile_sf_cols), sf_dtype)  # row-major layout
            sf_t = T.alloc_shared((tile_sf_cols // unit, rows * unit), sf_dtype)  # column-major layout
            T.copy(x[b, row : row + rows, 0:hidden], x_ub[:, 0:hidden])
            if has_residual != 0:
                T.copy(residual[b, row : row + rows, 0:hidden], y_ub[:, 0:hidden])
            if has_weight != 0:
                T.copy(weight[0:hidden], w_ub[0:hidden])
            with T.SimtVF(threads=THREADS):
                inv_rms = inverse_rms(x_ub, y_ub, rows, cols, hidden, eps, has_residual != 0)
                T.copy(inv_rms, rstd_ub)
                for k in T.serial(num_chunks):
                    for i, j in T.Parallel(rows, cols):
                        c = k * cols + j
                        scale = T.if_then_else(has_weight != 0, T.cast(w_ub[c], "float32") * out_scale, out_scale)
                        y_ub[i, c] = T.cast(T.cast(x_ub[i, c], "float32") * inv_rms[i] * scale, dtype)
                        if bf16_own:
                            yb_ub[i, c] = T.cast(y_ub[i, c], T.bfloat16)
                if packed and not isinstance(groups, int):
                    # a runtime row width: the unused bytes of a row's last packed word are zeroed first
                    for i in T.Parallel(rows):
                        for p in T.serial((PACK - groups % PACK) % PACK):
                            if sf_gstride == unit:
                                sf_ub[i, groups + p] = T.uint8(0)
                            else:
                                sf_t[words - 1, i * unit + groups % PACK + p] = T.uint8(0)
                amax = T.alloc_local((1,), T.float32)  # each thread's running maximum
                for t in T.Parallel(THREADS):
                    if isinstance(groups, int):
                        # (row, group) pairs dealt round-robin to all threads: one uniform loop, no partial barrier
                        for w in T.serial(T.ceildiv(rows * groups, THREADS)):
                            pair = w * THREADS + t
                            if pair < rows * groups:
                                group_scale(y_ub, inv_ub, sf_ub, sf_t, amax, pair // groups, pair % groups)
                    else:
                        # a runtime row width: each row's groups dealt round-robin (no division by the width)
                        T.assume(hidden % GROUP == 0 and hidden <= width)
                        for i in T.unroll(rows):
                            for w in T.serial(T.ceildiv(groups, THREADS)):
                                if w * THREADS + t < groups:
                                    group_scale(y_ub, inv_ub, sf_ub, sf_t, amax, i, w * THREADS + t)
                for k in T.serial(num_chunks):
                    for i, j in T.Parallel(rows, cols):
                        c = k * cols + j
                        out_ub[i, c] = T.cast(T.cast(y_ub[i, c], "float32") * inv_ub[i, c // GROUP], T.float8_e4m3fn)
            T.copy(out_ub[:, 0:hidden], out[b, row : row + rows, 0:hidden])
            if has_residual != 0:
                T.copy(x_ub[:, 0:hidden], residual_out[b, row : row + rows, 0:hidden])
            if has_rstd != 0:
                T.copy(rstd_ub, rstd[b, row : row + rows])
            if has_out_bf16 != 0:
                T.copy(yb_ub[:, 0:hidden], out_bf16[b, row : row + rows, 0:hidden])
            # views of out_sf's memory (they keep the parameter's name, which the launch spec maps to the op's out_sf)
            if sf_gstride == unit:
                out_sf = T.StridedTensor((batch, num_tokens, sf_cols), (sf_bstride, sf_stride, 1), sf_dtype, data=out_sf.data)
                T.copy(sf_ub[:, 0:sf_cols], out_sf[b, row : row + rows, 0:sf_cols])
            else:  # column-major: sf_stride is one scale factor (one word, packed)
                out_sf = T.StridedTensor(
                    (batch, words if packed else groups, num_tokens * unit), (sf_bstride, sf_gstride, 1), sf_dtype, data=out_sf.data
                )
                T.copy(sf_t[0 : sf_cols // unit, :], out_sf[b, 0 : sf_cols // unit, row * unit : (row + rows) * unit])

    def row_type(name, row_dtype):
        return batch_rows(name, shape, row_dtype)

    sf_t = T.StridedTensor[sf_shape, sf_strides, sf_dtype]
    return norm_cast_args.norm_cast(row_type, dtype, T.float8_e4m3fn, tensor(dtype, hidden), sf_t, fp32(batch, num_tokens), kernel)
