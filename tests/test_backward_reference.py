"""The backward references (tkaot/reference/backward.py) against autograd of the forward references, and, in fp64,
against finite differences (torch.autograd.gradcheck of the forward with the reference as its backward). CPU only."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tkaot import reference
from tkaot.reference import backward as ref

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- RMSNorm


@pytest.mark.parametrize("weight, residual, out_scale", [(True, True, 1.0), (True, False, 0.5), (False, True, 2.0), (False, False, 1.0)])
def test_norm_backward_is_autograd_of_norm_forward(weight, residual, out_scale):
    g = _gen(1)
    x = torch.randn(37, 256, generator=g, requires_grad=True)
    r = torch.randn(37, 256, generator=g, requires_grad=True) if residual else None
    w = (torch.rand(256, generator=g) + 0.5).requires_grad_() if weight else None
    out, rstd, s = reference.norm_forward(x, w, 1e-6, r, out_scale, with_rstd=True)
    dy, dr = torch.randn(37, 256, generator=g), torch.randn(37, 256, generator=g)
    loss = (out * dy).sum() + ((s * dr).sum() if residual else 0)
    loss.backward()
    x_grad, w_grad = ref.norm_backward(dy, s.detach(), w.detach() if weight else None, rstd.detach(), dr if residual else None, out_scale)
    torch.testing.assert_close(x_grad, x.grad, rtol=1e-4, atol=1e-5)
    if residual:
        torch.testing.assert_close(x_grad, r.grad, rtol=1e-4, atol=1e-5)
    if weight:
        torch.testing.assert_close(w_grad, w.grad, rtol=1e-4, atol=1e-4)
    else:
        assert w_grad is None


def test_norm_backward_accumulates_into_weight_grad_and_rounds_to_its_dtype():
    g = _gen(2)
    x, dy, w = torch.randn(5, 64, generator=g), torch.randn(5, 64, generator=g), torch.randn(64, generator=g)
    rstd = torch.rsqrt(x.square().mean(-1) + 1e-6)
    _, fresh = ref.norm_backward(dy, x, w, rstd)
    base = torch.randn(64, generator=g).bfloat16()
    _, summed = ref.norm_backward(dy, x, w, rstd, weight_grad=base)
    assert summed.dtype == torch.bfloat16
    torch.testing.assert_close(summed, (fresh + base.float()).bfloat16())


class _Norm(torch.autograd.Function):
    """RMSNorm in fp64 whose backward is the reference."""

    @staticmethod
    def forward(ctx, x, w, residual_grad_probe, out_scale):
        rstd = torch.rsqrt(x.square().mean(-1) + 1e-6)
        ctx.save_for_backward(x, w, rstd)
        ctx.out_scale = out_scale
        return x * rstd[:, None] * w * out_scale, x * residual_grad_probe

    @staticmethod
    def backward(ctx, dy, dprobe):
        x, w, rstd = ctx.saved_tensors
        x_grad, w_grad = ref.norm_backward(dy, x, w, rstd, None, ctx.out_scale)
        return x_grad, w_grad, None, None


def test_norm_backward_passes_gradcheck_in_fp64():
    g = _gen(3)
    x = torch.randn(3, 32, generator=g, dtype=F64, requires_grad=True)
    w = torch.randn(32, generator=g, dtype=F64, requires_grad=True)
    probe = torch.zeros(3, 32, dtype=F64)
    assert torch.autograd.gradcheck(lambda x, w: _Norm.apply(x, w, probe, 0.75)[0], (x, w))


# ---- SwiGLU


def _swiglu_inputs(seed: int, rows: int = 300, hidden: int = 128, dtype=torch.float32):
    g = _gen(seed)
    x = (torch.randn(rows, 2 * hidden, generator=g) * 3).to(dtype)
    dy = torch.randn(rows, hidden, generator=g).to(dtype)
    weights = torch.rand(rows, generator=g) + 0.25
    return x, dy, weights


@pytest.mark.parametrize("weights, rsf, clamp, psum", [
    (False, None, None, False), (True, None, None, False), (True, 2.5, None, True), (False, None, 4.0, True), (True, 0.5, 4.0, False),
])  # fmt: skip
def test_swiglu_backward_is_autograd_of_swiglu_forward(weights, rsf, clamp, psum):
    x, dy, w = _swiglu_inputs(4)
    psum_t = torch.tensor([40, 40, 170, 300], dtype=torch.int32) if psum else None
    if psum:
        pad = ref.padding_rows(300, psum_t)
        assert pad.sum() == (128 - 40) + (256 - 170) and not pad[:40].any() and pad[40:128].all()
        x[pad], dy[pad] = 0, 0  # the ops' contract: padding rows hold zeros
    if clamp is not None:
        x = torch.where((x.abs() - clamp).abs() < 1e-2, x + 0.05, x)  # keep off the clamp's kink
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = reference.fused.swiglu_forward(xr, "fp32", psum_t, wr if weights else None, rsf, clamp)
    (out * dy).sum().backward()
    got = ref.swiglu_backward(x, dy, "fp32", psum_t, w if weights else None, rsf, clamp, do_recompute=True)
    x_grad, act_out = got[0], got[-1]
    torch.testing.assert_close(x_grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(act_out, out.detach(), rtol=1e-6, atol=1e-6)
    if weights:
        torch.testing.assert_close(got[1], wr.grad, rtol=1e-4, atol=1e-4)
        assert len(got) == 3
    else:
        assert len(got) == 2


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, clamp):
        hidden = x.shape[1] // 2
        g, u = x[:, :hidden], x[:, hidden:]
        if clamp is not None:
            g, u = g.clamp(max=clamp), u.clamp(-clamp, clamp)
        ctx.save_for_backward(x, w)
        ctx.clamp = clamp
        return g * torch.sigmoid(g) * u * w[:, None]

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        x_grad, w_grad = ref.swiglu_backward(x, dy, "fp32", None, w, None, ctx.clamp)
        return x_grad, w_grad, None


@pytest.mark.parametrize("clamp", [None, 1.5])
def test_swiglu_backward_passes_gradcheck_in_fp64(clamp):
    g = _gen(5)
    x = torch.randn(4, 16, generator=g, dtype=F64) * 2
    if clamp is not None:
        x = torch.where((x.abs() - clamp).abs() < 0.05, x + 0.1, x)
    x.requires_grad_()
    w = (torch.rand(4, generator=g, dtype=F64) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: _SwiGLU.apply(x, w, clamp), (x, w))


def test_swiglu_backward_cast_decodes_x_and_casts_x_grad_per_group():
    x, dy, w = _swiglu_inputs(6, rows=130, hidden=256)
    amax = x.abs().unflatten(-1, (-1, 128)).amax(-1).clamp(min=1e-4)
    sf = amax / 448
    data = (x / sf.repeat_interleave(128, -1)).to(torch.float8_e4m3fn)
    psum = torch.tensor([100, 130], dtype=torch.int32)
    pad = ref.padding_rows(130, psum)
    x_grad, (q, q_sf), weight_grad = ref.swiglu_backward_and_per_token_cast(
        (data, sf), dy.bfloat16(), "e4m3", 128, psum, w, routed_scaling_factor=1.5, round_sf=True, use_packed_ue8m0=True
    )
    decoded = data.float() * sf.repeat_interleave(128, -1)
    plain, plain_wg = ref.swiglu_backward(decoded, dy.bfloat16().float(), "fp32", psum, w, 1.5)
    assert x_grad.dtype == torch.bfloat16 and torch.equal(x_grad, plain.bfloat16())
    assert torch.equal(weight_grad, plain_wg) and not weight_grad[pad].any()
    assert q.dtype == torch.float8_e4m3fn and q_sf.dtype == torch.int32 and q_sf.shape == (130, 1)  # 4 groups: 1 word
    assert not q[pad].float().any() and not q_sf[pad].any()
    exps = q_sf[~pad].view(torch.uint8).reshape(-1, 4).int() - 127
    back = q[~pad].float().unflatten(-1, (4, 128)) * torch.exp2(exps.float())[..., None]
    torch.testing.assert_close(back.flatten(1), plain[~pad], rtol=0.07, atol=1e-3)


# ---- MoE gate


def _gate_loss(logits, topk_idx, rsf, dw, mask, h):
    """The forward's weights (and the aux loss's per-sequence sums of u / sum(u)) as a differentiable function."""
    u = F.softplus(logits).sqrt()
    valid = topk_idx >= 0
    chosen = torch.where(valid, u.gather(1, topk_idx.clamp(min=0)), 0.0)
    w = rsf * chosen / (chosen.sum(-1, keepdim=True) + 1e-20)
    loss = (w * dw).sum()
    if h is not None:
        share = torch.where(mask[:, None], u / u.sum(-1, keepdim=True), 0.0)
        loss = loss + (share.unflatten(0, (h.shape[0], -1)).sum(1) * h).sum()
    return loss, u, w


@pytest.mark.parametrize("aux", [False, True])
def test_moe_topk_gate_backward_is_autograd_of_the_gate(aux):
    g = _gen(7)
    tokens, experts, topk = 24, 64, 6
    logits = torch.randn(tokens, experts, generator=g) * 2
    mask = torch.rand(tokens, generator=g) > 0.3
    idx = reference.moe.moe_topk_gate_forward(logits, topk, False, 0, 2.5, 0, mask=mask).topk_idx
    assert (idx[~mask] == -1).all() and (idx[mask] >= 0).all()
    idx[0, 1] = idx[0, 0]  # a repeated expert (fixed routing can repeat one): its slots add
    lr = logits.clone().requires_grad_()
    dw = torch.randn(tokens, topk, generator=g)
    h = torch.randn(4, experts, generator=g) if aux else None
    loss, u, w = _gate_loss(lr, idx, 2.5, dw, mask, h)
    loss.backward()
    got = ref.moe_topk_gate_backward(u.detach(), idx, w.detach(), dw, 2.5, mask=mask if aux else None, grad_scores_sum=h)
    torch.testing.assert_close(got, lr.grad, rtol=1e-4, atol=1e-6)


def test_moe_topk_gate_backward_passes_gradcheck_in_fp64():
    g = _gen(8)
    logits = (torch.randn(4, 8, generator=g, dtype=F64) * 2).requires_grad_()
    idx = torch.tensor([[1, 5], [0, -1], [7, 7], [2, 3]])
    mask = torch.tensor([True, False, True, True])
    dw = torch.randn(4, 2, generator=g, dtype=F64)
    h = torch.randn(2, 8, generator=g, dtype=F64)

    class Gate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits):
            loss, u, w = _gate_loss(logits, idx, 1.5, dw, mask, h)
            ctx.save_for_backward(u, w)
            return loss

        @staticmethod
        def backward(ctx, grad):
            u, w = ctx.saved_tensors
            return grad * ref.moe_topk_gate_backward(u, idx, w, dw, 1.5, mask=mask, grad_scores_sum=h)

    assert torch.autograd.gradcheck(Gate.apply, (logits,))
