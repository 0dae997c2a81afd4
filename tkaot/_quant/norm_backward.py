"""tkaot.quant.norm_backward: RMSNorm gradients, on the rmsnorm_backward and weight_grad_reduce kernels.

Two launches: rmsnorm_backward writes x_grad and, with a weight, one fp32 partial weight gradient per block (with a
residual gradient, rmsnorm_backward_residual where it is built, with neither a weight nor a residual gradient,
rmsnorm_backward_plain where it is built: the same bytes, a body of their own);
weight_grad_reduce adds the partials (and weight_grad's own values, when one is given) in a fixed order. The
grid depends on the token count alone, so results are the same from run to run.
"""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._op import OpKernels, current_stream
from tkaot._quant.kernels import (
    NORM_BACKWARD_MAX_BLOCKS,
    NORM_BACKWARD_THREADS,
    RMSNORM_BACKWARD,
    RMSNORM_BACKWARD_PLAIN,
    RMSNORM_BACKWARD_RESIDUAL,
    WEIGHT_GRAD_REDUCE,
    norm_backward_plain_block,
    norm_backward_tiling,
)
from tkaot._validate import MAX_I32, Rule, Signature, Tensor, lazy_checker
from tkaot.errors import VariantNotBuilt

__all__ = ["norm_backward"]

_FLOATS = (torch.bfloat16, torch.float32)
SIGNATURE = Signature(
    "tkaot.quant.norm_backward",
    tensors=(
        Tensor("out_grad", _FLOATS, (("num_tokens", "hidden"),), what="2-D (num_tokens, hidden)"),
        Tensor("x", "out_grad", "out_grad"),
        Tensor("weight", "out_grad", (("hidden",),), layout="contiguous", align=16, optional=True),
        Tensor("rstd", (torch.float32,), (("num_tokens",),), layout="contiguous"),
        Tensor("residual_out_grad", "out_grad", "out_grad", optional=True),
        Tensor("weight_grad", _FLOATS, (("hidden",),), layout="contiguous", optional=True),
    ),
    dims=("num_tokens", "hidden"),
    rules=(
        Rule("out_grad", "0 < hidden <= 8192 and hidden % 32 == 0", "of hidden size a multiple of 32 in [32, 8192]",
             actual="f'shape {tuple(h_out_grad)}'", after="out_grad.shape"),
        Rule("out_grad", f"num_tokens * hidden <= {MAX_I32}", "of fewer than 2**31 elements", actual="f'shape {tuple(h_out_grad)}'",
             after="out_grad.shape"),
        Rule("weight_grad", "weight is not None", message="weight_grad needs weight (it accumulates weight's gradient)",
             after="weight_grad"),
    ),
)  # fmt: skip


_check = lazy_checker(SIGNATURE, globals(), "_check")

_PASS1 = OpKernels(SIGNATURE.op, RMSNORM_BACKWARD)
_PASS1_RESIDUAL = OpKernels(SIGNATURE.op, RMSNORM_BACKWARD_RESIDUAL)
_PASS1_PLAIN = OpKernels(SIGNATURE.op, RMSNORM_BACKWARD_PLAIN)
_PASS2 = OpKernels(SIGNATURE.op, WEIGHT_GRAD_REDUCE)
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def norm_backward(
    out_grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    residual_out_grad: torch.Tensor | None = None,
    out_scale: float = 1.0,
    weight_grad: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of norm_forward's output with respect to its normalised input and its weight.

    With xhat = x * rstd, g = out_grad * out_scale and gw = g * weight (fp32):
        x_grad = round((gw - xhat * mean(xhat * gw)) * rstd + residual_out_grad)
        weight_grad = sum over tokens of xhat * g (+ weight_grad's values, when given)

    Args:
        out_grad: (num_tokens, hidden) bf16 or fp32 on a CUDA device, hidden a multiple of 32 up to
            8192; last dimension contiguous, rows 16-byte aligned.
        x: norm_forward's normalised input (its third result: x + residual), like out_grad.
        weight: (hidden,) of out_grad's dtype, or None for unit weight.
        rstd: (num_tokens,) fp32, contiguous: norm_forward's reciprocal RMS (with_rstd=True).
        residual_out_grad: optional gradient arriving at x + residual, like out_grad; it is added to
            x_grad, which is then also the residual's gradient.
        out_scale: norm_forward's out_scale.
        weight_grad: optional (hidden,) bf16 or fp32 contiguous buffer (needs weight); the weight gradient
            is added to it in place (in fp32, then rounded) and it is returned.

    Returns:
        (x_grad (num_tokens, hidden) contiguous, of x's dtype; weight_grad, or None without weight).
        Without a given weight_grad it is a new tensor of weight's dtype.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_norm_backward(out_grad, x, weight, rstd, residual_out_grad, out_scale, weight_grad)
    device, num_tokens, hidden, og_ptr, x_ptr, w_ptr, rstd_ptr, rg_ptr, wg_ptr, og_s, x_s, rg_s = _check(
        out_grad, x, weight, rstd, residual_out_grad, weight_grad
    )
    dtype = x.dtype
    x_grad = torch.empty((num_tokens, hidden), dtype=dtype, device=x.device)
    accumulate = weight_grad is not None
    if weight is not None and weight_grad is None:
        weight_grad = torch.empty_like(weight, memory_format=torch.contiguous_format)
    if num_tokens == 0:
        if weight is not None and not accumulate:
            weight_grad.zero_()
        return x_grad, weight_grad

    name = _DTYPE_NAMES[dtype]
    pass1, rows_per_block, most_blocks = _pass1(device, hidden, name, residual_out_grad is not None, weight is not None)
    num_blocks = min(-(-num_tokens // rows_per_block), most_blocks)
    partials = torch.empty((num_blocks, hidden), dtype=torch.float32, device=x.device) if weight is not None else None
    stream = current_stream(device)
    pass1(
        device, stream,
        og_ptr, x_ptr, w_ptr, rstd_ptr, rg_ptr, x_grad.data_ptr(), 0 if partials is None else partials.data_ptr(),
        float(out_scale), 0 if weight is None else 1, 0 if residual_out_grad is None else 1,
        num_tokens, num_blocks, og_s[0] if num_tokens > 1 else 0, x_s[0] if num_tokens > 1 else 0,
        rg_s[0] if rg_s is not None and num_tokens > 1 else 0,
    )  # fmt: skip
    if partials is not None:
        _PASS2.get(device, _DTYPE_NAMES[weight_grad.dtype])(
            device, stream, partials.data_ptr(), weight_grad.data_ptr(), 1 if accumulate else 0, num_blocks, hidden
        )
    return x_grad, weight_grad


def _pass1(device: int, hidden: int, dtype: str, residual: bool, weighted: bool):
    """(Pass 1's launcher, rows a block, most blocks a grid). The launcher: with a residual gradient,
    rmsnorm_backward_residual's where it is built; with neither a weight nor a residual gradient,
    rmsnorm_backward_plain's where it is built; else rmsnorm_backward's (its specialised variant, else the generic
    one, as OpKernels.get rules). The grid: blocks of NORM_BACKWARD_THREADS, one on each SM, but rmsnorm_backward_plain's
    as norm_backward_plain_block builds it (one row slot of 128 threads, 2 blocks an SM, at bf16 4096 and 5120). Any
    grid gives the same bytes (a block runs its own rows), so an artifact set built with other blocks stays right."""
    found = _PASS1.cache.get((device, hidden, dtype, residual, weighted))
    if found is None:
        launcher, threads, most_blocks = None, NORM_BACKWARD_THREADS, NORM_BACKWARD_MAX_BLOCKS
        first = _PASS1_RESIDUAL if residual else None if weighted else _PASS1_PLAIN
        if first is not None:
            try:
                launcher = first.get(device, hidden, dtype)
            except VariantNotBuilt:
                pass
            else:
                if first is _PASS1_PLAIN:
                    threads, most_blocks = norm_backward_plain_block(hidden, dtype)
        if launcher is None:
            launcher = _PASS1.get(device, hidden, dtype)
        rows = threads // norm_backward_tiling(hidden, dtype)[1]
        found = _PASS1.cache[device, hidden, dtype, residual, weighted] = (launcher, rows, most_blocks)
    return found


def _fake(new, out_grad, x, weight, rstd, residual_out_grad=None, out_scale=1.0, weight_grad=None):
    """norm_backward's outputs, allocated through `new` (tracing, tkaot/_compile.py)."""
    x_grad = new.empty(x.shape, x.dtype, x.device)
    if weight is not None and weight_grad is None:
        weight_grad = new.empty(weight.shape, weight.dtype, weight.device)
    return x_grad, weight_grad


_traced_norm_backward = traced(norm_backward, _fake, mutates=("weight_grad",), outputs=2)
