"""moe_topk_gate_forward's backward: the gradient of the logits from those of the top-k weights (+ the aux term).

With u = scores = sqrt(softplus(logits)), chosen experts e_k (k < num_topk; -1 marks an empty slot), the
chosen scores' sum D = sum_k u[e_k] and the weights w_k = routed_scaling_factor * u[e_k] / (D + 1e-20):
    du[e] = sum over k with e_k = e of (routed_scaling_factor * dw_k - <dw, w>) / (D + 1e-20)
With an aux gradient h (grad_scores_sum: one row per sequence of tokens_per_seq tokens), tokens whose mask
is set add the gradient of u / sum(u):
    du[e] += (h[e] - <h, u> / sum(u)) / sum(u)
and dlogits = du * dsqrt(softplus)/dx, recovered from u as (1 - exp(-u^2)) / (2u) (0 at u = 0).

One warp a token, WARPS tokens a block (the tiling): lane l holds experts l, l + 32, ... (up to MAX_EXPERTS), so
every sum is a warp shuffle reduction (16, 8, 4, 2, 1 lanes apart, the order of moe_topk_gate's sums); lane k holds
slot k. The route gradients reach their experts through a row of shared memory a warp: each slot lane adds, in slot
order, the gradients of every slot choosing its expert, and the last of those slots stores the sum, so no atomics and
the same bytes from run to run, repeated experts included. (Gathering them in registers, every lane comparing every
slot with each of its 16 expert registers, cost 16 compares a slot a lane: the kernel was issue-bound at 8192x256.)
Slots of experts past num_experts are skipped by branches uniform over the warp. Token, expert and slot counts are
runtime values: one variant a tiling.
"""

import tilelang.language as T

from kernels_src.moe.common import WARP, warp_sum
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._moe.kernels import MAX_EXPERTS, MOE_GATE_BWD_TILINGS, MOE_TOPK_GATE_BACKWARD

DECL = MOE_TOPK_GATE_BACKWARD  # the declaration this module builds (tkaot/_moe/kernels.py)

PER_LANE = MAX_EXPERTS // WARP
# Tokens (warps) a block, by tiling
WARPS = {MOE_GATE_BWD_TILINGS["default"]: 4, "scatter1": 1, "scatter2": 2, "scatter8": 8}


# The warp's row of route gradients, reached through these helpers: a TileLang shared buffer would have its
# storage-sync pass put block-wide barriers between the stores and loads that only one warp makes
ROUTE_SOURCE = """
__shared__ float tkaot_gate_route[{warps}][{experts}];
__device__ __forceinline__ int tkaot_route_put(int warp, int expert, float value) {{
    tkaot_gate_route[warp][expert] = value;
    return 0;
}}
__device__ __forceinline__ float tkaot_route_get(int warp, int expert) {{ return tkaot_gate_route[warp][expert]; }}
__device__ __forceinline__ int tkaot_sync_warp() {{
    __syncwarp();
    return 0;
}}
"""


def build(tiling: str):
    warps = WARPS[tiling]
    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")

    @T.prim_func
    def moe_topk_gate_backward(
        scores: T.Tensor[(num_tokens, num_experts), T.float32],
        topk_idx: T.Tensor[(num_tokens, num_topk), T.int64],
        topk_weights: T.Tensor[(num_tokens, num_topk), T.float32],
        grad_topk_weights: T.Tensor[(num_tokens, num_topk), T.float32],
        mask: T.Tensor[(num_tokens,), T.bool],
        # one row per sequence; its extent is nominal (rows are token // tokens_per_seq)
        grad_scores_sum: T.Tensor[(num_tokens, num_experts), T.float32],
        grad_logits: T.Tensor[(num_tokens, num_experts), T.float32],
        routed_scaling_factor: T.float32,
        has_aux: T.int32,
        tokens_per_seq: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as block:
            T.import_source(PDL_SOURCE + ROUTE_SOURCE.format(warps=warps, experts=MAX_EXPERTS))
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            tid = T.get_thread_binding()
            lane = tid % WARP
            warp = tid // WARP
            token = block * warps + warp
            u = T.alloc_local((PER_LANE,), T.float32)
            du = T.alloc_local((PER_LANE,), T.float32)
            h = T.alloc_local((PER_LANE,), T.float32)
            idx = T.alloc_var(T.int32)
            u_k = T.alloc_var(T.float32)
            g_k = T.alloc_var(T.float32)
            topk_sum = T.alloc_var(T.float32)
            dot = T.alloc_var(T.float32)
            r_k = T.alloc_var(T.float32)
            other = T.alloc_var(T.int32)
            r_other = T.alloc_var(T.float32)
            r_sum = T.alloc_var(T.float32)
            last = T.alloc_var(T.int32)
            u_sum = T.alloc_var(T.float32)
            aux_dot = T.alloc_var(T.float32)
            inv = T.alloc_var(T.float32)
            if token < num_tokens:  # the same for a whole warp: the shuffles below see every lane
                for i in T.unroll(PER_LANE):
                    u[i] = 0.0
                    du[i] = 0.0
                    if i * WARP < num_experts:  # uniform
                        T.call_extern("int32", "tkaot_route_put", warp, lane + i * WARP, T.float32(0.0))
                        if lane + i * WARP < num_experts:
                            u[i] = scores[token, lane + i * WARP]
                # Slot k on lane k: its expert, score and gradient (0 for an empty slot)
                idx = -1
                u_k = 0.0
                g_k = 0.0
                dot = 0.0
                if lane < num_topk:
                    idx = T.cast(topk_idx[token, lane], T.int32)
                    if idx >= 0:
                        u_k = scores[token, idx]
                        g_k = grad_topk_weights[token, lane]
                    dot = g_k * topk_weights[token, lane]
                topk_sum = u_k
                warp_sum(topk_sum)
                warp_sum(dot)
                r_k = (routed_scaling_factor * g_k - dot) / (topk_sum + T.float32(1e-20))
                # Each slot lane sums, in slot order, the route gradients of the slots choosing its expert (from 0, as a
                # register accumulator would); the last such slot stores the sum in the warp's row
                r_sum = 0.0
                last = 1
                for k in T.serial(num_topk):
                    other = T.shfl_sync(idx, k)
                    r_other = T.shfl_sync(r_k, k)
                    if other == idx:
                        r_sum += r_other
                        if k > lane:
                            last = 0
                T.call_extern("int32", "tkaot_sync_warp")  # the zeroed row before the stores
                if idx >= 0 and idx < num_experts and last != 0:
                    T.call_extern("int32", "tkaot_route_put", warp, idx, r_sum)
                T.call_extern("int32", "tkaot_sync_warp")
                for i in T.unroll(PER_LANE):
                    if i * WARP < num_experts:
                        du[i] = T.call_extern("float32", "tkaot_route_get", warp, lane + i * WARP)
                if has_aux != 0:
                    seq = T.alloc_var(T.int32, init=token // tokens_per_seq)
                    u_sum = 0.0
                    aux_dot = 0.0
                    for i in T.unroll(PER_LANE):
                        h[i] = 0.0
                        if i * WARP < num_experts and lane + i * WARP < num_experts:
                            h[i] = grad_scores_sum[seq, lane + i * WARP]
                        # every slot, the empty ones adding 0: sums of the order (and signed zeros) they always had
                        u_sum += u[i]
                        aux_dot += h[i] * u[i]
                    warp_sum(u_sum)
                    warp_sum(aux_dot)
                    inv = T.if_then_else(mask[token], T.float32(1.0) / u_sum, T.float32(0.0))
                    for i in T.unroll(PER_LANE):
                        if i * WARP < num_experts:
                            du[i] += (h[i] - aux_dot * inv) * inv
                for i in T.unroll(PER_LANE):
                    if lane + i * WARP < num_experts:
                        grad_logits[token, lane + i * WARP] = T.if_then_else(
                            u[i] > 0,
                            -T.call_extern("float32", "expm1f", -u[i] * u[i]) / (2 * u[i]) * du[i],
                            T.float32(0.0),
                        )

    return moe_topk_gate_backward
