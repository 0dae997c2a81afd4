"""Engram references in plain torch: n-gram hash, gate forward and backward, weight-gradient reduction, Sinkhorn.

Each takes its tkaot.engram op's arguments (takes_arguments_of). Ops that update tensors in place
return the updated values as new tensors instead. Floating-point math runs in float32, or in
float64 when the inputs are float64 (the modeling layer's gradcheck runs these in float64).
"""

from __future__ import annotations

import torch

import tkaot.engram
from tkaot.reference._arguments import takes_arguments_of


def _compute_dtype(*tensors) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


@takes_arguments_of(tkaot.engram.engram_hash)
def engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask) -> torch.Tensor:
    """(layers, tokens, orders * tables) int32: column (n - 2) * tables + j holds
    (XOR_{i < n} ids[:, i] * multipliers[l, i]) floor-mod vocab_sizes[l, n - 2, j], plus offsets; -1 for image tokens."""
    layers, orders, tables = vocab_sizes.shape
    terms = ngram_token_ids.long()[None, :, :] * multipliers.long()[:, None, :]  # (layers, tokens, max_ngram), wrapping
    hashed = terms[..., 0]
    columns = []
    for order in range(orders):
        hashed = hashed ^ terms[..., order + 1]
        columns.append(torch.remainder(hashed[..., None], vocab_sizes[:, None, order, :].long()))
    out = (torch.cat(columns, dim=-1) + offsets.long()[:, None, :]).to(torch.int32)
    if image_token_mask is not None:
        out[:, image_token_mask] = -1
    return out


@takes_arguments_of(tkaot.engram.fused_weight)
def fused_weight(weight_hidden, weight_embed) -> torch.Tensor:
    dtype = _compute_dtype(weight_hidden, weight_embed)
    return weight_hidden.to(dtype) * weight_embed.to(dtype)


def gate_terms(hidden_states, kv, weight_fused, eps, clamp_value):
    """(x, k, v, dot, rstd_x, rstd_k, gate) of every (token, head), in the compute dtype (differentiable)."""
    dtype = _compute_dtype(hidden_states, kv, weight_fused)
    hc, hidden = hidden_states.shape[1], hidden_states.shape[2]
    x, k, v = hidden_states.to(dtype), kv[:, :hc].to(dtype), kv[:, hc].to(dtype)
    dot = (x * weight_fused.to(dtype) * k).sum(-1)
    rstd_x = torch.rsqrt(x.square().mean(-1) + eps)
    rstd_k = torch.rsqrt(k.square().mean(-1) + eps)
    d = dot * rstd_x * rstd_k * hidden**-0.5
    gate = torch.sigmoid(torch.sign(d) * torch.sqrt(d.abs().clamp_min(clamp_value)))
    return x, k, v, dot, rstd_x, rstd_k, gate


@takes_arguments_of(tkaot.engram.engram_gate_fwd)
def engram_gate_fwd(hidden_states, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask):
    """engram_gate_fwd's (output, dot, gate_score, rstd_x, rstd_k) as new tensors (never in place); image tokens pass
    hidden_states through and save zeros. Differentiable."""
    x, _, v, dot, rstd_x, rstd_k, gate = gate_terms(hidden_states, kv, weight_fused, eps, clamp_value)
    out = (x + gate[..., None] * v[:, None, :]).to(hidden_states.dtype)
    saved = (dot, gate, rstd_x, rstd_k)
    if image_token_mask is not None:
        keep = image_token_mask[:, None]
        out = torch.where(keep[..., None], hidden_states, out)
        saved = tuple(torch.where(keep, torch.zeros_like(s), s) for s in saved)
    if not save_for_backward:
        return out, None, None, None, None
    return (out, *saved)


def token_ranges(num_tokens: int, num_partials: int) -> list[range]:
    """The tokens of each weight-gradient partial: consecutive runs of ceil(tokens / partials)."""
    per = -(-num_tokens // num_partials) if num_partials else 0
    return [range(min(p * per, num_tokens), min((p + 1) * per, num_tokens)) for p in range(num_partials)]


@takes_arguments_of(tkaot.engram.engram_gate_bwd)
def engram_gate_bwd(
    grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value, image_token_mask, num_partials: int = 1
):
    """(grad_hidden_states, grad_kv, grad_w_partial) from the saved values, in closed form; grad_w_partial has
    `num_partials` rows over the tokens of token_ranges (engram_gate_bwd's are the device's SM count)."""
    dtype = _compute_dtype(grad_out, hidden_states, dot)
    hc, hidden = hidden_states.shape[1], hidden_states.shape[2]
    go, x, k, v = grad_out.to(dtype), hidden_states.to(dtype), kv[:, :hc].to(dtype), kv[:, hc].to(dtype)
    w, dot, gate, rx, rk = weight_fused.to(dtype), dot.to(dtype), gate_score.to(dtype), rstd_x.to(dtype), rstd_k.to(dtype)
    scalar = hidden**-0.5
    dldg = (go * v[:, None, :]).sum(-1)
    slope = dldg * gate * (1 - gate) * 0.5 * torch.sqrt(scalar * rx * rk / dot.abs())
    r = torch.where(dot.abs() * scalar * rx * rk < clamp_value, torch.zeros_like(slope), slope)[..., None]
    grad_x = go + r * (k * w - x * (dot * rx * rx / hidden)[..., None])
    grad_k = r * (x * w - k * (dot * rk * rk / hidden)[..., None])
    grad_v = (go * gate[..., None]).sum(1)
    per_token_w = r * x * k
    if image_token_mask is not None:
        keep = image_token_mask[:, None, None]
        grad_x = torch.where(keep, go, grad_x)
        grad_k = torch.where(keep, torch.zeros_like(grad_k), grad_k)
        grad_v = torch.where(image_token_mask[:, None], torch.zeros_like(grad_v), grad_v)
        per_token_w = torch.where(keep, torch.zeros_like(per_token_w), per_token_w)
    grad_kv = torch.cat([grad_k, grad_v[:, None, :]], dim=1).to(kv.dtype)
    partials = [per_token_w[list(tokens)].sum(0) for tokens in token_ranges(x.shape[0], num_partials)]
    grad_w_partial = torch.stack(partials) if partials else per_token_w.new_zeros((0, hc, hidden))
    result_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return grad_x.to(hidden_states.dtype), grad_kv, grad_w_partial.to(result_dtype)


@takes_arguments_of(tkaot.engram.grad_w_reduce)
def grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    """(grad_weight_hidden, grad_weight_embed) after the update, as new tensors."""
    dtype = _compute_dtype(grad_w_partial, grad_weight_hidden)
    total = grad_w_partial.to(dtype).sum(0)
    return (
        grad_weight_hidden + (total * weight_embed.to(dtype)).to(grad_weight_hidden.dtype),
        grad_weight_embed + (total * weight_hidden.to(dtype)).to(grad_weight_embed.dtype),
    )


@takes_arguments_of(tkaot.engram.engram_sinkhorn_momentum_update)
def engram_sinkhorn_momentum_update(grad, momentum_buffer, beta1, nesterov) -> tuple[torch.Tensor, torch.Tensor]:
    """(sinkhorn_input float32, the updated momentum in momentum_buffer's dtype). The fused multiply-adds are
    computed in float64 and rounded once more to float32 (equal to a float32 fma but in rare double-rounding ties)."""
    one_minus = torch.tensor(1.0 - float(beta1), dtype=torch.float32).double()
    b1 = torch.tensor(float(beta1), dtype=torch.float32).double()
    g = grad.float().double()
    scaled = (one_minus * g).float().double()  # (1 - beta1) * g, rounded to float32 as the kernel does
    momentum = (momentum_buffer.float().double() * b1 + scaled).float()
    if nesterov:
        result = (g * one_minus + (b1 * momentum.double()).float().double()).float()
    else:
        result = momentum
    return result.reshape(momentum_buffer.shape), momentum.to(momentum_buffer.dtype).reshape(momentum_buffer.shape)


def _iterate(matrix, row_scale, col_scale) -> torch.Tensor:
    dtype = _compute_dtype(matrix)
    return row_scale.to(dtype)[:, None] * matrix.to(dtype) * col_scale.to(dtype)[None, :]


@takes_arguments_of(tkaot.engram.engram_sinkhorn_step)
def engram_sinkhorn_step(matrix, row_scale, col_scale, eps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row_norm, the updated row_scale, col_sumsq): the whole column sums of squares, where the op returns partials."""
    row_norm = _iterate(matrix, row_scale, col_scale).norm(dim=1)
    new_row_scale = row_scale / (row_norm + eps)
    col_sumsq = _iterate(matrix, new_row_scale, col_scale).square().sum(0)
    return row_norm, new_row_scale, col_sumsq


@takes_arguments_of(tkaot.engram.engram_sinkhorn_step_reduce)
def engram_sinkhorn_step_reduce(col_sumsq_partial) -> torch.Tensor:
    return col_sumsq_partial.double().sum(0).to(col_sumsq_partial.dtype)


@takes_arguments_of(tkaot.engram.engram_sinkhorn_finalize)
def engram_sinkhorn_finalize(matrix, row_scale, col_scale, eps, alpha) -> torch.Tensor:
    y = _iterate(matrix, row_scale, col_scale)
    return (alpha * y / (y.norm(dim=1, keepdim=True) + eps)).to(matrix.dtype)
