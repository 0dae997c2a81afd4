"""moe_topk_gate_forward's backward: the gradient of the logits from those of the top-k weights (+ the aux term).

With u = scores = sqrt(softplus(logits)), chosen experts e_k (k < num_topk; -1 marks an empty slot), the
chosen scores' sum D = sum_k u[e_k] and the weights w_k = routed_scaling_factor * u[e_k] / (D + 1e-20):
    du[e] = sum over k with e_k = e of (routed_scaling_factor * dw_k - <dw, w>) / (D + 1e-20)
With an aux gradient h (grad_scores_sum: one row per sequence of tokens_per_seq tokens), tokens whose mask
is set add the gradient of u / sum(u):
    du[e] += (h[e] - <h, u> / sum(u)) / sum(u)
and dlogits = du * dsqrt(softplus)/dx, recovered from u as (1 - exp(-u^2)) / (2u) (0 at u = 0; logit_grad).

One warp a token, `warps` tokens a block (the tiling, "scatter<warps>"): lane l holds experts l, l + 32, ... (up to
MAX_EXPERTS), so every sum is a warp shuffle reduction (16, 8, 4, 2, 1 lanes apart, the order of moe_topk_gate's
sums); lane k holds slot k. The kernel is latency-bound (8192 tokens are two waves of warps on an H200), so every
global load a token needs is issued first, together: its scores row, its slots, and with the aux term its mask and
h row; the chosen scores are then read from the warp's copy of its row in shared memory rather than by a second,
dependent global load. The route gradients reach their experts through another shared row a warp: a slot whose
expert no other slot of the token chose stores its own gradient (0 + r, as a sum from 0 would); when some expert is
chosen twice (a fixed routing; one vote a warp finds out), each slot lane adds, in slot order, the gradients of
every slot choosing its expert, and the last of those slots stores the sum: no atomics, and the same bytes from
run to run, repeated experts included. Slots of experts past num_experts are
skipped by branches uniform over the warp. Token, expert and slot counts are runtime values: one variant.
"""

import tilelang.language as T

from kernels_src.moe.common import WARP, warp_sum
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._moe.kernels import MAX_EXPERTS, MAX_TOPK, MOE_TOPK_GATE_BACKWARD

DECL = MOE_TOPK_GATE_BACKWARD  # the declaration this module builds (tkaot/_moe/kernels.py)

PER_LANE = MAX_EXPERTS // WARP
TILING_PREFIX = "scatter"  # "scatter<tokens a block>": route gradients scattered through shared memory

# d/dx sqrt(softplus(x)) = (1 - exp(-v)) / (2u), v = u^2. Below v = 1, where 1 - exp(-v) cancels, u * Q(v) with
# Q(v) ~ (1 - exp(-v)) / (2v): a degree-6 least-squares fit of ours (weights 1/Q at 4000 Chebyshev nodes of [0, 1],
# coefficients rounded to fp32), 1e-7 relative in fp32 Horner order; above, the fast exponential and division
# (a few ulps: no cancellation there). The exact expm1f and IEEE division cost ~40 instructions an expert.
DERIVATIVE_POLY = (
    0.5, -0.24999988079071045, 0.08333152532577515, -0.020822685211896896, 0.004136354196816683,
    -0.00064916379051283, 6.41353617538698e-05,
)  # fmt: skip

# The warp's rows (its scores, then its route gradients), reached through these helpers: a TileLang shared buffer
# would have its storage-sync pass put block-wide barriers between the stores and loads that only one warp makes
ROWS_SOURCE = """
__shared__ float tkaot_gate_rows[2][{warps}][{experts}];
__device__ __forceinline__ int tkaot_row_put(int row, int warp, int expert, float value) {{
    tkaot_gate_rows[row][warp][expert] = value;
    return 0;
}}
__device__ __forceinline__ float tkaot_row_get(int row, int warp, int expert) {{ return tkaot_gate_rows[row][warp][expert]; }}
__device__ __forceinline__ int tkaot_sync_warp() {{
    __syncwarp();
    return 0;
}}
// Whether any lane's expert (idx >= 0) is another lane's too. Every lane of the warp must reach both full-mask
// intrinsics: the match is taken before the test of idx (behind `&&`, lanes of empty slots skipped it: a hang)
__device__ __forceinline__ int tkaot_any_repeated(int idx) {{
    const unsigned peers = __match_any_sync(0xffffffffu, idx);
    return __any_sync(0xffffffffu, (idx >= 0) & (__popc(peers) > 1));
}}
"""
SCORES_ROW, ROUTE_ROW = 0, 1


def logit_grad(u, du):
    """du * dsqrt(softplus)/dx at the score u; 0 where u <= 0 (or NaN), whatever du."""
    v = u * u
    q = T.float32(DERIVATIVE_POLY[-1])
    for c in reversed(DERIVATIVE_POLY[:-1]):
        q = q * v + T.float32(c)
    above = T.call_extern("float32", "__fdividef", 1.0 - T.call_extern("float32", "__expf", -v), 2 * u)
    return T.if_then_else(u > 0, T.if_then_else(v < 1.0, u * q, above) * du, T.float32(0.0))


def build(tiling: str):
    return gate_backward_kernel(int(tiling.removeprefix(TILING_PREFIX)))


def gate_backward_kernel(warps: int, min_blocks: int = 1, grad=logit_grad):
    """The kernel at `warps` tokens a block (`min_blocks`: a launch bound; `grad`: (u, du) -> the logit's gradient)."""
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
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            T.import_source(PDL_SOURCE + ROWS_SOURCE.format(warps=warps, experts=MAX_EXPERTS))
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            tid = T.get_thread_binding()
            lane = tid % WARP
            warp = tid // WARP
            token = block * warps + warp
            u = T.alloc_local((PER_LANE,), T.float32)
            h = T.alloc_local((PER_LANE,), T.float32)
            idx = T.alloc_var(T.int32)
            u_k = T.alloc_var(T.float32)
            g_k = T.alloc_var(T.float32)
            w_k = T.alloc_var(T.float32)
            masked = T.alloc_var(T.int32)
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
            du = T.alloc_var(T.float32)
            if token < num_tokens:  # the same for a whole warp: the shuffles below see every lane
                # Every global load first: the slots, the scores row, the aux term's mask and h row
                idx = -1
                g_k = 0.0
                w_k = 0.0
                if lane < num_topk:
                    idx = T.cast(topk_idx[token, lane], T.int32)
                    g_k = grad_topk_weights[token, lane]
                    w_k = topk_weights[token, lane]
                for i in T.unroll(PER_LANE):
                    u[i] = 0.0
                    if i * WARP < num_experts and lane + i * WARP < num_experts:  # uniform, then the warp's tail
                        u[i] = scores[token, lane + i * WARP]
                masked = 0
                if has_aux != 0:
                    seq = T.alloc_var(T.int32, init=token // tokens_per_seq)
                    masked = T.cast(mask[token], T.int32)
                    for i in T.unroll(PER_LANE):
                        h[i] = 0.0
                        if i * WARP < num_experts and lane + i * WARP < num_experts:
                            h[i] = grad_scores_sum[seq, lane + i * WARP]
                # The warp's scores row (the chosen scores are read from it) and its zeroed route row
                for i in T.unroll(PER_LANE):
                    if i * WARP < num_experts:
                        T.call_extern("int32", "tkaot_row_put", SCORES_ROW, warp, lane + i * WARP, u[i])
                        T.call_extern("int32", "tkaot_row_put", ROUTE_ROW, warp, lane + i * WARP, T.float32(0.0))
                T.call_extern("int32", "tkaot_sync_warp")
                # Slot k on lane k: its expert, score and gradient (0 for an empty slot)
                u_k = 0.0
                if idx >= 0 and idx < num_experts:
                    u_k = T.call_extern("float32", "tkaot_row_get", SCORES_ROW, warp, idx)
                if idx < 0:
                    g_k = 0.0
                dot = 0.0
                if lane < num_topk:
                    dot = g_k * w_k
                topk_sum = u_k
                warp_sum(topk_sum)
                warp_sum(dot)
                r_k = (routed_scaling_factor * g_k - dot) / (topk_sum + T.float32(1e-20))
                # Each slot lane sums, in slot order, the route gradients of the slots choosing its expert (from 0, as a
                # register accumulator would); the last such slot stores the sum in the warp's row. Without repeated
                # experts (uniform), the sum is the slot's own: 0 + r_k, rounded as the sum from 0 (-0 becomes +0)
                last = 1
                if T.call_extern("int32", "tkaot_any_repeated", idx) != 0:
                    r_sum = 0.0
                    for k in T.unroll(MAX_TOPK):
                        if k < num_topk:  # uniform
                            other = T.shfl_sync(idx, k)
                            r_other = T.shfl_sync(r_k, k)
                            if other == idx:
                                r_sum += r_other
                                if k > lane:
                                    last = 0
                else:
                    r_sum = T.call_extern("float32", "__fadd_rn", T.float32(0.0), r_k)
                if idx >= 0 and idx < num_experts and last != 0:
                    T.call_extern("int32", "tkaot_row_put", ROUTE_ROW, warp, idx, r_sum)
                inv = 0.0
                aux_dot = 0.0
                if has_aux != 0:
                    u_sum = 0.0
                    for i in T.unroll(PER_LANE):
                        # every slot, the empty ones adding 0: sums of the order (and signed zeros) they always had
                        u_sum += u[i]
                        aux_dot += h[i] * u[i]
                    warp_sum(u_sum)
                    warp_sum(aux_dot)
                    inv = T.if_then_else(masked != 0, T.float32(1.0) / u_sum, T.float32(0.0))
                T.call_extern("int32", "tkaot_sync_warp")  # the route row's stores before its loads
                for i in T.unroll(PER_LANE):
                    if i * WARP < num_experts:
                        du = T.call_extern("float32", "tkaot_row_get", ROUTE_ROW, warp, lane + i * WARP)
                        if has_aux != 0:
                            du += (h[i] - aux_dot * inv) * inv
                        if lane + i * WARP < num_experts:
                            grad_logits[token, lane + i * WARP] = grad(u[i], du)

    return moe_topk_gate_backward
