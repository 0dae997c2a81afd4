"""tkaot.quant: TileKernels-compatible normalisation and quantisation ops."""

from __future__ import annotations

import importlib

import torch

from tkaot._op import OpKernels, current_stream
from tkaot._quant.kernels import RMSNORM
from tkaot._validate import MAX_I32, check_cuda, check_like, check_rows, fail

_NORM_VEC = {torch.bfloat16: 8, torch.float32: 4}  # elements per 16-byte vector
_NORM_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
_NORM = OpKernels("tkaot.quant.norm_forward", RMSNORM)


def _row_strides(t: torch.Tensor) -> tuple[int, int]:
    s = t.stride()
    return (s[0], s[1]) if len(s) == 3 else (0, s[0])


def norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
    out_scale: float = 1.0,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    with_rstd: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """RMSNorm over the last dimension, with an optional residual added first.

    Args:
        x: (num_tokens, hidden) or (batch, num_tokens, hidden), bf16 or fp32, on a CUDA
            device; last dimension contiguous, rows 16-byte aligned.
        weight: (hidden,) of x's dtype, or None for unit weight.
        eps: added to the mean square before the reciprocal square root.
        residual: optional, shaped like x; x + residual is rounded to x's dtype first.
        out_scale: multiplies the weight (fp32).
        out: optional output buffer shaped like x.
        residual_out: optional buffer for x + residual (ignored without residual).
        with_rstd: also return the fp32 reciprocal RMS of each row.

    Returns:
        (out, rstd of shape x.shape[:-1] or None, the normalised input: x + residual,
        or x itself without residual).
    """
    op = _NORM.op
    # The hot path reads each tensor property once; anything unusual is re-checked by the
    # helpers in tkaot._validate, which raise the detailed error.
    try:
        device, dtype, xs, shape, x_ptr = x.get_device(), x.dtype, x.stride(), x.shape, x.data_ptr()
    except AttributeError:
        raise TypeError(f"{op}: x must be a torch.Tensor, got {type(x).__name__}") from None
    if device < 0:
        check_cuda(op, "x", x)
    vec = _NORM_VEC.get(dtype)
    if vec is None:
        fail(op, "x", "bfloat16 or float32", dtype)
    ndim = len(xs)
    if ndim == 2:
        batch, (num_tokens, hidden), x_bs, x_s = 1, shape, 0, xs[0]
    elif ndim == 3:
        (batch, num_tokens, hidden), (x_bs, x_s) = shape, xs[:2]
        if batch > 65535:
            fail(op, "x", "at most 65535 batches", f"shape {tuple(shape)}")
    else:
        fail(op, "x", "2-D (num_tokens, hidden) or 3-D (batch, num_tokens, hidden)", f"shape {tuple(shape)}")
    if xs[-1] != 1 or x_ptr % 16 or (x_s % vec and num_tokens > 1) or (x_bs % vec and batch > 1) or x_s > MAX_I32 or x_bs > MAX_I32:
        check_rows(op, "x", x, vec)
    if weight is not None:
        try:
            w_ptr = weight.data_ptr()
        except AttributeError:
            check_cuda(op, "weight", weight)
        if weight.dtype is not dtype or weight.shape != (hidden,) or weight.stride() != (1,) or weight.get_device() != device or w_ptr % 16:
            check_like(op, "weight", weight, (hidden,), dtype, device)
            fail(op, "weight", "contiguous and 16-byte aligned", f"stride {weight.stride()} address {w_ptr:#x}")
    else:
        w_ptr = 0
    if out is None:
        out = torch.empty_like(x)
        # empty_like keeps the strides of a dense x; only a strided view needs asking
        if x_s == hidden and (ndim == 2 or x_bs == num_tokens * hidden):
            o_bs, o_s = x_bs, x_s
        else:
            o_bs, o_s = _row_strides(out)
    else:
        check_like(op, "out", out, shape, dtype, device)
        check_rows(op, "out", out, vec)
        o_bs, o_s = _row_strides(out)
    if residual is not None:
        check_like(op, "residual", residual, shape, dtype, device)
        check_rows(op, "residual", residual, vec)
        if residual_out is None:
            residual_out = torch.empty_like(x)
        else:
            check_like(op, "residual_out", residual_out, shape, dtype, device)
            check_rows(op, "residual_out", residual_out, vec)
        r_bs, r_s = _row_strides(residual)
        ro_bs, ro_s = _row_strides(residual_out)
        r_ptr, ro_ptr = residual.data_ptr(), residual_out.data_ptr()
    else:
        r_bs = r_s = ro_bs = ro_s = r_ptr = ro_ptr = 0
    if with_rstd:
        rstd = torch.empty(shape[:-1], dtype=torch.float32, device=x.device)
        rstd_ptr = rstd.data_ptr()
    else:
        rstd, rstd_ptr = None, 0

    fast_key = (device, hidden, dtype, weight is not None, residual is not None, with_rstd)
    launcher = _NORM.cache.get(fast_key)
    if launcher is None:
        launcher = _NORM.get(device, hidden, _NORM_DTYPE_NAMES[dtype], weight is not None, residual is not None, bool(with_rstd))
        _NORM.cache[fast_key] = launcher
    launcher(
        device, current_stream(device),
        x_ptr, w_ptr, r_ptr, out.data_ptr(), ro_ptr, rstd_ptr, eps, out_scale, batch, num_tokens,
        x_bs, x_s, r_bs, r_s, o_bs, o_s, ro_bs, ro_s,
    )  # fmt: skip
    return out, rstd, (x if residual is None else residual_out)


# The casts and fused ops load on first use (they are most of this module's import time);
# tests/test_import.py checks these lists against the modules' __all__.
_CAST_NAMES = (
    "cast", "cast_back", "per_block_cast", "per_block_cast_with_precomputed_sf", "per_block_cast_with_sf_only",
    "per_channel_cast", "per_token_cast_and_cast_back", "per_token_cast", "per_token_cast_back",
    "per_token_cast_with_precomputed_sf", "per_token_cast_with_sf_only", "unpack_from_e2m1fn_x2",
)  # fmt: skip
_WEIGHT_CAST_NAMES = ("batched_transpose_weight_sf", "per_block_cast_lossless")
_NORM_CAST_NAMES = ("norm_forward_and_per_token_cast",)
_SWIGLU_NAMES = ("swiglu_forward", "swiglu_forward_and_per_token_cast")
_LAZY = {
    **{name: "tkaot._casts" for name in _CAST_NAMES},
    **{name: "tkaot._weight_casts" for name in _WEIGHT_CAST_NAMES},
    **{name: "tkaot._norm_cast" for name in _NORM_CAST_NAMES},
    **{name: "tkaot._swiglu" for name in _SWIGLU_NAMES},
}
__all__ = ["norm_forward", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tkaot.quant' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
