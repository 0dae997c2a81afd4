"""tkaot.quant.norm_forward: RMSNorm with an optional residual, on the rmsnorm kernel."""

from __future__ import annotations

import numbers

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._op import OpKernels, current_stream
from tkaot._quant.kernels import RMSNORM
from tkaot._validate import Rule, Signature, Tensor, lazy_checker

__all__ = ["norm_forward"]

_ROWS = (("num_tokens", "hidden"), ("batch", "num_tokens", "hidden"))
# RMSNorm's inputs; norm_forward_and_per_token_cast (tkaot/_quant/norm_cast.py) takes the same
NORM_INPUTS = (
    Tensor("x", (torch.bfloat16, torch.float32), _ROWS, what="2-D (num_tokens, hidden) or 3-D (batch, num_tokens, hidden)"),
    Tensor("weight", "x", (("hidden",),), layout="contiguous", align=16, optional=True),
    Tensor("residual", "x", "x", optional=True),
)
_SHAPE = "f'shape {tuple(h_x)}'"


def real_rule(name: str) -> Rule:
    """A real-number argument (a float first, as it nearly always is; any numbers.Real but a bool): the kernel reads it
    as float32, so a string or None is refused here rather than at the launch."""
    check = f"type({name}) is float or (isinstance({name}, _Real) and not isinstance({name}, bool))"
    return Rule(name, check, "a real number", error="TypeError")


# eps and out_scale, norm_forward_and_per_token_cast's too
REAL_ARGS = (real_rule("eps"), real_rule("out_scale"))
SIGNATURE = Signature(
    "tkaot.quant.norm_forward",
    tensors=(
        *NORM_INPUTS,
        Tensor("out", "x", "x", optional=True),
        Tensor("residual_out", "x", "x", optional=True),
    ),
    dims=("batch", "num_tokens", "hidden"),
    defaults={"batch": 1},
    rules=(
        Rule("x", "batch <= 65535", "at most 65535 batches", actual=_SHAPE),
        # hidden is in the launcher's key: checked once a key, where the op binds its launcher
        Rule("x", "hidden % 16 == 0 and 0 < hidden <= 8192", "of hidden size a multiple of 16 in (0, 8192]", actual=_SHAPE, after="launch"),
        *REAL_ARGS,
    ),
    scalars=("eps", "out_scale"),
    env={"_Real": numbers.Real},
    returns=(
        "device", "t_x", "batch", "num_tokens", "hidden", "p_x", "p_weight", "p_residual", "p_out", "p_residual_out",
        "s_x", "s_residual", "s_out", "s_residual_out",
    ),
)  # fmt: skip


_check = lazy_checker(SIGNATURE, globals(), "_check")


_NORM = OpKernels(SIGNATURE.op, RMSNORM)
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def _rows(strides: tuple) -> tuple[int, int]:
    """(batch stride, row stride) of a 2-D or 3-D tensor's strides; batch stride 0 for 2-D."""
    return (strides[0], strides[1]) if len(strides) == 3 else (0, strides[0])


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
            device; last dimension contiguous, rows 16-byte aligned; hidden a multiple of 16, at most 8192.
        weight: (hidden,) of x's dtype, or None for unit weight.
        eps: added to the mean square before the reciprocal square root.
        residual: optional, shaped like x; x + residual is rounded to x's dtype first.
        out_scale: multiplies the weight (fp32).
        out: optional output buffer shaped like x.
        residual_out: optional buffer for x + residual (unused without residual).
        with_rstd: also return the fp32 reciprocal RMS of each row.

    Returns:
        (out, rstd of shape x.shape[:-1] or None, the normalised input: x + residual,
        or x itself without residual).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_norm_forward(x, weight, eps, residual, out_scale, out, residual_out, with_rstd)
    device, dtype, batch, num_tokens, hidden, x_ptr, w_ptr, r_ptr, o_ptr, ro_ptr, xs, rs, os_, ros = _check(
        x, weight, residual, out, residual_out, eps, out_scale
    )
    fast_key = (device, hidden, dtype, weight is not None, residual is not None, with_rstd)
    launcher = _NORM.cache.get(fast_key)
    if launcher is None:
        SIGNATURE.check_at_launch(x, weight, residual, out, residual_out, eps, out_scale)
        launcher = _NORM.get(device, hidden, _DTYPE_NAMES[dtype], weight is not None, residual is not None, bool(with_rstd))
        _NORM.cache[fast_key] = launcher
    x_s, x_bs = xs[-2], (xs[0] if batch != 1 else 0)  # one batch: the kernel never multiplies its stride
    if out is None:
        out = torch.empty_like(x)
        o_ptr = out.data_ptr()
        # empty_like keeps the strides of a dense x; only a strided view needs asking
        o_bs, o_s = (x_bs, x_s) if x_s == hidden and (batch == 1 or x_bs == num_tokens * hidden) else _rows(out.stride())
    else:
        o_bs, o_s = _rows(os_)
    if residual is not None:
        r_bs, r_s = _rows(rs)
        if residual_out is None:
            residual_out = torch.empty_like(x)
            ro_ptr, ros = residual_out.data_ptr(), residual_out.stride()
        ro_bs, ro_s = _rows(ros)
    else:
        r_bs = r_s = ro_bs = ro_s = r_ptr = ro_ptr = 0
    if with_rstd:
        rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        rstd_ptr = rstd.data_ptr()
    else:
        rstd, rstd_ptr = None, 0

    launcher(
        device, current_stream(device),
        x_ptr, w_ptr, r_ptr, o_ptr, ro_ptr, rstd_ptr, eps, out_scale, batch, num_tokens,
        x_bs, x_s, r_bs, r_s, o_bs, o_s, ro_bs, ro_s,
    )  # fmt: skip
    return out, rstd, (x if residual is None else residual_out)


def _fake(new, x, weight, eps, residual=None, out_scale=1.0, out=None, residual_out=None, with_rstd=False):
    """norm_forward's outputs, allocated through `new` (tracing, tkaot/_compile.py)."""
    out = new.empty_like(x) if out is None else out
    rstd = new.empty(x.shape[:-1], torch.float32, x.device) if with_rstd else None
    if residual is not None and residual_out is None:
        residual_out = new.empty_like(x)
    return out, rstd, (x if residual is None else residual_out)


_traced_norm_forward = traced(norm_forward, _fake, mutates=("out", "residual_out"), outputs=3)
