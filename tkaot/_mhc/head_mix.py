"""tkaot.mhc.mhc_head_compute_mix_fwd / _bwd: the sigmoid head mix of mHC and its gradient."""

from __future__ import annotations

import torch

from tkaot._compile import allocates_nothing, compiler, is_dynamo_compiling, traced
from tkaot._mhc.common import f32, float_rule, int_rules, like
from tkaot._mhc.kernels import HEAD_MIX_BWD, HEAD_MIX_BWD_THREADS, HEAD_MIX_FWD
from tkaot._op import current_stream, op_parts
from tkaot._validate import Rule, Signature

__all__ = ["mhc_head_compute_mix_fwd", "mhc_head_compute_mix_bwd"]

DEFAULT_TOKEN_BLOCK = 32  # TileKernels' default on CUDA; it picks which tokens each partial row sums
_MIXES = ("num_tokens", "mhc_mult")
_ELEMENTS = Rule("input_mix", "num_tokens * mhc_mult <= _MAX_I32", "of fewer than 2**31 elements", actual="f'shape {tuple(h_input_mix)}'")

FWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_head_compute_mix_fwd",
    tensors=(
        f32("input_mix", _MIXES, what="2-D (num_tokens, mhc_mult)"),
        f32("mhc_scale", (1,)),
        f32("mhc_base", ("mhc_mult",)),
        like("output_mix", "input_mix"),
    ),
    scalars=("mhc_pre_eps", "token_block_size"),
    dims=_MIXES,
    rules=(_ELEMENTS, float_rule("mhc_pre_eps"), *int_rules("token_block_size", "0", "_MAX_I32")),
)

BWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_head_compute_mix_bwd",
    tensors=(
        f32("output_mix_grad", _MIXES, what="2-D (num_tokens, mhc_mult)"),
        like("input_mix", "output_mix_grad"),
        f32("mhc_scale", (1,)),
        f32("mhc_base", ("mhc_mult",)),
        like("input_mix_grad", "output_mix_grad"),
        f32("mhc_scale_grad_partial", ("num_sms", 1)),
        f32("mhc_base_grad_partial", ("num_sms", "mhc_mult")),
    ),
    scalars=("num_sms", "token_block_size"),
    dims=_MIXES,
    rules=(
        *int_rules("num_sms", "1", "_MAX_I32", after="output_mix_grad"),
        Rule(
            "output_mix_grad", f"1 <= mhc_mult <= {HEAD_MIX_BWD_THREADS} and mhc_mult & (mhc_mult - 1) == 0",
            f"of a power-of-two mhc_mult up to {HEAD_MIX_BWD_THREADS} (TileKernels' reductions need one)",
            actual="f'shape {tuple(h_output_mix_grad)}'", after="output_mix_grad",
        ),
        Rule("output_mix_grad", "num_tokens * mhc_mult <= _MAX_I32", "of fewer than 2**31 elements",
             actual="f'shape {tuple(h_output_mix_grad)}'"),
        *int_rules("token_block_size", "0", "_MAX_I32 // max(mhc_mult, 1)"),
    ),
)  # fmt: skip

(_check_fwd, _FWD), (_check_bwd, _BWD) = op_parts(globals(), (FWD_SIGNATURE, HEAD_MIX_FWD), (BWD_SIGNATURE, HEAD_MIX_BWD))


def mhc_head_compute_mix_fwd(
    input_mix: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    output_mix: torch.Tensor,
    mhc_pre_eps: float,
    token_block_size: int = 0,
) -> None:
    """output_mix = sigmoid(input_mix * mhc_scale[0] + mhc_base) + mhc_pre_eps, written in place.

    Args:
        input_mix: (num_tokens, mhc_mult) float32, contiguous, on a CUDA device; any mhc_mult.
        mhc_scale: (1,) float32. mhc_base: (mhc_mult,) float32.
        output_mix: (num_tokens, mhc_mult) float32 output buffer, contiguous.
        mhc_pre_eps: added after the sigmoid.
        token_block_size: accepted for TileKernels' sake (its tiling); the result does not depend on it.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_head_compute_mix_fwd(input_mix, mhc_scale, mhc_base, output_mix, mhc_pre_eps, token_block_size)
    device, num_tokens, mhc_mult, in_ptr, scale_ptr, base_ptr, out_ptr = _check_fwd(
        input_mix, mhc_scale, mhc_base, output_mix, mhc_pre_eps, token_block_size
    )
    if num_tokens == 0 or mhc_mult == 0:
        return None
    launcher = _FWD.cache.get(device)
    if launcher is None:
        launcher = _FWD.cache[device] = _FWD.get(device, "float32")
    launcher(device, current_stream(device), in_ptr, scale_ptr, base_ptr, out_ptr, mhc_pre_eps, num_tokens, mhc_mult)
    return None


def mhc_head_compute_mix_bwd(
    output_mix_grad: torch.Tensor,
    input_mix: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    input_mix_grad: torch.Tensor,
    mhc_scale_grad_partial: torch.Tensor,
    mhc_base_grad_partial: torch.Tensor,
    num_sms: int,
    token_block_size: int = 0,
) -> None:
    """The gradient of mhc_head_compute_mix_fwd: input_mix_grad, and partial sums of the scale and base gradients.

    With s = sigmoid(input_mix * mhc_scale[0] + mhc_base) and g = s * (1 - s) * output_mix_grad:
    input_mix_grad = g * mhc_scale[0]; row p of the partials holds the sums, over the tiles of
    token_block_size tokens p, p + num_sms, p + 2 * num_sms, ..., of g * input_mix (scale) and of g per
    column (base). Their sums over rows are the gradients of mhc_scale and mhc_base. Every row is
    written (zero where it has no tile). One cubin serves every num_sms and token_block_size.

    Args:
        output_mix_grad, input_mix: (num_tokens, mhc_mult) float32, contiguous; mhc_mult a power of
            two up to 128.
        mhc_scale: (1,) float32. mhc_base: (mhc_mult,) float32.
        input_mix_grad: (num_tokens, mhc_mult) float32 output buffer.
        mhc_scale_grad_partial: (num_sms, 1) float32 output buffer.
        mhc_base_grad_partial: (num_sms, mhc_mult) float32 output buffer.
        num_sms: partial rows (blocks), >= 1.
        token_block_size: tokens a tile, 0 for TileKernels' default (32).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_head_compute_mix_bwd(
            output_mix_grad, input_mix, mhc_scale, mhc_base, input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial, num_sms,
            token_block_size,
        )  # fmt: skip
    device, num_tokens, mhc_mult, grad_ptr, in_ptr, scale_ptr, base_ptr, in_grad_ptr, scale_part_ptr, base_part_ptr = _check_bwd(
        output_mix_grad, input_mix, mhc_scale, mhc_base, input_mix_grad, mhc_scale_grad_partial, mhc_base_grad_partial,
        num_sms, token_block_size,
    )  # fmt: skip
    launcher = _BWD.cache.get(device)
    if launcher is None:
        launcher = _BWD.cache[device] = _BWD.get(device, "float32")
    launcher(
        device, current_stream(device),
        grad_ptr, in_ptr, scale_ptr, base_ptr, in_grad_ptr, scale_part_ptr, base_part_ptr,
        token_block_size or DEFAULT_TOKEN_BLOCK, num_tokens, mhc_mult, num_sms,
    )  # fmt: skip
    return None


_traced_mhc_head_compute_mix_fwd = traced(mhc_head_compute_mix_fwd, allocates_nothing, mutates=("output_mix",), outputs=0)
_traced_mhc_head_compute_mix_bwd = traced(
    mhc_head_compute_mix_bwd, allocates_nothing, mutates=("input_mix_grad", "mhc_scale_grad_partial", "mhc_base_grad_partial"), outputs=0
)
