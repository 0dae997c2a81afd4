"""tkaot.engram's gate: fused_weight, engram_gate_fwd, engram_gate_bwd and grad_w_reduce.

The gate mixes a token's Engram memory into its hc_mult residual streams:
    out = x + sigmoid(signed_sqrt(dot(x * w, k) * rstd_x * rstd_k / sqrt(hidden))) * v
with x = hidden_states[t, h], k = kv[t, h], v = kv[t, hc_mult], w = weight_hidden[h] * weight_embed[h] (fused_weight),
rstd the RMSNorm reciprocal std and signed_sqrt(d) = sign(d) * sqrt(max(|d|, clamp_value)).
"""

from __future__ import annotations

import torch

from tkaot._compile import allocates_nothing, compiler, is_dynamo_compiling, traced
from tkaot._engram import device as _device
from tkaot._engram import kernels  # the shipped tilings, read at every call
from tkaot._engram.kernels import FUSED_WEIGHT, GATE_BWD, GATE_FWD, GRAD_W_REDUCE, MAX_GATE_HIDDEN
from tkaot._op import current_stream, op_parts
from tkaot._validate import Rule, Signature, Tensor

__all__ = ["engram_gate_bwd", "engram_gate_fwd", "fused_weight", "grad_w_reduce"]

_BF16, _F32 = torch.bfloat16, torch.float32
_HIDDEN = f"a multiple of 256 in [256, {MAX_GATE_HIDDEN}]"
BWD_HC = 4  # the backward kernel's heads (TileKernels' backward asserts hc_mult == 4 too)
_SAVE, _MASK, _IN_PLACE = 1, 2, 4  # the forward kernel's flags (kernels_src/engram/gate_fwd.py)


def _row(name: str, dtypes, shape, **kw) -> Tensor:
    return Tensor(name, dtypes, shape, layout="contiguous", align=16, **kw)


def _per_token(name: str) -> Tensor:
    return Tensor(name, (_F32,), (("num_tokens", "hc_mult"),), layout="contiguous")


_HIDDEN_RULE = Rule(
    "hidden_states", f"hidden % 256 == 0 and 256 <= hidden <= {MAX_GATE_HIDDEN}", f"of hidden size {_HIDDEN}",
    actual="f'shape {tuple(h_hidden_states)}'", after="hidden_states",
)  # fmt: skip
_KV_RULE = Rule("kv", "kv_rows == hc_mult + 1", "of shape ({num_tokens}, {hc_mult + 1}, {hidden})", actual="tuple(h_kv)", after="kv")
_GATE_INPUTS = (
    _row("hidden_states", (_BF16,), (("num_tokens", "hc_mult", "hidden"),)),
    _row("kv", (_BF16,), (("num_tokens", "kv_rows", "hidden"),)),
    _row("weight_fused", (_F32,), (("hc_mult", "hidden"),)),
)
_MASK_INPUT = Tensor("image_token_mask", (torch.bool,), (("num_tokens",),), layout="contiguous", optional=True)

FUSED_SIGNATURE = Signature(
    "tkaot.engram.fused_weight",
    tensors=(
        _row("weight_hidden", (_BF16,), (("hc_mult", "hidden"),)),
        _row("weight_embed", (_BF16,), (("hc_mult", "hidden"),)),
    ),
    dims=("hc_mult", "hidden"),
    rules=(
        Rule(
            "weight_hidden",
            "hidden % 8 == 0 and hc_mult * hidden <= _MAX_I32",
            "of hidden size a multiple of 8, below 2**31 elements",
            actual="f'shape {tuple(h_weight_hidden)}'",
        ),
    ),  # fmt: skip
)

FWD_SIGNATURE = Signature(
    "tkaot.engram.engram_gate_fwd",
    tensors=(*_GATE_INPUTS, _MASK_INPUT),
    scalars=("eps", "clamp_value", "save_for_backward", "inplace"),
    dims=("num_tokens", "hc_mult", "hidden"),
    rules=(
        _HIDDEN_RULE,
        Rule("hidden_states", "1 <= hc_mult <= 65535 and num_tokens <= 32 * 65535",
             "of 1 to 65535 heads (hc_mult) and at most 2097120 tokens", actual="f'shape {tuple(h_hidden_states)}'", after="hidden_states"),
        _KV_RULE,
        Rule("inplace", "not (inplace and save_for_backward)",
             message="inplace=True overwrites hidden_states, which the backward reads: pass save_for_backward=False with it"),
    ),
)  # fmt: skip

BWD_SIGNATURE = Signature(
    "tkaot.engram.engram_gate_bwd",
    tensors=(
        _row("grad_out", (_BF16,), (("num_tokens", "hc_mult", "hidden"),)),
        _row("hidden_states", (_BF16,), (("num_tokens", "hc_mult", "hidden"),)),
        *_GATE_INPUTS[1:],
        _per_token("dot"),
        _per_token("gate_score"),
        _per_token("rstd_x"),
        _per_token("rstd_k"),
        _MASK_INPUT,
    ),
    dims=("num_tokens", "hc_mult", "hidden"),
    rules=(
        Rule("grad_out", f"hc_mult == {BWD_HC}", f"of {BWD_HC} heads (hc_mult): the backward kernel's",
             actual="f'shape {tuple(h_grad_out)}'", after="grad_out"),
        Rule("grad_out", "hidden % 256 == 0 and hidden > 0", "of hidden size a multiple of 256", actual="f'shape {tuple(h_grad_out)}'",
             after="grad_out"),
        _KV_RULE,
    ),
)  # fmt: skip

REDUCE_SIGNATURE = Signature(
    "tkaot.engram.grad_w_reduce",
    tensors=(
        Tensor("grad_w_partial", (_F32,), (("num_partials", "hc_mult", "hidden"),), layout="contiguous"),
        Tensor("weight_hidden", (_BF16,), (("hc_mult", "hidden"),), layout="contiguous"),
        Tensor("weight_embed", (_BF16,), (("hc_mult", "hidden"),), layout="contiguous"),
        Tensor("grad_weight_hidden", (_F32,), (("hc_mult", "hidden"),), layout="contiguous"),
        Tensor("grad_weight_embed", (_F32,), (("hc_mult", "hidden"),), layout="contiguous"),
    ),
    dims=("num_partials", "hc_mult", "hidden"),
    rules=(
        Rule(
            "grad_w_partial",
            "num_partials * hc_mult * hidden <= _MAX_I32",
            "below 2**31 elements",
            actual="f'shape {tuple(h_grad_w_partial)}'",
        ),
    ),  # fmt: skip
)

(_check_fused, _FUSED), (_check_fwd, _FWD), (_check_bwd, _BWD), (_check_reduce, _REDUCE) = op_parts(
    globals(), (FUSED_SIGNATURE, FUSED_WEIGHT), (FWD_SIGNATURE, GATE_FWD), (BWD_SIGNATURE, GATE_BWD), (REDUCE_SIGNATURE, GRAD_W_REDUCE)
)


def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """weight_hidden * weight_embed in fp32 (exact: a product of two bf16 values).

    Args:
        weight_hidden, weight_embed: (hc_mult, hidden) bf16, contiguous; hidden a multiple of 8.

    Returns:
        weight_fused: (hc_mult, hidden) float32.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_fused_weight(weight_hidden, weight_embed)
    device, hc_mult, hidden, wh_ptr, we_ptr = _check_fused(weight_hidden, weight_embed)
    weight_fused = torch.empty((hc_mult, hidden), dtype=_F32, device=weight_hidden.device)
    if hc_mult * hidden:
        _FUSED.get(device, "bfloat16")(device, current_stream(device), wh_ptr, we_ptr, weight_fused.data_ptr(), hc_mult * hidden)
    return weight_fused


def engram_gate_fwd(
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    save_for_backward: bool = True,
    image_token_mask: torch.Tensor | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The Engram gate (see the module's docstring), per token and head.

    Args:
        hidden_states: (num_tokens, hc_mult, hidden) bf16, contiguous; hidden a multiple of 256, at most 16384.
        kv: (num_tokens, hc_mult + 1, hidden) bf16, contiguous: the keys of the hc_mult heads, then v.
        weight_fused: (hc_mult, hidden) float32 (fused_weight's).
        eps: RMSNorm epsilon; clamp_value: the lower clamp of |d| under the signed square root.
        save_for_backward: also return dot (the raw sum of x * w * k), gate_score, rstd_x and rstd_k,
            (num_tokens, hc_mult) float32 each; else those are None (the inference path).
        image_token_mask: optional (num_tokens,) bool; True tokens pass hidden_states through unchanged
            (their saved values are 0).
        inplace: write the output into hidden_states (needs save_for_backward=False).

    Returns:
        (output, dot, gate_score, rstd_x, rstd_k); output is hidden_states itself when inplace.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_engram_gate_fwd(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask, inplace)
    device, num_tokens, hc_mult, hidden, x_ptr, kv_ptr, w_ptr, mask_ptr = _check_fwd(
        hidden_states, kv, weight_fused, image_token_mask, eps, clamp_value, save_for_backward, inplace
    )
    output = hidden_states if inplace else torch.empty_like(hidden_states)
    if save_for_backward:
        dot, gate_score, rstd_x, rstd_k = (torch.empty((num_tokens, hc_mult), dtype=_F32, device=hidden_states.device) for _ in range(4))
        saved = (dot.data_ptr(), gate_score.data_ptr(), rstd_x.data_ptr(), rstd_k.data_ptr())
    else:
        dot = gate_score = rstd_x = rstd_k = None
        saved = (0, 0, 0, 0)
    if num_tokens == 0:
        return output, dot, gate_score, rstd_x, rstd_k
    flags = (_SAVE if save_for_backward else 0) | (_MASK if image_token_mask is not None else 0) | (_IN_PLACE if inplace else 0)
    tilings = kernels.GATE_FWD_TILINGS
    # the decode form for few tokens (timed on the inference path only); a set built without it serves those calls
    # with the default tiling
    decode = not save_for_backward and num_tokens <= kernels.GATE_FWD_DECODE_TOKENS and hidden <= kernels.GATE_FWD_DECODE_HIDDEN
    launcher = _FWD.get(device, tilings["decode" if decode else "default"], general_tiling=tilings["default"])
    launcher(
        device, current_stream(device),
        x_ptr, kv_ptr, w_ptr, mask_ptr, output.data_ptr(), *saved,
        float(eps), float(clamp_value), hidden**-0.5, flags,
        num_tokens, hc_mult, hidden,
    )  # fmt: skip
    return output, dot, gate_score, rstd_x, rstd_k


def engram_gate_bwd(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    clamp_value: float,
    image_token_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gate's backward from engram_gate_fwd's saved values.

    Args:
        grad_out: (num_tokens, 4, hidden) bf16, the output's gradient; hidden a multiple of 256.
        hidden_states, kv, weight_fused: the forward's inputs (hc_mult must be 4).
        dot, gate_score, rstd_x, rstd_k: the forward's saved values, (num_tokens, 4) float32.
        clamp_value: the forward's; image_token_mask: the forward's (masked tokens pass grad_out to
            grad_hidden_states and get zero grad_kv).

    Returns:
        (grad_hidden_states bf16 like hidden_states, grad_kv bf16 like kv, grad_w_partial): grad_w_partial is
        (number of SMs, 4, hidden) float32, the fused weight's gradient summed over each CTA's tokens
        (grad_w_reduce sums it).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_engram_gate_bwd(
            grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value, image_token_mask,
        )  # fmt: skip
    device, num_tokens, hc_mult, hidden, go_ptr, x_ptr, kv_ptr, w_ptr, dot_ptr, gate_ptr, rx_ptr, rk_ptr, mask_ptr = _check_bwd(
        grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k, image_token_mask
    )
    num_partials = _device.sm_count(device)
    grad_hidden_states = torch.empty_like(hidden_states)
    grad_kv = torch.empty_like(kv)
    grad_w_partial = torch.empty((num_partials, hc_mult, hidden), dtype=_F32, device=hidden_states.device)
    launcher = _BWD.get(device, kernels.GATE_BWD_TILINGS["default"])
    launcher(
        device, current_stream(device),
        go_ptr, x_ptr, kv_ptr, w_ptr, dot_ptr, gate_ptr, rx_ptr, rk_ptr, mask_ptr,
        grad_hidden_states.data_ptr(), grad_kv.data_ptr(), grad_w_partial.data_ptr(),
        float(clamp_value), hidden**-0.5, 0 if image_token_mask is None else 1,
        num_tokens, hidden, num_partials,
    )  # fmt: skip
    return grad_hidden_states, grad_kv, grad_w_partial


def grad_w_reduce(
    grad_w_partial: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    grad_weight_hidden: torch.Tensor,
    grad_weight_embed: torch.Tensor,
) -> None:
    """Sum the backward's partials (in partial order) into the RMSNorm weights' gradients, in place:
    grad_weight_hidden += sum * weight_embed, grad_weight_embed += sum * weight_hidden.

    Args:
        grad_w_partial: (num_partials, hc_mult, hidden) float32, contiguous.
        weight_hidden, weight_embed: (hc_mult, hidden) bf16, contiguous.
        grad_weight_hidden, grad_weight_embed: (hc_mult, hidden) float32, contiguous; updated in place.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    device, num_partials, hc_mult, hidden, partial_ptr, wh_ptr, we_ptr, gwh_ptr, gwe_ptr = _check_reduce(
        grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed
    )
    if hc_mult * hidden:
        launcher = _REDUCE.get(device, "bfloat16", kernels.GRAD_W_REDUCE_TILINGS["default"])
        launcher(device, current_stream(device), partial_ptr, wh_ptr, we_ptr, gwh_ptr, gwe_ptr, num_partials, hc_mult * hidden)
    return None


def _fake_fused(new, weight_hidden, weight_embed):
    """fused_weight's output (tracing, tkaot/_compile.py)."""
    return new.empty(weight_hidden.shape, _F32, weight_hidden.device)


def _fake_fwd(new, hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward=True, image_token_mask=None, inplace=False):
    """engram_gate_fwd's outputs: hidden_states itself when inplace; the saved values only with save_for_backward."""
    output = hidden_states if inplace else new.empty_like(hidden_states)
    if not save_for_backward:
        return output, None, None, None, None
    per_token = hidden_states.shape[:2]
    return output, *(new.empty(per_token, _F32, hidden_states.device) for _ in range(4))


def _fake_bwd(new, grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value, image_token_mask=None):
    """engram_gate_bwd's outputs; grad_w_partial has a row per SM of the device, as the op's."""
    num_partials = _device.sm_count(hidden_states.get_device())
    partial = new.empty((num_partials, *hidden_states.shape[1:]), _F32, hidden_states.device)
    return new.empty_like(hidden_states), new.empty_like(kv), partial


_traced_fused_weight = traced(fused_weight, _fake_fused)
_traced_engram_gate_fwd = traced(engram_gate_fwd, _fake_fwd, mutates=("hidden_states",), outputs=5)
_traced_engram_gate_bwd = traced(engram_gate_bwd, _fake_bwd, outputs=3)
_traced_grad_w_reduce = traced(grad_w_reduce, allocates_nothing, mutates=("grad_weight_hidden", "grad_weight_embed"), outputs=0)
