"""The mHC references (tkaot/reference/mhc.py), on CPU: each explicit backward against autograd of its forward,
and against finite differences (float64 gradcheck of an autograd.Function whose backward is the explicit
formula); each op reference (fp32, the kernels' rounding) against the fp64 math."""

from __future__ import annotations

import pytest
import torch

from tkaot.reference import mhc as ref

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
MHC = (1, 2, 4, 8)


def gen(seed: int):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape, dtype=F64, scale=1.0):
    return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype)


def autograd_of(fn, inputs: list[torch.Tensor], grads: tuple):
    """The gradients of sum(fn(*inputs)[k] * grads[k]) with respect to each input, by autograd."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    outs = fn(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return torch.autograd.grad(outs, leaves, grads)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-10) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


class Explicit(torch.autograd.Function):
    """fn's forward with `grad_fn` as its backward, so gradcheck compares grad_fn with finite differences."""

    @staticmethod
    def forward(ctx, fn, grad_fn, *inputs):
        ctx.grad_fn, ctx.inputs = grad_fn, inputs
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.grad_fn(*grads, *ctx.inputs))


def explicit(fn, grad_fn):
    return lambda *inputs: Explicit.apply(fn, grad_fn, *inputs)


# ---- each explicit backward against autograd (several sizes) and finite differences (small)


@pytest.mark.parametrize("mhc", MHC)
def test_expand_grad(mhc):
    g = gen(mhc)
    x, o_grad = randn(g, 5, 24), randn(g, 5, mhc, 24)
    (want,) = autograd_of(lambda t: ref.expand(t, mhc), [x], (o_grad,))
    close(ref.expand_grad(o_grad), want)
    check = explicit(lambda t: ref.expand(t, mhc).clone(), lambda go, t: (ref.expand_grad(go),))
    assert torch.autograd.gradcheck(check, (randn(g, 2, 8).requires_grad_(),))


@pytest.mark.parametrize("mhc", MHC)
def test_apply_mix_grad(mhc):
    g = gen(10 + mhc)
    x, mix, o_grad = randn(g, 6, mhc, 40), randn(g, 6, mhc), randn(g, 6, 40)
    want = autograd_of(ref.apply_mix, [x, mix], (o_grad,))
    for got, expected in zip(ref.apply_mix_grad(o_grad, x, mix), want):
        close(got, expected)
    check = explicit(ref.apply_mix, lambda go, x, mix: ref.apply_mix_grad(go, x, mix))
    assert torch.autograd.gradcheck(check, (randn(g, 2, mhc, 8).requires_grad_(), randn(g, 2, mhc).requires_grad_()))


@pytest.mark.parametrize("mhc", MHC)
def test_split_mixes_grad(mhc):
    g = gen(20 + mhc)
    n, width, mult, eps = 7, mhc * (mhc + 2), 2.0, 1e-6
    im, scale, base = randn(g, n, width), randn(g, 3), randn(g, width, scale=0.5)
    grads = (randn(g, n, mhc), randn(g, n, mhc), randn(g, n, mhc * mhc))

    def fn(im, scale, base):
        return ref.split_mixes(im, scale, base, mhc, mult, eps)

    want = autograd_of(fn, [im, scale, base], grads)
    post = fn(im, scale, base)[1]
    for got, expected in zip(ref.split_mixes_grad(*grads, im, post, scale, base, mhc, mult), want):
        close(got, expected)

    def grad_fn(pre_g, post_g, comb_g, im, scale, base):
        return ref.split_mixes_grad(pre_g, post_g, comb_g, im, fn(im, scale, base)[1], scale, base, mhc, mult)

    small = (randn(g, 2, width).requires_grad_(), randn(g, 3).requires_grad_(), randn(g, width).requires_grad_())
    assert torch.autograd.gradcheck(explicit(fn, grad_fn), small)


@pytest.mark.parametrize("mhc, repeat", [(1, 1), (2, 3), (4, 1), (4, 2), (4, 20), (8, 5)])
def test_sinkhorn_grad(mhc, repeat):
    g = gen(30 + mhc * repeat)
    x, grad = randn(g, 6, mhc, mhc), randn(g, 6, mhc, mhc)
    (want,) = autograd_of(lambda t: ref.sinkhorn(t, repeat, 1e-6), [x], (grad,))
    close(ref.sinkhorn_grad(grad, x, repeat, 1e-6), want, 1e-9)
    check = explicit(lambda t: ref.sinkhorn(t, repeat, 1e-3), lambda go, t: (ref.sinkhorn_grad(go, t, repeat, 1e-3),))
    assert torch.autograd.gradcheck(check, (randn(g, 2, mhc, mhc).requires_grad_(),))


@pytest.mark.parametrize("mhc", MHC)
def test_post_grad(mhc):
    g = gen(40 + mhc)
    x, res = randn(g, 2, 3, 16), randn(g, 2, 3, mhc, 16)
    post, comb, d_o = randn(g, 2, 3, mhc, 1), randn(g, 2, 3, mhc, mhc), randn(g, 2, 3, mhc, 16)
    want = autograd_of(ref.post, [x, res, post, comb], (d_o,))
    for got, expected in zip(ref.post_grad(x, res, post, comb, d_o), want):
        close(got, expected)
    check = explicit(ref.post, lambda go, *inputs: ref.post_grad(*inputs, go))
    small = [randn(g, 1, 2, 8), randn(g, 1, 2, mhc, 8), randn(g, 1, 2, mhc, 1), randn(g, 1, 2, mhc, mhc)]
    assert torch.autograd.gradcheck(check, tuple(t.requires_grad_() for t in small))


# ---- the op references (fp32, the kernels' rounding) against the fp64 math


def bf16(g, *shape):
    return randn(g, *shape, dtype=BF16)


def test_expand_op_references():
    g = gen(50)
    x, o_grad = bf16(g, 9, 64), bf16(g, 9, 4, 64)
    assert torch.equal(ref.expand_to_mhc_fwd(x, torch.empty(9, 4, 64, dtype=BF16)), x.unsqueeze(1).expand(9, 4, 64))
    got = ref.expand_to_mhc_bwd(o_grad)
    torch.testing.assert_close(got.double(), ref.expand_grad(o_grad.double()), rtol=2**-8, atol=1e-6)
    zeros = -torch.zeros(1, 2, 8, dtype=BF16)  # -0 in every stream: the kernel adds from +0
    assert not ref.expand_to_mhc_bwd(zeros).signbit().any()


def test_pre_apply_mix_op_references():
    g = gen(51)
    x, mix, o_grad, x_grad = bf16(g, 9, 4, 64), randn(g, 9, 4, dtype=F32), bf16(g, 9, 64), bf16(g, 9, 4, 64)
    out = ref.mhc_pre_apply_mix_fwd(x, mix)
    torch.testing.assert_close(out.double(), ref.apply_mix(x.double(), mix.double()), rtol=2**-8, atol=1e-5)
    updated, mix_grad = ref.mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)
    dx, dmix = ref.apply_mix_grad(o_grad.double(), x.double(), mix.double())
    torch.testing.assert_close(updated.double(), x_grad.double() + dx, rtol=2**-8, atol=1e-5)
    close(mix_grad.double(), dmix, 1e-5)


def test_split_mixes_op_references():
    g = gen(52)
    n, mhc, width = 9, 4, 24
    im, scale, base = randn(g, n, width, dtype=F32), randn(g, 3, dtype=F32), randn(g, width, dtype=F32)
    outs = [torch.empty(n, mhc), torch.empty(n, mhc), torch.empty(n, mhc * mhc)]
    got = ref.mhc_pre_split_mixes_fwd(im, scale, base, outs[0], 2.0, 1e-6)
    want = ref.split_mixes(im.double(), scale.double(), base.double(), mhc, 2.0, 1e-6)
    for a, b in zip(got, want):
        assert a.dtype == F32 and a.shape == b.shape
        close(a.double(), b, 1e-6)
    grads = [randn(g, n, mhc, dtype=F32), randn(g, n, mhc, dtype=F32), randn(g, n, mhc * mhc, dtype=F32)]
    got = ref.mhc_pre_split_mixes_bwd(*grads, im, got[1], scale, base, 2.0)
    want = ref.split_mixes_grad(*(t.double() for t in grads), im.double(), want[1], scale.double(), base.double(), mhc, 2.0)
    for a, b in zip(got, want):
        assert a.dtype == F32 and a.shape == b.shape
        close(a.double(), b, 1e-5)


@pytest.mark.parametrize("repeat", [0, 1, 20])
def test_sinkhorn_op_references(repeat):
    g = gen(53 + repeat)
    x, grad = randn(g, 9, 4, 4, dtype=F32), randn(g, 9, 4, 4, dtype=F32)
    got = ref.mhc_sinkhorn_fwd(x, repeat, 1e-6)
    close(got.double(), ref.sinkhorn(x.double(), max(repeat, 1), 1e-6), 1e-5)
    if repeat:
        got = ref.mhc_sinkhorn_bwd(grad, x, repeat, 1e-6)
        close(got.double(), ref.sinkhorn_grad(grad.double(), x.double(), repeat, 1e-6), 1e-4)


def test_post_op_references():
    g = gen(54)
    x, res, post = bf16(g, 2, 5, 64), bf16(g, 2, 5, 4, 64), randn(g, 2, 5, 4, 1, dtype=F32)
    comb, d_o = randn(g, 2, 5, 4, 4, dtype=F32), bf16(g, 2, 5, 4, 64)
    out = ref.mhc_post_fwd(x, res, post, comb)
    assert out.dtype == BF16 and out.shape == res.shape
    torch.testing.assert_close(out.double(), ref.post(x.double(), res.double(), post.double(), comb.double()), rtol=2**-8, atol=1e-5)
    got = ref.mhc_post_bwd(x, res, post, comb, d_o)
    want = ref.post_grad(x.double(), res.double(), post.double(), comb.double(), d_o.double())
    for a, b, dtype in zip(got, want, (BF16, BF16, F32, F32)):
        assert a.dtype == dtype and a.shape == b.shape
        torch.testing.assert_close(a.double(), b, rtol=2**-8 if dtype is BF16 else 1e-6, atol=1e-5)


def test_the_fused_multiply_add_rounds_once():
    a, b = torch.tensor([1 + 2**-12], dtype=F32), torch.tensor([1 + 2**-12], dtype=F32)
    c = torch.tensor([-1.0], dtype=F32)
    assert fma_value(a, b, c) == 2**-11 + 2**-24  # a * b - 1 exactly; two roundings would lose 2**-24
    assert (a * b + c).item() == 2**-11


def fma_value(a, b, c) -> float:
    return ref.fma(a, b, c).item()
