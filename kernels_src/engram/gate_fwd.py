"""Engram gate forward: out = x + sigmoid(signed_sqrt(dot * rstd_x * rstd_k * scalar)) * v, per (token, head).

For head h of a token: x = hidden_states[t, h], k = kv[t, h], v = kv[t, hc_mult], w = weight_fused[h];
dot = sum(x * w * k), rstd_x = rsqrt(mean(x^2) + eps), rstd_k likewise, and
signed_sqrt(d) = sign(d) * sqrt(max(|d|, clamp_value)).

One warp a (token, head) row. Lane l sums elements c * 256 + l * 8 + j for the chunks c in
ascending order and j = 0..7 in order, then the warp sums its lanes: the order TileKernels sums
in, so dot, rstd_x, rstd_k and the gate score come out the same bits. The first 32 chunks of x
(hidden up to 8192) stay in registers for the output pass; beyond that x is read again. A CTA
(4 warps) serves one head and 32 tokens: it loads that head's weight row into shared memory once
and its warps take every fourth of its tokens. The head is the grid's fastest index, so the CTAs
of a token's heads run together and v is read from HBM about once.

Runtime values: tokens, hc_mult, hidden (a multiple of 256, at most 16384), eps, clamp_value,
scalar (hidden ** -0.5), and `flags`: bit 0 saves dot / gate_score / rstd_x / rstd_k, bit 1 reads
image_token_mask (masked tokens copy x to out, their saved values are 0), bit 2 writes out in place
of hidden_states (masked rows are then left alone).
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._engram.kernels import GATE_FWD, MAX_GATE_HIDDEN

DECL = GATE_FWD  # the declaration this module builds (tkaot/_engram/kernels.py)

WARPS = 4
THREADS = WARPS * 32
VEC = 8  # bf16 elements a lane reads at once
CHUNK = 32 * VEC  # elements a warp reads at once
REG_CHUNKS = 32  # chunks of x kept in registers
TOKENS = 32  # tokens a CTA
SAVE, MASK, IN_PLACE = 1, 2, 4


def build(tiling: str):
    num_tokens = T.dynamic("num_tokens")
    hc_mult = T.dynamic("hc_mult")
    hidden = T.dynamic("hidden")
    rows = (num_tokens, hc_mult)

    @T.prim_func
    def engram_gate_fwd(
        hidden_states: T.Tensor[(num_tokens, hc_mult, hidden), T.bfloat16],
        kv: T.Tensor[(num_tokens, hc_mult + 1, hidden), T.bfloat16],
        weight_fused: T.Tensor[(hc_mult, hidden), T.float32],
        image_token_mask: T.Tensor[(num_tokens,), T.bool],
        output: T.Tensor[(num_tokens, hc_mult, hidden), T.bfloat16],
        dot: T.Tensor[rows, T.float32],
        gate_score: T.Tensor[rows, T.float32],
        rstd_x: T.Tensor[rows, T.float32],
        rstd_k: T.Tensor[rows, T.float32],
        eps: T.float32,
        clamp_value: T.float32,
        scalar: T.float32,
        flags: T.int32,
    ):
        with T.Kernel(hc_mult, T.ceildiv(num_tokens, TOKENS), threads=THREADS) as (head, cta):
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(hidden % CHUNK == 0)
            T.assume(hidden <= MAX_GATE_HIDDEN)
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            chunks = hidden // CHUNK
            w_smem = T.alloc_shared((MAX_GATE_HIDDEN,), T.float32)
            x_reg = T.alloc_local((REG_CHUNKS, VEC), T.bfloat16)
            x_local = T.alloc_local((VEC,), T.float32)
            k_local = T.alloc_local((VEC,), T.float32)
            w_local = T.alloc_local((VEC,), T.float32)
            v_local = T.alloc_local((VEC,), T.float32)
            sum_x = T.alloc_local((1,), T.float32)
            sum_k = T.alloc_local((1,), T.float32)
            sum_d = T.alloc_local((1,), T.float32)
            total_x = T.alloc_var(T.float32)
            total_k = T.alloc_var(T.float32)
            total_d = T.alloc_var(T.float32)
            gate = T.alloc_var(T.float32)

            for i in T.serial(T.ceildiv(hidden, THREADS * 4)):
                col = (i * THREADS + tid) * 4
                if col < hidden:
                    for j in T.vectorized(4):
                        w_smem[col + j] = weight_fused[head, col + j]
            T.sync_threads()

            for step in T.serial(TOKENS // WARPS):
                token = cta * TOKENS + step * WARPS + warp
                if token < num_tokens:
                    if (flags & MASK) != 0 and image_token_mask[token]:
                        if (flags & IN_PLACE) == 0:
                            for c in T.serial(chunks):
                                for j in T.vectorized(VEC):
                                    output[token, head, c * CHUNK + lane * VEC + j] = hidden_states[token, head, c * CHUNK + lane * VEC + j]
                        if (flags & SAVE) != 0 and lane == 0:
                            dot[token, head] = 0.0
                            gate_score[token, head] = 0.0
                            rstd_x[token, head] = 0.0
                            rstd_k[token, head] = 0.0
                    else:
                        # pass 1: the three sums, in TileKernels' order
                        T.clear(sum_x)
                        T.clear(sum_k)
                        T.clear(sum_d)
                        for c in T.unroll(REG_CHUNKS):
                            if c < chunks:
                                for j in T.vectorized(VEC):
                                    x_reg[c, j] = hidden_states[token, head, c * CHUNK + lane * VEC + j]
                                for j in T.vectorized(VEC):
                                    x_local[j] = x_reg[c, j]
                                for j in T.vectorized(VEC):
                                    k_local[j] = kv[token, head, c * CHUNK + lane * VEC + j]
                                for j in T.vectorized(VEC):
                                    w_local[j] = w_smem[c * CHUNK + lane * VEC + j]
                                for j in T.serial(VEC):
                                    sum_x[0] += x_local[j] * x_local[j]
                                    sum_k[0] += k_local[j] * k_local[j]
                                    sum_d[0] += x_local[j] * w_local[j] * k_local[j]
                        for c in T.serial(REG_CHUNKS, chunks):
                            for j in T.vectorized(VEC):
                                x_local[j] = hidden_states[token, head, c * CHUNK + lane * VEC + j]
                            for j in T.vectorized(VEC):
                                k_local[j] = kv[token, head, c * CHUNK + lane * VEC + j]
                            for j in T.vectorized(VEC):
                                w_local[j] = w_smem[c * CHUNK + lane * VEC + j]
                            for j in T.serial(VEC):
                                sum_x[0] += x_local[j] * x_local[j]
                                sum_k[0] += k_local[j] * k_local[j]
                                sum_d[0] += x_local[j] * w_local[j] * k_local[j]
                        total_x = T.warp_reduce_sum(sum_x[0])
                        total_k = T.warp_reduce_sum(sum_k[0])
                        total_d = T.warp_reduce_sum(sum_d[0])
                        total_x = T.rsqrt(total_x / T.cast(hidden, T.float32) + eps)
                        total_k = T.rsqrt(total_k / T.cast(hidden, T.float32) + eps)
                        gate = total_d * total_x * total_k * scalar
                        gate = T.sigmoid(T.copysign(T.sqrt(T.clamp(T.abs(gate), clamp_value, T.infinity(T.float32))), gate))
                        if (flags & SAVE) != 0 and lane == 0:
                            dot[token, head] = total_d
                            gate_score[token, head] = gate
                            rstd_x[token, head] = total_x
                            rstd_k[token, head] = total_k
                        # pass 2: out = x + gate * v
                        for c in T.unroll(REG_CHUNKS):
                            if c < chunks:
                                for j in T.vectorized(VEC):
                                    x_local[j] = x_reg[c, j]
                                for j in T.vectorized(VEC):
                                    v_local[j] = kv[token, hc_mult, c * CHUNK + lane * VEC + j]
                                for j in T.vectorized(VEC):
                                    output[token, head, c * CHUNK + lane * VEC + j] = x_local[j] + gate * v_local[j]
                        for c in T.serial(REG_CHUNKS, chunks):
                            for j in T.vectorized(VEC):
                                x_local[j] = hidden_states[token, head, c * CHUNK + lane * VEC + j]
                            for j in T.vectorized(VEC):
                                v_local[j] = kv[token, hc_mult, c * CHUNK + lane * VEC + j]
                            for j in T.vectorized(VEC):
                                output[token, head, c * CHUNK + lane * VEC + j] = x_local[j] + gate * v_local[j]

    return engram_gate_fwd
