"""moe_topk_gate_forward's backward for Ascend: the logits' gradient from the top-k weights' (+ the aux term).

The math of the CUDA kernel (kernels_src/moe/moe_topk_gate_backward.py): with u = scores, the chosen experts e_k,
D = sum_k u[e_k] + 1e-20 and dw the weights' gradient,
    du[e] = sum over slots k with e_k = e, in slot order, of (routed_scaling_factor * dw_k - <dw, w>) / D
    du[e] += (h[e] - <h, u> / sum(u)) / sum(u)          (has_aux, tokens whose mask is set; h = grad_scores_sum)
    grad_logits = du * (1 - exp(-u^2)) / (2u)          (0 at u = 0)

A warp of 32 SIMT threads a token, `TOKENS` tokens a block: lane l holds experts l, l + 32, ... of the token's
scores (copied into the Unified Buffer, expert count a runtime value) and slot l; the sums are warp reductions
(T.warp_reduce_sum), and every lane forms each slot's route gradient from the slot's own values, so a repeated
expert adds its slots in slot order. The warp sums may run in another order than the CUDA kernel's shuffles, so
results may differ from it in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, stage, tensor
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.moe.moe_topk_gate_backward import gate_backward_dims
from tkaot._moe.kernels import MAX_EXPERTS, MOE_TOPK_GATE_BACKWARD

DECL = MOE_TOPK_GATE_BACKWARD
WARP = 32
TOKENS = 8  # tokens a block, a warp each
PER_LANE = MAX_EXPERTS // WARP


def build(tiling: str):
    # (the CUDA kernel's tilings; this kernel is the same for every one of them)
    num_tokens, num_experts, num_topk = gate_backward_dims()

    per_expert, per_slot = fp32(num_tokens, num_experts), fp32(num_tokens, num_topk)

    @T.prim_func
    def moe_topk_gate_backward(
        scores: per_expert,
        topk_idx: tensor(T.int64, num_tokens, num_topk),
        topk_weights: per_slot,
        grad_topk_weights: per_slot,
        mask: tensor(T.bool, num_tokens),
        grad_scores_sum: per_expert,  # one row per sequence; its extent is nominal (rows are token // tokens_per_seq)
        grad_logits: per_expert,
        routed_scaling_factor: T.float32,
        has_aux: T.int32,
        tokens_per_seq: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, TOKENS)) as block:
            first = block * TOKENS
            u_ub = stage(scores[first : first + TOKENS, 0:num_experts], (TOKENS, MAX_EXPERTS), T.float32, cols=num_experts)
            grad_ub = T.alloc_shared((TOKENS, MAX_EXPERTS), T.float32)
            with T.SimtVF(threads=TOKENS * WARP):
                u = T.alloc_local((PER_LANE,), T.float32)
                du = T.alloc_local((PER_LANE,), T.float32)
                h = T.alloc_local((PER_LANE,), T.float32)
                idx = T.alloc_var(T.int64)
                u_k = T.alloc_var(T.float32)
                g_k = T.alloc_var(T.float32)
                dot = T.alloc_var(T.float32)
                den = T.alloc_var(T.float32)
                r = T.alloc_var(T.float32)
                u_sum = T.alloc_var(T.float32)
                aux_dot = T.alloc_var(T.float32)
                inv = T.alloc_var(T.float32)
                for t in T.Parallel(TOKENS * WARP):
                    i, lane = t // WARP, t % WARP
                    token = first + i
                    # every lane takes part in the warp sums, past the last token too (with zeros)
                    for e in T.unroll(PER_LANE):
                        u[e] = T.float32(0)
                        du[e] = T.float32(0)
                        if token < num_tokens and lane + e * WARP < num_experts:
                            u[e] = u_ub[i, lane + e * WARP]
                    u_k = T.float32(0)
                    g_k = T.float32(0)
                    dot = T.float32(0)
                    if token < num_tokens and lane < num_topk:
                        idx = topk_idx[token, lane]
                        if idx >= 0:
                            u_k = u_ub[i, idx]
                            g_k = grad_topk_weights[token, lane]
                        dot = g_k * topk_weights[token, lane]
                    den = T.warp_reduce_sum(u_k) + T.float32(1e-20)
                    dot = T.warp_reduce_sum(dot)
                    if token < num_tokens:
                        # slot k's route gradient, formed by every lane, added to the lane's expert it names
                        for k in T.serial(num_topk):
                            idx = topk_idx[token, k]
                            g_k = T.float32(0)
                            if idx >= 0:
                                g_k = grad_topk_weights[token, k]
                            r = (routed_scaling_factor * g_k - dot) / den
                            for e in T.unroll(PER_LANE):
                                if idx == T.Cast(T.int64, lane + e * WARP):
                                    du[e] = du[e] + r
                    if has_aux != 0:
                        u_sum = T.float32(0)
                        aux_dot = T.float32(0)
                        for e in T.unroll(PER_LANE):
                            h[e] = T.float32(0)
                            if token < num_tokens and lane + e * WARP < num_experts:
                                h[e] = grad_scores_sum[token // tokens_per_seq, lane + e * WARP]
                            u_sum = u_sum + u[e]
                            aux_dot = aux_dot + h[e] * u[e]
                        u_sum = T.warp_reduce_sum(u_sum)
                        aux_dot = T.warp_reduce_sum(aux_dot)
                        inv = T.float32(0)
                        if token < num_tokens:
                            if mask[token]:
                                inv = T.float32(1) / u_sum
                        for e in T.unroll(PER_LANE):
                            du[e] = du[e] + (h[e] - aux_dot * inv) * inv
                    for e in T.unroll(PER_LANE):
                        grad_ub[i, lane + e * WARP] = T.if_then_else(
                            u[e] > 0, -T.call_extern("float32", "expm1f", -u[e] * u[e]) / (2 * u[e]) * du[e], T.float32(0)
                        )
            T.copy(grad_ub[:, 0:num_experts], grad_logits[first : first + TOKENS, 0:num_experts])

    return moe_topk_gate_backward
