"""SwiGLU backward for Ascend, optionally with the per-token E4M3 cast of the input gradient.

The math of the CUDA kernel (kernels_src/fused/swiglu_backward.py), per element in fp32, with g and u clamped
first when has_clamp (g to at most c, u to [-c, c]) and w the row's weight:
    s = 1 / (1 + exp(-g))
    x_grad[gate] = dy * w * s * u * (1 + g * (1 - s))   (0 where g was clamped)
    x_grad[up]   = dy * w * s * g                       (0 where u was clamped)
    act          = silu(g) * u, silu(g) = g * s with one fused-multiply-add correction toward g / (1 + exp(-g))
    weight_grad  = sum(dy * act) * routed_scaling_factor;  act_out = act * w (recompute)
and, for fmt="e4m3", each group of `group` x_grad values gets its scale factor from the CUDA kernels' expressions
(kernels_src/quant/common.py) and is rounded to E4M3. A row in the alignment padding after an expert's segment
(has_psum) gets zeros everywhere, as on CUDA.

A block takes `rows` rows and walks their columns a segment of SEGMENT at a time (hidden, a runtime value, need
not be a multiple of it: the last segment's copies are clipped to the row): the segment's gate, up and dy go
into the Unified Buffer, a SIMT region forms the outputs there and adds the segment's dy * act (T.reduce_sum) to
the rows' weight gradients; E4M3 scale factors go from the SIMT region straight to x_grad_sf. Element-wise
outputs keep the CUDA kernel's order of operations; the weight gradient's sum runs in another order, so it may
differ from CUDA's in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import refuse
from kernels_src.ascend.tile import rows_per_block
from kernels_src.fused.swiglu_args import backward, backward_dims
from kernels_src.quant.common import scale_factor
from tkaot._quant.kernels import SWIGLU_BACKWARD

DECL = SWIGLU_BACKWARD
REQUIRES: dict[str, int] = {}
THREADS = 128
SEGMENT = 512  # columns of each half a segment: a multiple of every group
FLT_MAX = 3.4028234663852886e38
FP8 = "float8_e4m3fn"
_DTYPES = {"bfloat16": "bfloat16", "float32": "float32", "e4m3": FP8}
_BYTES = {"bfloat16": 2, "float32": 4, "e4m3": 1}
_OUT = {"bf16": "bfloat16", "fp32": "float32", "e4m3": "bfloat16"}


def unsupported(x_dtype, grad_dtype, fmt, group, sf) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if (x_dtype == "e4m3") != (fmt == "e4m3"):
        return "an E4M3 x goes with fmt=e4m3 and only with it"
    if fmt == "e4m3" and (group == 0 or sf == "none"):
        return "fmt=e4m3 needs group 32 or 128 and an sf kind"
    if fmt != "e4m3" and (group != 0 or sf != "none"):
        return f"fmt={fmt} takes group=0 and sf=none"
    return None


def silu_refined(g, s, den):
    """g * s, corrected by one residual toward g / den (den capped at FLT_MAX): the CUDA kernel's silu."""
    est = g * s
    r = T.call_extern("float32", "fmaf", est, T.min(den, T.float32(FLT_MAX)), -g)
    return T.call_extern("float32", "fmaf", -r, s, est)


def build(x_dtype: str, grad_dtype: str, fmt: str, group: int, sf: str):
    refuse(DECL, unsupported(x_dtype, grad_dtype, fmt, group, sf))
    x_t, out_t = _DTYPES[x_dtype], _OUT[fmt]
    quantized = fmt == "e4m3"
    packed = sf == "ue8m0"
    groups = SEGMENT // group if quantized else 1  # a segment's groups of each half
    out_bytes = 4 if fmt == "fp32" else 2
    # a column's bytes: gate, up, dy, both gradients (fp32 and stored), act, dy * act, E4M3 values
    col_bytes = 2 * _BYTES[x_dtype] + _BYTES[grad_dtype] + 2 * (4 + out_bytes) + out_bytes + 4 + (2 if quantized else 0)
    rows = rows_per_block(SEGMENT * col_bytes, 1)

    dims = backward_dims()
    num_rows, hidden, num_experts = dims.num_rows, dims.hidden, dims.num_experts

    @T.macro
    def swiglu_backward(
        x, x_sf, act_x_grad, topk_weights, psum_num_tokens_per_expert, x_grad, x_grad_fp8, x_grad_sf, weight_grad, act_out, moe, recompute
    ):
        with T.Kernel(T.ceildiv(num_rows, rows)) as block:
            row = block * rows
            gate_ub = T.alloc_shared((rows, SEGMENT), x_t)
            up_ub = T.alloc_shared((rows, SEGMENT), x_t)
            dy_ub = T.alloc_shared((rows, SEGMENT), grad_dtype)
            xg_ub = T.alloc_shared((rows, SEGMENT), T.float32)
            yg_ub = T.alloc_shared((rows, SEGMENT), T.float32)
            xg_out = T.alloc_shared((rows, SEGMENT), out_t)
            yg_out = T.alloc_shared((rows, SEGMENT), out_t)
            act_ub = T.alloc_shared((rows, SEGMENT), out_t)
            xq_ub = T.alloc_shared((rows, SEGMENT), FP8)
            yq_ub = T.alloc_shared((rows, SEGMENT), FP8)
            w_ub = T.alloc_shared((rows,), T.float32)
            pad_ub = T.alloc_shared((rows,), T.int32)
            wg_ub = T.alloc_shared((rows,), T.float32)
            with T.SimtVF(threads=THREADS):
                lo = T.alloc_var(T.int32)
                hi = T.alloc_var(T.int32)
                prev = T.alloc_var(T.int32)
                padding = T.alloc_var(T.int32)
                weight = T.alloc_var(T.float32)
                for i in T.Parallel(rows):
                    # a row is padding when it lies before the aligned end of the last segment ending at or before it
                    padding = 0
                    if moe.has_psum != 0 and row + i < num_rows:
                        lo = 0
                        hi = num_experts
                        for _ in T.serial(moe.search_steps):
                            if lo < hi:
                                if psum_num_tokens_per_expert[(lo + hi) // 2] <= row + i:
                                    lo = (lo + hi) // 2 + 1
                                else:
                                    hi = (lo + hi) // 2
                        prev = 0
                        if lo > 0:
                            prev = psum_num_tokens_per_expert[lo - 1]
                        if row + i < T.ceildiv(prev, moe.alignment) * moe.alignment:
                            padding = 1
                    weight = T.float32(1)
                    if moe.has_weights != 0 and padding == 0 and row + i < num_rows:
                        weight = topk_weights[row + i] * moe.routed_scaling_factor
                    pad_ub[i] = padding
                    w_ub[i] = weight
                    wg_ub[i] = T.float32(0)
            for seg in T.serial(T.ceildiv(hidden, SEGMENT)):
                col = seg * SEGMENT
                width = T.min(SEGMENT, hidden - col)
                T.copy(x[row : row + rows, col : col + width], gate_ub[:, 0:width])
                T.copy(x[row : row + rows, hidden + col : hidden + col + width], up_ub[:, 0:width])
                T.copy(act_x_grad[row : row + rows, col : col + width], dy_ub[:, 0:width])
                with T.SimtVF(threads=THREADS):
                    prods = T.alloc_fragment((rows, SEGMENT), T.float32)
                    part = T.alloc_fragment((rows,), T.float32)
                    g0, u0, g, u, s, den, act, ws = (T.alloc_var(T.float32) for _ in range(8))
                    zero = T.alloc_var(T.bool)
                    for i, c in T.Parallel(rows, SEGMENT):
                        g0 = T.cast(gate_ub[i, c], "float32")
                        u0 = T.cast(up_ub[i, c], "float32")
                        if quantized:
                            # the row's input scale factors (read for rows and columns in range only)
                            if row + i < num_rows and c < width:
                                g0 = g0 * x_sf[row + i, (col + c) // group]
                                u0 = u0 * x_sf[row + i, hidden // group + (col + c) // group]
                        g = g0
                        u = u0
                        if moe.has_clamp != 0:
                            g = T.min(g0, moe.clamp_value)
                            u = T.max(T.min(u0, moe.clamp_value), -moe.clamp_value)
                        den = 1 + T.exp(-g)
                        s = T.float32(1.0) / den
                        act = silu_refined(g, s, den) * u
                        ws = T.cast(dy_ub[i, c], "float32") * w_ub[i] * s
                        zero = pad_ub[i] != 0 or c >= width
                        prods[i, c] = T.if_then_else(zero, T.float32(0), T.cast(dy_ub[i, c], "float32") * act)
                        act_ub[i, c] = T.cast(T.if_then_else(zero, T.float32(0), act * w_ub[i]), out_t)
                        xg_ub[i, c] = T.if_then_else(
                            zero or (moe.has_clamp != 0 and g0 > moe.clamp_value), T.float32(0), ws * u * (1 + g * (1 - s))
                        )
                        yg_ub[i, c] = T.if_then_else(
                            zero or (moe.has_clamp != 0 and (u0 > moe.clamp_value or u0 < -moe.clamp_value)), T.float32(0), ws * g
                        )
                        xg_out[i, c] = T.cast(xg_ub[i, c], out_t)
                        yg_out[i, c] = T.cast(yg_ub[i, c], out_t)
                    T.reduce_sum(prods, part, dim=1)
                    for i in T.Parallel(rows):
                        wg_ub[i] = wg_ub[i] + part[i]
                    if quantized:
                        amax = T.alloc_local((2,), T.float32)  # each thread's running maxima (gate, up)
                        # (row, group) pairs dealt round-robin to all threads: one uniform loop, no partial barrier
                        for t in T.Parallel(THREADS):
                            for r in T.serial(T.ceildiv(rows * groups, THREADS)):
                                pair = r * THREADS + t
                                if pair < rows * groups:
                                    i, q = pair // groups, pair % groups
                                    if row + i < num_rows and q * group < width:
                                        amax[0] = T.float32(0)
                                        amax[1] = T.float32(0)
                                        for j in T.serial(group):
                                            amax[0] = T.max(amax[0], T.abs(xg_ub[i, q * group + j]))
                                            amax[1] = T.max(amax[1], T.abs(yg_ub[i, q * group + j]))
                                        stored_x, inv_x = scale_factor(amax[0], "e4m3", sf)
                                        stored_y, inv_y = scale_factor(amax[1], "e4m3", sf)
                                        for j in T.serial(group):
                                            xq_ub[i, q * group + j] = T.cast(xg_ub[i, q * group + j] * inv_x, FP8)
                                            yq_ub[i, q * group + j] = T.cast(yg_ub[i, q * group + j] * inv_y, FP8)
                                        gx = col // group + q
                                        gy = hidden // group + gx
                                        padding = pad_ub[i] != 0
                                        if packed:
                                            x_grad_sf[row + i, gx // 4, gx % 4] = T.if_then_else(padding, T.uint8(0), stored_x)
                                            x_grad_sf[row + i, gy // 4, gy % 4] = T.if_then_else(padding, T.uint8(0), stored_y)
                                        else:
                                            x_grad_sf[row + i, gx] = T.if_then_else(padding, T.float32(0), stored_x)
                                            x_grad_sf[row + i, gy] = T.if_then_else(padding, T.float32(0), stored_y)
                                        if packed and gy == 2 * hidden // group - 1 and (2 * hidden // group) % 4 != 0:
                                            # the unused bytes of the row's last word are zero
                                            for p in T.serial(4 - (2 * hidden // group) % 4):
                                                x_grad_sf[row + i, gy // 4, gy % 4 + 1 + p] = T.uint8(0)
                T.copy(xg_out[:, 0:width], x_grad[row : row + rows, col : col + width])
                T.copy(yg_out[:, 0:width], x_grad[row : row + rows, hidden + col : hidden + col + width])
                if recompute != 0:
                    T.copy(act_ub[:, 0:width], act_out[row : row + rows, col : col + width])
                if quantized:
                    T.copy(xq_ub[:, 0:width], x_grad_fp8[row : row + rows, col : col + width])
                    T.copy(yq_ub[:, 0:width], x_grad_fp8[row : row + rows, hidden + col : hidden + col + width])
            if moe.has_weights != 0:
                with T.SimtVF(threads=THREADS):
                    for i in T.Parallel(rows):
                        wg_ub[i] = T.if_then_else(pad_ub[i] != 0, T.float32(0), wg_ub[i] * moe.routed_scaling_factor)
                T.copy(wg_ub, weight_grad[row : row + rows])

    return backward("swiglu_backward", dims, x_t, grad_dtype, out_t, FP8, packed, swiglu_backward)
