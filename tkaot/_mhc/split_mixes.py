"""tkaot.mhc.mhc_pre_split_mixes_fwd / _bwd: split a token's raw mixes into the pre-layer, post-layer and residual
mixes (scaled, biased, the first two through a sigmoid), and the backward."""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._mhc.common import F32, current_stream, f32, float_rule, launcher, mhc_rule
from tkaot._mhc.kernels import SPLIT_MIXES_BWD, SPLIT_MIXES_BWD_REDUCE, SPLIT_MIXES_FWD
from tkaot._op import OpKernels, op_parts
from tkaot._validate import Rule, Signature

__all__ = ["mhc_pre_split_mixes_bwd", "mhc_pre_split_mixes_fwd"]

_THREADS = 128  # kernels_src/mhc/split_mixes_bwd.py THREADS
_MAX_PARTIALS = 256  # the first backward launch's blocks at most; each thread then takes whole tokens


_TOKEN_MIXES = ("num_tokens", "mhc")
_MIXES = "of (num_tokens, mhc * (mhc + 2)) (pre, post and residual mixes)"


def _mixes_rules(first: str) -> tuple:
    """mhc, bound from the first per-token (num_tokens, mhc) tensor, sizes the raw mixes and the residual mixes."""
    return (
        mhc_rule(first),
        Rule("input_mixes", "n_mixes == mhc * (mhc + 2)", "of shape ({num_tokens}, {mhc * (mhc + 2)}) for mhc={mhc}",
             actual="tuple(h_input_mixes)"),
        Rule("mhc_base", "n_base == mhc * (mhc + 2)", "of shape ({mhc * (mhc + 2)},) for mhc={mhc}", actual="tuple(h_mhc_base)"),
    )  # fmt: skip


def _comb_rule(name: str) -> Rule:
    return Rule(name, "n_comb == mhc * mhc", "of shape ({num_tokens}, {mhc * mhc}) for mhc={mhc}", actual=f"tuple(h_{name})")


FWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_pre_split_mixes_fwd",
    tensors=(
        f32("input_mixes", ("num_tokens", "n_mixes"), what=_MIXES),
        f32("mhc_scale", (3,)),
        f32("mhc_base", ("n_base",)),
        f32("pre_layer_mix", _TOKEN_MIXES),
        f32("post_layer_mix", _TOKEN_MIXES),
        f32("comb_res_mix", ("num_tokens", "n_comb")),
    ),
    scalars=("mhc_post_mult_value", "mhc_pre_eps"),
    dims=("num_tokens", "mhc"),
    rules=(
        *_mixes_rules("pre_layer_mix"), _comb_rule("comb_res_mix"), float_rule("mhc_post_mult_value"), float_rule("mhc_pre_eps"),
    ),
)  # fmt: skip
BWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_pre_split_mixes_bwd",
    tensors=(
        f32("pre_layer_mix_grad", _TOKEN_MIXES),
        f32("post_layer_mix_grad", _TOKEN_MIXES),
        f32("comb_res_mix_grad", ("num_tokens", "n_comb")),
        f32("input_mixes", ("num_tokens", "n_mixes"), what=_MIXES),
        f32("post_layer_mix", _TOKEN_MIXES),
        f32("mhc_scale", (3,)),
        f32("mhc_base", ("n_base",)),
        f32("input_mixes_grad", ("num_tokens", "n_mixes")),
        f32("mhc_scale_grad", (3,)),
        f32("mhc_base_grad", ("n_base",)),
    ),
    scalars=("mhc_post_mult_value",),
    dims=("num_tokens", "mhc"),
    rules=(*_mixes_rules("pre_layer_mix_grad"), _comb_rule("comb_res_mix_grad"), float_rule("mhc_post_mult_value")),
)
(_check_fwd, _FWD), (_check_bwd, _BWD) = op_parts(globals(), (FWD_SIGNATURE, SPLIT_MIXES_FWD), (BWD_SIGNATURE, SPLIT_MIXES_BWD))
_BWD_REDUCE = OpKernels(BWD_SIGNATURE.op, SPLIT_MIXES_BWD_REDUCE)


def mhc_pre_split_mixes_fwd(
    input_mixes,
    mhc_scale,
    mhc_base,
    pre_layer_mix,
    post_layer_mix,
    comb_res_mix,
    mhc_post_mult_value: float,
    mhc_pre_eps: float,
):
    """Split raw mixes: with v = input_mixes[t, j] * mhc_scale[part] + mhc_base[j] (fp32),
    pre_layer_mix = sigmoid(v) + mhc_pre_eps over the first mhc columns, post_layer_mix = sigmoid(v) *
    mhc_post_mult_value over the next mhc, comb_res_mix = v over the last mhc * mhc.

    Args:
        input_mixes: (num_tokens, mhc * (mhc + 2)) fp32, contiguous, on a CUDA device; mhc in [1, 8].
        mhc_scale: (3,) fp32, one scale a part. mhc_base: (mhc * (mhc + 2),) fp32.
        pre_layer_mix, post_layer_mix: (num_tokens, mhc) fp32; comb_res_mix: (num_tokens, mhc * mhc) fp32;
            all contiguous, written in place.

    Returns None.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_pre_split_mixes_fwd(
            input_mixes, mhc_scale, mhc_base, pre_layer_mix, post_layer_mix, comb_res_mix, mhc_post_mult_value, mhc_pre_eps
        )
    device, num_tokens, mhc, im, scale, base, pre, post, comb = _check_fwd(
        input_mixes, mhc_scale, mhc_base, pre_layer_mix, post_layer_mix, comb_res_mix, mhc_post_mult_value, mhc_pre_eps
    )
    if num_tokens:
        launcher(_FWD, device, mhc)(
            device, current_stream(device), im, scale, base, pre, post, comb, mhc_post_mult_value, mhc_pre_eps, num_tokens
        )


def partial_count(num_tokens: int) -> int:
    """Blocks of the backward's first launch: one a THREADS tokens up to _MAX_PARTIALS, so the parameter
    gradients' summation order depends on the token count alone, never on the GPU."""
    return min(-(-num_tokens // _THREADS), _MAX_PARTIALS)


def mhc_pre_split_mixes_bwd(
    pre_layer_mix_grad,
    post_layer_mix_grad,
    comb_res_mix_grad,
    input_mixes,
    post_layer_mix,
    mhc_scale,
    mhc_base,
    input_mixes_grad,
    mhc_scale_grad,
    mhc_base_grad,
    mhc_post_mult_value: float,
):
    """The gradient of mhc_pre_split_mixes_fwd.

    Args:
        pre_layer_mix_grad, post_layer_mix_grad: (num_tokens, mhc) fp32; comb_res_mix_grad: (num_tokens, mhc * mhc)
            fp32: the outputs' gradients.
        input_mixes, post_layer_mix, mhc_scale, mhc_base: the forward's inputs and its post_layer_mix output.
        input_mixes_grad: (num_tokens, mhc * (mhc + 2)) fp32, written in place.
        mhc_scale_grad: (3,) fp32, mhc_base_grad: (mhc * (mhc + 2),) fp32: written in place (not accumulated
            into), each a sum over all tokens.
        All tensors fp32, contiguous, on one CUDA device.

    Returns None.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:
        return _traced_mhc_pre_split_mixes_bwd(
            pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale, mhc_base,
            input_mixes_grad, mhc_scale_grad, mhc_base_grad, mhc_post_mult_value,
        )  # fmt: skip
    device, num_tokens, mhc, *pointers = _check_bwd(
        pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale, mhc_base,
        input_mixes_grad, mhc_scale_grad, mhc_base_grad, mhc_post_mult_value,
    )  # fmt: skip
    pre_g, post_g, comb_g, im, post, scale, base, im_g, scale_g, base_g = pointers
    count = partial_count(num_tokens)
    partials = torch.empty((count, mhc * (mhc + 2) + 3), dtype=F32, device=input_mixes.device)
    stream = current_stream(device)
    if num_tokens:
        launcher(_BWD, device, mhc)(
            device, stream, pre_g, post_g, comb_g, im, post, scale, base, im_g, partials.data_ptr(), mhc_post_mult_value,
            num_tokens, count,
        )  # fmt: skip
    # with no tokens the sums are over nothing: the reduction writes zeros
    launcher(_BWD_REDUCE, device, mhc)(device, stream, partials.data_ptr(), scale_g, base_g, count)


# ---- traced forms (tkaot/_compile.py): both write their output buffers and allocate nothing they return


def _fake(new, *args):
    return None


_TENSORS = {
    name: "tensor"
    for name in (
        "input_mixes", "mhc_scale", "mhc_base", "pre_layer_mix", "post_layer_mix", "comb_res_mix", "pre_layer_mix_grad",
        "post_layer_mix_grad", "comb_res_mix_grad", "input_mixes_grad", "mhc_scale_grad", "mhc_base_grad",
    )
}  # fmt: skip
_traced_mhc_pre_split_mixes_fwd = traced(
    mhc_pre_split_mixes_fwd, _fake, mutates=("pre_layer_mix", "post_layer_mix", "comb_res_mix"), outputs=0, kinds=_TENSORS
)
_traced_mhc_pre_split_mixes_bwd = traced(
    mhc_pre_split_mixes_bwd, _fake, mutates=("input_mixes_grad", "mhc_scale_grad", "mhc_base_grad"), outputs=0, kinds=_TENSORS
)
