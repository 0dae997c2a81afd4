"""SwiGLU backward, optionally with the per-token FP8 cast of the input gradient fused.

x rows are [gate | up], each `hidden` wide (bf16 / fp32, or E4M3 with one fp32 scale factor per group of
`group` columns); act_x_grad rows are the gradient dy of the forward output. Per element, in fp32, with
g and u clamped first when a clamp is given (g to at most c, u to [-c, c]) and w the row's weight:
    s = 1 / (1 + exp(-g))
    x_grad[gate] = dy * w * s * u * (1 + g * (1 - s))   (0 where g was clamped)
    x_grad[up]   = dy * w * s * g                       (0 where u was clamped)
    act          = silu(g) * u, silu(g) = g * s with one fused-multiply-add correction toward g / (1 + exp(-g))
    weight_grad  = sum(dy * act) (* routed_scaling_factor);  act_out = act * w (recompute)
x_grad is stored in the output format (bf16 for an FP8 output) and, for an FP8 output, cast per group of
`group` columns (kernels_src/quant/common.py's scale factors). The expressions keep TileKernels' order of
operations, so the element-wise outputs are the same bits.

One warp holds a row: lane i owns `vec` adjacent columns of each chunk of 32 * vec, so a group's lanes
are adjacent and its amax is reduced with shuffles; the row's weight_grad is reduced with shuffles too. With an
fp32 x (4 columns a lane: 40 bytes a lane a chunk) the next chunk's loads are issued into a second set of registers
before this chunk's math, so a lane always has a chunk's loads in flight (H200, 8192 x 8192, bf16 grad -> bf16:
114.62 µs against 120.70 without, TileKernels 114.43; f014b86:bench/results/2026-12-03-H200-s17-tune_swigbwd8.log, by
bench/tuning/tune_swigbwd8.py as of commit 8a216a6, where also timed: 8 columns a lane, 2 or 4 chunks loaded together,
an L2 prefetch ahead, 2 rows a block). Row
width (hidden), expert segments (psum_num_tokens_per_expert: a row in the alignment padding after an
expert's segment gets zeros everywhere), weights, scaling, clamp and recompute are runtime values.
"""

import tilelang.language as T

from kernels_src.fused import swiglu_args
from kernels_src.fused.swiglu_math import expert_search
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant.common import scale_factor
from tkaot._quant.kernels import SWIGLU_BACKWARD

DECL = SWIGLU_BACKWARD  # the declaration this module builds (tkaot/_quant/kernels.py)

WARPS = 4  # rows a block
FLT_MAX = 3.4028234663852886e38
_DTYPES = {"bfloat16": "bfloat16", "float32": "float32", "e4m3": "float8_e4m3"}
_BYTES = {"bfloat16": 2, "float32": 4, "e4m3": 1}
_OUT = {"bf16": "bfloat16", "fp32": "float32", "e4m3": "bfloat16"}
FP8 = "float8_e4m3"

SILU_FMA = """
__device__ __forceinline__ float tkaot_silu_refined(float g, float s, float den) {
    // g * s, corrected by one residual: g * s - r * s with r = g * s * den - g (den capped at FLT_MAX)
    float est = g * s;
    float r = __fmaf_rn(est, fminf(den, 3.4028234663852886e38f), -g);
    return __fmaf_rn(-r, s, est);
}
"""


def check_static(x_dtype: str, grad_dtype: str, fmt: str, group: int, sf: str) -> None:
    """Refuse axis combinations that name no valid call."""
    if (x_dtype == "e4m3") != (fmt == "e4m3"):
        raise ValueError(f"an E4M3 x goes with fmt=e4m3 and only with it, got x_dtype={x_dtype} fmt={fmt}")
    if fmt == "e4m3" and (group == 0 or sf == "none"):
        raise ValueError(f"fmt=e4m3 needs group 32 or 128 and an sf kind, got group={group} sf={sf}")
    if fmt != "e4m3" and (group != 0 or sf != "none"):
        raise ValueError(f"fmt={fmt} takes group=0 and sf=none, got group={group} sf={sf}")


def vector_elems(x_dtype: str, grad_dtype: str, fmt: str) -> int:
    """Columns a lane owns in a chunk: one 16-byte access of the widest of x, act_x_grad and x_grad; but an fp32
    act_x_grad beside an FP8 x is read in two 16-byte accesses (at 4 columns a lane, x would be read 4 bytes a lane)."""
    widest = max(_BYTES[x_dtype], 4 if fmt == "fp32" else 2)
    if not (x_dtype == "e4m3" and grad_dtype == "float32"):
        widest = max(widest, _BYTES[grad_dtype])
    return 16 // widest


def build(x_dtype: str, grad_dtype: str, fmt: str, group: int, sf: str):
    check_static(x_dtype, grad_dtype, fmt, group, sf)
    vec = vector_elems(x_dtype, grad_dtype, fmt)
    chunk = 32 * vec
    quantized = fmt == "e4m3"
    x_t, out_t = _DTYPES[x_dtype], _OUT[fmt]
    group_lanes = group // vec if quantized else 1
    packed = sf == "ue8m0"
    pipelined = x_dtype == "float32"  # the next chunk's loads before this chunk's math

    dims = swiglu_args.backward_dims()
    num_rows, hidden, num_experts = dims.num_rows, dims.hidden, dims.num_experts

    @T.macro
    def load(x, act_x_grad, row, col, gate_buf, up_buf, dy_buf):
        """The lane's gate, up and dy vectors at column col of the row."""
        for j in T.vectorized(vec):
            gate_buf[j] = x[row, col + j]
        for j in T.vectorized(vec):
            up_buf[j] = x[row, hidden + col + j]
        for j in T.vectorized(vec):
            dy_buf[j] = act_x_grad[row, col + j]

    @T.macro
    def swiglu_backward(
        x, x_sf, act_x_grad, topk_weights, psum_num_tokens_per_expert, x_grad, x_grad_fp8, x_grad_sf, weight_grad, act_out, moe, recompute
    ):
        with T.Kernel(T.ceildiv(num_rows, WARPS), threads=WARPS * 32) as block:
            T.import_source(SILU_FMA + PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(hidden % 64 == 0)
            tid = T.get_thread_binding()
            lane = tid % 32
            row = block * WARPS + tid // 32
            gate_in = T.alloc_local((vec,), x_t)
            up_in = T.alloc_local((vec,), x_t)
            dy_in = T.alloc_local((vec,), grad_dtype)
            if pipelined:  # the next chunk's
                gate_next = T.alloc_local((vec,), x_t)
                up_next = T.alloc_local((vec,), x_t)
                dy_next = T.alloc_local((vec,), grad_dtype)
            xg = T.alloc_local((vec,), T.float32)
            yg = T.alloc_local((vec,), T.float32)
            xg_out = T.alloc_local((vec,), out_t)
            yg_out = T.alloc_local((vec,), out_t)
            act_res = T.alloc_local((vec,), out_t)
            q = T.alloc_local((vec,), "float8_e4m3")
            acc = T.alloc_var(T.float32)
            w = T.alloc_var(T.float32)
            padding = T.alloc_var(T.int32)
            lo = T.alloc_var(T.int32)
            hi = T.alloc_var(T.int32)
            prev = T.alloc_var(T.int32)
            g = T.alloc_var(T.float32)
            u = T.alloc_var(T.float32)
            dy = T.alloc_var(T.float32)
            s = T.alloc_var(T.float32)
            den = T.alloc_var(T.float32)
            ws = T.alloc_var(T.float32)
            act = T.alloc_var(T.float32)
            x_scale = T.alloc_var(T.float32)
            y_scale = T.alloc_var(T.float32)
            amax_x = T.alloc_var(T.float32)
            amax_y = T.alloc_var(T.float32)
            clamp_x = T.alloc_var(T.int32)
            clamp_y = T.alloc_var(T.int32)

            if row < num_rows:  # the same for a whole warp: the shuffles below see every lane
                # In expert layouts, a row is padding when it lies before the aligned end of the last segment that
                # ends at or before it: lo = how many psum entries are <= row
                padding = 0
                if moe.has_psum != 0:
                    expert_search(psum_num_tokens_per_expert, row, num_experts, moe.search_steps, lo, hi)
                    prev = 0
                    if lo > 0:
                        prev = psum_num_tokens_per_expert[lo - 1]
                    if row < T.ceildiv(prev, moe.alignment) * moe.alignment:
                        padding = 1
                w = 1.0
                if moe.has_weights != 0 and padding == 0:
                    w = topk_weights[row] * moe.routed_scaling_factor
                acc = 0.0
                if pipelined:
                    if padding == 0 and lane * vec < hidden:
                        load(x, act_x_grad, row, lane * vec, gate_next, up_next, dy_next)
                for c in T.serial(T.ceildiv(hidden, chunk)):
                    col = c * chunk + lane * vec
                    active = col < hidden  # the same for a whole group's lanes: hidden is a multiple of the group
                    if active and padding == 0:
                        if pipelined:
                            for j in T.unroll(vec):
                                gate_in[j] = gate_next[j]
                                up_in[j] = up_next[j]
                                dy_in[j] = dy_next[j]
                            if col + chunk < hidden:
                                load(x, act_x_grad, row, col + chunk, gate_next, up_next, dy_next)
                        else:
                            load(x, act_x_grad, row, col, gate_in, up_in, dy_in)
                        if quantized:
                            x_scale = x_sf[row, col // group]
                            y_scale = x_sf[row, hidden // group + col // group]
                        for j in T.unroll(vec):
                            if quantized:
                                g = T.cast(gate_in[j], T.float32) * x_scale
                                u = T.cast(up_in[j], T.float32) * y_scale
                            else:
                                g = T.cast(gate_in[j], T.float32)
                                u = T.cast(up_in[j], T.float32)
                            clamp_x = 0
                            clamp_y = 0
                            if moe.has_clamp != 0:
                                clamp_x = T.if_then_else(g > moe.clamp_value, 1, 0)
                                clamp_y = T.if_then_else(u > moe.clamp_value or u < -moe.clamp_value, 1, 0)
                                g = T.min(g, moe.clamp_value)
                                u = T.max(T.min(u, moe.clamp_value), -moe.clamp_value)
                            dy = T.cast(dy_in[j], T.float32)
                            den = 1 + T.exp(-g)
                            s = 1.0 / den
                            if moe.has_weights != 0 or recompute != 0:
                                act = T.call_extern("float32", "tkaot_silu_refined", g, s, den) * u
                                if moe.has_weights != 0:
                                    acc += dy * act
                                if recompute != 0:
                                    act_res[j] = T.cast(act * w, out_t)
                            ws = dy * w * s
                            xg[j] = T.if_then_else(clamp_x != 0, T.float32(0), ws * u * (1 + g * (1 - s)))
                            yg[j] = T.if_then_else(clamp_y != 0, T.float32(0), ws * g)
                    else:
                        for j in T.unroll(vec):
                            xg[j] = 0.0
                            yg[j] = 0.0
                            act_res[j] = T.cast(0, out_t)
                    if active:
                        for j in T.unroll(vec):
                            xg_out[j] = T.cast(xg[j], out_t)
                            yg_out[j] = T.cast(yg[j], out_t)
                        for j in T.vectorized(vec):
                            x_grad[row, col + j] = xg_out[j]
                        for j in T.vectorized(vec):
                            x_grad[row, hidden + col + j] = yg_out[j]
                        if recompute != 0:
                            for j in T.vectorized(vec):
                                act_out[row, col + j] = act_res[j]
                    if quantized:
                        amax_x = T.abs(xg[0])
                        amax_y = T.abs(yg[0])
                        for j in T.unroll(1, vec):
                            amax_x = T.max(amax_x, T.abs(xg[j]))
                            amax_y = T.max(amax_y, T.abs(yg[j]))
                        for i in T.unroll(group_lanes.bit_length() - 1):
                            amax_x = T.max(amax_x, T.shfl_xor(amax_x, 1 << i))
                            amax_y = T.max(amax_y, T.shfl_xor(amax_y, 1 << i))
                        if active:
                            gx = col // group
                            gy = hidden // group + gx
                            if padding != 0:
                                for j in T.unroll(vec):
                                    q[j] = T.cast(0, "float8_e4m3")
                                for j in T.vectorized(vec):
                                    x_grad_fp8[row, col + j] = q[j]
                                for j in T.vectorized(vec):
                                    x_grad_fp8[row, hidden + col + j] = q[j]
                                # Every lane of a group stores its (equal) scale factor: no branch
                                if packed:
                                    x_grad_sf[row, gx // 4, gx % 4] = T.uint8(0)
                                    x_grad_sf[row, gy // 4, gy % 4] = T.uint8(0)
                                else:
                                    x_grad_sf[row, gx] = T.float32(0)
                                    x_grad_sf[row, gy] = T.float32(0)
                            else:
                                stored_x, inv_x = scale_factor(amax_x, "e4m3", sf)
                                for j in T.unroll(vec):
                                    q[j] = T.cast(xg[j] * inv_x, "float8_e4m3")
                                for j in T.vectorized(vec):
                                    x_grad_fp8[row, col + j] = q[j]
                                if packed:
                                    x_grad_sf[row, gx // 4, gx % 4] = stored_x
                                else:
                                    x_grad_sf[row, gx] = stored_x
                                stored_y, inv_y = scale_factor(amax_y, "e4m3", sf)
                                for j in T.unroll(vec):
                                    q[j] = T.cast(yg[j] * inv_y, "float8_e4m3")
                                for j in T.vectorized(vec):
                                    x_grad_fp8[row, hidden + col + j] = q[j]
                                if packed:
                                    x_grad_sf[row, gy // 4, gy % 4] = stored_y
                                else:
                                    x_grad_sf[row, gy] = stored_y
                            if packed and lane % group_lanes == 0:
                                # The unused bytes of the last word are zero
                                last = 2 * hidden // group
                                if gy == last - 1 and last % 4 != 0:
                                    for p in T.serial(4 - last % 4):
                                        x_grad_sf[row, (last - 1) // 4, last % 4 + p] = T.uint8(0)
                if moe.has_weights != 0:
                    for i in T.unroll(5):
                        acc += T.shfl_xor(acc, 1 << i)
                    if lane == 0:
                        weight_grad[row] = T.if_then_else(padding != 0, T.float32(0), acc * moe.routed_scaling_factor)

    return swiglu_args.backward("swiglu_backward", dims, x_t, grad_dtype, out_t, FP8, packed, swiglu_backward)
