"""Engram gate forward for Ascend: out = x + sigmoid(signed_sqrt(dot * rstd_x * rstd_k * scalar)) * v, per (token, head).

The math of the CUDA kernel (kernels_src/engram/gate_fwd.py): for head h of token t, x = hidden_states[t, h],
k = kv[t, h], v = kv[t, hc_mult], w = weight_fused[h]; dot = sum(x * w * k), rstd_x = rsqrt(mean(x^2) + eps),
rstd_k likewise, signed_sqrt(d) = sign(d) * sqrt(max(|d|, clamp_value)). `flags`: bit 0 saves dot, gate_score,
rstd_x and rstd_k; bit 1 reads image_token_mask (a masked token's row is copied to out, its saved values are 0);
bit 2 writes out in place of hidden_states (masked rows are then left alone).

A block takes one (token, head) row and walks it a segment of SEGMENT columns at a time, twice: the first pass
copies x, k and w into the Unified Buffer and adds the segment's three sums (T.reduce_sum) to the row's, the
second copies x and v and writes x + gate * v back. hc_mult and hidden (a multiple of 256, at most 16384) are
runtime values. The sums run in another order than TileKernels', so results may differ from it in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, tensor
from tkaot._engram.kernels import GATE_FWD, GATE_FWD_TILINGS

DECL = GATE_FWD
THREADS = 128
SEGMENT = 2048  # columns a pass takes at a time
SAVE, MASK, IN_PLACE = 1, 2, 4


def unsupported(tiling) -> str | None:
    """Why this module does not build these static values (None: it does). The tiling is the CUDA kernel's; this
    kernel is the same for all, so the decode tiling is left out and the op's fallback to the default serves its calls."""
    if tiling == GATE_FWD_TILINGS["decode"]:
        return f"tiling={tiling} is a CUDA latency form (the tiling={GATE_FWD_TILINGS['default']} kernel serves its calls)"
    return None


def build(tiling: str):
    num_tokens, hc_mult, hidden = T.dynamic("num_tokens"), T.dynamic("hc_mult"), T.dynamic("hidden")
    streams, per_row = tensor(T.bfloat16, num_tokens, hc_mult, hidden), fp32(num_tokens, hc_mult)
    segments = T.ceildiv(hidden, SEGMENT)

    @T.prim_func
    def engram_gate_fwd(
        hidden_states: streams,
        kv: tensor(T.bfloat16, num_tokens, hc_mult + 1, hidden),
        weight_fused: fp32(hc_mult, hidden),
        image_token_mask: tensor(T.bool, num_tokens),
        output: streams,
        dot: per_row,
        gate_score: per_row,
        rstd_x: per_row,
        rstd_k: per_row,
        eps: T.float32,
        clamp_value: T.float32,
        scalar: T.float32,
        flags: T.int32,
    ):
        with T.Kernel(num_tokens * hc_mult) as block:
            token, head = block // hc_mult, block % hc_mult
            x_ub = T.alloc_shared((1, SEGMENT), T.bfloat16)
            k_ub = T.alloc_shared((1, SEGMENT), T.bfloat16)  # k, then v
            w_ub = T.alloc_shared((1, SEGMENT), T.float32)
            out_ub = T.alloc_shared((1, SEGMENT), T.bfloat16)
            sums_ub = T.alloc_shared((4,), T.float32)  # sum(x^2), sum(k^2), dot; then the gate
            masked = T.alloc_var(T.bool)
            masked = False
            if (flags & MASK) != 0:
                masked = image_token_mask[token]
            if masked:
                if (flags & IN_PLACE) == 0:
                    for seg in T.serial(segments):
                        T.copy(hidden_states[token, head, seg * SEGMENT : seg * SEGMENT + SEGMENT], x_ub[0, :])
                        T.copy(x_ub[0, :], output[token, head, seg * SEGMENT : seg * SEGMENT + SEGMENT])
                if (flags & SAVE) != 0:
                    with T.SimtVF(threads=THREADS):
                        for t in T.Parallel(THREADS):
                            if t == 0:
                                dot[token, head] = T.float32(0)
                                gate_score[token, head] = T.float32(0)
                                rstd_x[token, head] = T.float32(0)
                                rstd_k[token, head] = T.float32(0)
            else:
                with T.SimtVF(threads=THREADS):
                    for t in T.Parallel(4):
                        sums_ub[t] = T.float32(0)
                for seg in T.serial(segments):
                    col = seg * SEGMENT
                    T.copy(hidden_states[token, head, col : col + SEGMENT], x_ub[0, :])
                    T.copy(kv[token, head, col : col + SEGMENT], k_ub[0, :])
                    T.copy(weight_fused[head, col : col + SEGMENT], w_ub[0, :])
                    with T.SimtVF(threads=THREADS):
                        sq_x = T.alloc_fragment((1, SEGMENT), T.float32)
                        sq_k = T.alloc_fragment((1, SEGMENT), T.float32)
                        prod = T.alloc_fragment((1, SEGMENT), T.float32)
                        part = T.alloc_fragment((1,), T.float32)
                        for i, c in T.Parallel(1, SEGMENT):
                            live = col + c < hidden
                            xv = T.cast(x_ub[i, c], "float32")
                            kv_ = T.cast(k_ub[i, c], "float32")
                            sq_x[i, c] = T.if_then_else(live, xv * xv, T.float32(0))
                            sq_k[i, c] = T.if_then_else(live, kv_ * kv_, T.float32(0))
                            prod[i, c] = T.if_then_else(live, xv * w_ub[i, c] * kv_, T.float32(0))
                        T.reduce_sum(sq_x, part, dim=1)
                        for i in T.Parallel(1):
                            sums_ub[0] = sums_ub[0] + part[i]
                        T.reduce_sum(sq_k, part, dim=1)
                        for i in T.Parallel(1):
                            sums_ub[1] = sums_ub[1] + part[i]
                        T.reduce_sum(prod, part, dim=1)
                        for i in T.Parallel(1):
                            sums_ub[2] = sums_ub[2] + part[i]
                with T.SimtVF(threads=THREADS):
                    for t in T.Parallel(THREADS):
                        if t == 0:
                            rx = T.rsqrt(sums_ub[0] / T.cast(hidden, T.float32) + eps)
                            rk = T.rsqrt(sums_ub[1] / T.cast(hidden, T.float32) + eps)
                            g = sums_ub[2] * rx * rk * scalar
                            gate = T.sigmoid(T.copysign(T.sqrt(T.max(T.abs(g), clamp_value)), g))
                            sums_ub[3] = gate
                            if (flags & SAVE) != 0:
                                dot[token, head] = sums_ub[2]
                                gate_score[token, head] = gate
                                rstd_x[token, head] = rx
                                rstd_k[token, head] = rk
                for seg in T.serial(segments):
                    col = seg * SEGMENT
                    T.copy(hidden_states[token, head, col : col + SEGMENT], x_ub[0, :])
                    T.copy(kv[token, hc_mult, col : col + SEGMENT], k_ub[0, :])
                    with T.SimtVF(threads=THREADS):
                        for i, c in T.Parallel(1, SEGMENT):
                            out_ub[i, c] = T.cast(T.cast(x_ub[i, c], "float32") + sums_ub[3] * T.cast(k_ub[i, c], "float32"), T.bfloat16)
                    if (flags & IN_PLACE) != 0:
                        T.copy(out_ub[0, :], hidden_states[token, head, col : col + SEGMENT])
                    else:
                        T.copy(out_ub[0, :], output[token, head, col : col + SEGMENT])

    return engram_gate_fwd
