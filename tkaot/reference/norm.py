"""RMSNorm reference in plain torch."""

from __future__ import annotations

import torch

import tkaot.quant
from tkaot.reference._arguments import takes_arguments_of


@takes_arguments_of(tkaot.quant.norm_forward)
def norm_forward(x, weight, eps, residual, out_scale, with_rstd) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """RMSNorm over the last dimension with an optional residual added first.

    The residual sum is rounded to x.dtype (it is also returned); the mean of
    squares, rstd and products are fp32; the output is rounded to x.dtype:
        s = round(x + residual);  rstd = 1 / sqrt(mean(s**2) + eps)
        out = round(s * rstd * (weight * out_scale))
    Returns (out, rstd or None, s).
    """
    s = x if residual is None else (x + residual).to(x.dtype)
    s32 = s.float()
    rstd = torch.rsqrt(s32.square().mean(dim=-1) + eps)
    scale = (weight.float() * out_scale) if weight is not None else out_scale
    out = (s32 * rstd[..., None] * scale).to(x.dtype)
    return out, (rstd if with_rstd else None), s
