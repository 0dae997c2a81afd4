"""The backward (training) ops on a GPU against the pure-torch references (tkaot/reference/backward.py):
norm_backward, swiglu_backward, swiglu_backward_and_per_token_cast, moe_topk_gate_backward; and tkaot.rand.

Every output the ops allocate starts as NaN / 0xFF bytes, so an element left unwritten shows; every element is
compared. The calls cover what the default set serves: norm_backward at every threads-a-row class of widths, in both
dtypes (bf16 at the specialised widths on rmsnorm_backward, or rmsnorm_backward_residual with a residual gradient, the
rest on rmsnorm_backward_generic: the generic tier warns, which is expected here), and the SwiGLU backward ops in every
dtype combination TileKernels takes.
Element-wise results (SwiGLU's x_grad and act_out, the FP8 cast and its scale factors) must be the same bits as the
reference, which runs the same fp32 operations on the GPU. Results that sum over a row or over tokens (RMSNorm's
x_grad and weight_grad, SwiGLU's weight_grad, the gate's gradient) are compared within the tolerances below: the
kernels add in another order than torch.
"""

import pytest
import torch

import tkaot
from tests.helpers import poisoned_allocations
from tkaot import _op
from tkaot._quant import norm_backward as _norm_backward
from tkaot._quant.kernels import NORM_BACKWARD_MAX_BLOCKS, NORM_BACKWARD_THREADS, norm_backward_tiling
from tkaot.errors import GenericVariantWarning
from tkaot.reference import backward as ref

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::tkaot.errors.GenericVariantWarning")]

TOKENS = [1, 3, 127, 4097]
BF16, F32, FP8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
# Sums in another order: an fp32 row dot product moves x_grad by a few fp32 ulps of the row's scale, which can
# flip a bf16 rounding (one bf16 ulp); weight_grad sums up to 4097 rows
SUM_TOL = {BF16: dict(rtol=2**-7, atol=2**-7), F32: dict(rtol=1e-5, atol=1e-5)}
# weight_grad sums up to 4097 tokens (RMSNorm) or 2 x 7168 columns (SwiGLU) in another order: a few fp32 ulps of
# the sum of |terms|, which shows where the sum cancels to near zero; a bf16 weight_grad can also round one bf16 ulp
WEIGHT_GRAD_TOL = {F32: dict(rtol=1e-4, atol=4e-3), BF16: dict(rtol=2**-7, atol=4e-3)}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    wide = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    diff = (a.contiguous().view(wide) != b.contiguous().view(wide)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} elements differ, first at {diff[0].tolist()}: {a[tuple(diff[0])]} vs {b[tuple(diff[0])]}"


# ---- norm_backward


# The default set's specialised widths (bf16), and widths only the generic tier serves: the narrowest, the first and
# last of each threads-a-row class (8 to 256 threads), rows of partial vectors a thread, the parity run's, the widest
NORM_SPECIALISED = [512, 1536, 2048, 4096, 5120, 7168, 8192]
NORM_GENERIC = [32, 64, 96, 224, 256, 448, 480, 896, 928, 1792, 1824, 3168, 3584, 3616, 6144, 7200, 7776, 8160]


@pytest.mark.parametrize("hidden", NORM_SPECIALISED + NORM_GENERIC)
@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("weight, residual, given", [(True, False, False), (True, True, True), (False, True, False), (False, False, False)])
def test_norm_backward_matches_reference(seed, hidden, dtype, weight, residual, given):
    for tokens in TOKENS:
        x = torch.randn(tokens, hidden, device="cuda").to(dtype)
        dy = torch.randn(tokens, hidden, device="cuda").to(dtype)
        w = (torch.rand(hidden, device="cuda") + 0.5).to(dtype) if weight else None
        dr = torch.randn(tokens, hidden, device="cuda").to(dtype) if residual else None
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        wg = torch.randn(hidden, device="cuda").to(F32 if dtype is BF16 else BF16) if given else None
        expected = ref.norm_backward(dy, x, w, rstd, dr, 0.75, wg)
        with poisoned_allocations():
            x_grad, w_grad = tkaot.quant.norm_backward(dy, x, w, rstd, dr, 0.75, None if wg is None else wg.clone())
        torch.cuda.synchronize()
        torch.testing.assert_close(x_grad, expected[0], **SUM_TOL[dtype])
        if weight:
            assert w_grad.dtype == (wg.dtype if given else dtype)
            torch.testing.assert_close(w_grad.float(), expected[1].float(), **WEIGHT_GRAD_TOL[w_grad.dtype])
        else:
            assert w_grad is None


# (residual gradient, weight) of the calls each flag kernel serves
FLAG_KERNELS = {"residual": ((True, True), (True, False)), "plain": ((False, False),)}


@pytest.mark.parametrize("hidden", NORM_SPECIALISED)
@pytest.mark.parametrize("form, residual, weight", [(f, r, w) for f, calls in FLAG_KERNELS.items() for r, w in calls])
def test_norm_backwards_flag_kernels_write_rmsnorm_backwards_bytes(monkeypatch, seed, hidden, form, residual, weight):
    """bf16 calls with a residual gradient run rmsnorm_backward_residual, those with neither a weight nor a residual
    gradient rmsnorm_backward_plain (the default set builds both at the specialised widths): the same bits as
    rmsnorm_backward, which takes both as runtime flags."""
    device, pass1 = torch.cuda.current_device(), _norm_backward._PASS1
    flag_kernels = _norm_backward._PASS1_RESIDUAL if form == "residual" else _norm_backward._PASS1_PLAIN
    monkeypatch.setattr(pass1, "cache", {})
    assert _norm_backward._pass1(device, hidden, "bfloat16", residual, weight)[0] is flag_kernels.get(device, hidden, "bfloat16")
    rows = NORM_BACKWARD_THREADS // norm_backward_tiling(hidden, "bfloat16")[1]
    shipped_launch = (pass1.get(device, hidden, "bfloat16"), rows, NORM_BACKWARD_MAX_BLOCKS)  # the shipped kernel, its grid
    for tokens in TOKENS:
        x, dy, dr = (torch.randn(tokens, hidden, device="cuda").to(BF16) for _ in range(3))
        dr = dr if residual else None
        w = (torch.rand(hidden, device="cuda") + 0.5).to(BF16) if weight else None
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        with poisoned_allocations():
            ours = tkaot.quant.norm_backward(dy, x, w, rstd, dr, 0.75)
        pass1.cache[device, hidden, "bfloat16", residual, weight] = shipped_launch
        with poisoned_allocations():
            shipped = tkaot.quant.norm_backward(dy, x, w, rstd, dr, 0.75)
        del pass1.cache[device, hidden, "bfloat16", residual, weight]
        torch.cuda.synchronize()
        assert not ours[0].isnan().any()  # every element written (a NaN the two left alike would compare equal)
        bits_equal(ours[0], shipped[0])
        if weight:
            bits_equal(ours[1], shipped[1])
        else:
            assert ours[1] is None and shipped[1] is None


@pytest.mark.filterwarnings("default::tkaot.errors.GenericVariantWarning")
def test_norm_backward_of_fp32_activations_runs_on_the_generic_tier_and_names_its_build(monkeypatch):
    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(_norm_backward._PASS1, "cache", {})
    x = torch.randn(3, 2048, device="cuda")
    with pytest.warns(GenericVariantWarning, match="--set hidden=2048 --set dtype=float32"):
        x_grad, _ = tkaot.quant.norm_backward(x, x, None, torch.ones(3, device="cuda"))
    torch.testing.assert_close(x_grad, ref.norm_backward(x, x, None, torch.ones(3, device="cuda"), None, 1.0, None)[0], **SUM_TOL[F32])
    monkeypatch.setenv("TKAOT_STRICT", "1")
    monkeypatch.setattr(_norm_backward._PASS1, "cache", {})
    with pytest.raises(tkaot.VariantNotBuilt, match="--set hidden=2048 --set dtype=float32"):
        tkaot.quant.norm_backward(x, x, None, torch.ones(3, device="cuda"))


@pytest.mark.parametrize("hidden, dtype", [(7168, BF16), (7168, F32), (3168, BF16)])  # specialised, generic, generic
def test_norm_backward_is_the_same_from_run_to_run(seed, hidden, dtype):
    x, dy = torch.randn(4097, hidden, device="cuda").to(dtype), torch.randn(4097, hidden, device="cuda").to(dtype)
    w, rstd = torch.rand(hidden, device="cuda").to(dtype), torch.rand(4097, device="cuda") + 0.5
    first = tkaot.quant.norm_backward(dy, x, w, rstd)
    second = tkaot.quant.norm_backward(dy, x, w, rstd)
    bits_equal(first[0], second[0])
    bits_equal(first[1], second[1])


@pytest.mark.parametrize("hidden, dtype", [(4096, BF16), (4096, F32), (2880, BF16)])
def test_norm_backward_inverts_norm_forward(seed, hidden, dtype):
    """Chained with the real forward: x_grad and weight_grad against autograd of the fp32 forward reference (bf16 at a
    specialised width; fp32 and a width no specialised variant has, on the generic tiers of both)."""
    x, w = torch.randn(127, hidden, device="cuda").to(dtype), (torch.rand(hidden, device="cuda") + 0.5).to(dtype)
    out, rstd, _ = tkaot.quant.norm_forward(x, w, 1e-6, with_rstd=True)
    dy = torch.randn_like(out)
    xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
    expected, _, _ = tkaot.reference.norm_forward(xf, wf, 1e-6, with_rstd=True)
    (expected * dy.float()).sum().backward()
    x_grad, w_grad = tkaot.quant.norm_backward(dy, x, w, rstd)
    torch.testing.assert_close(x_grad.float(), xf.grad, **SUM_TOL[dtype])
    torch.testing.assert_close(w_grad.float(), wf.grad, **WEIGHT_GRAD_TOL[dtype])


# ---- SwiGLU


def swiglu_inputs(tokens, hidden, dtype, psum: bool, weights: bool, grad_dtype=None):
    x = (torch.randn(tokens, 2 * hidden, device="cuda") * 4).to(dtype)
    dy = torch.randn(tokens, hidden, device="cuda").to(grad_dtype or dtype)
    w = torch.rand(tokens, device="cuda") + 0.25 if weights else None
    p = None
    if psum:
        ends = sorted(torch.randint(0, tokens + 1, (5,)).tolist())
        p = torch.tensor(ends, dtype=torch.int32, device="cuda")
        pad = ref.padding_rows(tokens, p).cuda()
        x[pad], dy[pad] = 0, 0
        if w is not None:
            w[pad] = 0
    return x, dy, w, p


def check_swiglu(got: tuple, expected: tuple, weights: bool) -> None:
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        if isinstance(a, tuple):
            bits_equal(a[0], b[0])
            bits_equal(a[1], b[1])  # in logical order: layouts are compared by the CPU tests
        elif weights and i == (2 if isinstance(got[1], tuple) else 1):
            torch.testing.assert_close(a, b, **WEIGHT_GRAD_TOL[a.dtype])  # weight_grad: a row sum
        else:
            bits_equal(a, b)


SWIGLU_OPTIONS = [
    (False, False, None, None, False), (True, True, 2.5, None, True), (False, True, None, 7.0, False), (True, False, None, 3.0, True),
]  # fmt: skip


@pytest.mark.parametrize("hidden", [64, 256, 768, 1536, 2048, 7168, 7616])
@pytest.mark.parametrize("dtype", [BF16, F32])
@pytest.mark.parametrize("fmt", ["bf16", "fp32"])  # every pair TileKernels' swiglu_backward takes (x and dy of one dtype)
@pytest.mark.parametrize("psum, weights, rsf, clamp, recompute", SWIGLU_OPTIONS)
def test_swiglu_backward_matches_reference(seed, hidden, dtype, fmt, psum, weights, rsf, clamp, recompute):
    for tokens in TOKENS:
        x, dy, w, p = swiglu_inputs(tokens, hidden, dtype, psum, weights)
        expected = ref.swiglu_backward(x, dy, fmt, p, w, rsf, clamp, recompute)
        with poisoned_allocations():
            got = tkaot.quant.swiglu_backward(x, dy, fmt, p, w, rsf, clamp, recompute)
        torch.cuda.synchronize()
        check_swiglu(got, expected, weights)


@pytest.mark.parametrize("hidden", [64, 768, 7168])
@pytest.mark.parametrize("dtype, grad_dtype", [(BF16, BF16), (BF16, F32), (F32, BF16), (F32, F32)])
@pytest.mark.parametrize("fmt", ["bf16", "fp32"])  # swiglu_backward_and_per_token_cast without a cast: any dtype pair
@pytest.mark.parametrize("psum, weights, rsf, clamp, recompute", SWIGLU_OPTIONS[:2] + SWIGLU_OPTIONS[3:])
def test_swiglu_backward_and_per_token_cast_without_a_cast_matches_reference(seed, hidden, dtype, grad_dtype, fmt, psum, weights, rsf,
                                                                             clamp, recompute):  # fmt: skip
    for tokens in TOKENS:
        x, dy, w, p = swiglu_inputs(tokens, hidden, dtype, psum, weights, grad_dtype)
        args = (x, dy, fmt, 128, p, w, rsf, False, False, False, clamp, recompute)
        expected = ref.swiglu_backward_and_per_token_cast(*args)
        with poisoned_allocations():
            got = tkaot.quant.swiglu_backward_and_per_token_cast(*args)
        torch.cuda.synchronize()
        check_swiglu(got, expected, weights)


# Every combination the default set builds: bf16 and fp32 gradients; per 32 and 128 with each sf kind (fp32, pow2,
# packed UE8M0), row- and column-major
@pytest.mark.parametrize("hidden", [256, 1536, 2048, 7168])
@pytest.mark.parametrize("grad_dtype", [BF16, F32])
@pytest.mark.parametrize("group", [128, 32])
@pytest.mark.parametrize("round_sf, packed", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("psum, weights, clamp", [(False, False, None), (True, True, 5.0)])
def test_swiglu_backward_and_per_token_cast_matches_reference(seed, hidden, grad_dtype, group, round_sf, packed, col, psum, weights, clamp):
    for tokens in TOKENS:
        x, dy, w, p = swiglu_inputs(tokens, hidden, F32, psum, weights)
        dy = dy.to(grad_dtype)
        amax = x.abs().unflatten(-1, (-1, group)).amax(-1).clamp(min=1e-4)
        sf = amax / 448
        data = (x / sf.repeat_interleave(group, -1)).to(FP8)
        args = ((data, sf), dy, "e4m3", group, p, w, 1.5 if weights else None, col, round_sf, packed, clamp, True)
        expected = ref.swiglu_backward_and_per_token_cast(*args)
        with poisoned_allocations():
            got = tkaot.quant.swiglu_backward_and_per_token_cast(*args)
        torch.cuda.synchronize()
        check_swiglu(got, expected, weights)


# ---- MoE gate


# (250 and 61 experts: rows not 16-byte aligned, the kernel's element-by-element path)
@pytest.mark.parametrize("experts, topk", [(64, 6), (128, 8), (256, 8), (72, 1), (512, 32), (250, 8), (61, 3)])
@pytest.mark.parametrize("aux", [False, True])
def test_moe_topk_gate_backward_matches_reference(seed, experts, topk, aux):
    for tokens in TOKENS:
        logits = torch.randn(tokens, experts, device="cuda") * 2
        mask = torch.rand(tokens, device="cuda") > 0.2
        scores = torch.nn.functional.softplus(logits).sqrt()
        idx = torch.stack([torch.randperm(experts, device="cuda")[:topk] for _ in range(tokens)])
        idx[~mask] = -1
        if topk > 1:
            idx[0, -1] = idx[0, 0]  # a repeated expert (fixed routing can repeat one): its slots add
        weights = torch.rand(tokens, topk, device="cuda")
        dw = torch.randn(tokens, topk, device="cuda")
        seqs = 1 if tokens in (1, 127, 4097) else 3
        h = torch.randn(seqs, experts, device="cuda") if aux else None
        m = mask if aux else None
        expected = ref.moe_topk_gate_backward(scores, idx, weights, dw, 2.5, mask=m, grad_scores_sum=h)
        with poisoned_allocations():
            got = tkaot.moe.moe_topk_gate_backward(scores, idx, weights, dw, 2.5, mask=m, grad_scores_sum=h)
        out = torch.full_like(scores, float("nan"))
        assert tkaot.moe.moe_topk_gate_backward(scores, idx, weights, dw, 2.5, mask=m, grad_scores_sum=h, out=out) is out
        torch.cuda.synchronize()
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        bits_equal(out, got)


@pytest.mark.parametrize("aux", [False, True])
def test_moe_topk_gate_backward_unaligned_rows_write_the_aligned_bytes(aux):
    """Scores, h and the output 4 bytes past a 16-byte boundary (contiguous, accepted): the element-by-element path,
    whose bytes are those of the 128-bit path on the same values."""
    tokens, experts, topk = 1000, 256, 8

    def shifted(t):  # t's values at an address 4 bytes past 16-byte alignment
        buf = torch.empty(t.numel() + 1, device="cuda")
        view = buf[1:].view(t.shape)
        view.copy_(t)
        return view

    scores = torch.nn.functional.softplus(torch.randn(tokens, experts, device="cuda") * 2).sqrt()
    idx = torch.stack([torch.randperm(experts, device="cuda")[:topk] for _ in range(tokens)])
    weights, dw = torch.rand(tokens, topk, device="cuda"), torch.randn(tokens, topk, device="cuda")
    m = torch.rand(tokens, device="cuda") > 0.2 if aux else None
    h = torch.randn(4, experts, device="cuda") if aux else None
    aligned = tkaot.moe.moe_topk_gate_backward(scores, idx, weights, dw, 2.5, mask=m, grad_scores_sum=h)
    out = shifted(torch.full_like(scores, float("nan")))
    got = tkaot.moe.moe_topk_gate_backward(
        shifted(scores), idx, weights, dw, 2.5, mask=m, grad_scores_sum=None if h is None else shifted(h), out=out
    )
    torch.cuda.synchronize()
    assert got.data_ptr() % 16 == 4
    bits_equal(got, aligned)


# ---- rand


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_randn_is_standard_normal_and_reproducible_under_set_seed(dtype):
    tkaot.rand.set_seed(20261201)
    a = tkaot.rand.randn(4096, 4097, dtype=dtype)
    b = tkaot.rand.randn_like(a)
    assert a.device.type == "cuda" and a.dtype == dtype and not torch.equal(a, b)
    v = a.float()
    assert abs(v.mean().item()) < 1e-3 and abs(v.std().item() - 1) < 2e-3
    # P(|z| > 3) = 0.0027
    assert abs((v.abs() > 3).float().mean().item() - 0.0027) < 2e-4
    tkaot.rand.set_seed(20261201)
    bits_equal(tkaot.rand.randn((4096, 4097), dtype=dtype), a)
    torch.manual_seed(20261201)
    bits_equal(torch.randn(4096, 4097, dtype=dtype, device="cuda"), a)
