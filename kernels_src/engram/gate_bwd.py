"""Engram gate backward: grad_hidden_states, grad_kv and per-CTA partials of the fused weight's gradient.

With g the saved gate score, d = dot * scalar * rstd_x * rstd_k and the upstream gradient go of
a (token, head) row:
    dL/dg   = sum(go * v)
    r       = 0 where |d| < clamp_value, else dL/dg * g * (1 - g) * 0.5 * sqrt(scalar * rstd_x * rstd_k / |dot|)
    grad_x  = go + r * (k * w - x * dot * rstd_x^2 / hidden)
    grad_k  = r * (x * w - k * dot * rstd_k^2 / hidden)
    grad_v  = sum over heads of go * g
    grad_w  = sum over tokens of r * x * k (grad_w_partial[p]: the tokens of CTA p)
Image tokens (has_mask) pass go through to grad_x and get zero grad_kv.

One CTA a partial p, 8 warps, two a head (hc_mult is 4): CTA p takes tokens
[p * ceil(T / P), (p + 1) * ceil(T / P)). Every sum runs in TileKernels' order (dL/dg: warp w of
a head sums its lanes' elements in 128-element halves of 256-element groups, then the two warps
add; grad_w: token by token), so the results are the same bits. The thread that owns a grad_w
element accumulates it in grad_w_partial itself (each CTA owns its row, which stays in L2),
so hidden is a runtime value (a multiple of 256).
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._engram.kernels import GATE_BWD

DECL = GATE_BWD  # the declaration this module builds (tkaot/_engram/kernels.py)

HC = 4
THREADS = HC * 2 * 32
GROUP = 256  # elements of a head's row two warps cover at once (4 a lane)


def build(tiling: str):
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    num_partials = T.dynamic("num_partials")
    rows = (num_tokens, HC)

    @T.prim_func
    def engram_gate_bwd(
        grad_out: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        hidden_states: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        kv: T.Tensor[(num_tokens, HC + 1, hidden), T.bfloat16],
        weight_fused: T.Tensor[(HC, hidden), T.float32],
        dot: T.Tensor[rows, T.float32],
        gate_score: T.Tensor[rows, T.float32],
        rstd_x: T.Tensor[rows, T.float32],
        rstd_k: T.Tensor[rows, T.float32],
        image_token_mask: T.Tensor[(num_tokens,), T.bool],
        grad_hidden_states: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        grad_kv: T.Tensor[(num_tokens, HC + 1, hidden), T.bfloat16],
        grad_w_partial: T.Tensor[(num_partials, HC, hidden), T.float32],
        clamp_value: T.float32,
        scalar: T.float32,
        has_mask: T.int32,
    ):
        with T.Kernel(num_partials, threads=THREADS) as part:
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(hidden % GROUP == 0)
            T.assume(num_partials > 0)
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            head = warp // 2
            half = warp % 2
            groups = hidden // GROUP
            per = T.ceildiv(num_tokens, num_partials)
            start = T.min(per * part, num_tokens)
            end = T.min(per * (part + 1), num_tokens)
            sums = T.alloc_shared((2, HC, 2), T.float32)
            go = T.alloc_local((4,), T.float32)
            v = T.alloc_local((4,), T.float32)
            x = T.alloc_local((4,), T.float32)
            k = T.alloc_local((4,), T.float32)
            w = T.alloc_local((4,), T.float32)
            gv = T.alloc_local((4,), T.float32)
            gates = T.alloc_local((HC,), T.float32)
            acc = T.alloc_local((1,), T.float32)
            r = T.alloc_var(T.float32)
            gate = T.alloc_var(T.float32)
            rx = T.alloc_var(T.float32)
            rk = T.alloc_var(T.float32)
            d = T.alloc_var(T.float32)
            dot_x = T.alloc_var(T.float32)
            dot_k = T.alloc_var(T.float32)
            done = T.alloc_var(T.int32)  # unmasked tokens so far: picks the half of `sums` to use
            done = 0

            for g in T.serial(groups):
                for j in T.vectorized(4):
                    grad_w_partial[part, head, g * GROUP + half * 128 + lane * 4 + j] = 0.0

            for t in T.serial(start, end):
                if has_mask != 0 and image_token_mask[t]:
                    for i in T.serial(T.ceildiv(hidden, THREADS * 8)):
                        col = (i * THREADS + tid) * 8
                        if col < hidden:
                            for h in T.unroll(HC):
                                for j in T.vectorized(8):
                                    grad_hidden_states[t, h, col + j] = grad_out[t, h, col + j]
                            for h in T.unroll(HC + 1):
                                for j in T.vectorized(8):
                                    grad_kv[t, h, col + j] = T.bfloat16(0)
                else:
                    # dL/dg of this warp's head: each warp sums its halves, then the two warps add
                    T.clear(acc)
                    for g in T.serial(groups):
                        e = g * GROUP + half * 128 + lane * 4
                        for j in T.vectorized(4):
                            go[j] = grad_out[t, head, e + j]
                        for j in T.vectorized(4):
                            v[j] = kv[t, HC, e + j]
                        for j in T.serial(4):
                            acc[0] += go[j] * v[j]
                    acc[0] = T.warp_reduce_sum(acc[0])
                    if lane == 0:
                        sums[done % 2, head, half] = acc[0]
                    T.sync_threads()
                    r = sums[done % 2, head, 0] + sums[done % 2, head, 1]
                    done = done + 1
                    gate = gate_score[t, head]
                    rx = rstd_x[t, head]
                    rk = rstd_k[t, head]
                    d = dot[t, head]
                    r = T.Select(
                        T.abs(d) * scalar * rx * rk < clamp_value,
                        T.float32(0),
                        r * gate * (1.0 - gate) * 0.5 * T.sqrt(scalar * rx * rk / T.abs(d)),
                    )

                    # grad_v: every thread, 4 elements at a time, heads summed in order
                    for h in T.unroll(HC):
                        gates[h] = gate_score[t, h]
                    for i in T.serial(T.ceildiv(hidden, THREADS * 4)):
                        e = (i * THREADS + tid) * 4
                        if e < hidden:
                            T.clear(gv)
                            for h in T.unroll(HC):
                                for j in T.vectorized(4):
                                    go[j] = grad_out[t, h, e + j]
                                for j in T.vectorized(4):
                                    gv[j] += go[j] * gates[h]
                            for j in T.vectorized(4):
                                grad_kv[t, HC, e + j] = gv[j]

                    # grad_x, grad_k and this token's share of grad_w
                    dot_x = d * rx * rx / T.cast(hidden, T.float32)
                    dot_k = d * rk * rk / T.cast(hidden, T.float32)
                    for g in T.serial(groups):
                        e = g * GROUP + half * 128 + lane * 4
                        for j in T.vectorized(4):
                            go[j] = grad_out[t, head, e + j]
                        for j in T.vectorized(4):
                            x[j] = hidden_states[t, head, e + j]
                        for j in T.vectorized(4):
                            k[j] = kv[t, head, e + j]
                        for j in T.vectorized(4):
                            w[j] = weight_fused[head, e + j]
                        for j in T.vectorized(4):
                            grad_hidden_states[t, head, e + j] = go[j] + r * (k[j] * w[j] - x[j] * dot_x)
                            grad_kv[t, head, e + j] = r * (x[j] * w[j] - k[j] * dot_k)
                        for j in T.vectorized(4):
                            grad_w_partial[part, head, e + j] = grad_w_partial[part, head, e + j] + r * x[j] * k[j]

    return engram_gate_bwd
