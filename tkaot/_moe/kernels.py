"""Declarations of the kernels behind tkaot.moe (tkaot/_decl.py): top-k gates and weight normalisation."""

from __future__ import annotations

from tkaot._decl import Axis, KernelDecl, tiling_axis

MAX_TOPK = 32  # one warp holds a token's slots
MAX_EXPERTS = 512
# Each token's top-k found by warp ballots over 4 candidates a lane (kernels_src/moe/common.py)
GATE_TILINGS = {"default": "ballot4"}

MOE_TOPK_GATE = KernelDecl(
    name="moe_topk_gate",
    source="kernels_src.moe.moe_topk_gate",
    axes=(
        Axis("num_experts", int, check=lambda e: 4 <= e <= MAX_EXPERTS and e % 4 == 0, rule=f"a multiple of 4 in [4, {MAX_EXPERTS}]"),
        Axis("num_topk", int, check=lambda k: 1 <= k <= MAX_TOPK, rule=f"in [1, {MAX_TOPK}]"),
        tiling_axis(GATE_TILINGS),
    ),
    params=(
        "logits", "bias", "image_bias", "image_token_mask", "mask", "fix_routing_mask", "force_random",
        "to_physical_map", "logical_count", "topk_idx", "topk_weights", "unmapped_topk_idx", "scores",
        "num_shared_experts", "routed_scaling_factor", "ep_rank", "flags",
    ),
    dims=("num_tokens", "num_logical_experts", "num_duplicates", "num_physical_topk", "unmapped_topk_idx_stride"),
    ops=("tkaot.moe.moe_topk_gate_forward",),
    tilings=GATE_TILINGS,
)  # fmt: skip

TOPK_GATE = KernelDecl(
    name="topk_gate",
    source="kernels_src.moe.topk_gate",
    axes=(
        Axis("num_experts", int, check=lambda e: 1 <= e <= MAX_EXPERTS, rule=f"in [1, {MAX_EXPERTS}]"),
        Axis("num_topk", int, check=lambda k: 1 <= k <= MAX_TOPK, rule=f"in [1, {MAX_TOPK}]"),
        tiling_axis(GATE_TILINGS),
    ),
    params=("scores", "topk_idx"),
    dims=("num_tokens",),
    ops=("tkaot.moe.topk_gate",),
    tilings=GATE_TILINGS,
)

# Any expert count and k in one variant: the calls whose specialised variant is not built (tkaot/_op.py)
MOE_TOPK_GATE_GENERIC = MOE_TOPK_GATE.generic("moe_topk_gate_generic", "kernels_src.moe.moe_topk_gate_generic", ("num_experts", "num_topk"))
TOPK_GATE_GENERIC = TOPK_GATE.generic("topk_gate_generic", "kernels_src.moe.topk_gate_generic", ("num_experts", "num_topk"))

NORMALIZE_WEIGHT = KernelDecl(
    name="normalize_weight",
    source="kernels_src.moe.normalize_weight",
    axes=(Axis("num_topk", int, check=lambda k: 1 <= k <= MAX_TOPK, rule=f"in [1, {MAX_TOPK}]"),),
    params=("topk_weights", "denominator", "normalized_weights"),
    dims=("num_tokens",),
    ops=("tkaot.moe.normalize_weight",),
)
# Any number of weights a token, one variant
NORMALIZE_WEIGHT_GENERIC = NORMALIZE_WEIGHT.generic("normalize_weight_generic", "kernels_src.moe.normalize_weight_generic", ("num_topk",))

# ---- Backward (training): the gate's logits gradient. Expert and slot counts are runtime values: one variant, 4 tokens
# a block, every load of a token issued first, route gradients gathered in shared memory. Before (tuned on the H200 at
# 8192x256 top-8, TileKernels 8.0 µs), scatter1/2/4/8 tokens a block: 12.17 / 11.28 / 11.54 / 11.29 µs, within noise.
MOE_GATE_BWD_TILINGS = {"default": "scatter4"}
MOE_TOPK_GATE_BACKWARD = KernelDecl(
    name="moe_topk_gate_backward",
    source="kernels_src.moe.moe_topk_gate_backward",
    axes=(tiling_axis(MOE_GATE_BWD_TILINGS),),
    params=(
        "scores", "topk_idx", "topk_weights", "grad_topk_weights", "mask", "grad_scores_sum", "grad_logits",
        "routed_scaling_factor", "has_aux", "tokens_per_seq",
    ),
    dims=("num_tokens", "num_experts", "num_topk"),
    ops=("tkaot.moe.moe_topk_gate_backward",),
    tilings=MOE_GATE_BWD_TILINGS,
)  # fmt: skip
# ---- end of the backward kernels

KERNELS = (
    MOE_TOPK_GATE,
    MOE_TOPK_GATE_GENERIC,
    TOPK_GATE,
    TOPK_GATE_GENERIC,
    NORMALIZE_WEIGHT,
    NORMALIZE_WEIGHT_GENERIC,
    MOE_TOPK_GATE_BACKWARD,
)
