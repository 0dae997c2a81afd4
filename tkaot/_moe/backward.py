"""tkaot.moe.moe_topk_gate_backward: the logits' gradient of moe_topk_gate_forward, on the moe_topk_gate_backward
kernel (kernels_src/moe/moe_topk_gate_backward.py), one variant (its default tiling) for every expert and slot count."""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._moe.kernels import MAX_EXPERTS, MAX_TOPK, MOE_GATE_BWD_TILINGS, MOE_TOPK_GATE_BACKWARD
from tkaot._op import OpKernels, current_stream
from tkaot._validate import MAX_I32, Rule, Signature, Tensor, lazy_checker

__all__ = ["moe_topk_gate_backward"]

_F32, _I64, _BOOL = torch.float32, torch.int64, torch.bool
_SLOTS = (("num_tokens", "num_topk"),)
_TOGETHER = "{} and {} come together (the aux-loss term)"
SIGNATURE = Signature(
    "tkaot.moe.moe_topk_gate_backward",
    tensors=(
        Tensor("scores", (_F32,), (("num_tokens", "num_experts"),), layout="contiguous", what="2-D (num_tokens, num_experts)"),
        Tensor("topk_idx", (_I64,), _SLOTS, layout="contiguous", what="2-D (num_tokens, num_topk)"),
        Tensor("topk_weights", (_F32,), "topk_idx", layout="contiguous"),
        Tensor("grad_topk_weights", (_F32,), "topk_idx", layout="contiguous"),
        Tensor("mask", (_BOOL,), (("num_tokens",),), layout="contiguous", optional=True),
        Tensor("grad_scores_sum", (_F32,), (("num_seqs", "num_experts"),), layout="contiguous", optional=True),
        Tensor("out", (_F32,), "scores", layout="contiguous", optional=True),
    ),
    scalars=("scoring_func",),
    dims=("num_tokens", "num_experts", "num_topk", "num_seqs"),
    defaults={"num_seqs": 0},
    rules=(
        Rule("scores", f"1 <= num_experts <= {MAX_EXPERTS}", f"of 1 to {MAX_EXPERTS} experts",
             actual="f'shape {tuple(h_scores)}'", after="scores"),
        Rule("scores", f"num_tokens * num_experts <= {MAX_I32}", "of fewer than 2**31 elements",
             actual="f'shape {tuple(h_scores)}'", after="scores"),
        Rule("scoring_func", "scoring_func == 'sqrtsoftplus'", "'sqrtsoftplus'", actual="repr(scoring_func)", after="scores"),
        Rule("topk_idx", f"num_topk <= min(num_experts, {MAX_TOPK})", f"of at most min(num_experts, {MAX_TOPK}) slots",
             actual="f'shape {tuple(h_topk_idx)}'", after="topk_idx"),
        Rule("grad_scores_sum", "num_seqs > 0 and num_tokens % num_seqs == 0",
             "of a row count dividing num_tokens ({num_tokens})", actual="f'shape {tuple(h_grad_scores_sum)}'",
             after="grad_scores_sum"),
        Rule("mask", "mask is None or grad_scores_sum is not None", message=_TOGETHER.format("mask", "grad_scores_sum")),
        Rule("grad_scores_sum", "grad_scores_sum is None or mask is not None", message=_TOGETHER.format("grad_scores_sum", "mask")),
    ),
)  # fmt: skip


_check = lazy_checker(SIGNATURE, globals(), "_check")

_KERNEL = OpKernels(SIGNATURE.op, MOE_TOPK_GATE_BACKWARD)
_TILING = MOE_GATE_BWD_TILINGS["default"]


def moe_topk_gate_backward(
    scores: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    grad_topk_weights: torch.Tensor,
    routed_scaling_factor: float,
    scoring_func: str = "sqrtsoftplus",
    mask: torch.Tensor | None = None,
    grad_scores_sum: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gradient of moe_topk_gate_forward's top-k weights (and of the aux loss's score sums) with respect to logits.

    With u = scores, the chosen experts e_k (-1: an empty slot, which contributes nothing),
    D = sum_k u[e_k] + 1e-20 and w_k = routed_scaling_factor * u[e_k] / D:
        du[e] = sum over slots k choosing e of (routed_scaling_factor * grad_topk_weights[k] - <grad, w>) / D
    and, with grad_scores_sum h (one row per sequence of num_tokens / num_seqs tokens), for tokens whose mask
    is True: du += (h - <h, u> / sum(u)) / sum(u). grad_logits = du * (1 - exp(-u**2)) / (2u) (0 where u = 0).

    Args:
        scores: (num_tokens, num_experts) float32, contiguous: moe_topk_gate_forward's `scores` output
            (sqrt(softplus(logits))); 1 to 512 experts.
        topk_idx: (num_tokens, num_topk) int64, contiguous: the logical routed experts, -1 for empty slots;
            num_topk <= min(num_experts, 32). No shared-expert slots or physical mapping.
        topk_weights, grad_topk_weights: float32 like topk_idx, contiguous.
        routed_scaling_factor: the forward's.
        scoring_func: must be "sqrtsoftplus".
        mask: optional (num_tokens,) bool, together with grad_scores_sum: the tokens the aux loss counts.
        grad_scores_sum: optional (num_seqs, num_experts) float32, contiguous; num_seqs divides num_tokens.
        out: optional (num_tokens, num_experts) float32 contiguous buffer for the result.

    Returns:
        grad_logits, (num_tokens, num_experts) float32 (out when given).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_moe_topk_gate_backward(
            scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func, mask, grad_scores_sum, out
        )
    (device, num_tokens, num_experts, num_topk, num_seqs, scores_ptr, idx_ptr, weights_ptr, grad_ptr, mask_ptr,
     h_ptr, out_ptr) = _check(scores, topk_idx, topk_weights, grad_topk_weights, mask, grad_scores_sum, out, scoring_func)  # fmt: skip
    if out is None:
        out = torch.empty_like(scores)
        out_ptr = out.data_ptr()
    if num_tokens == 0:
        return out
    _KERNEL.get(device, _TILING)(
        device, current_stream(device),
        scores_ptr, idx_ptr, weights_ptr, grad_ptr, mask_ptr, h_ptr, out_ptr, float(routed_scaling_factor),
        0 if grad_scores_sum is None else 1, num_tokens // num_seqs if num_seqs else 1, num_tokens, num_experts, num_topk,
    )  # fmt: skip
    return out


def _fake(new, scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, scoring_func="sqrtsoftplus", mask=None,
          grad_scores_sum=None, out=None):  # fmt: skip
    """moe_topk_gate_backward's output, allocated through `new` (tracing, tkaot/_compile.py)."""
    return new.empty_like(scores) if out is None else out


_traced_moe_topk_gate_backward = traced(moe_topk_gate_backward, _fake, mutates=("out",))
