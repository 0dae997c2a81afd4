"""References of the fused inference ops in plain torch: SwiGLU (+ per-token FP8 cast), RMSNorm + cast.

Scale factors, E4M3 rounding and sf layouts are tkaot.reference.quant's. On a
GPU every step is the same fp32 operation the kernels perform, so quantized
outputs compare bit for bit.
"""

from __future__ import annotations

import torch

import tkaot.quant
from tkaot.reference import quant
from tkaot.reference._arguments import takes_arguments_of

TOKEN_ALIGNMENT = 128


def psum_row_mask(num_rows: int, psum_num_tokens_per_expert: torch.Tensor | None, alignment: int = TOKEN_ALIGNMENT) -> torch.Tensor:
    """Bool (num_rows,): the rows an op computes. Expert e owns rows [align(psum[e-1]), psum[e]), psum[-1] = 0."""
    if psum_num_tokens_per_expert is None:
        return torch.ones(num_rows, dtype=torch.bool)
    mask = torch.zeros(num_rows, dtype=torch.bool)
    begin = 0
    for end in psum_num_tokens_per_expert.tolist():
        start = -(-begin // alignment) * alignment
        mask[start : max(start, min(end, num_rows))] = True
        begin = end
    return mask


@takes_arguments_of(tkaot.quant.swiglu_forward)
def swiglu_forward(x, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count) -> torch.Tensor:
    """silu(gate) * up * (topk_weights * routed_scaling_factor) over x = [gate | up], every row, in fp32.

    gate is clamped to at most clamp_value and up to [-clamp_value, clamp_value] first; clamped_count
    (int64 (4,)) gains the counts of gate > c, up > c, up < -c and of all elements, over the rows that
    psum_num_tokens_per_expert selects (psum_row_mask). The result is rounded to bf16 for fmt="bf16".
    """
    hidden = x.shape[-1] // 2
    g, u = x.float()[:, :hidden], x.float()[:, hidden:]
    if clamp_value is not None:
        if clamped_count is not None:
            rows = psum_row_mask(x.shape[0], psum_num_tokens_per_expert).to(x.device)
            clamped_count[0] += (g[rows] > clamp_value).sum()
            clamped_count[1] += (u[rows] > clamp_value).sum()
            clamped_count[2] += (u[rows] < -clamp_value).sum()
            clamped_count[3] += int(rows.sum()) * hidden
        g = torch.where(g > clamp_value, clamp_value, g)
        u = torch.where(u > clamp_value, clamp_value, torch.where(u < -clamp_value, -clamp_value, u))
    out = g / (1.0 + torch.exp(-g)) * u
    if topk_weights is not None:
        weight = topk_weights if routed_scaling_factor is None else topk_weights * routed_scaling_factor
        out = out * weight[:, None]
    return out.to(torch.bfloat16) if fmt == "bf16" else out


def per_token_cast(v: torch.Tensor, group: int, sf_kind: str = "fp32", col_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 values, sf as the ops return it) of fp32 v (rows, cols) cast per group of `group` columns of a row.

    sf_kind is "fp32", "pow2" or "ue8m0" (tkaot.reference.quant's rules and layouts).
    """
    amax = v.abs().unflatten(-1, (-1, group)).amax(dim=-1)
    sf, inv = quant.scale_factors(amax, "e4m3", sf_kind)
    q = quant.round_e4m3(v * inv.repeat_interleave(group, dim=-1))
    return q, quant.store_sf(sf, sf_kind, col_major)


@takes_arguments_of(tkaot.quant.swiglu_forward_and_per_token_cast)
def swiglu_forward_and_per_token_cast(
    x,
    fmt,
    num_per_channels,
    psum_num_tokens_per_expert,
    topk_weights,
    routed_scaling_factor,
    use_tma_aligned_col_major_sf,
    round_sf,
    use_packed_ue8m0,
    clamp_value,
    clamped_count,
):
    """swiglu_forward's fp32 output, cast per token group to E4M3 ((out, sf)), or as swiglu_forward for bf16/fp32."""
    if fmt != "e4m3":
        return swiglu_forward(x, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count)
    v = swiglu_forward(x, "fp32", psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count)
    sf_kind = quant.sf_kind_of(round_sf, use_packed_ue8m0, False)
    return per_token_cast(v, num_per_channels, sf_kind, use_tma_aligned_col_major_sf)


@takes_arguments_of(tkaot.quant.norm_forward_and_per_token_cast)
def norm_forward_and_per_token_cast(x, weight, eps, residual, out_scale, round_sf, use_packed_ue8m0, rstd: torch.Tensor | None = None):
    """RMSNorm rounded to x.dtype, then cast to E4M3 per group of 32 columns of a row.

    s = round(x + residual); rstd = 1 / sqrt(mean(s**2) + eps) (or the given rstd, to reproduce a
    kernel's rounding exactly); y = round(s * rstd * (weight * out_scale)); (q, sf) = per-token cast of y.
    Returns ((q shaped like x, sf row-major (*x.shape[:-1], groups or words)), y, rstd, s).
    """
    s = x if residual is None else (x + residual).to(x.dtype)
    s32 = s.float()
    if rstd is None:
        rstd = torch.rsqrt(s32.square().mean(dim=-1) + eps)
    scale = weight.float() * out_scale if weight is not None else out_scale
    y = (s32 * rstd[..., None] * scale).to(x.dtype)
    sf_kind = quant.sf_kind_of(round_sf, use_packed_ue8m0, False)
    q, sf = per_token_cast(y.float().reshape(-1, x.shape[-1]), 32, sf_kind)
    return (q.view(x.shape), sf.view(*x.shape[:-1], sf.shape[-1])), y, rstd, s
