"""SwiGLU forward for Ascend, optionally with the per-token E4M3 cast: out = silu(gate) * up * weight.

x rows are [gate | up], each `hidden` wide. A block takes `rows` rows into the Unified Buffer; in a SIMT
region gate is clamped to at most clamp_value and up to [-clamp_value, clamp_value] (when has_clamp), then
silu(gate) * up = gate / (1 + exp(-gate)) * up in fp32, times topk_weights[row] * routed_scaling_factor (when
has_weights). For fmt="e4m3" each group of `group` outputs gets its scale factor from the CUDA kernels'
expressions (kernels_src/quant/common.py) and the values are rounded to E4M3; "bf16" rounds to bf16, "fp32"
stores fp32.

Not yet for Ascend: MoE expert segments (has_psum: rows in the alignment padding must be skipped) and clamp
counting (count_clamp: atomic adds to clamped_count), and column-major scale factors (sf_group_stride other
than 1). REQUIRES holds them, so the Ascend launcher refuses such calls before launching; packed UE8M0 scale
factors are not built (`unsupported`).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import refuse, split_block
from kernels_src.ascend.tile import chunk, rows_per_block
from kernels_src.fused.swiglu_args import forward, forward_dims
from kernels_src.quant.common import scale_factor
from tkaot._quant.kernels import SWIGLU

DECL = SWIGLU
REQUIRES = {"has_psum": 0, "count_clamp": 0, "sf_group_stride": 1}
THREADS = 128
UB_ROW_LIMIT = 192 * 1024  # bytes of one row's tiles, leaving room for the rest below the 216 KiB limit
_OUT = {"bf16": "bfloat16", "fp32": "float32", "e4m3": "float8_e4m3fn"}
MIN_GROUP = 32  # the smallest group the declaration takes


def unsupported(hidden, dtype, fmt, group, sf, tiling) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if fmt == "e4m3" and sf not in ("fp32", "pow2"):
        return "E4M3 output with fp32 or pow2 scale factors only"
    if fmt == "e4m3" and (group == 0 or hidden % group):
        return f"hidden={hidden} needs whole groups of {group}"
    if fmt != "e4m3" and (group != 0 or sf != "none"):
        return f"fmt={fmt} takes group=0 and sf=none"
    elem, out_elem = (2 if dtype == "bfloat16" else 4), {"bf16": 2, "fp32": 4, "e4m3": 1}[fmt]
    if hidden * (2 * elem + 4 + out_elem) > UB_ROW_LIMIT:
        return f"hidden={hidden} {dtype} -> {fmt}: one row's input, fp32 values and output exceed the Unified Buffer"
    return None


def build(hidden: int, dtype: str, fmt: str, group: int, sf: str, tiling: str):
    refuse(DECL, unsupported(hidden, dtype, fmt, group, sf, tiling))
    return swiglu_kernel(hidden, hidden, group, dtype, fmt, sf)


def swiglu_kernel(hidden, width: int, group, dtype: str, fmt: str, sf: str):
    """The kernel for rows of `hidden` columns a half and groups of `group` (ints, or the generic kernel's runtime
    values): a block takes `width` columns of each half, the whole row (width == hidden) or one segment of it."""
    segmented = not isinstance(hidden, int)
    elem = 2 if dtype == "bfloat16" else 4
    out_dtype = _OUT[fmt]
    quantized = fmt == "e4m3"
    rows = rows_per_block(width * (2 * elem + 4 + 4), 1)
    cols = chunk(width)
    groups = width // group if quantized else 1  # a block's groups
    tile_groups = width // MIN_GROUP if segmented and quantized else groups

    dims = forward_dims()
    num_rows, num_experts, x_stride, _, sf_stride, sf_group_stride = dims
    if segmented:
        # the extents bind hidden and group (a dim must stand alone in some extent) and bound no index
        sf_shape, sf_strides = (num_rows, hidden, group), (sf_stride, sf_group_stride, 1)
        segs = T.ceildiv(hidden, width)
        blocks = T.ceildiv(num_rows, rows) * segs
    else:
        sf_shape, sf_strides = (num_rows, groups), (sf_stride, sf_group_stride)
        blocks = T.ceildiv(num_rows, rows)

    @T.macro
    def group_scale(val_ub, sf_ub, inv_ub, amax, i, q):
        # group q of row i: its amax, scale factor and inverse
        amax[0] = T.float32(0)
        for j in T.serial(group):
            amax[0] = T.max(amax[0], T.abs(val_ub[i, q * group + j]))
        stored, inv = scale_factor(amax[0], "e4m3", sf)
        sf_ub[i, q] = stored
        inv_ub[i, q] = inv

    @T.macro
    def swiglu(x, out, out_sf, psum_num_tokens_per_expert, topk_weights, clamped_count, moe, count_clamp):
        with T.Kernel(blocks) as block:
            if segmented:
                row, col = split_block(block, segs, width, rows)
                span = T.min(width, hidden - col)  # the segment's columns in the row
            else:
                row = block * rows
            x_ub = T.alloc_shared((rows, 2 * width), dtype)  # gate, then up
            val_ub = T.alloc_shared((rows, width), T.float32)
            out_ub = T.alloc_shared((rows, width), out_dtype)
            w_ub = T.alloc_shared((rows,), T.float32)
            sf_ub = T.alloc_shared((rows, tile_groups), T.float32)
            inv_ub = T.alloc_shared((rows, tile_groups), T.float32)
            if segmented:
                T.copy(x[row : row + rows, col : col + span], x_ub[:, 0:span])
                T.copy(x[row : row + rows, hidden + col : hidden + col + span], x_ub[:, width : width + span])
            else:
                T.copy(x[row : row + rows, :], x_ub)
            for i in T.serial(rows):
                w_ub[i] = T.float32(1)
                if moe.has_weights != 0 and row + i < num_rows:
                    w_ub[i] = topk_weights[row + i] * moe.routed_scaling_factor
            with T.SimtVF(threads=THREADS):
                for k in T.serial(width // cols):
                    for i, j in T.Parallel(rows, cols):
                        c = k * cols + j
                        g0 = T.cast(x_ub[i, c], "float32")
                        u0 = T.cast(x_ub[i, width + c], "float32")
                        g = T.if_then_else(moe.has_clamp != 0, T.min(g0, moe.clamp_value), g0)
                        u = T.if_then_else(moe.has_clamp != 0, T.max(T.min(u0, moe.clamp_value), -moe.clamp_value), u0)
                        val_ub[i, c] = g / (T.float32(1) + T.exp(-g)) * u * w_ub[i]
                if quantized:
                    amax = T.alloc_local((1,), T.float32)  # each thread's running maximum
                    for t in T.Parallel(THREADS):
                        if segmented:
                            # each row's groups dealt round-robin to all threads (no division by the runtime group count)
                            T.assume(group >= MIN_GROUP and group <= width)
                            for i in T.unroll(rows):
                                for w in T.serial(T.ceildiv(groups, THREADS)):
                                    if w * THREADS + t < groups:
                                        group_scale(val_ub, sf_ub, inv_ub, amax, i, w * THREADS + t)
                        else:
                            # (row, group) pairs dealt round-robin to all threads: one uniform loop, no partial barrier
                            for w in T.serial(T.ceildiv(rows * groups, THREADS)):
                                pair = w * THREADS + t
                                if pair < rows * groups:
                                    group_scale(val_ub, sf_ub, inv_ub, amax, pair // groups, pair % groups)
                    for k in T.serial(width // cols):
                        for i, j in T.Parallel(rows, cols):
                            c = k * cols + j
                            out_ub[i, c] = T.cast(val_ub[i, c] * inv_ub[i, c // group], out_dtype)
                else:
                    for k in T.serial(width // cols):
                        for i, j in T.Parallel(rows, cols):
                            out_ub[i, k * cols + j] = T.cast(val_ub[i, k * cols + j], out_dtype)
            if segmented:
                T.copy(out_ub[:, 0:span], out[row : row + rows, col : col + span])
            else:
                T.copy(out_ub, out[row : row + rows, :])
            if quantized:
                # row-major scale factors (REQUIRES sf_group_stride == 1): a 2-D copy
                # (the view keeps the parameter's name, which the launch spec maps to the op's out_sf)
                if segmented:
                    out_sf = T.StridedTensor((num_rows, hidden // group), (sf_stride, 1), T.float32, data=out_sf.data)
                    T.copy(sf_ub[:, 0 : span // group], out_sf[row : row + rows, col // group : col // group + span // group])
                else:
                    out_sf = T.StridedTensor((num_rows, groups), (sf_stride, 1), T.float32, data=out_sf.data)
                    T.copy(sf_ub, out_sf[row : row + rows, :])

    return forward("swiglu", dims, hidden, dtype, out_dtype, T.StridedTensor[sf_shape, sf_strides, T.float32], swiglu)
