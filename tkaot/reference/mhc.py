"""Pure-torch references of tkaot.mhc's ops: what each op writes in place or returns, as new tensors.

The head mix, norm-weight merge, reduce partials + RMSNorm, pre big fuse and multilayer recompute (first part):
sums run in the order the kernels sum (splits and streams in order, from zero), so float32 results differ
from the kernels' only by fused multiply-adds and the exp / rsqrt implementations. Every function keeps
its inputs' floating dtype, so the float64 gradient checks (tests/test_mhc_fused.py) can run them in double.

Expand, pre-apply mix, split mixes, Sinkhorn and post (second part), in two layers. The math functions
(`expand`, `apply_mix`, `split_mixes`, `sinkhorn`, `post` and their `*_grad` counterparts) compute in the dtype
they are given (fp32 for the op references, fp64 for gradient checks), never round, and are differentiable:
each `*_grad` is an explicit formula that tests/test_mhc_reference.py holds to autograd of its forward. The op
references take an op's arguments (takes_arguments_of) and compute the way the kernels compute: fp32 in stream
order, fused multiply-adds where the kernels fuse them (emulated in fp64, exact in all but vanishingly rare
double-rounding cases), sums of 2**k terms in butterfly order (kernels_src/mhc/common.py tree_sum), then one
rounding to the output dtype.
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
    comb_mix = sinkhorn(comb, sinkhorn_repeat, mhc_sinkhorn_eps).reshape(tokens, m * m)
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


# ---- expand, pre-apply mix, split mixes, Sinkhorn, post

F32, F64 = torch.float32, torch.float64


# ---- math, in the given dtype


def expand(x: torch.Tensor, mhc: int) -> torch.Tensor:
    """(..., hidden) -> (..., mhc, hidden): the row repeated in each stream."""
    return x.unsqueeze(-2).expand(*x.shape[:-1], mhc, x.shape[-1])


def expand_grad(o_grad: torch.Tensor) -> torch.Tensor:
    return o_grad.sum(-2)


def apply_mix(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """x (..., mhc, hidden), mix (..., mhc) -> (..., hidden): sum over m of mix[m] * x[m]."""
    return (mix.unsqueeze(-1) * x).sum(-2)


def apply_mix_grad(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x's gradient, mix's gradient) of apply_mix."""
    return mix.unsqueeze(-1) * o_grad.unsqueeze(-2), (o_grad.unsqueeze(-2) * x).sum(-1)


def _parts(mhc: int) -> list[int]:
    """The part (0 pre, 1 post, 2 residual) of each of the mhc * (mhc + 2) raw mixes."""
    return [0] * mhc + [1] * mhc + [2] * (mhc * mhc)


def split_mixes(input_mixes, mhc_scale, mhc_base, mhc: int, post_mult: float, pre_eps: float):
    """input_mixes (..., mhc * (mhc + 2)) -> (pre (..., mhc), post (..., mhc), comb (..., mhc * mhc))."""
    v = input_mixes * mhc_scale[_parts(mhc)] + mhc_base
    pre = torch.sigmoid(v[..., :mhc]) + pre_eps
    post = torch.sigmoid(v[..., mhc : 2 * mhc]) * post_mult
    return pre, post, v[..., 2 * mhc :]


def split_mixes_grad(pre_grad, post_grad, comb_grad, input_mixes, post, mhc_scale, mhc_base, mhc: int, post_mult: float):
    """(input_mixes', mhc_scale', mhc_base') of split_mixes; `post` is its post output."""
    s = torch.sigmoid(input_mixes[..., :mhc] * mhc_scale[0] + mhc_base[:mhc])
    d = torch.cat([pre_grad * s * (1 - s), post_grad * post * (1 - post / post_mult), comb_grad], dim=-1)
    parts = torch.tensor(_parts(mhc), device=d.device)
    products = (d * input_mixes).reshape(-1, d.shape[-1]).sum(0)
    scale_grad = torch.zeros(3, dtype=d.dtype, device=d.device).index_add_(0, parts, products)
    return d * mhc_scale[parts], scale_grad, d.reshape(-1, d.shape[-1]).sum(0)


def sinkhorn(x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """(..., mhc, mhc) -> the Sinkhorn normalisation of mhc_sinkhorn_fwd, over the last two dims (rows, cols): a row
    softmax plus eps, a column normalisation, then repeat - 1 times a row and a column normalisation, each dividing
    by (sum + eps)."""
    x = x.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def sinkhorn_grad(grad: torch.Tensor, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """x's gradient of sinkhorn: replay the forward keeping each step's input, then walk the steps back."""
    p = x.softmax(-1)
    steps = []  # (axis summed over, the matrix entering the division, its sums + eps)
    y = p + eps
    for r in range(repeat):
        if r:
            s = y.sum(-1, keepdim=True) + eps
            steps.append((-1, y, s))
            y = y / s
        s = y.sum(-2, keepdim=True) + eps
        steps.append((-2, y, s))
        y = y / s
    for axis, entering, s in reversed(steps):
        grad = (grad - (grad * entering).sum(axis, keepdim=True) / s) / s
    return (grad - (grad * p).sum(-1, keepdim=True)) * p


def post(x, residual, post_layer_mix, comb_res_mix):
    """out[..., o, :] = post_layer_mix[..., o, 0] * x + sum over i of comb_res_mix[..., i, o] * residual[..., i, :]."""
    return post_layer_mix * x.unsqueeze(-2) + torch.einsum("...io,...ih->...oh", comb_res_mix, residual)


def post_grad(x, residual, post_layer_mix, comb_res_mix, d_o):
    """(x', residual', post_layer_mix', comb_res_mix') of post."""
    d_x = (post_layer_mix * d_o).sum(-2)
    d_residual = torch.einsum("...io,...oh->...ih", comb_res_mix, d_o)
    d_post = (d_o * x.unsqueeze(-2)).sum(-1, keepdim=True)
    d_comb = torch.einsum("...ih,...oh->...io", residual, d_o)
    return d_x, d_residual, d_post, d_comb


# ---- how the kernels round


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c rounded once to fp32 (a fused multiply-add), through fp64."""
    return (a.to(F64) * b.to(F64) + c.to(F64)).to(F32)


def _stream_sum(terms: list[torch.Tensor]) -> torch.Tensor:
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _tree(terms: list[torch.Tensor]) -> torch.Tensor:
    """kernels_src/mhc/common.py tree_sum, on tensors."""
    n = len(terms)
    if n == 1:
        return terms[0]
    if n & (n - 1):
        return _stream_sum(terms)
    return _tree([terms[i] + terms[i + n // 2] for i in range(n // 2)])


def _row_sums(x: torch.Tensor) -> torch.Tensor:
    return _tree(list(x.unbind(-1))).unsqueeze(-1)


def _col_sums(x: torch.Tensor) -> torch.Tensor:
    return _tree(list(x.unbind(-2))).unsqueeze(-2)


def _sinkhorn_steps(x: torch.Tensor, repeat: int, eps: float):
    """The fp32 forward as the kernel runs it: (softmax output, [(axis, entering matrix, sums)], result)."""
    e = torch.exp(x - x.amax(-1, keepdim=True))
    p = e / _row_sums(e)
    y = p + eps
    steps = []
    for r in range(max(repeat, 1)):
        if r:
            s = _row_sums(y)
            steps.append((-1, y, s))
            y = y / (s + eps)
        s = _col_sums(y)
        steps.append((-2, y, s))
        y = y / (s + eps)
    return p, steps, y


# ---- the ops


@takes_arguments_of(tkaot.mhc.expand_to_mhc_fwd)
def expand_to_mhc_fwd(x, o) -> torch.Tensor:
    """What expand_to_mhc_fwd writes into o."""
    return expand(x, o.shape[-2]).clone()


@takes_arguments_of(tkaot.mhc.expand_to_mhc_bwd)
def expand_to_mhc_bwd(o_grad) -> torch.Tensor:
    """What expand_to_mhc_bwd writes into x_grad: the streams added in fp32 in order, rounded once."""
    streams = list(o_grad.float().unbind(-2))
    return _stream_sum([torch.zeros_like(streams[0]), *streams]).to(o_grad.dtype)  # from +0, as the kernel


@takes_arguments_of(tkaot.mhc.mhc_pre_apply_mix_fwd)
def mhc_pre_apply_mix_fwd(x, mix) -> torch.Tensor:
    """What mhc_pre_apply_mix_fwd writes into o."""
    acc = torch.zeros(x.shape[0], x.shape[-1], dtype=F32, device=x.device)
    for m in range(x.shape[1]):
        acc = fma(mix[:, m : m + 1], x[:, m].float(), acc)
    return acc.to(x.dtype)


@takes_arguments_of(tkaot.mhc.mhc_pre_apply_mix_bwd)
def mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_grad after the op's in-place update, the mix_grad it returns)."""
    updated = fma(mix.unsqueeze(-1), o_grad.float().unsqueeze(1), x_grad.float()).to(x_grad.dtype)
    return updated, (o_grad.to(F64).unsqueeze(1) * x.to(F64)).sum(-1).to(F32)


@takes_arguments_of(tkaot.mhc.mhc_pre_split_mixes_fwd)
def mhc_pre_split_mixes_fwd(input_mixes, mhc_scale, mhc_base, pre_layer_mix, mhc_post_mult_value, mhc_pre_eps):
    """What mhc_pre_split_mixes_fwd writes: (pre_layer_mix, post_layer_mix, comb_res_mix), shaped as those."""
    mhc = pre_layer_mix.shape[-1]
    v = fma(input_mixes, mhc_scale[_parts(mhc)], mhc_base)
    pre = 1 / (1 + torch.exp(0 - v[:, :mhc])) + torch.tensor(mhc_pre_eps, dtype=F32)
    post = 1 / (1 + torch.exp(0 - v[:, mhc : 2 * mhc])) * torch.tensor(mhc_post_mult_value, dtype=F32)
    return pre, post, v[:, 2 * mhc :].contiguous()


@takes_arguments_of(tkaot.mhc.mhc_pre_split_mixes_bwd)
def mhc_pre_split_mixes_bwd(
    pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, mhc_scale, mhc_base,
    mhc_post_mult_value,
):  # fmt: skip
    """What mhc_pre_split_mixes_bwd writes: (input_mixes_grad, mhc_scale_grad, mhc_base_grad); the two sums over
    tokens in fp64, rounded once (the kernel's order of summation is its own)."""
    mhc = pre_layer_mix_grad.shape[-1]
    s = 1 / (1 + torch.exp(0 - fma(input_mixes[:, :mhc], mhc_scale[0], mhc_base[:mhc])))
    mult = torch.tensor(mhc_post_mult_value, dtype=F32)
    d = torch.cat(
        [pre_layer_mix_grad * s * (1 - s), post_layer_mix_grad * post_layer_mix * (1 - post_layer_mix / mult), comb_res_mix_grad],
        dim=-1,
    )
    parts = _parts(mhc)
    products = (d.to(F64) * input_mixes.to(F64)).sum(0)
    scale_grad = torch.stack([products[[j for j, p in enumerate(parts) if p == g]].sum() for g in range(3)]).to(F32)
    return d * mhc_scale[parts], scale_grad, d.to(F64).sum(0).to(F32)


@takes_arguments_of(tkaot.mhc.mhc_sinkhorn_fwd)
def mhc_sinkhorn_fwd(comb_res_mix, repeat, eps) -> torch.Tensor:
    """What mhc_sinkhorn_fwd writes into comb_res_mix_out."""
    return _sinkhorn_steps(comb_res_mix.float(), repeat, torch.tensor(eps, dtype=F32))[2]


@takes_arguments_of(tkaot.mhc.mhc_sinkhorn_bwd)
def mhc_sinkhorn_bwd(grad_output, x, repeat, eps) -> torch.Tensor:
    """What mhc_sinkhorn_bwd writes into grad_input: the kernel's replay and walk back, in fp32."""
    eps = torch.tensor(eps, dtype=F32)
    p, steps, _ = _sinkhorn_steps(x.float(), repeat, eps)
    grad = grad_output.float()
    for axis, entering, s in reversed(steps):
        sums = _row_sums if axis == -1 else _col_sums
        grad = (grad - sums(grad * entering) / (s + eps)) / (s + eps)
    return (grad - _row_sums(grad * p)) * p


@takes_arguments_of(tkaot.mhc.mhc_post_fwd)
def mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix) -> torch.Tensor:
    """What mhc_post_fwd returns."""
    mhc = residual.shape[-2]
    xf, rf = x.float().unsqueeze(-2), residual.float()
    acc = post_layer_mix * xf
    for i in range(mhc):
        acc = fma(comb_res_mix[..., i, :].unsqueeze(-1), rf[..., i : i + 1, :], acc)
    return acc.to(residual.dtype)


@takes_arguments_of(tkaot.mhc.mhc_post_bwd)
def mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o):
    """What mhc_post_bwd returns: (d_x, d_residual, d_post_layer_mix, d_comb_res_mix); the bf16 ones summed over
    streams as the kernel does, the sums over hidden in fp64, rounded once."""
    mhc = d_o.shape[-2]
    do = d_o.float()
    d_x = torch.zeros(x.shape, dtype=F32, device=x.device)
    d_residual = torch.zeros(residual.shape, dtype=F32, device=x.device)
    for o in range(mhc):
        d_x = fma(post_layer_mix[..., o, :], do[..., o, :], d_x)
        d_residual = fma(comb_res_mix[..., :, o : o + 1], do[..., o : o + 1, :], d_residual)
    d64 = d_o.to(F64)
    d_post = (d64 * x.to(F64).unsqueeze(-2)).sum(-1, keepdim=True).to(F32)
    d_comb = torch.einsum("...ih,...oh->...io", residual.to(F64), d64).to(F32)
    return d_x.to(x.dtype), d_residual.to(residual.dtype), d_post, d_comb
