"""MoE top-k gate forward: scores = sqrt(softplus(logits)), stable top-k of scores + bias,
weights = score / sum(top-k scores) * routed_scaling_factor, shared-expert slots, physical map.

One warp routes one token. Each option (mask, bias, image bias, fixed routing,
unmapped indices, physical map, forced-random tokens, scores output) is a bit
of the runtime `flags`, so one cubin per (experts, top-k) serves every
combination; the branches are uniform across a warp. The token's route is
decided first, in priority order: masked > forced random > fixed > routed.
The same body (`gate`) builds the generic gate (moe_topk_gate_generic.py), over runtime sizes.
"""

from typing import NamedTuple

import tilelang.language as T

from kernels_src.moe.common import (
    TILINGS,
    WARP,
    Rows,
    load_row,
    philox_first_two,
    rows_topk,
    sqrt_softplus,
    warp_min,
    warp_sum,
    warp_token,
)
from kernels_src.pdl import kernel_entry
from tkaot._moe.kernels import MOE_TOPK_GATE

DECL = MOE_TOPK_GATE  # the declaration this module builds (tkaot/_moe/kernels.py)


# Bits of the runtime `flags` argument: which optional tensors were given.
FLAG_MASK = 1
FLAG_BIAS = 2
FLAG_IMAGE = 4
FLAG_FIX = 8
FLAG_UNMAPPED = 16
FLAG_PHYSICAL = 32
FLAG_RANDOM = 64
FLAG_SCORES = 128

DUPLICATE_STRIDE = 23333  # spreads tokens over an expert's physical copies, as TileKernels does
INT_MAX = 0x7FFFFFFF

ROUTED, MASKED, RANDOM, FIXED = 0, 1, 2, 3


def gate_dims() -> tuple:
    """The gate's runtime dims, in both backends' kernels: (num_tokens, num_physical_topk, num_logical_experts,
    num_duplicates, the stride of unmapped_topk_idx's rows)."""
    names = ("num_tokens", "num_physical_topk", "num_logical_experts", "num_duplicates", "unmapped_topk_idx_stride")
    return tuple(T.dynamic(name) for name in names)


@T.macro
def pick_route(route: T.Ref, token, flags, mask, force_random, fix_routing_mask):
    """route = the token's route, in priority order (masked > forced random > fixed > routed); nested ifs, so an
    absent tensor is never read. The Ascend kernel decides with it too."""
    if (flags & FLAG_MASK) != 0:
        if not mask[token]:
            route = MASKED
    if route == ROUTED and (flags & FLAG_RANDOM) != 0:
        if force_random[token]:
            route = RANDOM
    if route == ROUTED and (flags & FLAG_FIX) != 0:
        if fix_routing_mask[token]:
            route = FIXED


@T.macro
def physical_slot(out_idx: T.Ref, count: T.Ref, token, ep_rank, num_logical_experts, logical_count, to_physical_map):
    """out_idx (a logical expert) -> one of its physical copies, spread over the copies by ep_rank and token (an
    index outside the logical experts is kept). The Ascend kernel maps with it too."""
    if out_idx >= 0 and out_idx < T.Cast(T.int64, num_logical_experts):
        count = T.max(logical_count[out_idx], 1)
        out_idx = T.Cast(
            T.int64,
            to_physical_map[
                out_idx,
                (T.Cast(T.int64, ep_rank) + T.Cast(T.int64, token) * DUPLICATE_STRIDE) % T.Cast(T.int64, count),
            ],
        )


@T.macro
def draw_distinct(choice: T.Ref, pending: T.Ref, low: T.Ref, low_lane: T.Ref, word: T.Ref, experts: T.Ref, lane, num_physical_topk, lowest):
    """choice = this lane's expert of a forced-random token (INT_MAX past num_physical_topk), the token's picks distinct:
    lane l draws `word` mod (experts - l); taking the drawn values in increasing order, each later-lane value at or
    above the one just taken steps up by one. `lowest(low, low_lane, pending, lane)` is the backend's warp reduction:
    low = the warp's lowest pending value, low_lane = the lowest lane holding it. The Ascend kernel draws with it too."""
    if lane < num_physical_topk:
        pending = T.Cast(T.int32, word % T.Cast(T.uint32, experts - lane))
        choice = -1
    else:
        pending = INT_MAX
        choice = INT_MAX
    for _ in T.serial(num_physical_topk):
        lowest(low, low_lane, pending, lane)
        if choice == -1:
            if pending >= low and low_lane < lane:
                pending = pending + 1
            elif low_lane == lane:
                choice = pending
                pending = INT_MAX


class GateArgs(NamedTuple):
    """The gate's arguments that the route macros below read, in both backends' kernels."""

    topk_idx: T.Buffer
    topk_weights: T.Buffer
    unmapped_topk_idx: T.Buffer
    logical_count: T.Buffer
    to_physical_map: T.Buffer
    flags: T.Var
    ep_rank: T.Var
    routed_scaling_factor: T.Var
    num_experts: T.Var  # an int in the specialised kernels
    num_topk: T.Var
    num_physical_topk: T.Var
    num_shared_experts: T.Var
    num_logical_experts: T.Var


@T.macro
def store_masked(args: GateArgs, token, lane, in_range):
    """A masked token's outputs: no experts, weight 0, where in_range (True, or the Ascend kernel's token <
    num_tokens). The Ascend kernel stores with it too."""
    if in_range and lane < args.num_physical_topk:
        args.topk_idx[token, lane] = T.int64(-1)
        args.topk_weights[token, lane] = T.float32(0)
    if in_range and (args.flags & FLAG_UNMAPPED) != 0 and lane < args.num_topk:
        args.unmapped_topk_idx[token, lane] = T.int64(-1)


def route_vars() -> tuple:
    """The int32 variables random_route and store_routed take (pending, choice, low, low_lane, experts, count), for
    either backend's kernel to allocate in its place. A plain function, not a macro: a macro would hand back their
    values, not the variables."""
    return tuple(T.alloc_var(T.int32) for _ in range(6))


@T.macro
def random_route(args: GateArgs, token, lane, words: T.Ref, draws: T.Ref, weight: T.Ref, choice: T.Ref, pending: T.Ref, low: T.Ref,
                 low_lane: T.Ref, experts: T.Ref, count: T.Ref, lowest, warp_total):  # fmt: skip
    """A forced-random token's outputs from two Philox words of its lane: the uniform (0, 1] weight from `words`, the
    expert drawn from `draws` (draw_distinct; `lowest` its warp reduction) among the physical experts (the warp's sum
    of logical_count, lane j * 32 + lane's entries on the lane; `warp_total(experts, count)` the backend's warp sum)
    with the physical map, else the routed and shared ones; no unmapped expert. The Ascend kernel routes with it too."""
    weight = T.Cast(T.float32, words) * T.float32(2.0**-32) + T.float32(2.0**-33)
    if (args.flags & FLAG_PHYSICAL) != 0:
        count = 0
        for j in T.serial(T.ceildiv(args.num_logical_experts, WARP)):
            if j * WARP + lane < args.num_logical_experts:
                count = count + args.logical_count[j * WARP + lane]
        warp_total(experts, count)
    else:
        experts = args.num_experts + args.num_shared_experts
    draw_distinct(choice, pending, low, low_lane, draws, experts, lane, args.num_physical_topk, lowest)
    if lane < args.num_physical_topk:
        args.topk_idx[token, lane] = T.Cast(T.int64, choice)
        args.topk_weights[token, lane] = weight
    if (args.flags & FLAG_UNMAPPED) != 0 and lane < args.num_topk:
        args.unmapped_topk_idx[token, lane] = T.int64(-1)


@T.macro
def store_routed(args: GateArgs, token, lane, in_range, out_idx: T.Ref, weight: T.Ref, count: T.Ref, score: T.Ref, total: T.Ref):
    """A routed or fixed token's outputs, out_idx its expert on a top-k lane: the weight score / total *
    routed_scaling_factor (and the unmapped expert), on the lanes after them the shared experts at weight 1; then the
    physical map and the stores, where in_range (as for store_masked). The Ascend kernel stores with it too."""
    if lane < args.num_topk:
        weight = score / total * args.routed_scaling_factor
        if in_range and (args.flags & FLAG_UNMAPPED) != 0:
            args.unmapped_topk_idx[token, lane] = out_idx
    elif lane < args.num_physical_topk:
        weight = T.float32(1)
        out_idx = T.Cast(T.int64, args.num_experts + lane - args.num_topk)
    if (args.flags & FLAG_PHYSICAL) != 0 and lane < args.num_physical_topk:
        physical_slot(out_idx, count, token, args.ep_rank, args.num_logical_experts, args.logical_count, args.to_physical_map)
    if in_range and lane < args.num_physical_topk:
        args.topk_idx[token, lane] = out_idx
        args.topk_weights[token, lane] = weight


@T.macro
def warp_total(total: T.Ref, value: T.Ref):
    """random_route's warp sum, by shuffles (value is summed in place)."""
    warp_sum(value)
    total = value  # noqa: F841 (a T.Ref: the caller's variable is written)


@T.macro
def warp_lowest(low: T.Ref, low_lane: T.Ref, pending: T.Ref, lane):
    """draw_distinct's warp reduction, by shuffles."""
    low = pending
    warp_min(low)
    low_lane = T.if_then_else(pending == low, lane, INT_MAX)
    warp_min(low_lane)


def build(num_experts: int, num_topk: int, tiling: str):
    if num_topk > num_experts:
        raise ValueError(f"num_topk={num_topk} exceeds num_experts={num_experts}")
    return gate(num_experts, num_topk, tiling, Rows.of(num_experts))


def gate(num_experts, num_topk, tiling: str, rows: Rows):
    """The gate over `rows` (common.Rows) of num_experts; the generic gate passes runtime sizes and layout."""
    warps = TILINGS[tiling]  # tokens per block
    vec, chunks = rows.vec, rows.chunks
    num_tokens, num_physical_topk, num_logical_experts, num_duplicates, unmapped_stride = gate_dims()

    @T.prim_func
    def moe_topk_gate(
        logits: T.Tensor[(num_tokens, num_experts), T.float32],
        bias: T.Tensor[(num_experts,), T.float32],
        image_bias: T.Tensor[(num_experts,), T.float32],
        image_token_mask: T.Tensor[(num_tokens,), T.bool],
        mask: T.Tensor[(num_tokens,), T.bool],
        fix_routing_mask: T.Tensor[(num_tokens,), T.bool],
        force_random: T.Tensor[(num_tokens,), T.bool],
        to_physical_map: T.Tensor[(num_logical_experts, num_duplicates), T.int32],
        logical_count: T.Tensor[(num_logical_experts,), T.int32],
        topk_idx: T.Tensor[(num_tokens, num_physical_topk), T.int64],
        topk_weights: T.Tensor[(num_tokens, num_physical_topk), T.float32],
        unmapped_topk_idx: T.StridedTensor[(num_tokens, num_topk), (unmapped_stride, 1), T.int64],
        scores: T.Tensor[(num_tokens, num_experts), T.float32],
        num_shared_experts: T.int32,
        routed_scaling_factor: T.float32,
        ep_rank: T.int32,
        flags: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as block:
            kernel_entry()
            lane, token = warp_token(block, warps)
            if isinstance(num_experts, int):
                row = token
            else:
                T.assume(num_experts % 4 == 0)  # the generic gate's rows: whole 16-byte vectors (the op checks)
                # the row's offset in 64 bits: a variable, as TileLang narrows int64(token) * num_experts to 32
                row = T.alloc_var(T.int64, init=T.Cast(T.int64, token))
            vals = T.alloc_local((rows.slots,), T.float32)
            shift = T.alloc_local((rows.slots,), T.float32)
            route = T.alloc_var(T.int32, init=ROUTED)
            image = T.alloc_var(T.bool, init=False)
            idx = T.alloc_var(T.int32, init=-1)
            score = T.alloc_var(T.float32, init=0.0)
            total = T.alloc_var(T.float32)
            weight = T.alloc_var(T.float32, init=0.0)
            out_idx = T.alloc_var(T.int64, init=-1)
            r0 = T.alloc_var(T.uint32)
            r1 = T.alloc_var(T.uint32)
            pending, choice, low, low_lane, experts, count = route_vars()
            args = GateArgs(topk_idx, topk_weights, unmapped_topk_idx, logical_count, to_physical_map, flags, ep_rank,
                            routed_scaling_factor, num_experts, num_topk, num_physical_topk, num_shared_experts,
                            num_logical_experts)  # fmt: skip
            if token < num_tokens:
                pick_route(route, token, flags, mask, force_random, fix_routing_mask)

                if route == MASKED:
                    store_masked(args, token, lane, True)
                elif route == RANDOM:
                    # Distinct random physical experts, uniform (0, 1] weights, from Philox
                    # keyed by ep_rank at subsequence token * 32 + lane.
                    key = T.alloc_var(T.uint32, init=T.Cast(T.uint32, ep_rank))
                    counter = T.alloc_var(T.uint32, init=T.Cast(T.uint32, token * WARP + lane))
                    philox_first_two(key, counter, r0, r1)
                    random_route(args, token, lane, r0, r1, weight, choice, pending, low, low_lane, experts, count, warp_lowest, warp_total)
                else:
                    # Scores, written out if asked, then the bias the ranking adds
                    load_row(vals, logits, token, lane, rows)
                    for c in T.unroll(chunks):
                        if rows.held(c, lane):
                            for j in T.unroll(vec):
                                vals[c * vec + j] = sqrt_softplus(vals[c * vec + j])
                            if (flags & FLAG_SCORES) != 0:
                                for j in T.vectorized(vec):
                                    scores[token, rows.base(c, lane) + j] = vals[c * vec + j]
                    if (flags & FLAG_IMAGE) != 0:
                        image = image_token_mask[token]
                    if image or (flags & FLAG_BIAS) != 0:
                        for c in T.unroll(chunks):
                            base = rows.base(c, lane)
                            if rows.held(c, lane):
                                if image:
                                    for j in T.vectorized(vec):
                                        shift[c * vec + j] = image_bias[base + j]
                                else:
                                    for j in T.vectorized(vec):
                                        shift[c * vec + j] = bias[base + j]
                                for j in T.unroll(vec):
                                    vals[c * vec + j] = vals[c * vec + j] + shift[c * vec + j]

                    if route == ROUTED:
                        rows_topk(vals, lane, num_topk, idx, rows)
                        out_idx = T.Cast(T.int64, idx)
                    elif lane < num_topk:
                        out_idx = unmapped_topk_idx[token, lane]

                    # The chosen experts' unbiased scores, recomputed from the (cached) logits:
                    # the same function of the same input, so the same bits as above.
                    # A fixed index outside [0, num_experts) weighs 0.
                    if lane < num_topk and out_idx >= 0 and out_idx < num_experts:
                        score = sqrt_softplus(logits[row, out_idx])
                    total = score
                    warp_sum(total)
                    total = total + T.float32(1e-20)

                    store_routed(args, token, lane, True, out_idx, weight, count, score, total)

                if route == MASKED or route == RANDOM:
                    if (flags & FLAG_SCORES) != 0:
                        for c in T.unroll(chunks):
                            if rows.held(c, lane):
                                for j in T.vectorized(vec):
                                    scores[token, rows.base(c, lane) + j] = T.float32(0)

    return moe_topk_gate
