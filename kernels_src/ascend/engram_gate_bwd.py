"""Engram gate backward for Ascend: grad_hidden_states, grad_kv and per-block partials of the fused weight's gradient.

The math of the CUDA kernel (kernels_src/engram/gate_bwd.py): with g the saved gate score, d = dot * scalar *
rstd_x * rstd_k and the upstream gradient go of a (token, head) row,
    dL/dg   = sum(go * v)
    r       = 0 where |d| < clamp_value, else dL/dg * g * (1 - g) * 0.5 * sqrt(scalar * rstd_x * rstd_k / |dot|)
    grad_x  = go + r * (k * w - x * dot * rstd_x^2 / hidden)
    grad_k  = r * (x * w - k * dot * rstd_k^2 / hidden)
    grad_v  = sum over heads, in order, of go * g
    grad_w  = sum over tokens of r * x * k (grad_w_partial[p]: the tokens of block p)
Image tokens (has_mask) pass go through to grad_x and get zero grad_kv.

Block p takes tokens [p * ceil(T / P), (p + 1) * ceil(T / P)) one at a time, as on CUDA, each in two passes over
segments of SEGMENT columns of its four heads: the first adds each head's dL/dg (T.reduce_sum), the second forms
the gradients in the Unified Buffer and adds the token's r * x * k to the block's grad_w_partial row, which it
keeps in global memory (zeroed first) as the CUDA kernel does, so hidden is a runtime value (a multiple of 256).
Token by token, grad_w runs in the CUDA kernel's order; dL/dg's sums run in another, so results may differ from
it in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, tensor
from kernels_src.ascend.common import unsupported as unsupported
from tkaot._engram.kernels import GATE_BWD

DECL = GATE_BWD
HC = 4
THREADS = 128
SEGMENT = 1024  # columns of each head a pass takes at a time


def build(tiling: str):
    num_tokens, hidden, num_partials = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_partials")
    streams, kvs = tensor(T.bfloat16, num_tokens, HC, hidden), tensor(T.bfloat16, num_tokens, HC + 1, hidden)
    per_row = fp32(num_tokens, HC)
    segments = T.ceildiv(hidden, SEGMENT)

    @T.prim_func
    def engram_gate_bwd(
        grad_out: streams,
        hidden_states: streams,
        kv: kvs,
        weight_fused: fp32(HC, hidden),
        dot: per_row,
        gate_score: per_row,
        rstd_x: per_row,
        rstd_k: per_row,
        image_token_mask: tensor(T.bool, num_tokens),
        grad_hidden_states: streams,
        grad_kv: kvs,
        grad_w_partial: fp32(num_partials, HC, hidden),
        clamp_value: T.float32,
        scalar: T.float32,
        has_mask: T.int32,
    ):
        with T.Kernel(num_partials) as part:
            go_ub = T.alloc_shared((HC, SEGMENT), T.bfloat16)
            x_ub = T.alloc_shared((HC, SEGMENT), T.bfloat16)  # x, then grad_x
            k_ub = T.alloc_shared((HC + 1, SEGMENT), T.bfloat16)  # k and v, then their gradients
            w_ub = T.alloc_shared((HC, SEGMENT), T.float32)
            gw_ub = T.alloc_shared((HC, SEGMENT), T.float32)
            r_ub = T.alloc_shared((HC,), T.float32)  # dL/dg, then r
            per = T.ceildiv(num_tokens, num_partials)
            with T.SimtVF(threads=THREADS):
                for h, c in T.Parallel(HC, SEGMENT):
                    gw_ub[h, c] = T.float32(0)
            for seg in T.serial(segments):
                T.copy(gw_ub, grad_w_partial[part, :, seg * SEGMENT : seg * SEGMENT + SEGMENT])
            for t in T.serial(T.min(per * part, num_tokens), T.min(per * (part + 1), num_tokens)):
                masked = T.alloc_var(T.bool)
                masked = False
                if has_mask != 0:
                    masked = image_token_mask[t]
                if masked:
                    with T.SimtVF(threads=THREADS):
                        for h, c in T.Parallel(HC + 1, SEGMENT):
                            k_ub[h, c] = T.bfloat16(0)
                    for seg in T.serial(segments):
                        col = seg * SEGMENT
                        T.copy(grad_out[t, :, col : col + SEGMENT], go_ub)
                        T.copy(go_ub, grad_hidden_states[t, :, col : col + SEGMENT])
                        T.copy(k_ub, grad_kv[t, :, col : col + SEGMENT])
                else:
                    with T.SimtVF(threads=THREADS):
                        for h in T.Parallel(HC):
                            r_ub[h] = T.float32(0)
                    for seg in T.serial(segments):
                        col = seg * SEGMENT
                        T.copy(grad_out[t, :, col : col + SEGMENT], go_ub)
                        T.copy(kv[t, HC, col : col + SEGMENT], k_ub[HC, :])
                        with T.SimtVF(threads=THREADS):
                            prods = T.alloc_fragment((HC, SEGMENT), T.float32)
                            sums = T.alloc_fragment((HC,), T.float32)
                            for h, c in T.Parallel(HC, SEGMENT):
                                prods[h, c] = T.if_then_else(
                                    col + c < hidden, T.cast(go_ub[h, c], "float32") * T.cast(k_ub[HC, c], "float32"), T.float32(0)
                                )
                            T.reduce_sum(prods, sums, dim=1)
                            for h in T.Parallel(HC):
                                r_ub[h] = r_ub[h] + sums[h]
                    with T.SimtVF(threads=THREADS):
                        for h in T.Parallel(HC):
                            gate = gate_score[t, h]
                            rx = rstd_x[t, h]
                            rk = rstd_k[t, h]
                            d = dot[t, h]
                            r_ub[h] = T.if_then_else(
                                T.abs(d) * scalar * rx * rk < clamp_value,
                                T.float32(0),
                                r_ub[h] * gate * (1.0 - gate) * 0.5 * T.sqrt(scalar * rx * rk / T.abs(d)),
                            )
                    for seg in T.serial(segments):
                        col = seg * SEGMENT
                        T.copy(grad_out[t, :, col : col + SEGMENT], go_ub)
                        T.copy(hidden_states[t, :, col : col + SEGMENT], x_ub)
                        T.copy(kv[t, 0:HC, col : col + SEGMENT], k_ub[0:HC, :])
                        T.copy(weight_fused[:, col : col + SEGMENT], w_ub)
                        T.copy(grad_w_partial[part, :, col : col + SEGMENT], gw_ub)
                        with T.SimtVF(threads=THREADS):
                            gv = T.alloc_local((1,), T.float32)
                            for c in T.Parallel(SEGMENT):
                                gv[0] = T.float32(0)
                                for h in T.unroll(HC):
                                    gv[0] = gv[0] + T.cast(go_ub[h, c], "float32") * gate_score[t, h]
                                k_ub[HC, c] = T.cast(gv[0], T.bfloat16)
                            for h, c in T.Parallel(HC, SEGMENT):
                                r = r_ub[h]
                                d = dot[t, h]
                                rx = rstd_x[t, h]
                                rk = rstd_k[t, h]
                                x = T.cast(x_ub[h, c], "float32")
                                k = T.cast(k_ub[h, c], "float32")
                                go = T.cast(go_ub[h, c], "float32")
                                x_ub[h, c] = T.cast(go + r * (k * w_ub[h, c] - x * (d * rx * rx / T.cast(hidden, T.float32))), T.bfloat16)
                                k_ub[h, c] = T.cast(r * (x * w_ub[h, c] - k * (d * rk * rk / T.cast(hidden, T.float32))), T.bfloat16)
                                gw_ub[h, c] = gw_ub[h, c] + r * x * k
                        T.copy(x_ub, grad_hidden_states[t, :, col : col + SEGMENT])
                        T.copy(k_ub, grad_kv[t, :, col : col + SEGMENT])
                        T.copy(gw_ub, grad_w_partial[part, :, col : col + SEGMENT])

    return engram_gate_bwd
