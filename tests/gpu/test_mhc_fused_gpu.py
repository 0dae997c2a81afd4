"""tkaot.mhc's head mix, norm-weight merge, reduce partials + RMSNorm, pre big fuse and multilayer recompute on a GPU,
against the pure-torch references (tkaot/reference/mhc.py).

1, 3, 127, 4097 and 8191 tokens (pre big fuse also 64 and 65, either side of the token count up to which its split
kernel runs); every output buffer NaN-poisoned first, every element compared. Tolerances: float32 results 1e-5
relative (the kernels fuse multiply-adds and use expf / rsqrtf, the references round twice and use torch's); bf16
results one bf16 step (2**-7 relative); sums over splits, streams and rows run in the references' order, so nothing
else differs. Each backward is also checked against autograd of its forward reference, and a forward mHC layer step
(pre big fuse, then the post mix) captured in a CUDA graph replays bit-identical to eager launches.
"""

import pytest
import torch

import tkaot
from tkaot._mhc import big_fuse
from tkaot.reference import mhc as ref

pytestmark = pytest.mark.gpu

TOKENS = [1, 3, 127, 4097, 8191]
# pre big fuse: its split kernel up to SPLIT_MAX_TOKENS (64) tokens, the one-block kernel past it
BIG_FUSE_TOKENS = [1, 3, 64, 65, 127, 4097, 8191]
F32, BF16 = torch.float32, torch.bfloat16
F32_TOL = dict(rtol=1e-5, atol=1e-5)
BF16_TOL = dict(rtol=2**-7, atol=2**-7)
CHAIN_TOL = dict(rtol=2**-5, atol=2**-5)
MHC = tkaot.mhc


def poisoned(*shape, dtype=F32) -> torch.Tensor:
    """An output buffer of NaN (all bits set), so elements the kernel leaves unwritten show."""
    t = torch.empty(*shape, dtype=dtype, device="cuda")
    t.view(torch.uint8 if dtype.itemsize == 1 else {2: torch.int16, 4: torch.int32}[dtype.itemsize]).fill_(-1)
    return t


def randn(*shape, dtype=F32, scale=1.0, seed=0) -> torch.Tensor:
    g = torch.Generator("cuda").manual_seed(seed * 7919 + sum(shape))
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


def assert_within_terms(out, expected, terms, rtol, name):
    """|out - expected| <= 1e-6 * terms + rtol * |expected|: for sums that cancel, `terms` the sum of |terms| (the
    reference on absolute inputs), so the bound is a few fp32 ulps of what was added, not of the result."""
    assert not out.isnan().any(), f"{name}: {int(out.isnan().sum())} elements left unwritten (NaN poison)"
    err = (out - expected).abs()
    assert (err <= 1e-6 * terms + rtol * expected.abs()).all(), f"{name}: max error {err.max().item()} (terms {terms.max().item()})"


def assert_written_close(out, expected, tol):
    assert not out.isnan().any(), f"{int(out.isnan().sum())} elements left unwritten (NaN poison)"
    torch.testing.assert_close(out, expected, **tol)


# ---- head mix


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("m", [1, 4, 6])
def test_head_mix_forward(tokens, m):
    x, scale, base = randn(tokens, m), randn(1), randn(m, seed=1)
    out = poisoned(tokens, m)
    MHC.mhc_head_compute_mix_fwd(x, scale, base, out, 1e-6)
    assert_written_close(out, ref.mhc_head_compute_mix_fwd(x, scale, base, 1e-6), F32_TOL)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("m, num_sms, block", [(4, 132, 0), (4, 78, 16), (2, 7, 64), (8, 1, 0)])
def test_head_mix_backward(tokens, m, num_sms, block):
    x, scale, base, dy = randn(tokens, m), randn(1), randn(m, seed=1), randn(tokens, m, seed=2)
    dx, scale_part, base_part = poisoned(tokens, m), poisoned(num_sms, 1), poisoned(num_sms, m)
    MHC.mhc_head_compute_mix_bwd(dy, x, scale, base, dx, scale_part, base_part, num_sms, block)
    ref_dx, ref_scale, ref_base = ref.mhc_head_compute_mix_bwd(dy, x, scale, base, num_sms, block)
    assert_written_close(dx, ref_dx, F32_TOL)
    assert_written_close(scale_part, ref_scale, dict(rtol=1e-4, atol=1e-4))
    assert_written_close(base_part, ref_base, dict(rtol=1e-4, atol=1e-4))
    leaves = [t.clone().requires_grad_() for t in (x, scale, base)]
    ref.mhc_head_compute_mix_fwd(*leaves, 1e-6).backward(dy)
    torch.testing.assert_close(dx, leaves[0].grad, **F32_TOL)
    torch.testing.assert_close(scale_part.sum(0), leaves[1].grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(base_part.sum(0), leaves[2].grad, rtol=1e-4, atol=1e-3)


# ---- norm-weight merge


@pytest.mark.parametrize("m, n", [(24, 4 * 7168), (24, 4 * 4096), (3, 1), (35, 1000), (49, 257)])
def test_normw_merge_forward_and_backward(m, n):
    fn, w, dy = randn(m, n), randn(n, seed=1), randn(m, n, seed=2)
    out = poisoned(m, n)
    MHC.mhc_fn_normw_merge_fwd(fn, w, out)
    assert torch.equal(out, fn * w)  # one rounding, both ways
    fn_grad, w_grad = randn(m, n, seed=3), randn(n, seed=4)
    expected = ref.mhc_fn_normw_merge_bwd(fn, w, dy, fn_grad, w_grad)
    MHC.mhc_fn_normw_merge_bwd(fn, w, dy, fn_grad, w_grad)
    torch.testing.assert_close(fn_grad, expected[0], **F32_TOL)
    torch.testing.assert_close(w_grad, expected[1], rtol=1e-5, atol=1e-4)
    leaves = [t.clone().requires_grad_() for t in (fn, w)]
    ref.mhc_fn_normw_merge_fwd(*leaves).backward(dy)
    torch.testing.assert_close(w_grad - randn(n, seed=4), leaves[1].grad, rtol=1e-4, atol=1e-3)


# ---- reduce partials + RMSNorm


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("splits, groups, m3", [(16, 1, 24), (1, 1, 24), (4, 3, 35), (7, 2, 8)])
def test_reduce_partials_forward_and_backward(tokens, splits, groups, m3):
    size = 4 * 7168
    parts, sq_parts = randn(splits, tokens, groups, m3, scale=30), randn(splits, tokens, groups, scale=100).abs()
    out_mul, sqrsum, out = poisoned(tokens, groups, m3), poisoned(tokens, groups), poisoned(tokens, m3)
    MHC.mhc_reduce_partials_and_rmsnorm_fwd(parts, sq_parts, out_mul, sqrsum, out, size, 1e-6, splits)
    ref_mul, ref_sq, ref_out = ref.mhc_reduce_partials_and_rmsnorm_fwd(parts, sq_parts, size, 1e-6, splits)
    assert torch.equal(out_mul, ref_mul) and torch.equal(sqrsum, ref_sq)  # sums in split order, both ways
    # out sums `groups` products in another order than the reference and cancels where they do: bound the error by
    # fp32 ulps of the sum of |terms| (the reference on |partials|), not of the result
    assert_within_terms(out, ref_out, ref.mhc_reduce_partials_and_rmsnorm_fwd(parts.abs(), sq_parts, size, 1e-6, splits)[2], 1e-5, "out")

    dy = randn(tokens, m3, seed=5)
    mul_grad, sq_grad = poisoned(tokens, groups, m3), poisoned(tokens, groups)
    MHC.mhc_reduce_partials_and_rmsnorm_bwd(dy, out_mul, sqrsum, mul_grad, sq_grad, size, 1e-6)
    ref_mul_grad, ref_sq_grad = ref.mhc_reduce_partials_and_rmsnorm_bwd(dy, out_mul, sqrsum, size, 1e-6)
    assert_written_close(mul_grad, ref_mul_grad, F32_TOL)
    # sq_grad sums m3 products of either sign: bounded by fp32 ulps of the sum of |terms| (seen on the H200: 5.7e-7 at
    # a value of 2.3e-3 over 4097 tokens, where the kernel is byte-identical to TileKernels)
    sq_terms = ref.mhc_reduce_partials_and_rmsnorm_bwd(dy.abs(), out_mul.abs(), sqrsum, size, 1e-6)[1].abs()
    assert_within_terms(sq_grad, ref_sq_grad, sq_terms, 1e-4, "sq_grad")
    leaves = [out_mul.clone().requires_grad_(), sqrsum.clone().requires_grad_()]
    (leaves[0] * torch.rsqrt(leaves[1] / size + 1e-6).unsqueeze(-1)).sum(1).backward(dy)
    torch.testing.assert_close(mul_grad, leaves[0].grad, **F32_TOL)
    assert_within_terms(sq_grad, leaves[1].grad, sq_terms, 1e-4, "sq_grad against autograd")


# ---- pre big fuse


def big_fuse_inputs(tokens: int, m: int = 4, hidden: int = 7168, splits: int = 16, seed: int = 0) -> dict:
    m3 = m * (m + 2)
    residual = randn(tokens, m, hidden, dtype=BF16, seed=seed)
    x = residual.float().view(tokens, m * hidden)
    fn = randn(m3, m * hidden, scale=m * hidden**-0.5, seed=seed + 1)
    per = m * hidden // splits  # split-K partials, as the GEMM before the op makes them
    mul = torch.stack([x[:, i * per : (i + 1) * per] @ fn[:, i * per : (i + 1) * per].T for i in range(splits)])
    sq = torch.stack([x[:, i * per : (i + 1) * per].square().sum(-1) for i in range(splits)])
    return dict(gemm_out_mul=mul.contiguous(), gemm_out_sqrsum=sq.contiguous(), mhc_scale=randn(3, seed=seed + 2).abs(),
                mhc_base=randn(m3, seed=seed + 3), residual=residual)  # fmt: skip


def run_big_fuse(a: dict, repeat: int = 20, splits: int = 16):
    tokens, m, hidden = a["residual"].shape
    post, comb, layer_input = poisoned(tokens, m), poisoned(tokens, m * m), poisoned(tokens, hidden, dtype=BF16)
    MHC.mhc_pre_big_fuse_fwd(
        a["gemm_out_mul"], a["gemm_out_sqrsum"], a["mhc_scale"], a["mhc_base"], a["residual"], post, comb, layer_input,
        1e-6, 1e-6, 1e-6, 2.0, repeat, splits,
    )  # fmt: skip
    return post, comb, layer_input


@pytest.mark.parametrize("tokens", BIG_FUSE_TOKENS)
@pytest.mark.parametrize("hidden, repeat", [(7168, 20), (4096, 20), (2560, 1), (1032, 7)])
def test_pre_big_fuse(tokens, hidden, repeat):
    a = big_fuse_inputs(tokens, hidden=hidden)
    post, comb, layer_input = run_big_fuse(a, repeat)
    expected = ref.mhc_pre_big_fuse_fwd(**a, rms_eps=1e-6, mhc_pre_eps=1e-6, mhc_sinkhorn_eps=1e-6,
                                        mhc_post_mult_value=2.0, sinkhorn_repeat=repeat, n_splits=16)  # fmt: skip
    assert_written_close(post, expected[0], F32_TOL)
    assert_written_close(comb, expected[1], dict(rtol=1e-4, atol=1e-5))
    assert_written_close(layer_input.float(), expected[2].float(), BF16_TOL)


def test_pre_big_fuse_split_kernel_is_built():
    """The default set builds the split kernel, so few tokens run on it (the op would fall back to the other silently)."""
    big_fuse._SPLIT.get(torch.cuda.current_device(), 4)


@pytest.mark.parametrize("tokens", [1, 3, 64, 65, 127])
@pytest.mark.parametrize("hidden, repeat", [(7168, 20), (1032, 7)])
def test_pre_big_fuse_split_and_one_block_kernels_write_the_same_bytes(monkeypatch, tokens, hidden, repeat):
    """The same sums in the same order: either kernel at any token count (SPLIT_MAX_TOKENS steers the op)."""
    a = big_fuse_inputs(tokens, hidden=hidden)
    outputs = []
    for limit in (0, 65535):  # the one-block kernel, then the split kernel
        monkeypatch.setattr(big_fuse, "SPLIT_MAX_TOKENS", limit)
        outputs.append(run_big_fuse(a, repeat))
    for name, one_block, split in zip(("post_mix", "comb_mix", "layer_input"), *outputs):
        assert torch.equal(one_block, split), name


@pytest.mark.parametrize("m", [1, 2])
def test_pre_big_fuse_other_rates_when_built(m):
    """Rates 1 and 2 build on demand (tkaot-build build --op mhc_pre_big_fuse --set mhc_mult=2); skipped when not built."""
    a = big_fuse_inputs(127, m=m, hidden=512, splits=4)
    try:
        post, comb, layer_input = run_big_fuse(a, 20, splits=4)
    except tkaot.VariantNotBuilt:
        pytest.skip(f"mhc_pre_big_fuse for mhc_mult={m} is not in the default set")
    expected = ref.mhc_pre_big_fuse_fwd(**a, rms_eps=1e-6, mhc_pre_eps=1e-6, mhc_sinkhorn_eps=1e-6,
                                        mhc_post_mult_value=2.0, sinkhorn_repeat=20, n_splits=4)  # fmt: skip
    assert_written_close(comb, expected[1], dict(rtol=1e-4, atol=1e-5))
    assert_written_close(layer_input.float(), expected[2].float(), BF16_TOL)


def test_a_layer_step_replays_bit_identical_in_a_cuda_graph():
    """pre big fuse -> (the layer, here a fixed map) -> post mix: captured once, replayed on new inputs, equal to eager."""
    tokens, m, hidden = 8, 4, 7168
    a = big_fuse_inputs(tokens)
    post, comb, layer_input = poisoned(tokens, m), poisoned(tokens, m * m), poisoned(tokens, hidden, dtype=BF16)
    has_post = hasattr(MHC, "mhc_post_fwd")  # the other half of the family; without it the step ends at pre big fuse
    out = poisoned(tokens, m, hidden, dtype=BF16)

    def step():
        MHC.mhc_pre_big_fuse_fwd(a["gemm_out_mul"], a["gemm_out_sqrsum"], a["mhc_scale"], a["mhc_base"], a["residual"], post,
                                 comb, layer_input, 1e-6, 1e-6, 1e-6, 2.0, 20, 16)  # fmt: skip
        if has_post:
            MHC.mhc_post_fwd(
                layer_input.unsqueeze(0),
                a["residual"].unsqueeze(0),
                post.view(1, tokens, m, 1),
                comb.view(1, tokens, m, m),
                out=out.unsqueeze(0),
            )  # one sequence: (1, tokens, ...)

    step()  # loads the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (5, 6):
        fresh = big_fuse_inputs(tokens, seed=seed)
        for name, t in fresh.items():
            a[name].copy_(t)
        graph.replay()
        torch.cuda.synchronize()
        replayed = [t.clone() for t in (post, comb, layer_input, out)]
        for t in (post, comb, layer_input, out):
            t.view(torch.int16 if t.dtype is BF16 else torch.int32).fill_(-1)
        step()
        torch.cuda.synchronize()
        for r, e in zip(replayed, (post, comb, layer_input, out)):
            assert torch.equal(r.view(torch.uint8), e.view(torch.uint8))


# ---- multilayer recompute


def recompute_inputs(tokens: int, layers: int, post_count: int, m: int = 4, hidden: int = 7168):
    res0 = randn(tokens, m, hidden, dtype=BF16)
    pre = [randn(tokens, m, 1, seed=i).sigmoid() for i in range(layers)]
    outs = [randn(tokens, hidden, dtype=BF16, seed=10 + i) for i in range(post_count)]
    post = [randn(tokens, m, 1, seed=20 + i).sigmoid() * 2 for i in range(post_count)]
    comb = [randn(tokens, m, m, seed=30 + i).softmax(-1) for i in range(post_count)]
    return res0, pre, outs, post, comb


@pytest.mark.parametrize("tokens", TOKENS)
# 4 layers with 4 and 3 post layers (the staged mixes' three buffers all used, the last layer's commit group empty);
# hidden 1536: the second block of a token half past the hidden size (its threads still reach every barrier)
@pytest.mark.parametrize(
    "m, hidden, layers, post_count",
    [(4, 7168, 4, 4), (4, 7168, 4, 3), (4, 1536, 4, 4), (4, 1536, 4, 3), (4, 4096, 3, 3), (4, 1032, 1, 0), (4, 2048, 1, 1)],
)
def test_multilayer_recompute(tokens, m, hidden, layers, post_count):
    check_recompute(*recompute_inputs(tokens, layers, post_count, m, hidden))


def check_recompute(res0, pre, outs, post, comb):
    tokens, m, hidden = res0.shape
    inputs = [poisoned(tokens, hidden, dtype=BF16) for _ in pre]
    residuals = [poisoned(tokens, m, hidden, dtype=BF16) for _ in outs]
    MHC.mhc_multilayer_recompute(res0, pre, outs, post, comb, inputs, residuals)
    ref_inputs, ref_residuals = ref.mhc_multilayer_recompute(res0, pre, outs, post, comb)
    # each layer rounds its input to bf16 before the next reads it; one rounding that falls the other way in an early
    # layer moves a later one by a few bf16 ulps (the kernel is byte-identical to TileKernels: tests/gpu/test_parity_gpu.py)
    for got, want in zip(inputs + residuals, ref_inputs + ref_residuals):
        assert_written_close(got.float(), want.float(), BF16_TOL if len(pre) == 1 else CHAIN_TOL)


def one_float_in(t: torch.Tensor) -> torch.Tensor:
    """t's values in a buffer one float longer, at its second element: 4-byte but not 16-byte aligned."""
    buffer = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buffer[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("m", [1, 3, 8])
def test_multilayer_recompute_other_rates_when_built(m):
    """Rates whose mix rows are copied a float at a time (1, 3: from mixes only 4-byte aligned) or in two 16-byte
    pieces (8); built on demand (tkaot-build build --op mhc_multilayer_recompute --set mhc_mult=3), skipped when not."""
    res0, pre, outs, post, comb = recompute_inputs(127, 4, 3, m, 1536)
    if m % 4:
        pre, post, comb = ([one_float_in(x) for x in xs] for xs in (pre, post, comb))
    try:
        check_recompute(res0, pre, outs, post, comb)
    except tkaot.VariantNotBuilt:
        pytest.skip(f"mhc_multilayer_recompute for mhc_mult={m} is not in the default set")
