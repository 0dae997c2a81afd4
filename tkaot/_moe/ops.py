"""tkaot.moe: TileKernels-compatible MoE routing ops (top-k gate, weight normalisation)."""

from __future__ import annotations

import torch

from tkaot._moe.kernels import GATE_TILINGS, MOE_TOPK_GATE, NORMALIZE_WEIGHT, TOPK_GATE
from tkaot._op import OpKernels, current_stream
from tkaot._validate import MAX_I32, check_cuda, fail

# Bits of the gate kernel's runtime `flags` (kernels_src/moe/moe_topk_gate.py)
_MASK, _BIAS, _IMAGE, _FIX, _UNMAPPED, _PHYSICAL, _RANDOM, _SCORES = 1, 2, 4, 8, 16, 32, 64, 128
_MAX_TOPK = 32  # one warp holds a token's slots
_MAX_GATE_TOKENS = 2**26  # token * 32 + lane is the random stream's 32-bit subsequence
_GATE_TILING = _TOPK_TILING = GATE_TILINGS["default"]

_GATE = OpKernels("tkaot.moe.moe_topk_gate_forward", MOE_TOPK_GATE)
_TOPK = OpKernels("tkaot.moe.topk_gate", TOPK_GATE)
_NORMALIZE = OpKernels("tkaot.moe.normalize_weight", NORMALIZE_WEIGHT)


def _check_int(op: str, name: str, value, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        fail(op, name, f"in [{low}, {high}]", value)
    return value


def _check_tensor(op: str, name: str, t, device: int, dtype, shape=None, numel=None, align: int = 1) -> None:
    """t is a contiguous tensor of dtype on the device, of the shape (or element count) given."""
    check_cuda(op, name, t, device)
    if t.dtype != dtype:
        fail(op, name, f"{dtype}", t.dtype)
    if shape is not None and tuple(t.shape) != tuple(shape):
        fail(op, name, f"of shape {tuple(shape)}", tuple(t.shape))
    if numel is not None and t.numel() != numel:
        fail(op, name, f"of {numel} elements (one per token)", f"{t.numel()} (shape {tuple(t.shape)})")
    if not t.is_contiguous():
        fail(op, name, "contiguous", f"strides {t.stride()}")
    if align > 1 and t.data_ptr() % align:
        fail(op, name, f"{align}-byte aligned", f"address {t.data_ptr():#x}")


def _check_gate_args(op: str, logits, num_topk, use_shared_as_routed, num_shared_experts, ep_rank, scoring_func) -> int:
    """The detailed checks of moe_topk_gate_forward's leading arguments: raises on the first bad
    one, else returns the device index."""
    device = check_cuda(op, "logits", logits)
    if logits.dtype != torch.float32:
        fail(op, "logits", "torch.float32", logits.dtype)
    if logits.dim() != 2:
        fail(op, "logits", "2-D (num_tokens, num_experts)", f"shape {tuple(logits.shape)}")
    num_tokens, num_experts = logits.shape
    if not 64 <= num_experts <= 512 or num_experts % 4:
        fail(op, "logits", "of a multiple of 4 in [64, 512] experts", f"{num_experts} (shape {tuple(logits.shape)})")
    if num_tokens >= _MAX_GATE_TOKENS:
        fail(op, "logits", f"of fewer than {_MAX_GATE_TOKENS} tokens", num_tokens)
    if not logits.is_contiguous() or logits.data_ptr() % 16:
        fail(op, "logits", "contiguous and 16-byte aligned", f"strides {logits.stride()} address {logits.data_ptr():#x}")
    if scoring_func != "sqrtsoftplus":
        fail(op, "scoring_func", "'sqrtsoftplus'", repr(scoring_func))
    _check_int(op, "num_topk", num_topk, 1, min(num_experts, _MAX_TOPK))
    _check_int(op, "ep_rank", ep_rank, 0, MAX_I32)
    num_shared = _check_int(op, "num_shared_experts", num_shared_experts, 1, 2) if use_shared_as_routed else 0
    if num_topk + num_shared > _MAX_TOPK:
        fail(op, "num_topk + num_shared_experts", f"at most {_MAX_TOPK}", num_topk + num_shared)
    return device


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
            of 4 in [64, 512].
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
    op = "tkaot.moe.moe_topk_gate_forward"
    # The hot path reads each property once and checks everything in one expression;
    # only when that fails do the detailed checks below run and raise.
    try:
        device, shape, strides, logits_ptr = logits.get_device(), logits.shape, logits.stride(), logits.data_ptr()
    except AttributeError:
        raise TypeError(f"{op}: logits must be a torch.Tensor, got {type(logits).__name__}") from None
    num_shared = num_shared_experts if use_shared_as_routed else 0
    if not (
        device >= 0
        and logits.dtype is torch.float32
        and len(shape) == 2
        and 64 <= shape[1] <= 512
        and shape[1] % 4 == 0
        and shape[0] < _MAX_GATE_TOKENS
        and strides[1] == 1
        and (strides[0] == shape[1] or shape[0] <= 1)
        and logits_ptr % 16 == 0
        and scoring_func == "sqrtsoftplus"
        and type(num_topk) is int
        and 1 <= num_topk <= shape[1]
        and type(ep_rank) is int
        and 0 <= ep_rank <= MAX_I32
        and (not use_shared_as_routed or (type(num_shared) is int and 1 <= num_shared <= 2))
        and num_topk + num_shared <= _MAX_TOPK
    ):
        device = _check_gate_args(op, logits, num_topk, use_shared_as_routed, num_shared_experts, ep_rank, scoring_func)
    num_tokens, num_experts = shape
    num_slots = num_topk + num_shared

    flags = 0
    bias_ptr = image_bias_ptr = image_mask_ptr = mask_ptr = fix_ptr = random_ptr = 0
    map_ptr = count_ptr = unmapped_ptr = scores_ptr = 0
    num_logical = num_duplicates = unmapped_stride = 0
    if mask is not None:
        _check_tensor(op, "mask", mask, device, torch.bool, numel=num_tokens)
        flags |= _MASK
        mask_ptr = mask.data_ptr()
    if bias is not None:
        _check_tensor(op, "bias", bias, device, torch.float32, shape=(num_experts,), align=16)
        flags |= _BIAS
        bias_ptr = bias.data_ptr()
    if (image_bias is None) != (image_token_mask is None):
        given, missing = ("image_bias", "image_token_mask") if image_token_mask is None else ("image_token_mask", "image_bias")
        raise ValueError(f"{op}: {given} needs {missing}; give both or neither")
    if image_bias is not None:
        _check_tensor(op, "image_bias", image_bias, device, torch.float32, shape=(num_experts,), align=16)
        _check_tensor(op, "image_token_mask", image_token_mask, device, torch.bool, shape=(num_tokens,))
        flags |= _IMAGE
        image_bias_ptr, image_mask_ptr = image_bias.data_ptr(), image_token_mask.data_ptr()
    if unmapped_topk_idx is not None:
        check_cuda(op, "unmapped_topk_idx", unmapped_topk_idx, device)
        if unmapped_topk_idx.dtype != torch.int64:
            fail(op, "unmapped_topk_idx", "torch.int64", unmapped_topk_idx.dtype)
        if tuple(unmapped_topk_idx.shape) != (num_tokens, num_topk):
            fail(op, "unmapped_topk_idx", f"of shape {(num_tokens, num_topk)}", tuple(unmapped_topk_idx.shape))
        row_stride, col_stride = unmapped_topk_idx.stride()
        if (num_topk > 1 and col_stride != 1) or not 0 <= row_stride <= MAX_I32:
            fail(op, "unmapped_topk_idx", "of column stride 1 and row stride in [0, 2**31)", f"strides {unmapped_topk_idx.stride()}")
        flags |= _UNMAPPED
        unmapped_ptr, unmapped_stride = unmapped_topk_idx.data_ptr(), row_stride
    if fix_routing_mask is not None:
        if unmapped_topk_idx is None:
            raise ValueError(f"{op}: fix_routing_mask needs unmapped_topk_idx, which holds the fixed experts")
        _check_tensor(op, "fix_routing_mask", fix_routing_mask, device, torch.bool, shape=(num_tokens,))
        flags |= _FIX
        fix_ptr = fix_routing_mask.data_ptr()
    if (to_physical_map is None) != (logical_count is None):
        given, missing = ("to_physical_map", "logical_count") if logical_count is None else ("logical_count", "to_physical_map")
        raise ValueError(f"{op}: {given} needs {missing}; give both or neither")
    if to_physical_map is not None:
        num_logical = num_experts + num_shared
        check_cuda(op, "to_physical_map", to_physical_map, device)
        if to_physical_map.dim() != 2 or to_physical_map.shape[0] != num_logical:
            fail(op, "to_physical_map", f"2-D with {num_logical} rows (experts + shared slots)", f"shape {tuple(to_physical_map.shape)}")
        _check_tensor(op, "to_physical_map", to_physical_map, device, torch.int32)
        _check_tensor(op, "logical_count", logical_count, device, torch.int32, shape=(num_logical,))
        if to_physical_map.numel() > MAX_I32:
            fail(op, "to_physical_map", "of fewer than 2**31 elements", to_physical_map.numel())
        flags |= _PHYSICAL
        map_ptr, count_ptr = to_physical_map.data_ptr(), logical_count.data_ptr()
        num_duplicates = to_physical_map.shape[1]
    if force_random is not None:
        _check_tensor(op, "force_random", force_random, device, torch.bool, numel=num_tokens)
        flags |= _RANDOM
        random_ptr = force_random.data_ptr()
    if scores is not None:
        _check_tensor(op, "scores", scores, device, torch.float32, shape=(num_tokens, num_experts), align=16)
        flags |= _SCORES
        scores_ptr = scores.data_ptr()
    if out is None:
        topk_idx = logits.new_empty((num_tokens, num_slots), dtype=torch.int64)
        topk_weights = logits.new_empty((num_tokens, num_slots))
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"{op}: out must be a (topk_idx, topk_weights) pair, got {type(out).__name__}")
        topk_idx, topk_weights = out
        _check_tensor(op, "out[0] (topk_idx)", topk_idx, device, torch.int64, shape=(num_tokens, num_slots))
        _check_tensor(op, "out[1] (topk_weights)", topk_weights, device, torch.float32, shape=(num_tokens, num_slots))
    if num_tokens == 0:
        return topk_idx, topk_weights

    launcher = _GATE.cache.get((device, num_experts, num_topk))
    if launcher is None:
        launcher = _GATE.cache[device, num_experts, num_topk] = _GATE.get(device, num_experts, num_topk, _GATE_TILING)
    launcher(
        device,
        current_stream(device),
        logits_ptr, bias_ptr, image_bias_ptr, image_mask_ptr, mask_ptr, fix_ptr, random_ptr,
        map_ptr, count_ptr, topk_idx.data_ptr(), topk_weights.data_ptr(), unmapped_ptr, scores_ptr,
        num_shared, float(routed_scaling_factor), ep_rank, flags,
        num_tokens, num_logical, num_duplicates, num_slots, unmapped_stride,
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
    op = "tkaot.moe.topk_gate"
    device = check_cuda(op, "scores", scores)
    if scores.dtype != torch.float32:
        fail(op, "scores", "torch.float32", scores.dtype)
    if scores.dim() != 2:
        fail(op, "scores", "2-D (num_tokens, num_experts)", f"shape {tuple(scores.shape)}")
    num_tokens, num_experts = scores.shape
    if not 1 <= num_experts <= 512:
        fail(op, "scores", "of 1 to 512 experts", f"{num_experts} (shape {tuple(scores.shape)})")
    if num_tokens > MAX_I32:
        fail(op, "scores", "of fewer than 2**31 tokens", num_tokens)
    align = 16 if num_experts % 4 == 0 else 4
    if not scores.is_contiguous() or scores.data_ptr() % align:
        fail(op, "scores", f"contiguous and {align}-byte aligned", f"strides {scores.stride()} address {scores.data_ptr():#x}")
    _check_int(op, "num_topk", num_topk, 1, min(num_experts, _MAX_TOPK))
    topk_idx = scores.new_empty((num_tokens, num_topk), dtype=torch.int64)
    if num_tokens == 0:
        return topk_idx
    launcher = _TOPK.get(device, num_experts, num_topk, _TOPK_TILING)
    launcher(device, current_stream(device), scores.data_ptr(), topk_idx.data_ptr(), num_tokens)
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
    op = "tkaot.moe.normalize_weight"
    device = check_cuda(op, "topk_weights", topk_weights)
    if topk_weights.dtype != torch.float32:
        fail(op, "topk_weights", "torch.float32", topk_weights.dtype)
    if topk_weights.dim() != 2:
        fail(op, "topk_weights", "2-D (num_tokens, num_topk)", f"shape {tuple(topk_weights.shape)}")
    num_tokens, num_topk = topk_weights.shape
    if not 1 <= num_topk <= _MAX_TOPK:
        fail(op, "topk_weights", f"of 1 to {_MAX_TOPK} weights a token", f"{num_topk} (shape {tuple(topk_weights.shape)})")
    if num_tokens > MAX_I32:
        fail(op, "topk_weights", "of fewer than 2**31 tokens", num_tokens)
    if not topk_weights.is_contiguous():
        fail(op, "topk_weights", "contiguous", f"strides {topk_weights.stride()}")
    denominator = torch.empty((num_tokens,), dtype=torch.float32, device=topk_weights.device)
    normalized = torch.empty_like(topk_weights)
    if num_tokens == 0:
        return denominator, normalized
    launcher = _NORMALIZE.get(device, num_topk)
    launcher(device, current_stream(device), topk_weights.data_ptr(), denominator.data_ptr(), normalized.data_ptr(), num_tokens)
    return denominator, normalized


__all__ = ["moe_topk_gate", "moe_topk_gate_forward", "normalize_weight", "topk_gate"]
