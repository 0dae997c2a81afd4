"""References of the backward (training) ops in plain torch: RMSNorm, SwiGLU (+ per-token FP8 cast), the MoE gate.

Each computes in fp32 (fp64 when given fp64 inputs, for gradient checks) with the kernels' order of operations
where a result is element-wise, so on a GPU element-wise outputs compare bit for bit; sums over a row or over
tokens are taken in torch's order and compare within a tolerance. tests/test_backward_reference.py checks each
against autograd of the forward references and against finite differences.
"""

from __future__ import annotations

import torch

import tkaot.moe
import tkaot.quant
from tkaot.reference._arguments import takes_arguments_of
from tkaot.reference.fused import per_token_cast
from tkaot.reference.quant import sf_kind_of

TOKEN_ALIGNMENT = 128
FLT_MAX = torch.finfo(torch.float32).max


def _compute(*tensors) -> torch.dtype:
    """fp64 when any input is fp64, else fp32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


@takes_arguments_of(tkaot.quant.norm_backward)
def norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad) -> tuple[torch.Tensor, torch.Tensor | None]:
    """xhat = x * rstd, g = out_grad * out_scale, gw = g * weight:
    x_grad = round((gw - xhat * sum(xhat * gw) / hidden) * rstd + residual_out_grad);
    weight_grad = round(sum over tokens of xhat * g (+ the given weight_grad)), of weight_grad's (else weight's) dtype.
    """
    c = _compute(x, out_grad)
    xhat = x.to(c) * rstd.to(c)[:, None]
    g = out_grad.to(c) * out_scale
    gw = g * weight.to(c) if weight is not None else g
    mean = (xhat * gw).sum(dim=-1, keepdim=True) / x.shape[-1]
    x_grad = (gw - xhat * mean) * rstd.to(c)[:, None]
    if residual_out_grad is not None:
        x_grad = x_grad + residual_out_grad.to(c)
    if weight is None:
        return x_grad.to(x.dtype), None
    dw = (xhat * g).sum(dim=0)
    if weight_grad is not None:
        return x_grad.to(x.dtype), (dw + weight_grad.to(c)).to(weight_grad.dtype)
    return x_grad.to(x.dtype), dw.to(weight.dtype)


def padding_rows(num_rows: int, psum: torch.Tensor | None, alignment: int = TOKEN_ALIGNMENT) -> torch.Tensor:
    """Bool (num_rows,): the rows the backward ops zero. Row r is padding when r < align(p) for p the last
    psum entry <= r (psum[-1] = 0): the gap between an expert's end and the aligned start of the next one."""
    padding = torch.zeros(num_rows, dtype=torch.bool)
    if psum is None:
        return padding
    ends = psum.tolist()
    for end in ends:
        start = -(-end // alignment) * alignment
        padding[end : min(start, num_rows)] = True
    return padding


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 a * b + c rounded once (the product is exact in fp64; the sum rounds there, then to fp32)."""
    if a.dtype == torch.float64:
        return a * b + c
    return (a.double() * b.double() + c.double()).float()


def swiglu_backward_rows(x, x_sf, act_x_grad, group, psum, topk_weights, routed_scaling_factor, clamp_value):
    """(x_grad fp32 (rows, 2h), weight_grad or None, act_out fp32 (rows, h)) of the SwiGLU backward, before
    rounding or casting; x_sf (rows, 2h / group) decodes an E4M3 x."""
    c = _compute(x, act_x_grad)
    rows, width = x.shape[0], x.shape[-1]
    hidden = width // 2
    xf = x.reshape(rows, width).to(c)
    if x_sf is not None:
        xf = xf * x_sf.to(c).repeat_interleave(group, dim=-1)
    g, u = xf[:, :hidden], xf[:, hidden:]
    dy = act_x_grad.reshape(rows, hidden).to(c)
    pad = padding_rows(rows, psum).to(x.device)
    if clamp_value is not None:
        cx = g > clamp_value
        cy = (u > clamp_value) | (u < -clamp_value)
        g = torch.clamp(g, max=clamp_value)
        u = torch.clamp(u, min=-clamp_value, max=clamp_value)
    den = 1 + torch.exp(-g)
    s = 1.0 / den
    # silu = g * s, refined by one fused-multiply-add residual toward g / den
    est = g * s
    silu = _fma32(-_fma32(est, den.clamp(max=FLT_MAX), -g), s, est)
    act = silu * u
    w = torch.ones(rows, dtype=c, device=x.device)
    if topk_weights is not None:
        w = topk_weights.to(c) * (1.0 if routed_scaling_factor is None else routed_scaling_factor)
    ws = dy * w[:, None] * s
    xg = ws * u * _fma32(g, 1 - s, torch.ones_like(g))
    yg = ws * g
    if clamp_value is not None:
        xg = torch.where(cx, 0.0, xg)
        yg = torch.where(cy, 0.0, yg)
    x_grad = torch.where(pad[:, None], 0.0, torch.cat([xg, yg], dim=1))
    act_out = torch.where(pad[:, None], 0.0, act * w[:, None])
    weight_grad = None
    if topk_weights is not None:
        weight_grad = (dy * act).sum(dim=1) * (1.0 if routed_scaling_factor is None else routed_scaling_factor)
        weight_grad = torch.where(pad, 0.0, weight_grad)
    return x_grad, weight_grad, act_out


_OUT = {"bf16": torch.bfloat16, "fp32": torch.float32, "e4m3": torch.bfloat16}


def _assemble(x_grad, weight_grad, act_out, fmt, do_recompute, cast=None) -> tuple:
    out = _OUT[fmt] if x_grad.dtype != torch.float64 else torch.float64
    result = [x_grad.to(out)]
    if cast is not None:
        result.append(cast)
    if weight_grad is not None:
        result.append(weight_grad)
    if do_recompute:
        result.append(act_out.to(out))
    return tuple(result)


@takes_arguments_of(tkaot.quant.swiglu_backward)
def swiglu_backward(x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, do_recompute):
    """x_grad = [dy w s u (1 + g (1 - s)) | dy w s g] (0 where clamped), weight_grad = sum(dy silu(g) u) * rsf,
    act_out = silu(g) u w; padding rows of an expert layout are 0 in each. Returns TileKernels' tuple."""
    parts = swiglu_backward_rows(x, None, act_x_grad, 0, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value)
    return _assemble(*parts, fmt, do_recompute)


@takes_arguments_of(tkaot.quant.swiglu_backward_and_per_token_cast)
def swiglu_backward_and_per_token_cast(
    x, act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
    use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute,
):  # fmt: skip
    """swiglu_backward of x = (E4M3 data, fp32 sf) decoded; x_grad's fp32 values also cast to E4M3 per group
    (padding rows: zero data and zero sf). For fmt bf16 / fp32, swiglu_backward of a plain x."""
    if fmt != "e4m3":
        parts = swiglu_backward_rows(x, None, act_x_grad, 0, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value)
        return _assemble(*parts, fmt, do_recompute)
    data, sf = x
    x_grad, weight_grad, act_out = swiglu_backward_rows(
        data, sf, act_x_grad, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value
    )
    sf_kind = sf_kind_of(round_sf, use_packed_ue8m0, False)
    q, out_sf = per_token_cast(x_grad.float(), num_per_channels, sf_kind, use_tma_aligned_col_major_sf)
    pad = padding_rows(x_grad.shape[0], psum_num_tokens_per_expert).to(x_grad.device)
    if pad.any():
        q = torch.where(pad[:, None], 0.0, q.float()).to(q.dtype)
        out_sf = out_sf.clone()
        out_sf[pad] = 0
    return _assemble(x_grad, weight_grad, act_out, fmt, do_recompute, (q, out_sf))


@takes_arguments_of(tkaot.moe.moe_topk_gate_backward)
def moe_topk_gate_backward(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor, mask, grad_scores_sum) -> torch.Tensor:
    """dlogits of moe_topk_gate_forward: route term (rsf * dw_k - <dw, w>) / (D + 1e-20) gathered per expert
    (repeated experts add), the aux term (h - <h, u> / sum u) / sum u on masked-in tokens, times
    dsqrt(softplus)/dx = (1 - exp(-u^2)) / (2u) (0 at u = 0)."""
    c = _compute(scores)
    u = scores.to(c)
    valid = topk_idx >= 0
    idx = topk_idx.clamp(min=0)
    g = torch.where(valid, grad_topk_weights.to(c), 0.0)
    d = torch.where(valid, u.gather(1, idx), 0.0).sum(dim=-1, keepdim=True) + 1e-20
    dot = (g * topk_weights.to(c)).sum(dim=-1, keepdim=True)
    route = torch.where(valid, (routed_scaling_factor * g - dot) / d, 0.0)
    du = torch.zeros_like(u).scatter_add_(1, idx, route)
    if grad_scores_sum is not None:
        h = grad_scores_sum.to(c).repeat_interleave(u.shape[0] // grad_scores_sum.shape[0], dim=0)
        total = u.sum(dim=-1, keepdim=True)
        inv = torch.where(mask[:, None], 1.0 / total, 0.0)
        du = du + (h - (h * u).sum(dim=-1, keepdim=True) * inv) * inv
    safe = torch.where(u > 0, u, 1.0)
    dydx = torch.where(u > 0, -torch.expm1(-safe * safe) / (2 * safe), 0.0)
    return (dydx * du).to(scores.dtype)
