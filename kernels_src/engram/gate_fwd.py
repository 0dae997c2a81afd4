"""Engram gate forward: out = x + sigmoid(signed_sqrt(dot * rstd_x * rstd_k * scalar)) * v, per (token, head).

For head h of a token: x = hidden_states[t, h], k = kv[t, h], v = kv[t, hc_mult], w = weight_fused[h];
dot = sum(x * w * k), rstd_x = rsqrt(mean(x^2) + eps), rstd_k likewise, and
signed_sqrt(d) = sign(d) * sqrt(max(|d|, clamp_value)).

One warp a (token, head) row. Lane l sums elements c * 256 + l * 8 + j for the chunks c in
ascending order and j = 0..7 in order, then the warp sums its lanes: the order TileKernels sums
in, so dot, rstd_x, rstd_k and the gate score come out the same bits.

The kernel is bound by how many bytes each SM keeps in flight, so loads run ahead of their use
in register rings: pass 1 keeps the x and k of the next `depth` chunks (and the weight of the next
depth / 2, an L2 hit) in flight while it sums the current one, and parks x in the warp's slice of
shared memory; pass 2 starts v's ring before the warp's reduction and streams out = x + gate * v.
Chunks past the shared slice (hidden above slice * 256) read x again in pass 2, through the ring.
The rows are token-major and a CTA's warps take consecutive rows, so the heads of a token run
together and v comes from HBM about once. Nothing is shared between warps: no block barrier.

Runtime values: tokens, hc_mult, hidden (a multiple of 256, at most 16384), eps, clamp_value,
scalar (hidden ** -0.5), and `flags`: bit 0 saves dot / gate_score / rstd_x / rstd_k, bit 1 reads
image_token_mask (masked tokens copy x to out, their saved values are 0), bit 2 writes out in place
of hidden_states (masked rows are then left alone).
"""

import re

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._engram.kernels import GATE_FWD, MAX_GATE_HIDDEN

DECL = GATE_FWD  # the declaration this module builds (tkaot/_engram/kernels.py)

VEC = 8  # bf16 elements a lane reads at once
CHUNK = 32 * VEC  # elements a warp reads at once
SAVE, MASK, IN_PLACE = 1, 2, 4


def parse_tiling(tiling: str) -> tuple[int, int, int]:
    """Tiling "w<warps>x<slice>b<depth>": warps a CTA, chunks of x a warp parks in shared memory, chunks in flight."""
    match = re.fullmatch(r"w(\d+)x(\d+)b(\d+)", tiling)
    if match is None:
        raise ValueError(f"engram_gate_fwd tiling {tiling!r} is not w<warps>x<slice>b<depth>")
    warps, slice_, depth = map(int, match.groups())
    if not (1 <= warps <= 8 and 1 <= slice_ <= MAX_GATE_HIDDEN // CHUNK and depth in (2, 4, 6, 8, 12, 16)):
        raise ValueError(f"engram_gate_fwd tiling {tiling!r}: warps 1-8, slice 1-64, depth 2-16 and even")
    return warps, slice_, depth


def build(tiling: str):
    warps, slice_, depth = parse_tiling(tiling)
    w_depth = depth // 2
    threads = warps * 32
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
        with T.Kernel(T.ceildiv(num_tokens * hc_mult, warps), threads=threads) as cta:
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(hidden % CHUNK == 0)
            T.assume(hidden <= MAX_GATE_HIDDEN)
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            chunks = hidden // CHUNK
            x_smem = T.alloc_shared((warps, slice_ * CHUNK), T.bfloat16)
            x_ring = T.alloc_local((depth, VEC), T.bfloat16)
            k_ring = T.alloc_local((depth, VEC), T.bfloat16)
            w_ring = T.alloc_local((w_depth, VEC), T.float32)
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

            token = T.alloc_var(T.int32)
            head = T.alloc_var(T.int32)
            token = (cta * warps + warp) // hc_mult
            head = (cta * warps + warp) - token * hc_mult
            T.assume(0 <= token and 0 <= head and head < hc_mult)
            col = lane * VEC
            live = T.alloc_var(T.bool)  # a row to gate: in range and not masked
            live = False
            if token < num_tokens:
                live = (flags & MASK) == 0 or not image_token_mask[token]
                if not live:
                    if (flags & IN_PLACE) == 0:
                        for c in T.serial(chunks):
                            for j in T.vectorized(VEC):
                                output[token, head, c * CHUNK + col + j] = hidden_states[token, head, c * CHUNK + col + j]
                    if (flags & SAVE) != 0 and lane == 0:
                        dot[token, head] = 0.0
                        gate_score[token, head] = 0.0
                        rstd_x[token, head] = 0.0
                        rstd_k[token, head] = 0.0
            # both passes under `live`, not a branch around them: TileLang's block barrier between the
            # shared-memory writes of pass 1 and the reads of pass 2 must be reached by every warp
            if live:
                # pass 1: the three sums in TileKernels' order, loads `depth` chunks ahead
                T.clear(sum_x)
                T.clear(sum_k)
                T.clear(sum_d)
                for u in T.unroll(depth):
                    if u < chunks:
                        for j in T.vectorized(VEC):
                            x_ring[u, j] = hidden_states[token, head, u * CHUNK + col + j]
                        for j in T.vectorized(VEC):
                            k_ring[u, j] = kv[token, head, u * CHUNK + col + j]
                for u in T.unroll(w_depth):
                    if u < chunks:
                        for j in T.vectorized(VEC):
                            w_ring[u, j] = weight_fused[head, u * CHUNK + col + j]
                for g in T.serial(T.ceildiv(chunks, depth)):
                    for u in T.unroll(depth):
                        c = g * depth + u
                        if c < chunks:
                            for j in T.vectorized(VEC):
                                x_local[j] = x_ring[u, j]
                            for j in T.vectorized(VEC):
                                k_local[j] = k_ring[u, j]
                            for j in T.vectorized(VEC):
                                w_local[j] = w_ring[u % w_depth, j]
                            if c < slice_:
                                for j in T.vectorized(VEC):
                                    x_smem[warp, c * CHUNK + col + j] = x_ring[u, j]
                            if c + depth < chunks:
                                for j in T.vectorized(VEC):
                                    x_ring[u, j] = hidden_states[token, head, (c + depth) * CHUNK + col + j]
                                for j in T.vectorized(VEC):
                                    k_ring[u, j] = kv[token, head, (c + depth) * CHUNK + col + j]
                            if c + w_depth < chunks:
                                for j in T.vectorized(VEC):
                                    w_ring[u % w_depth, j] = weight_fused[head, (c + w_depth) * CHUNK + col + j]
                            for j in T.serial(VEC):
                                sum_x[0] += x_local[j] * x_local[j]
                                sum_k[0] += k_local[j] * k_local[j]
                                sum_d[0] += x_local[j] * w_local[j] * k_local[j]
                # v (and x past the slice) for pass 2, in flight during the reduction
                for u in T.unroll(depth):
                    if u < chunks:
                        for j in T.vectorized(VEC):
                            k_ring[u, j] = kv[token, hc_mult, u * CHUNK + col + j]
                        if u >= slice_:
                            for j in T.vectorized(VEC):
                                x_ring[u, j] = hidden_states[token, head, u * CHUNK + col + j]
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
            if live:
                # pass 2: out = x + gate * v, v `depth` chunks ahead
                for g in T.serial(T.ceildiv(chunks, depth)):
                    for u in T.unroll(depth):
                        c = g * depth + u
                        if c < chunks:
                            if c < slice_:
                                for j in T.vectorized(VEC):
                                    x_local[j] = x_smem[warp, c * CHUNK + col + j]
                            else:
                                for j in T.vectorized(VEC):
                                    x_local[j] = x_ring[u, j]
                            for j in T.vectorized(VEC):
                                v_local[j] = k_ring[u, j]
                            if c + depth < chunks:
                                for j in T.vectorized(VEC):
                                    k_ring[u, j] = kv[token, hc_mult, (c + depth) * CHUNK + col + j]
                                if c + depth >= slice_:
                                    for j in T.vectorized(VEC):
                                        x_ring[u, j] = hidden_states[token, head, (c + depth) * CHUNK + col + j]
                            for j in T.vectorized(VEC):
                                output[token, head, c * CHUNK + col + j] = x_local[j] + gate * v_local[j]

    return engram_gate_fwd
