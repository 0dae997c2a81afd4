"""Rotary position embedding reference in plain torch."""

from __future__ import annotations

import torch

import tkaot.transform
from tkaot.reference._arguments import takes_arguments_of


def rotate(
    x: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor | None = None,
    interleaved: bool = False,
    conjugate: bool = False,
    seqlen_offset: int = 0,
) -> torch.Tensor:
    """x rotated by the rotary embedding, as a new tensor of x's dtype.

    x is (num_tokens, heads, rot_dim) or (batch, seqlen, heads, rot_dim). Token t
    (of any batch) takes angle row r = positions[..., t] + seqlen_offset, or
    t + seqlen_offset without positions; cos = cache[r, :rot_dim/2],
    sin = cache[r, rot_dim/2:], negated when conjugate. Pair i is
    (x[2i], x[2i+1]) when interleaved, else (x[i], x[i + rot_dim/2]); it
    becomes (a cos_i - b sin_i, a sin_i + b cos_i) in fp32, rounded to x.dtype.
    """
    rot_dim = cos_sin_cache.shape[-1]
    half = rot_dim // 2
    seqlen = x.shape[-3]
    if positions is None:
        rows = torch.arange(seqlen, device=x.device) + seqlen_offset
    else:
        rows = positions.long() + seqlen_offset
    angles = cos_sin_cache.float()[rows]  # (..., seqlen, rot_dim)
    cos = angles[..., :half].unsqueeze(-2)  # broadcast over heads
    sin = angles[..., half:].unsqueeze(-2)
    if conjugate:
        sin = -sin
    xf = x.float()
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
    else:
        a, b = xf[..., :half], xf[..., half:]
    ra = a * cos - b * sin
    rb = a * sin + b * cos
    if interleaved:
        out = torch.stack((ra, rb), dim=-1).flatten(-2)
    else:
        out = torch.cat((ra, rb), dim=-1)
    return out.to(x.dtype)


@takes_arguments_of(tkaot.transform.apply_rotary)
def apply_rotary(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What tkaot.transform.apply_rotary writes in place, returned as (query, key or None) copies."""
    q = rotate(query, cos_sin_cache, positions, interleaved, conjugate, seqlen_offset)
    k = None if key is None else rotate(key, cos_sin_cache, positions, interleaved, conjugate, seqlen_offset)
    return q, k
