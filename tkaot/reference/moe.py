"""MoE routing references in plain torch (numpy for the Philox stream of random routes)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

import tkaot.moe
from tkaot.reference._arguments import takes_arguments_of

DUPLICATE_STRIDE = 23333
_WARP = 32


class GateResult(NamedTuple):
    topk_idx: torch.Tensor  # (num_tokens, num_topk + shared slots) int64
    topk_weights: torch.Tensor  # same shape, float32
    unmapped_topk_idx: torch.Tensor | None  # what the op leaves in unmapped_topk_idx, when one is given
    scores: torch.Tensor  # what the op writes to `scores`, when one is given


def sqrt_softplus(logits: torch.Tensor) -> torch.Tensor:
    """sqrt(softplus(x)) in fp32, softplus taken as x above 20 (torch's threshold)."""
    return F.softplus(logits.float()).sqrt()


def warp_order_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum of the last dim (at most 32) in the kernels' order: zero-pad to 32, then add the
    upper half onto the lower half, 16, 8, 4, 2, 1 apart. fp32 sums depend on order."""
    padded = F.pad(values, (0, _WARP - values.shape[-1]))
    half = _WARP // 2
    while half:
        padded = padded[..., :half] + padded[..., half : 2 * half]
        half //= 2
    return padded[..., 0]


def philox_first_two(seed: int, subsequence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First two 32-bit outputs of Philox4x32-10 for key (seed, 0) and counters (0, 0, subsequence, 0):
    the stream of a curand Philox4_32_10 state initialised with (seed, subsequence, offset 0)."""
    mask32 = np.uint64(0xFFFFFFFF)
    c0 = np.zeros(subsequence.shape, np.uint64)
    c1 = np.zeros_like(c0)
    c2 = subsequence.astype(np.uint64)
    c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(0)
    for r in range(10):
        p0 = c0 * np.uint64(0xD2511F53)  # 32 x 32 bits: exact in uint64
        p1 = c2 * np.uint64(0xCD9E8D57)
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask32
        if r < 9:
            k0 = (k0 + np.uint64(0x9E3779B9)) & mask32
            k1 = (k1 + np.uint64(0xBB67AE85)) & mask32
    return c0, c1


def random_route(tokens: torch.Tensor, num_slots: int, num_physical_experts: int, ep_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Random (indices, weights) of the given tokens, (len(tokens), num_slots) each.

    Slot l of token t reads Philox outputs (r0, r1) at subsequence t * 32 + l, key ep_rank:
    weight = r0 * 2**-32 + 2**-33 in fp32, draw = r1 % (num_physical_experts - l). The draws
    become distinct indices by taking them in increasing order (the lower slot first among
    equals) and raising by one each still-pending draw of a later slot that is at or above
    the value just taken.
    """
    slot = np.arange(num_slots, dtype=np.int64)
    sub = tokens.cpu().numpy().astype(np.int64)[:, None] * _WARP + slot[None, :]
    r0, r1 = philox_first_two(ep_rank, sub)
    weights = r0.astype(np.float32) * np.float32(2.0**-32) + np.float32(2.0**-33)
    pending = (r1 % (num_physical_experts - slot).astype(np.uint64)).astype(np.int64)
    chosen = np.full(pending.shape, -1, np.int64)
    taken = np.iinfo(np.int64).max
    for _ in range(num_slots):
        low = pending.min(axis=1, keepdims=True)
        low_slot = np.where(pending == low, slot, num_slots).min(axis=1, keepdims=True)
        open_ = chosen == -1
        pick = open_ & (slot == low_slot)
        step = open_ & (pending >= low) & (low_slot < slot)
        chosen = np.where(pick, pending, chosen)
        pending = np.where(pick, taken, pending + step)
    return chosen, weights


@takes_arguments_of(tkaot.moe.moe_topk_gate_forward)
def moe_topk_gate_forward(
    logits,
    num_topk,
    use_shared_as_routed,
    num_shared_experts,
    routed_scaling_factor,
    ep_rank,
    scoring_func,
    mask,
    bias,
    image_bias,
    image_token_mask,
    fix_routing_mask,
    to_physical_map,
    logical_count,
    unmapped_topk_idx,
    force_random,
) -> GateResult:
    """The MoE top-k gate, token by token (inputs are not modified):

    1. Route: masked (mask False) > forced random (force_random True) > fixed
       (fix_routing_mask True, experts read from unmapped_topk_idx) > routed.
    2. scores = sqrt(softplus(logits)); routed tokens take the num_topk largest of
       scores + bias (image_bias for image tokens) by a stable descending sort.
    3. weights = score / (warp_order_sum(chosen scores) + 1e-20) * routed_scaling_factor
       on unbiased scores; a fixed index outside [0, num_experts) weighs 0.
    4. With use_shared_as_routed, slots num_topk.. hold experts num_experts.. with weight 1.
    5. With a physical map, every slot's expert e in [0, num_experts + shared) becomes
       to_physical_map[e, (ep_rank + token * 23333) % max(logical_count[e], 1)].
    6. Masked tokens: indices -1, weights 0; random tokens: see random_route, over
       sum(logical_count) (or num_experts + shared) physical experts, unmapped. Both
       leave unmapped_topk_idx -1 and scores 0.
    """
    assert scoring_func == "sqrtsoftplus"
    device = logits.device
    num_tokens, num_experts = logits.shape
    num_shared = num_shared_experts if use_shared_as_routed else 0
    token = torch.arange(num_tokens, device=device)

    masked = ~mask.reshape(-1) if mask is not None else torch.zeros(num_tokens, dtype=torch.bool, device=device)
    rand = force_random.reshape(-1) & ~masked if force_random is not None else torch.zeros_like(masked)
    fixed = fix_routing_mask & ~masked & ~rand if fix_routing_mask is not None else torch.zeros_like(masked)

    scores = sqrt_softplus(logits)
    shift = bias if bias is not None else torch.zeros(num_experts, dtype=torch.float32, device=device)
    shift = shift[None, :].expand(num_tokens, -1)
    if image_token_mask is not None:
        shift = torch.where(image_token_mask[:, None], image_bias[None, :], shift)
    ranked = torch.sort(scores + shift, dim=1, descending=True, stable=True).indices[:, :num_topk]
    idx = torch.where(fixed[:, None], unmapped_topk_idx, ranked) if fix_routing_mask is not None else ranked

    valid = (idx >= 0) & (idx < num_experts)
    chosen = torch.where(valid, scores.gather(1, idx.clamp(0, num_experts - 1)), torch.zeros((), device=device))
    total = warp_order_sum(chosen) + 1e-20
    weights = chosen / total[:, None] * routed_scaling_factor

    shared = torch.arange(num_experts, num_experts + num_shared, device=device)
    topk_idx = torch.cat([idx, shared[None, :].expand(num_tokens, -1)], dim=1)
    topk_weights = torch.cat([weights, torch.ones(num_tokens, num_shared, device=device)], dim=1)
    if to_physical_map is not None:
        logical = (topk_idx >= 0) & (topk_idx < num_experts + num_shared)
        safe = topk_idx.clamp(0, num_experts + num_shared - 1)
        count = logical_count.long()[safe].clamp(min=1)
        column = (ep_rank + token[:, None] * DUPLICATE_STRIDE) % count
        topk_idx = torch.where(logical, to_physical_map.long()[safe, column], topk_idx)

    unmapped = None
    if unmapped_topk_idx is not None:
        unmapped = torch.where((masked | rand)[:, None], torch.full_like(idx, -1), idx)

    if rand.any():
        rows = rand.nonzero().squeeze(1)
        physical = int(logical_count.sum()) if logical_count is not None else num_experts + num_shared
        r_idx, r_weights = random_route(rows, num_topk + num_shared, physical, ep_rank)
        topk_idx[rows] = torch.from_numpy(r_idx).to(device)
        topk_weights[rows] = torch.from_numpy(r_weights).to(device)
    topk_idx[masked] = -1
    topk_weights[masked] = 0.0
    scores = torch.where((masked | rand)[:, None], torch.zeros((), device=device), scores)
    return GateResult(topk_idx, topk_weights, unmapped, scores)


@takes_arguments_of(tkaot.moe.topk_gate)
def topk_gate(scores, num_topk) -> torch.Tensor:
    """Indices of the num_topk largest scores per row, largest first, ties to the lower index."""
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :num_topk].contiguous()


@takes_arguments_of(tkaot.moe.normalize_weight)
def normalize_weight(topk_weights) -> tuple[torch.Tensor, torch.Tensor]:
    """(denominator, weights / denominator) with denominator = 1e-20 + warp_order_sum(weights)."""
    denominator = warp_order_sum(topk_weights) + 1e-20
    return denominator, topk_weights / denominator[:, None]
