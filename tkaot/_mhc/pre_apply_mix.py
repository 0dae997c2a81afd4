"""tkaot.mhc.mhc_pre_apply_mix_fwd / _bwd: mix a token's mhc streams into one layer input, and the backward."""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._mhc import kernels  # the shipped tilings, read at every call
from tkaot._mhc.common import BF16, F32, current_stream, elements_rule, hidden_rule, launcher, mhc_rule
from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD, PRE_APPLY_MIX_FWD
from tkaot._op import op_parts
from tkaot._validate import Signature, Tensor

__all__ = ["mhc_pre_apply_mix_bwd", "mhc_pre_apply_mix_fwd"]

_ROW = (("num_tokens", "hidden"),)
_STREAMS = (("num_tokens", "mhc", "hidden"),)
_MIX = (("num_tokens", "mhc"),)
_RULES = (mhc_rule("x"), hidden_rule("x"), elements_rule("x", "num_tokens * hidden"))

FWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_pre_apply_mix_fwd",
    tensors=(
        Tensor("x", (BF16,), _STREAMS, layout="contiguous", align=16),
        Tensor("mix", (F32,), _MIX, layout="contiguous"),
        Tensor("o", (BF16,), _ROW, layout="contiguous", align=16),
    ),
    dims=("num_tokens", "hidden", "mhc"),
    rules=_RULES,
)
BWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_pre_apply_mix_bwd",
    tensors=(
        Tensor("o_grad", (BF16,), _ROW, layout="contiguous", align=16),
        Tensor("x", (BF16,), _STREAMS, layout="contiguous", align=16),
        Tensor("mix", (F32,), _MIX, layout="contiguous"),
        Tensor("x_grad", (BF16,), _STREAMS, layout="contiguous", align=16),
    ),
    dims=("num_tokens", "hidden", "mhc"),
    rules=_RULES,
)
(_check_fwd, _FWD), (_check_bwd, _BWD) = op_parts(globals(), (FWD_SIGNATURE, PRE_APPLY_MIX_FWD), (BWD_SIGNATURE, PRE_APPLY_MIX_BWD))


def mhc_pre_apply_mix_fwd(x, mix, o):
    """Mix each token's streams into one row: o[t, :] = sum over m of mix[t, m] * x[t, m, :], in fp32 in stream
    order (fused multiply-adds from 0), rounded once to bf16.

    Args:
        x: (num_tokens, mhc, hidden) bf16, contiguous, on a CUDA device; mhc in [1, 8], hidden a multiple of 8.
        mix: (num_tokens, mhc) fp32, contiguous.
        o: (num_tokens, hidden) bf16, contiguous, written in place.

    Returns None.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_pre_apply_mix_fwd(x, mix, o)
    device, num_tokens, hidden, mhc, x_ptr, mix_ptr, o_ptr = _check_fwd(x, mix, o)
    if num_tokens and hidden:
        launcher(_FWD, device, mhc)(device, current_stream(device), x_ptr, mix_ptr, o_ptr, num_tokens, hidden)


def mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad):
    """The gradient of mhc_pre_apply_mix_fwd.

    Args:
        o_grad: (num_tokens, hidden) bf16, contiguous, on a CUDA device.
        x: (num_tokens, mhc, hidden) bf16, contiguous (the forward's input).
        mix: (num_tokens, mhc) fp32, contiguous.
        x_grad: (num_tokens, mhc, hidden) bf16, contiguous, accumulated into in place:
            x_grad[t, m, :] += mix[t, m] * o_grad[t, :] (one fp32 fused multiply-add, rounded to bf16).

    Returns mix_grad, a new (num_tokens, mhc) fp32 tensor: sum over h of o_grad[t, h] * x[t, m, h].
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:
        return _traced_mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)
    device, num_tokens, hidden, mhc, og_ptr, x_ptr, mix_ptr, xg_ptr = _check_bwd(o_grad, x, mix, x_grad)
    if not hidden:
        return torch.zeros((num_tokens, mhc), dtype=F32, device=x.device)
    mix_grad = torch.empty((num_tokens, mhc), dtype=F32, device=x.device)
    if num_tokens:
        _bwd_launcher(device, mhc, hidden)(
            device, current_stream(device), og_ptr, x_ptr, mix_ptr, xg_ptr, mix_grad.data_ptr(), num_tokens, hidden
        )
    return mix_grad


def _bwd_launcher(device: int, mhc: int, hidden: int):
    """The backward's launcher: the one-vector walk for rows narrower than PRE_APPLY_MIX_BWD_NARROW_HIDDEN, the
    three-vector walk otherwise; a set built without the narrow variant serves those rows with the default one."""
    return _BWD.get(device, mhc, kernels.pre_apply_mix_bwd_tiling(hidden), general_tiling=kernels.PRE_APPLY_MIX_BWD_TILINGS["default"])


# ---- traced forms (tkaot/_compile.py)


def _fake_fwd(new, x, mix, o):
    return None


def _fake_bwd(new, o_grad, x, mix, x_grad):
    return new.empty((x.shape[0], x.shape[1]), F32, x.device)


_TENSORS = {name: "tensor" for name in ("x", "mix", "o", "o_grad", "x_grad")}
_traced_mhc_pre_apply_mix_fwd = traced(mhc_pre_apply_mix_fwd, _fake_fwd, mutates=("o",), outputs=0, kinds=_TENSORS)
_traced_mhc_pre_apply_mix_bwd = traced(mhc_pre_apply_mix_bwd, _fake_bwd, mutates=("x_grad",), outputs=1, kinds=_TENSORS)
