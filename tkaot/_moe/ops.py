"""tkaot.moe: TileKernels-compatible MoE routing ops (top-k gate, weight normalisation)."""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._moe.kernels import GATE_TILINGS, MAX_EXPERTS, MAX_TOPK, MOE_TOPK_GATE, NORMALIZE_WEIGHT, TOPK_GATE
from tkaot._op import OpKernels, current_stream
from tkaot._validate import Let, Rule, Signature, Tensor, lazy_checker

_MAX_GATE_TOKENS = 2**26  # token * 32 + lane is the random stream's 32-bit subsequence
_GATE_TILING = _TOPK_TILING = GATE_TILINGS["default"]
_F32, _I32, _I64, _BOOL = torch.float32, torch.int32, torch.int64, torch.bool


def _is_int(name: str) -> str:
    """The check that an argument is an int (not a bool): type() first, the rest only for int subclasses."""
    return f"type({name}) is int or (isinstance({name}, int) and not isinstance({name}, bool))"


def _int_rules(name: str, low: str, high: str, after: str = "", when: str = "", within: str = "") -> tuple[Rule, Rule]:
    """An int argument in [low, high] (expressions), checked only `when` given; `within`: the same test written
    more cheaply (a min() in `high` as two comparisons), `high` then only naming the bound in the error."""
    guard = f"not ({when}) or " if when else ""
    return (
        Rule(name, f"{guard}{_is_int(name)}", "an int", error="TypeError", after=after),
        Rule(name, f"{guard}{within or f'{low} <= {name} <= {high}'}", f"in [{{{low}}}, {{{high}}}]", after=after),
    )


def _num_topk_rules(after: str = "") -> tuple[Rule, Rule]:
    """num_topk an int in [1, min(num_experts, MAX_TOPK)] (tested as two comparisons, without a min() call)."""
    within = f"1 <= num_topk <= {MAX_TOPK} and num_topk <= num_experts"
    return _int_rules("num_topk", "1", f"min(num_experts, {MAX_TOPK})", after=after, within=within)


def _needs(given: str, missing: str, why: str = "give both or neither") -> Rule:
    return Rule(given, f"{missing} is not None", message=f"{given} needs {missing}; {why}", after=given)


def _per_token(name: str) -> Rule:
    """A bool tensor of any shape with one element per token, as TileKernels allows."""
    return Rule(
        name, f"h_{name}.numel() == num_tokens", "of {num_tokens} elements (one per token)",
        actual=f"f'{{h_{name}.numel()}} (shape {{tuple(h_{name})}})'", after=name,
    )  # fmt: skip


# Bits of the gate kernel's runtime `flags` (kernels_src/moe/moe_topk_gate.py), one per optional tensor
_FLAGS = ("mask", "bias", "image_bias", "fix_routing_mask", "unmapped_topk_idx", "to_physical_map", "force_random", "scores")
_LOGITS = "logits"
GATE_SIGNATURE = Signature(
    "tkaot.moe.moe_topk_gate_forward",
    tensors=(
        Tensor("logits", (_F32,), (("num_tokens", "num_experts"),), layout="contiguous", align=16, what="2-D (num_tokens, num_experts)"),
        Tensor("mask", (_BOOL,), None, layout="contiguous", optional=True),
        Tensor("bias", (_F32,), (("num_experts",),), layout="contiguous", align=16, optional=True),
        Tensor("image_bias", (_F32,), (("num_experts",),), layout="contiguous", align=16, optional=True),
        Tensor("image_token_mask", (_BOOL,), (("num_tokens",),), layout="contiguous", optional=True),
        Tensor("unmapped_topk_idx", (_I64,), (("num_tokens", "num_topk"),), layout="any", optional=True),
        Tensor("fix_routing_mask", (_BOOL,), (("num_tokens",),), layout="contiguous", optional=True),
        Tensor(
            "to_physical_map",
            (_I32,),
            (("num_logical", "num_duplicates"),),
            layout="contiguous",
            optional=True,
            what="2-D (experts + shared slots, duplicates)",
        ),
        Tensor("logical_count", (_I32,), (("num_logical",),), layout="contiguous", optional=True),
        Tensor("force_random", (_BOOL,), None, layout="contiguous", optional=True),
        Tensor("scores", (_F32,), (("num_tokens", "num_experts"),), layout="contiguous", align=16, optional=True),
        Tensor("topk_idx", (_I64,), (("num_tokens", "num_slots"),), layout="contiguous", optional=True, label="out[0] (topk_idx)"),
        Tensor("topk_weights", (_F32,), (("num_tokens", "num_slots"),), layout="contiguous", optional=True, label="out[1] (topk_weights)"),
    ),
    unpack={"out": ("topk_idx", "topk_weights")},
    scalars=("num_topk", "use_shared_as_routed", "num_shared_experts", "ep_rank", "scoring_func"),
    dims=("num_tokens", "num_experts", "num_shared", "num_slots", "num_logical", "num_duplicates", "unmapped_stride", "flags"),
    defaults={"num_duplicates": 0, "unmapped_stride": 0, "flags": 0},
    rules=(
        Rule(
            "logits",
            f"4 <= num_experts <= {MAX_EXPERTS} and num_experts % 4 == 0",
            f"of a multiple of 4 in [4, {MAX_EXPERTS}] experts",
            actual="f'{num_experts} (shape {tuple(h_logits)})'",
            after=_LOGITS,
        ),
        Rule("logits", f"num_tokens < {_MAX_GATE_TOKENS}", f"of fewer than {_MAX_GATE_TOKENS} tokens", actual="num_tokens", after=_LOGITS),
        Rule("scoring_func", "scoring_func == 'sqrtsoftplus'", "'sqrtsoftplus'", actual="repr(scoring_func)", after=_LOGITS),
        *_num_topk_rules(after=_LOGITS),
        *_int_rules("ep_rank", "0", "_MAX_I32", after=_LOGITS),
        *_int_rules("num_shared_experts", "1", "2", after=_LOGITS, when="use_shared_as_routed"),
        Let("num_shared", "num_shared_experts if use_shared_as_routed else 0", after=_LOGITS),
        Let("num_slots", "num_topk + num_shared", after=_LOGITS),
        Rule("num_topk + num_shared_experts", f"num_slots <= {MAX_TOPK}", f"at most {MAX_TOPK}", actual="num_slots", after=_LOGITS),
        Let("num_logical", "num_experts + num_shared", after=_LOGITS),
        _per_token("mask"),
        _needs("image_bias", "image_token_mask"),
        _needs("image_token_mask", "image_bias"),
        Rule(
            "unmapped_topk_idx",
            "(num_topk <= 1 or s_unmapped_topk_idx[1] == 1) and 0 <= s_unmapped_topk_idx[0] <= _MAX_I32",
            "of column stride 1 and row stride in [0, 2**31)",
            actual="f'strides {s_unmapped_topk_idx}'",
            after="unmapped_topk_idx",
        ),
        Let("unmapped_stride", "s_unmapped_topk_idx[0]", after="unmapped_topk_idx"),
        _needs("fix_routing_mask", "unmapped_topk_idx", why="it holds the fixed experts"),
        _needs("to_physical_map", "logical_count"),
        Rule(
            "to_physical_map",
            "num_logical * num_duplicates <= _MAX_I32",
            "of fewer than 2**31 elements",
            actual="num_logical * num_duplicates",
            after="to_physical_map",
        ),
        _needs("logical_count", "to_physical_map"),
        _per_token("force_random"),
        # the kernel's flags: a bit per optional tensor given
        *(Let("flags", f"flags | {1 << bit}", after=name) for bit, name in enumerate(_FLAGS)),
    ),
)
_PHYSICAL = 1 << _FLAGS.index("to_physical_map")


_check_gate = lazy_checker(GATE_SIGNATURE, globals(), "_check_gate")


_COUNT_AND_SHAPE = "f'{num_experts} (shape {tuple(h_scores)})'"
TOPK_SIGNATURE = Signature(
    "tkaot.moe.topk_gate",
    tensors=(
        Tensor("scores", (_F32,), (("num_tokens", "num_experts"),), layout="contiguous", align=4, what="2-D (num_tokens, num_experts)"),
    ),
    scalars=("num_topk",),
    dims=("num_tokens", "num_experts"),
    rules=(
        Rule("scores", f"1 <= num_experts <= {MAX_EXPERTS}", f"of 1 to {MAX_EXPERTS} experts", actual=_COUNT_AND_SHAPE),
        Rule("scores", "num_tokens <= _MAX_I32", "of fewer than 2**31 tokens", actual="num_tokens"),
        Rule(
            "scores",
            "num_experts % 4 or p_scores % 16 == 0",
            "16-byte aligned (experts a multiple of 4)",
            actual="f'address {p_scores:#x}'",
        ),
        *_num_topk_rules(),
    ),
)


_check_topk = lazy_checker(TOPK_SIGNATURE, globals(), "_check_topk")


NORMALIZE_SIGNATURE = Signature(
    "tkaot.moe.normalize_weight",
    tensors=(Tensor("topk_weights", (_F32,), (("num_tokens", "num_topk"),), layout="contiguous", what="2-D (num_tokens, num_topk)"),),
    dims=("num_tokens", "num_topk"),
    rules=(
        Rule(
            "topk_weights",
            f"1 <= num_topk <= {MAX_TOPK}",
            f"of 1 to {MAX_TOPK} weights a token",
            actual="f'{num_topk} (shape {tuple(h_topk_weights)})'",
        ),
        Rule("topk_weights", "num_tokens <= _MAX_I32", "of fewer than 2**31 tokens", actual="num_tokens"),
    ),
)


_check_normalize = lazy_checker(NORMALIZE_SIGNATURE, globals(), "_check_normalize")


_GATE = OpKernels(GATE_SIGNATURE.op, MOE_TOPK_GATE)
_TOPK = OpKernels(TOPK_SIGNATURE.op, TOPK_GATE)
_NORMALIZE = OpKernels(NORMALIZE_SIGNATURE.op, NORMALIZE_WEIGHT)


def moe_topk_gate_forward(
    logits: torch.Tensor,
    num_topk: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    scoring_func: str = "sqrtsoftplus",
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    image_bias: torch.Tensor | None = None,
    image_token_mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
    force_random: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    scores: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route each token to its top-k experts: scores = sqrt(softplus(logits)), ranked with a bias.

    Per token: the num_topk largest of scores + bias (image_bias for image tokens)
    are chosen, ties to the lower expert index (a stable descending sort); their
    weights are score / (sum of the chosen scores + 1e-20) * routed_scaling_factor,
    computed on the unbiased scores. With use_shared_as_routed, num_shared_experts
    (1 or 2) more slots follow, holding experts num_experts, num_experts + 1 with
    weight 1. With to_physical_map / logical_count, every slot's logical expert e
    becomes to_physical_map[e, (ep_rank + token * 23333) % logical_count[e]].

    Args:
        logits: (num_tokens, num_experts) float32, contiguous; num_experts a multiple
            of 4 in [4, 512].
        num_topk: experts chosen per token, 1..num_experts; with the shared slots at most 32.
        use_shared_as_routed: append the shared-expert slots (else num_shared_experts is ignored).
        num_shared_experts: 1 or 2 when use_shared_as_routed.
        routed_scaling_factor: multiplies the routed weights.
        ep_rank: this expert-parallel rank, >= 0; picks among physical copies and
            seeds the random routes.
        scoring_func: must be "sqrtsoftplus".
        mask: optional bool, one per token; False tokens are not routed: every slot
            gets index -1 and weight 0, unmapped_topk_idx -1, scores 0.
        bias: optional (num_experts,) float32 added to the scores for ranking only.
        image_bias, image_token_mask: together or not at all; (num_experts,) float32
            and (num_tokens,) bool; image tokens rank with image_bias instead of bias.
        fix_routing_mask: optional (num_tokens,) bool; needs unmapped_topk_idx. True
            tokens keep the experts already in unmapped_topk_idx (an index outside
            [0, num_experts) passes through with weight 0, unmapped).
        to_physical_map, logical_count: together or not at all; int32
            (num_experts + shared slots, duplicates) and (num_experts + shared slots,);
            every count must be >= 1 and name valid columns.
        unmapped_topk_idx: optional int64 (num_tokens, num_topk) with unit column
            stride; receives the logical expert indices.
        force_random: optional (num_tokens,) bool; True tokens (unless masked) get
            distinct uniformly random physical experts and uniform (0, 1] weights
            (Philox keyed by ep_rank, reproducible), unmapped_topk_idx -1 and scores 0.
            It wins over fix_routing_mask.
        out: optional (topk_idx int64, topk_weights float32) buffers of shape
            (num_tokens, num_topk + shared slots), contiguous.
        scores: optional (num_tokens, num_experts) float32 buffer for the unbiased scores.

    Returns:
        (topk_idx int64, topk_weights float32), each (num_tokens, num_topk + shared slots).

    Logits must be finite; a non-finite logit gives an unspecified (but in-bounds) route.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_moe_topk_gate_forward(
            logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func, mask, bias,
            image_bias, image_token_mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx, force_random, out, scores
        )  # fmt: skip
    (
        device, num_tokens, num_experts, num_shared, num_slots, num_logical, num_duplicates, unmapped_stride, flags,
        logits_ptr, mask_ptr, bias_ptr, image_bias_ptr, image_mask_ptr, unmapped_ptr, fix_ptr, map_ptr, count_ptr,
        random_ptr, scores_ptr, idx_ptr, weights_ptr, _,
    ) = _check_gate(
        logits, mask, bias, image_bias, image_token_mask, unmapped_topk_idx, fix_routing_mask, to_physical_map,
        logical_count, force_random, scores, out, num_topk, use_shared_as_routed, num_shared_experts, ep_rank, scoring_func,
    )  # fmt: skip
    if out is None:
        topk_idx = logits.new_empty((num_tokens, num_slots), dtype=torch.int64)
        topk_weights = logits.new_empty((num_tokens, num_slots))
        idx_ptr, weights_ptr = topk_idx.data_ptr(), topk_weights.data_ptr()
    else:
        topk_idx, topk_weights = out
    if num_tokens == 0:
        return topk_idx, topk_weights

    launcher = _GATE.cache.get((device, num_experts, num_topk))
    if launcher is None:
        launcher = _GATE.cache[device, num_experts, num_topk] = _GATE.get(device, num_experts, num_topk, _GATE_TILING)
    launcher(
        device,
        current_stream(device),
        logits_ptr, bias_ptr, image_bias_ptr, image_mask_ptr, mask_ptr, fix_ptr, random_ptr,
        map_ptr, count_ptr, idx_ptr, weights_ptr, unmapped_ptr, scores_ptr,
        num_shared, float(routed_scaling_factor), ep_rank, flags,
        num_tokens, num_logical if flags & _PHYSICAL else 0, num_duplicates, num_slots, unmapped_stride,
    )  # fmt: skip
    return topk_idx, topk_weights


def moe_topk_gate(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """The same op as moe_topk_gate_forward, under its earlier name."""
    return moe_topk_gate_forward(*args, **kwargs)


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Indices of each token's num_topk largest scores, largest first, ties to the lower index.

    Args:
        scores: (num_tokens, num_experts) float32, contiguous, num_experts in [1, 512]; finite.
        num_topk: 1..min(num_experts, 32).

    Returns:
        (num_tokens, num_topk) int64, contiguous.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_topk_gate(scores, num_topk)
    device, num_tokens, num_experts, scores_ptr = _check_topk(scores, num_topk)
    topk_idx = scores.new_empty((num_tokens, num_topk), dtype=torch.int64)
    if num_tokens == 0:
        return topk_idx
    launcher = _TOPK.get(device, num_experts, num_topk, _TOPK_TILING)
    launcher(device, current_stream(device), scores_ptr, topk_idx.data_ptr(), num_tokens)
    return topk_idx


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale each token's weights to sum to one.

    denominator = 1e-20 + sum(weights), summed in the order moe_topk_gate_forward
    sums its top-k scores; normalized = weights / denominator.

    Args:
        topk_weights: (num_tokens, num_topk) float32, contiguous, num_topk <= 32.

    Returns:
        (denominator of shape (num_tokens,), normalized weights of shape (num_tokens, num_topk)).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_normalize_weight(topk_weights)
    device, num_tokens, num_topk, weights_ptr = _check_normalize(topk_weights)
    denominator = torch.empty((num_tokens,), dtype=torch.float32, device=topk_weights.device)
    normalized = torch.empty_like(topk_weights)
    if num_tokens == 0:
        return denominator, normalized
    launcher = _NORMALIZE.get(device, num_topk)
    launcher(device, current_stream(device), weights_ptr, denominator.data_ptr(), normalized.data_ptr(), num_tokens)
    return denominator, normalized


__all__ = ["moe_topk_gate", "moe_topk_gate_forward", "normalize_weight", "topk_gate"]


# ---- tracing (tkaot/_compile.py): each op's outputs, allocated through `new`


def _fake_gate(
    new, logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func="sqrtsoftplus",
    mask=None, bias=None, image_bias=None, image_token_mask=None, fix_routing_mask=None, to_physical_map=None, logical_count=None,
    unmapped_topk_idx=None, force_random=None, out=None, scores=None,
):  # fmt: skip
    if out is not None:
        return out
    slots = (logits.shape[0], num_topk + (num_shared_experts if use_shared_as_routed else 0))
    return new.empty(slots, _I64, logits.device), new.empty(slots, _F32, logits.device)


def _fake_topk(new, scores, num_topk):
    return new.empty((scores.shape[0], num_topk), _I64, scores.device)


def _fake_normalize(new, topk_weights):
    return new.empty(topk_weights.shape[:1], _F32, topk_weights.device), new.empty_like(topk_weights)


_traced_moe_topk_gate_forward = traced(moe_topk_gate_forward, _fake_gate, mutates=("unmapped_topk_idx", "out", "scores"), outputs=2)
_traced_topk_gate = traced(topk_gate, _fake_topk)
_traced_normalize_weight = traced(normalize_weight, _fake_normalize, outputs=2)
