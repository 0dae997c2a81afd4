"""tkaot.quant: TileKernels-compatible normalisation and quantisation ops."""

from __future__ import annotations

import torch

from tkaot._op import OpKernels, current_stream
from tkaot._validate import MAX_I32, check_cuda, check_like, check_rows, fail

_NORM_DTYPES = {torch.bfloat16: ("bfloat16", 8), torch.float32: ("float32", 4)}
_NORM = OpKernels(
    "tkaot.quant.norm_forward",
    "rmsnorm",
    ("hidden", "dtype", "with_weight", "with_residual", "with_rstd"),
    (
        "x", "weight", "residual", "out", "residual_out", "rstd", "eps", "out_scale", "batch", "num_tokens",
        "x_batch_stride", "x_stride", "residual_batch_stride", "residual_stride",
        "out_batch_stride", "out_stride", "residual_out_batch_stride", "residual_out_stride",
    ),
)  # fmt: skip


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
    op = "tkaot.quant.norm_forward"
    device = check_cuda(op, "x", x)
    spec = _NORM_DTYPES.get(x.dtype)
    if spec is None:
        fail(op, "x", "bfloat16 or float32", x.dtype)
    dtype_name, vec = spec
    shape = x.shape
    ndim = len(shape)
    if ndim == 2:
        batch, num_tokens, hidden = 1, shape[0], shape[1]
    elif ndim == 3:
        batch, num_tokens, hidden = shape
    else:
        fail(op, "x", "2-D (num_tokens, hidden) or 3-D (batch, num_tokens, hidden)", f"shape {tuple(shape)}")
    if batch > 65535 or num_tokens > MAX_I32:
        fail(op, "x", "at most 65535 batches and 2**31-1 tokens", f"shape {tuple(shape)}")
    check_rows(op, "x", x, vec)
    if weight is not None:
        check_like(op, "weight", weight, (hidden,), x.dtype, device)
        if weight.stride(0) != 1 or weight.data_ptr() % 16:
            fail(op, "weight", "contiguous and 16-byte aligned", f"stride {weight.stride()} address {weight.data_ptr():#x}")
    if out is None:
        out = torch.empty_like(x)
    else:
        check_like(op, "out", out, shape, x.dtype, device)
        check_rows(op, "out", out, vec)
    if residual is not None:
        check_like(op, "residual", residual, shape, x.dtype, device)
        check_rows(op, "residual", residual, vec)
        if residual_out is None:
            residual_out = torch.empty_like(x)
        else:
            check_like(op, "residual_out", residual_out, shape, x.dtype, device)
            check_rows(op, "residual_out", residual_out, vec)
    rstd = torch.empty(shape[:-1], dtype=torch.float32, device=x.device) if with_rstd else None

    with_weight, with_residual = weight is not None, residual is not None
    launcher = _NORM.get(device, hidden, dtype_name, with_weight, with_residual, with_rstd)
    x_bs, x_s = _row_strides(x)
    o_bs, o_s = _row_strides(out)
    if with_residual:
        r_bs, r_s = _row_strides(residual)
        ro_bs, ro_s = _row_strides(residual_out)
        r_ptr, ro_ptr = residual.data_ptr(), residual_out.data_ptr()
    else:
        r_bs = r_s = ro_bs = ro_s = r_ptr = ro_ptr = 0
    launcher(
        device,
        current_stream(device),
        x.data_ptr(),
        weight.data_ptr() if with_weight else 0,
        r_ptr,
        out.data_ptr(),
        ro_ptr,
        rstd.data_ptr() if with_rstd else 0,
        eps,
        out_scale,
        batch,
        num_tokens,
        x_bs, x_s, r_bs, r_s, o_bs, o_s, ro_bs, ro_s,
    )  # fmt: skip
    return out, rstd, (residual_out if with_residual else x)
