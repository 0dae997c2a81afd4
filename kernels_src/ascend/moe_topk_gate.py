"""MoE top-k gate forward for Ascend: scores = sqrt(softplus(logits)), stable top-k of scores + bias, weights =
score / (sum of the top-k scores + 1e-20) * routed_scaling_factor, shared-expert slots, the physical map.

As on CUDA (kernels_src/moe/moe_topk_gate.py), a warp of 32 SIMT threads routes one token and every option is a
bit of the runtime `flags`; the route is decided in the same priority (masked > forced random > fixed > routed)
and each route writes what the CUDA kernel writes. A block copies `TOKENS` tokens' logits into the Unified
Buffer; lane l of a token holds experts l * per .. l * per + per - 1 (the CUDA kernel's order), each round of the
selection takes the warp's largest remaining value (T.warp_reduce_max) from its lowest lane, so ties go to the
lower expert index. Forced-random tokens draw from the same Philox stream (kernels_src/moe/common.py) with the
CUDA kernel's draw (draw_distinct), so they pick the CUDA kernel's experts. Outputs whose width is a runtime value (topk_idx, topk_weights,
unmapped_topk_idx) and the small tables (bias, masks, the physical map) are read and written from the SIMT
region directly; the scores go out through the Unified Buffer.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import fp32, refuse, stage, tensor
from kernels_src.moe.common import layout, philox_rounds
from kernels_src.moe.moe_topk_gate import (  # the CUDA kernel's bits of `flags`, routes and the steps both take
    FLAG_BIAS,
    FLAG_IMAGE,
    FLAG_SCORES,
    INT_MAX,
    MASKED,
    RANDOM,
    ROUTED,
    GateArgs,
    gate_dims,
    pick_route,
    random_route,
    route_vars,
    store_masked,
    store_routed,
)
from tkaot._moe.kernels import MOE_TOPK_GATE

DECL = MOE_TOPK_GATE
REQUIRES: dict[str, int] = {}
WARP = 32
TOKENS = 8  # tokens a block, a warp each


def unsupported(num_experts, num_topk, tiling) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if num_topk > num_experts:
        return f"num_topk={num_topk} exceeds num_experts={num_experts}"
    return None


def sqrt_softplus(x):
    # softplus with torch's threshold of 20, then sqrt (the CUDA kernel's expression)
    return T.sqrt(T.if_then_else(x > 20.0, x, T.log1p(T.exp(x))))


@T.macro
def warp_total(total: T.Ref, value: T.Ref):
    """random_route's warp sum, by the dialect's warp reduction."""
    total = T.warp_reduce_sum(value)  # noqa: F841 (a T.Ref: the caller's variable is written)


@T.macro
def warp_lowest(low: T.Ref, low_lane: T.Ref, pending: T.Ref, lane):
    """draw_distinct's warp reduction, by the dialect's warp reductions."""
    low = T.warp_reduce_min(pending)
    low_lane = T.warp_reduce_min(T.if_then_else(pending == low, lane, INT_MAX))  # noqa: F841 (a T.Ref: the caller's variable is written)


def build(num_experts: int, num_topk: int, tiling: str):
    refuse(DECL, unsupported(num_experts, num_topk, tiling))
    return moe_topk_gate_kernel(num_experts, num_topk, num_experts)


def moe_topk_gate_kernel(num_experts, num_topk, max_experts: int):
    """The kernel for `num_experts` and `num_topk` (ints, or the generic kernel's runtime values) in tiles sized for
    max_experts (num_experts itself, or the most the generic kernel takes). A lane holds `per` adjacent experts, the
    CUDA layout of max_experts; ties go to the lower expert index whatever `per` is, so the picks do not depend on it."""
    vec, chunks = layout(max_experts)
    per = vec * chunks  # experts a lane holds
    num_tokens, num_physical_topk, num_logical_experts, num_duplicates, unmapped_stride = gate_dims()
    per_expert, token_mask = fp32(num_tokens, num_experts), tensor(T.bool, num_tokens)

    @T.prim_func
    def moe_topk_gate(
        logits: per_expert,
        bias: fp32(num_experts),
        image_bias: fp32(num_experts),
        image_token_mask: token_mask,
        mask: token_mask,
        fix_routing_mask: token_mask,
        force_random: token_mask,
        to_physical_map: tensor(T.int32, num_logical_experts, num_duplicates),
        logical_count: tensor(T.int32, num_logical_experts),
        topk_idx: tensor(T.int64, num_tokens, num_physical_topk),
        topk_weights: fp32(num_tokens, num_physical_topk),
        unmapped_topk_idx: T.StridedTensor[(num_tokens, num_topk), (unmapped_stride, 1), T.int64],
        scores: per_expert,
        num_shared_experts: T.int32,
        routed_scaling_factor: T.float32,
        ep_rank: T.int32,
        flags: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, TOKENS)) as block:
            first = block * TOKENS
            logits_ub = stage(logits[first : first + TOKENS, 0:num_experts], (TOKENS, max_experts), T.float32, cols=num_experts)
            scores_ub = T.alloc_shared((TOKENS, max_experts), T.float32)
            with T.SimtVF(threads=TOKENS * WARP):
                vals = T.alloc_local((per,), T.float32)
                route = T.alloc_var(T.int32)
                image = T.alloc_var(T.bool)
                idx = T.alloc_var(T.int32)
                score = T.alloc_var(T.float32)
                total = T.alloc_var(T.float32)
                weight = T.alloc_var(T.float32)
                out_idx = T.alloc_var(T.int64)
                removed = T.alloc_var(T.uint32)
                best = T.alloc_var(T.float32)
                best_slot = T.alloc_var(T.int32)
                winner = T.alloc_var(T.int32)
                slot = T.alloc_var(T.int32)
                c0, c1, c2, c3 = (T.alloc_var(T.uint32) for _ in range(4))
                k0, k1 = T.alloc_var(T.uint32), T.alloc_var(T.uint32)
                p0, p1 = T.alloc_var(T.uint64), T.alloc_var(T.uint64)
                pending, choice, low, low_lane, experts, count = route_vars()
                args = GateArgs(topk_idx, topk_weights, unmapped_topk_idx, logical_count, to_physical_map, flags, ep_rank,
                                routed_scaling_factor, num_experts, num_topk, num_physical_topk, num_shared_experts,
                                num_logical_experts)  # fmt: skip
                for t in T.Parallel(TOKENS * WARP):
                    i, lane = t // WARP, t % WARP
                    token = first + i
                    route = ROUTED
                    image = False
                    idx = -1
                    score = T.float32(0)
                    weight = T.float32(0)
                    out_idx = T.int64(-1)
                    if token < num_tokens:
                        pick_route(route, token, flags, mask, force_random, fix_routing_mask)
                    if route == MASKED or route == RANDOM:
                        for s in T.serial(per):
                            if lane * per + s < num_experts:
                                scores_ub[i, lane * per + s] = T.float32(0)
                    if route == MASKED:
                        store_masked(args, token, lane, token < num_tokens)
                    elif route == RANDOM:
                        # Philox4x32-10 at key (ep_rank, 0), counter (0, 0, token * 32 + lane, 0): curand's stream
                        c0, c1, c3, k1 = T.uint32(0), T.uint32(0), T.uint32(0), T.uint32(0)
                        k0 = T.Cast(T.uint32, ep_rank)
                        c2 = T.Cast(T.uint32, token * WARP + lane)
                        philox_rounds(c0, c1, c2, c3, k0, k1, p0, p1)
                        random_route(
                            args, token, lane, c0, c1, weight, choice, pending, low, low_lane, experts, count, warp_lowest, warp_total
                        )
                    else:
                        # scores (kept for the output), then the bias the ranking adds
                        if token < num_tokens and (flags & FLAG_IMAGE) != 0:
                            image = image_token_mask[token]
                        for s in T.serial(per):
                            e = lane * per + s
                            vals[s] = -T.infinity(T.float32)
                            if e < num_experts:
                                vals[s] = sqrt_softplus(logits_ub[i, e])
                                scores_ub[i, e] = vals[s]
                                if image:
                                    vals[s] = vals[s] + image_bias[e]
                                elif (flags & FLAG_BIAS) != 0:
                                    vals[s] = vals[s] + bias[e]
                        if route == ROUTED:
                            # each round: the warp's largest remaining value, from its lowest lane (lowest expert)
                            removed = T.uint32(0)
                            for k in T.serial(num_topk):
                                best = -T.infinity(T.float32)
                                best_slot = INT_MAX
                                for s in T.serial(per):
                                    if lane * per + s < num_experts and ((removed >> T.Cast(T.uint32, s)) & T.uint32(1)) == T.uint32(0):
                                        if vals[s] > best or best_slot == INT_MAX:
                                            best = vals[s]
                                            best_slot = s
                                top = T.warp_reduce_max(best)
                                winner = T.warp_reduce_min(T.if_then_else(best_slot != INT_MAX and best == top, lane, INT_MAX))
                                if winner == INT_MAX:  # only when a value is NaN: any lane with slots left
                                    winner = T.warp_reduce_min(T.if_then_else(best_slot != INT_MAX, lane, INT_MAX))
                                slot = T.warp_reduce_min(T.if_then_else(lane == winner, best_slot, INT_MAX))
                                if lane == k:
                                    idx = winner * per + slot
                                if lane == winner:
                                    removed = removed | (T.uint32(1) << T.Cast(T.uint32, slot))
                            out_idx = T.Cast(T.int64, idx)
                        elif lane < num_topk:
                            out_idx = unmapped_topk_idx[token, lane]
                        # the chosen experts' unbiased scores; a fixed index outside [0, num_experts) weighs 0
                        # (recomputed from the logits, as on CUDA: another lane wrote that expert's score)
                        if lane < num_topk and out_idx >= 0 and out_idx < num_experts:
                            score = sqrt_softplus(logits_ub[i, out_idx])
                        total = T.warp_reduce_sum(score) + T.float32(1e-20)
                        store_routed(args, token, lane, token < num_tokens, out_idx, weight, count, score, total)
            if (flags & FLAG_SCORES) != 0:
                T.copy(scores_ub[:, 0:num_experts], scores[first : first + TOKENS, 0:num_experts])

    return moe_topk_gate
