"""Pure-torch references of tkaot.mhc's ops (the head mix, norm-weight merge, reduce partials + RMSNorm, pre big
fuse and multilayer recompute): what each op writes in place, returned as new tensors.

Sums run in the order the kernels sum (splits and streams in order, from zero), so float32 results differ
from the kernels' only by fused multiply-adds and the exp / rsqrt implementations. Every function keeps
its inputs' floating dtype, so the float64 gradient checks (tests/test_mhc_fused.py) can run them in double.
"""

from __future__ import annotations

import torch

import tkaot.mhc
from tkaot.reference._arguments import takes_arguments_of


def _ordered_sum(parts: torch.Tensor) -> torch.Tensor:
    """parts.sum(0), summed in index order from zero."""
    total = torch.zeros_like(parts[0])
    for part in parts:
        total = total + part
    return total


def _rms_factor(squares: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    return torch.rsqrt(squares / group_size + eps)


def _sinkhorn(comb: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """Sinkhorn over the last two dims (rows, cols): a row softmax plus eps, a column normalisation, then
    repeat - 1 times a row and a column normalisation, each dividing by (sum + eps)."""
    comb = comb.softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return comb


def _apply_mix(streams: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum over i of weights[:, i] * streams[:, i] (streams (tokens, M, hidden) as float32, weights (tokens, M)),
    in stream order from zero."""
    x = streams.float()
    total = torch.zeros_like(x[:, 0])
    for i in range(x.shape[1]):
        total = total + weights[:, i : i + 1].float() * x[:, i]
    return total


@takes_arguments_of(tkaot.mhc.mhc_head_compute_mix_fwd)
def mhc_head_compute_mix_fwd(input_mix, mhc_scale, mhc_base, mhc_pre_eps) -> torch.Tensor:
    """output_mix."""
    return torch.sigmoid(input_mix * mhc_scale[0] + mhc_base) + mhc_pre_eps


@takes_arguments_of(tkaot.mhc.mhc_head_compute_mix_bwd)
def mhc_head_compute_mix_bwd(output_mix_grad, input_mix, mhc_scale, mhc_base, num_sms, token_block_size):
    """(input_mix_grad, mhc_scale_grad_partial (num_sms, 1), mhc_base_grad_partial (num_sms, mhc_mult)): partial
    row p sums the tiles of token_block_size (0: 32) tokens p, p + num_sms, ..."""
    s = torch.sigmoid(input_mix * mhc_scale[0] + mhc_base)
    g = s * (1 - s) * output_mix_grad
    block = token_block_size or 32
    rows = (torch.arange(input_mix.shape[0], device=input_mix.device) // block) % num_sms
    scale_partial = torch.zeros(num_sms, 1, dtype=g.dtype, device=g.device)
    base_partial = torch.zeros(num_sms, input_mix.shape[1], dtype=g.dtype, device=g.device)
    scale_partial.index_add_(0, rows, (g * input_mix).sum(1, keepdim=True))
    base_partial.index_add_(0, rows, g)
    return g * mhc_scale[0], scale_partial, base_partial


@takes_arguments_of(tkaot.mhc.mhc_fn_normw_merge_fwd)
def mhc_fn_normw_merge_fwd(fn, normw) -> torch.Tensor:
    """out_fn."""
    return fn * normw


@takes_arguments_of(tkaot.mhc.mhc_fn_normw_merge_bwd)
def mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad) -> tuple[torch.Tensor, torch.Tensor]:
    """(fn_grad, normw_grad) after the op's accumulation: the given ones plus this call's gradients."""
    return fn_grad + out_fn_grad * normw, normw_grad + _ordered_sum(out_fn_grad * fn)


@takes_arguments_of(tkaot.mhc.mhc_reduce_partials_and_rmsnorm_fwd)
def mhc_reduce_partials_and_rmsnorm_fwd(out_mul_splitted, sqrsum_splitted, rms_group_size, rms_eps, n_splits):
    """(out_mul, sqrsum, out)."""
    out_mul = _ordered_sum(out_mul_splitted[:n_splits])
    sqrsum = _ordered_sum(sqrsum_splitted[:n_splits])
    out = _ordered_sum((out_mul * _rms_factor(sqrsum, rms_group_size, rms_eps).unsqueeze(-1)).transpose(0, 1))
    return out_mul, sqrsum, out


@takes_arguments_of(tkaot.mhc.mhc_reduce_partials_and_rmsnorm_bwd)
def mhc_reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, rms_group_size, rms_eps):
    """(out_mul_grad, sqrsum_grad): the gradients of the forward's out with respect to out_mul and sqrsum."""
    r = _rms_factor(sqrsum, rms_group_size, rms_eps)
    out_mul_grad = out_grad.unsqueeze(1) * r.unsqueeze(-1)
    dot = (out_grad.unsqueeze(1) * out_mul).sum(-1)
    return out_mul_grad, dot * r / (sqrsum + rms_eps * rms_group_size) / -2


def pre_big_fuse_mixes(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, mhc_mult: int, hidden: int, rms_eps: float):
    """(pre logits, post logits, comb logits (tokens, M, M)) of the fused pre step: the reduced, RMS-normalised
    mixes times their scale plus their base."""
    mixes = _ordered_sum(gemm_out_mul) * _rms_factor(_ordered_sum(gemm_out_sqrsum), mhc_mult * hidden, rms_eps).unsqueeze(-1)
    m = mhc_mult
    pre = mixes[:, :m] * mhc_scale[0] + mhc_base[:m]
    post = mixes[:, m : 2 * m] * mhc_scale[1] + mhc_base[m : 2 * m]
    comb = mixes[:, 2 * m :] * mhc_scale[2] + mhc_base[2 * m :]
    return pre, post, comb.view(-1, m, m)


@takes_arguments_of(tkaot.mhc.mhc_pre_big_fuse_fwd)
def mhc_pre_big_fuse_fwd(
    gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps,
    mhc_post_mult_value, sinkhorn_repeat, n_splits,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(post_mix (tokens, M), comb_mix (tokens, M * M), layer_input (tokens, hidden) bf16)."""
    tokens, m, hidden = residual.shape
    pre, post, comb = pre_big_fuse_mixes(gemm_out_mul[:n_splits], gemm_out_sqrsum[:n_splits], mhc_scale, mhc_base, m, hidden, rms_eps)
    pre_mix = torch.sigmoid(pre) + mhc_pre_eps
    post_mix = torch.sigmoid(post) * mhc_post_mult_value
    comb_mix = _sinkhorn(comb, sinkhorn_repeat, mhc_sinkhorn_eps).reshape(tokens, m * m)
    return post_mix, comb_mix, _apply_mix(residual, pre_mix).bfloat16()


@takes_arguments_of(tkaot.mhc.mhc_multilayer_recompute)
def mhc_multilayer_recompute(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list):
    """(layer inputs, residuals): a list of L bf16 (tokens, hidden) and one of P bf16 (tokens, M, hidden)."""
    m, hidden = initial_residual.shape[-2:]
    res = initial_residual.reshape(-1, m, hidden)
    tokens = res.shape[0]
    inputs, residuals = [], []
    for layer, pre in enumerate(pre_mix_list):
        inputs.append(_apply_mix(res, pre.reshape(tokens, m)).bfloat16())
        if layer == len(layer_output_list):
            break
        post = post_mix_list[layer].reshape(tokens, m, 1).float()
        comb = comb_mix_list[layer].reshape(tokens, m, m).float()
        out = layer_output_list[layer].reshape(tokens, 1, hidden).float()
        new = post * out
        for i in range(m):
            new = new + comb[:, i, :, None] * res[:, i : i + 1].float()
        res = new.bfloat16()
        residuals.append(res)
    return inputs, residuals
