"""tkaot.mhc's first ten ops on a GPU against the pure-torch references (tkaot/reference/mhc.py).

Every op at 1, 3, 127, 4097 and 8191 tokens, hidden 7168 and an odd multiple of 8; every output poisoned with NaN
first (given buffers filled, new ones allocated as 0xFF bytes), every element compared. Exact where the reference
computes as the kernel does: expand (fwd, bwd) bit for bit; bf16 outputs of fused multiply-adds (pre-apply mix,
post) within one bf16 level, nearly all identical (the reference's fma is emulated in fp64); fp32 sums over a
hidden row or over tokens within 1e-5 of the largest value; the Sinkhorn matrices within 1e-5 (torch's exp against
expf). Each backward is also held to autograd of the forward math (fp64). Then: in-place aliasing, CUDA-graph
replay of an mHC layer step (expand, split, Sinkhorn, pre-apply, post) against eager launches, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

import tkaot
from tests.helpers import poisoned_allocations
from tkaot.reference import mhc as ref

pytestmark = pytest.mark.gpu

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
MHC = 4
TOKENS = [1, 3, 127, 4097, 8191]
HIDDEN = [7168, 1032]  # DeepSeek's, and 8 * 129 (no multiple of 16: the last vector of a row alone)
SUMS = 1e-5


def gen(*seed: int) -> torch.Generator:
    return torch.Generator("cuda").manual_seed(hash(seed) % 2**31)


def randn(g, *shape, dtype=F32, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


def nan(*shape, dtype=F32):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def assert_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within one bf16 level everywhere (no NaN), identical in all but a 1e-4 fraction. Where a sum of unit-scale
    terms cancels to almost nothing, one bf16 level is no bound: there a few fp32 ulps of the terms (atol 1e-6; seen on
    the H200: 2.4e-7 in mhc_post_fwd at 4097 x 7168, which is byte-identical to TileKernels)."""
    assert got.shape == want.shape and got.dtype == want.dtype == BF16
    assert not got.isnan().any()
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)
    assert (got != want).float().mean().item() <= 1e-4


def assert_sums(got: torch.Tensor, want: torch.Tensor, tol: float = SUMS) -> None:
    """fp32 values within tol of the largest magnitude (sums added in another order)."""
    assert got.shape == want.shape and not got.isnan().any()
    scale = want.abs().max().item() if want.numel() else 0.0
    torch.testing.assert_close(got.double(), want.double(), rtol=0, atol=tol * scale + 1e-30)


def autograd(fn, inputs: list[torch.Tensor], grads: tuple) -> tuple:
    leaves = [t.detach().to(F64).requires_grad_(True) for t in inputs]
    outs = fn(*leaves)
    return torch.autograd.grad(outs if isinstance(outs, tuple) else (outs,), leaves, [g.to(F64) for g in grads])


cases = pytest.mark.parametrize("tokens, hidden", [(t, h) for t in TOKENS for h in HIDDEN])


# ---- expand


@cases
def test_expand_fwd(tokens, hidden):
    x = randn(gen(1, tokens, hidden), tokens, hidden, dtype=BF16)
    o = nan(tokens, MHC, hidden, dtype=BF16)
    assert tkaot.mhc.expand_to_mhc_fwd(x, o) is None
    assert torch.equal(o, ref.expand_to_mhc_fwd(x, o))


@cases
def test_expand_bwd(tokens, hidden):
    o_grad = randn(gen(2, tokens, hidden), tokens, MHC, hidden, dtype=BF16)
    x_grad = nan(tokens, hidden, dtype=BF16)
    assert tkaot.mhc.expand_to_mhc_bwd(o_grad, x_grad) is None
    assert torch.equal(x_grad, ref.expand_to_mhc_bwd(o_grad))
    (want,) = autograd(lambda x: ref.expand(x, MHC), [torch.zeros(tokens, hidden, device="cuda")], (o_grad,))
    torch.testing.assert_close(x_grad.double(), want, rtol=2**-8, atol=0)


# ---- pre-apply mix


@cases
def test_pre_apply_mix_fwd(tokens, hidden):
    g = gen(3, tokens, hidden)
    x, mix = randn(g, tokens, MHC, hidden, dtype=BF16), torch.rand(tokens, MHC, generator=g, device="cuda") * 2
    o = nan(tokens, hidden, dtype=BF16)
    assert tkaot.mhc.mhc_pre_apply_mix_fwd(x, mix, o) is None
    assert_bf16(o, ref.mhc_pre_apply_mix_fwd(x, mix))


@cases
def test_pre_apply_mix_bwd(tokens, hidden):
    g = gen(4, tokens, hidden)
    o_grad, x = randn(g, tokens, hidden, dtype=BF16), randn(g, tokens, MHC, hidden, dtype=BF16)
    mix, x_grad = torch.rand(tokens, MHC, generator=g, device="cuda") * 2, randn(g, tokens, MHC, hidden, dtype=BF16)
    want_x_grad, want_mix_grad = ref.mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)
    accumulated = x_grad.clone()
    with poisoned_allocations():
        mix_grad = tkaot.mhc.mhc_pre_apply_mix_bwd(o_grad, x, mix, accumulated)
    assert mix_grad.shape == (tokens, MHC) and mix_grad.dtype == F32
    assert_bf16(accumulated, want_x_grad)
    assert_sums(mix_grad, want_mix_grad)
    dx, dmix = autograd(ref.apply_mix, [x, mix], (o_grad,))
    torch.testing.assert_close((accumulated.double() - x_grad.double()), dx, rtol=2**-6, atol=2**-6 * dx.abs().max().item())
    assert_sums(mix_grad, dmix.float())


# ---- split mixes


def split_inputs(g, tokens):
    width = MHC * (MHC + 2)
    return randn(g, tokens, width, scale=2), randn(g, 3, scale=0.5) + 1, randn(g, width, scale=0.5)


@pytest.mark.parametrize("tokens", TOKENS)
def test_split_mixes_fwd(tokens):
    im, scale, base = split_inputs(gen(5, tokens), tokens)
    outs = (nan(tokens, MHC), nan(tokens, MHC), nan(tokens, MHC * MHC))
    assert tkaot.mhc.mhc_pre_split_mixes_fwd(im, scale, base, *outs, 2.0, 1e-6) is None
    for got, want in zip(outs, ref.mhc_pre_split_mixes_fwd(im, scale, base, outs[0], 2.0, 1e-6)):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("tokens", [0, *TOKENS])
def test_split_mixes_bwd(tokens):
    g = gen(6, tokens)
    im, scale, base = split_inputs(g, tokens)
    post = torch.rand(tokens, MHC, generator=g, device="cuda") * 2
    grads = (randn(g, tokens, MHC), randn(g, tokens, MHC), randn(g, tokens, MHC * MHC))
    outs = (nan(tokens, MHC * (MHC + 2)), nan(3), nan(MHC * (MHC + 2)))
    with poisoned_allocations():
        assert tkaot.mhc.mhc_pre_split_mixes_bwd(*grads, im, post, scale, base, *outs, 2.0) is None
    want = ref.mhc_pre_split_mixes_bwd(*grads, im, post, scale, base, 2.0)
    torch.testing.assert_close(outs[0], want[0], rtol=1e-5, atol=1e-6)
    for got, expected in zip(outs[1:], want[1:]):
        assert_sums(got, expected)
    if tokens:  # autograd through the forward, post taken at its forward value

        def fn(im, scale, base):
            return ref.split_mixes(im, scale, base, MHC, 2.0, 1e-6)

        post = fn(im.double(), scale.double(), base.double())[1].float()
        outs = (nan(tokens, MHC * (MHC + 2)), nan(3), nan(MHC * (MHC + 2)))
        tkaot.mhc.mhc_pre_split_mixes_bwd(*grads, im, post, scale, base, *outs, 2.0)
        for got, expected in zip(outs, autograd(fn, [im, scale, base], grads)):
            assert_sums(got, expected.float(), 1e-4)


SPLIT_ROWS = ("pre_layer_mix_grad", "post_layer_mix_grad", "comb_res_mix_grad", "input_mixes", "post_layer_mix", "input_mixes_grad")


def misaligned(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a copy of t at an address 4 bytes past a 16-byte boundary, the NaN-filled buffer it is a view into: one
    element before it, three after)."""
    buf = nan(t.numel() + 4, dtype=t.dtype)
    view = buf[1 : 1 + t.numel()].view(t.shape).copy_(t)
    assert view.data_ptr() % 16 == 4
    return view, buf


@pytest.mark.parametrize("moved", [*SPLIT_ROWS, "all"])
@pytest.mark.parametrize("tokens", TOKENS)
def test_split_mixes_bwd_misaligned_rows(tokens, moved):
    """split_mixes_bwd moves its rows as 16-byte vectors only when every row tensor is 16-byte aligned (the op does
    not require it); with any one of them, or all, 4 bytes off, it reads and writes them as scalars: the same bytes
    as the aligned call (same values, same order), nothing written outside the misaligned gradient."""
    g = gen(7, tokens)
    im, scale, base = split_inputs(g, tokens)
    post = torch.rand(tokens, MHC, generator=g, device="cuda") * 2
    rows = dict(zip(SPLIT_ROWS[:5], (randn(g, tokens, MHC), randn(g, tokens, MHC), randn(g, tokens, MHC * MHC), im, post)))
    want = (nan(tokens, MHC * (MHC + 2)), nan(3), nan(MHC * (MHC + 2)))
    tkaot.mhc.mhc_pre_split_mixes_bwd(*rows.values(), scale, base, *want, 2.0)
    assert not any(t.isnan().any() for t in want)
    rows["input_mixes_grad"] = nan(tokens, MHC * (MHC + 2))  # a new output, poisoned
    bufs = {}
    for k in SPLIT_ROWS if moved == "all" else (moved,):
        rows[k], bufs[k] = misaligned(rows[k])
    got = (rows.pop("input_mixes_grad"), nan(3), nan(MHC * (MHC + 2)))
    with poisoned_allocations():
        tkaot.mhc.mhc_pre_split_mixes_bwd(*rows.values(), scale, base, *got, 2.0)
    for a, b in zip(got, want, strict=True):
        assert a.data_ptr() != b.data_ptr() and torch.equal(a.view(torch.int32), b.view(torch.int32))
    for buf in bufs.values():  # the element before each view and the three after it are untouched
        assert buf[0].isnan() and buf[-3:].isnan().all()


# ---- Sinkhorn


@pytest.mark.parametrize("repeat", [0, 1, 3, 20])
@pytest.mark.parametrize("tokens", TOKENS)
def test_sinkhorn_fwd(tokens, repeat):
    x = randn(gen(7, tokens, repeat), tokens, MHC, MHC, scale=2)
    out = nan(tokens, MHC, MHC)
    assert tkaot.mhc.mhc_sinkhorn_fwd(x, out, repeat, 1e-6) is None
    torch.testing.assert_close(out, ref.mhc_sinkhorn_fwd(x, repeat, 1e-6), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("repeat", [1, 3, 20])
@pytest.mark.parametrize("tokens", TOKENS)
def test_sinkhorn_bwd(tokens, repeat):
    g = gen(8, tokens, repeat)
    x, grad = randn(g, tokens, MHC, MHC, scale=2), randn(g, tokens, MHC, MHC)
    out = nan(tokens, MHC, MHC)
    with poisoned_allocations():  # the step records' scratch too: every record is written before it is read
        assert tkaot.mhc.mhc_sinkhorn_bwd(grad, x, out, repeat, 1e-6) is None
    assert_sums(out, ref.mhc_sinkhorn_bwd(grad, x, repeat, 1e-6), 1e-4)
    (want,) = autograd(lambda t: ref.sinkhorn(t, repeat, 1e-6), [x], (grad,))
    assert_sums(out, want.float(), 1e-4)


def test_sinkhorn_in_place():
    x = randn(gen(9), 300, MHC, MHC)
    want = ref.mhc_sinkhorn_fwd(x, 20, 1e-6)
    tkaot.mhc.mhc_sinkhorn_fwd(x, x, 20, 1e-6)
    torch.testing.assert_close(x, want, rtol=1e-5, atol=1e-6)


# ---- post


def post_inputs(g, tokens, hidden, seqs=1):
    lead = (seqs, tokens)
    return (
        randn(g, *lead, hidden, dtype=BF16), randn(g, *lead, MHC, hidden, dtype=BF16),
        torch.rand(*lead, MHC, 1, generator=g, device="cuda") * 2, randn(g, *lead, MHC, MHC, scale=0.5),
    )  # fmt: skip


@cases
def test_post_fwd(tokens, hidden):
    x, residual, post_mix, comb = post_inputs(gen(10, tokens, hidden), tokens, hidden)
    with poisoned_allocations():
        out = tkaot.mhc.mhc_post_fwd(x, residual, post_mix, comb)
    assert_bf16(out, ref.mhc_post_fwd(x, residual, post_mix, comb))
    given = nan(*residual.shape, dtype=BF16)
    assert tkaot.mhc.mhc_post_fwd(x, residual, post_mix, comb, out=given) is given
    assert torch.equal(given, out)
    strided = residual.transpose(-1, -2).contiguous().transpose(-1, -2)  # TileKernels copies such a residual; tkaot
    with pytest.raises(ValueError, match="residual must be contiguous"):  # refuses it (no hidden copies, README)
        tkaot.mhc.mhc_post_fwd(x, strided, post_mix, comb)


@cases
def test_post_bwd(tokens, hidden):
    g = gen(11, tokens, hidden)
    inputs = post_inputs(g, tokens, hidden, seqs=2)
    d_o = randn(g, *inputs[1].shape, dtype=BF16)
    with poisoned_allocations():
        got = tkaot.mhc.mhc_post_bwd(*inputs, d_o)
    want = ref.mhc_post_bwd(*inputs, d_o)
    assert_bf16(got[0], want[0])
    assert_bf16(got[1], want[1])
    assert_sums(got[2], want[2])
    assert_sums(got[3], want[3])
    for value, expected in zip(got, autograd(ref.post, list(inputs), (d_o,))):
        assert_sums(value.float(), expected.float(), 2**-7)
    strided = d_o.transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match="d_o must be contiguous"):
        tkaot.mhc.mhc_post_bwd(*inputs, strided)


# ---- an mHC layer step in a CUDA graph


def layer_step(s: dict) -> dict:
    """Expand a hidden row into the streams, split raw mixes, Sinkhorn, mix the streams into a layer input, and
    merge a layer output back: the ops of one mHC layer around its body (the body here is the input itself)."""
    n, h = s["x"].shape
    streams = torch.empty(n, MHC, h, dtype=BF16, device="cuda")
    tkaot.mhc.expand_to_mhc_fwd(s["x"], streams)
    pre, post, comb = (torch.empty(n, w, device="cuda") for w in (MHC, MHC, MHC * MHC))
    tkaot.mhc.mhc_pre_split_mixes_fwd(s["mixes"], s["scale"], s["base"], pre, post, comb, 2.0, 1e-6)
    comb = comb.view(n, MHC, MHC)
    tkaot.mhc.mhc_sinkhorn_fwd(comb, comb, 20, 1e-6)
    layer_in = torch.empty(n, h, dtype=BF16, device="cuda")
    tkaot.mhc.mhc_pre_apply_mix_fwd(streams, pre, layer_in)
    out = tkaot.mhc.mhc_post_fwd(layer_in.unsqueeze(0), streams.unsqueeze(0), post.view(1, n, MHC, 1), comb.unsqueeze(0))
    return {"layer_in": layer_in, "comb": comb, "out": out}


def layer_state(tokens: int, hidden: int, seed: int) -> dict:
    g = gen(12, seed)
    mixes, scale, base = split_inputs(g, tokens)
    return {"x": randn(g, tokens, hidden, dtype=BF16), "mixes": mixes, "scale": scale, "base": base}


@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_layer_step_graph_replay_matches_eager(tokens):
    state = layer_state(tokens, 7168, 0)
    layer_step(state)  # load the kernels outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = layer_step(state)
    for trial in range(3):
        for name, value in layer_state(tokens, 7168, 1 + trial).items():
            state[name].copy_(value)
        for value in outs.values():
            value.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = layer_step(state)
        for name, value in eager.items():
            assert torch.equal(outs[name], value), name
