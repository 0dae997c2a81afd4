"""MoE routing on a GPU against the pure-torch references: every default (experts, top-k),
every option alone and together, odd token counts, deliberate ties, poisoned outputs,
masked and forced-random tokens, CUDA graphs; and against tile_kernels when it is installed.
The generic tier (moe_topk_gate_generic, normalize_weight_generic): byte for byte what the
specialised variants write, and the references' results at expert counts and k no specialised
variant has (4 to 512 experts)."""

import warnings

import pytest
import torch

import tkaot
from bench.generic import on_generic
from tkaot import _op
from tkaot._moe import ops as moe_ops
from tkaot.errors import GenericVariantWarning
from tkaot.reference import moe as ref

pytestmark = pytest.mark.gpu

TOKENS = [1, 3, 127, 4097]
SHAPES = [(256, 8, 1), (128, 8, 0), (64, 6, 0), (64, 8, 2)]  # (experts, top-k, shared slots)
OPTIONS = {
    "none": (),
    "bias": ("bias",),
    "mask": ("mask",),
    "image": ("bias", "image"),
    "fixed": ("bias", "fixed"),
    "unmapped": ("unmapped",),
    "physical": ("physical",),
    "random": ("random",),
    "random_physical": ("random", "physical"),
    "scores": ("scores",),
    "all": ("mask", "bias", "image", "fixed", "physical", "random", "scores"),
}
WEIGHT_TOL = dict(rtol=1e-6, atol=1e-7)  # scores may differ from torch's in the last bit
TIE_STRIDE = 9  # experts 0, 9, 18, ... share logits and biases: exact ties in every row


def tied(t: torch.Tensor) -> torch.Tensor:
    t[..., TIE_STRIDE::TIE_STRIDE] = t[..., :1]
    return t


def make_logits(tokens, experts, topk, shift, gap=1e-4):
    """Random logits with exact ties, redrawn where two different ranked scores are so close
    (under `gap`) that a last-bit difference between kernel and torch could swap them."""
    logits = tied(torch.randn(tokens, experts, device="cuda") * 2)
    logits[0] = 0.5  # a row of nothing but ties (before any bias)
    for _ in range(100):
        ranked = (ref.sqrt_softplus(logits) + shift).topk(min(topk + 1, experts), dim=1).values
        steps = ranked[:, :-1] - ranked[:, 1:]
        bad = ((steps > 0) & (steps < gap)).any(dim=1)
        if not bad.any():
            return logits
        logits[bad] = tied(torch.randn(int(bad.sum()), experts, device="cuda") * 2)
    raise RuntimeError("could not draw logits with well separated ranks")


def make_case(tokens, experts, topk, shared, options):
    k = {}
    dev = dict(device="cuda")
    if "bias" in options:
        k["bias"] = tied(torch.randn(experts, **dev) * 0.3)
    if "image" in options:
        k["image_bias"] = tied(torch.randn(experts, **dev) * 0.3)
        k["image_token_mask"] = torch.rand(tokens, **dev) < 0.5
    if "mask" in options:
        k["mask"] = torch.rand(tokens, **dev) < 0.8
    if "fixed" in options or "unmapped" in options:
        base = torch.full((tokens, topk + 3), 99999, dtype=torch.int64, **dev)  # strided rows, poisoned
        k["unmapped_topk_idx"] = base[:, :topk]
    if "fixed" in options:
        k["fix_routing_mask"] = torch.rand(tokens, **dev) < 0.4
        fixed = torch.rand(tokens, experts, **dev).argsort(dim=1)[:, :topk]
        k["unmapped_topk_idx"].copy_(fixed)
    if "physical" in options:
        logical = experts + shared
        k["logical_count"] = torch.randint(1, 4, (logical,), dtype=torch.int32, **dev)
        k["to_physical_map"] = torch.randint(0, 4 * logical, (logical, 3), dtype=torch.int32, **dev)
    if "random" in options:
        k["force_random"] = torch.rand(tokens, **dev) < 0.3
    shift = k.get("bias", torch.zeros(experts, **dev))[None, :].expand(tokens, -1)
    if "image" in options:
        shift = torch.where(k["image_token_mask"][:, None], k["image_bias"][None, :], shift)
    logits = make_logits(tokens, experts, topk, shift)
    return logits, k


def run_gate(logits, topk, shared, scale, ep_rank, kwargs, with_scores):
    slots = topk + shared
    tokens, experts = logits.shape
    out = (torch.full((tokens, slots), -7, dtype=torch.int64, device="cuda"), torch.full((tokens, slots), float("nan"), device="cuda"))
    scores = torch.full((tokens, experts), float("nan"), device="cuda") if with_scores else None
    want = ref.moe_topk_gate_forward(logits, topk, shared > 0, shared, scale, ep_rank, **kwargs)  # first: the op rewrites unmapped_topk_idx
    got = tkaot.moe.moe_topk_gate_forward(logits, topk, shared > 0, shared, scale, ep_rank, out=out, scores=scores, **kwargs)
    torch.cuda.synchronize()
    assert got[0] is out[0] and got[1] is out[1]
    return got, want, scores


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("experts, topk, shared", SHAPES)
def test_gate_matches_reference(seed, experts, topk, shared, option):
    assert_gate_matches_reference(experts, topk, shared, OPTIONS[option])


def assert_gate_matches_reference(experts, topk, shared, options):
    for i, tokens in enumerate(TOKENS):
        logits, kwargs = make_case(tokens, experts, topk, shared, options)
        scale, ep_rank = (2.5, 3) if i % 2 else (1.0, 0)
        (topk_idx, topk_weights), want, scores = run_gate(logits, topk, shared, scale, ep_rank, kwargs, "scores" in options)
        assert torch.equal(topk_idx, want.topk_idx), f"{tokens} tokens: indices differ"
        assert not torch.isnan(topk_weights).any(), "unwritten weights"
        torch.testing.assert_close(topk_weights, want.topk_weights, **WEIGHT_TOL)
        if "random" in options:  # the random stream is bit-exact
            rows = kwargs["force_random"] & kwargs.get("mask", torch.ones_like(kwargs["force_random"]))
            assert torch.equal(topk_weights[rows], want.topk_weights[rows])
        if "unmapped_topk_idx" in kwargs:
            assert torch.equal(kwargs["unmapped_topk_idx"], want.unmapped_topk_idx)
        if scores is not None:
            assert not torch.isnan(scores).any(), "unwritten scores"
            torch.testing.assert_close(scores, want.scores, rtol=1e-6, atol=1e-7)


def test_masked_and_random_tokens_as_documented(seed):
    experts, topk, shared, tokens = 256, 8, 1, 4097
    logits = torch.randn(tokens, experts, device="cuda")
    mask = torch.rand(tokens, device="cuda") < 0.7
    force_random = torch.rand(tokens, device="cuda") < 0.5
    unmapped = torch.full((tokens, topk), 5, dtype=torch.int64, device="cuda")
    fixed = torch.ones(tokens, dtype=torch.bool, device="cuda")  # random wins over fixed
    scores = torch.full((tokens, experts), float("nan"), device="cuda")
    idx, w = tkaot.moe.moe_topk_gate_forward(
        logits, topk, True, shared, 2.5, 7, mask=mask, force_random=force_random, fix_routing_mask=fixed,
        unmapped_topk_idx=unmapped, scores=scores,
    )  # fmt: skip
    masked, rand = ~mask, mask & force_random
    assert (idx[masked] == -1).all() and (w[masked] == 0).all() and (unmapped[masked] == -1).all() and (scores[masked] == 0).all()
    r_idx = idx[rand]
    assert ((r_idx >= 0) & (r_idx < experts + shared)).all()
    assert (r_idx.sort(dim=1).values.diff(dim=1) > 0).all(), "random experts of a token must be distinct"
    assert ((w[rand] > 0) & (w[rand] <= 1)).all() and (unmapped[rand] == -1).all() and (scores[rand] == 0).all()
    again, _ = tkaot.moe.moe_topk_gate_forward(logits, topk, True, shared, 2.5, 7, mask=mask, force_random=force_random)
    assert torch.equal(again[rand], r_idx), "random routes are reproducible for one ep_rank"
    other, _ = tkaot.moe.moe_topk_gate_forward(logits, topk, True, shared, 2.5, 8, mask=mask, force_random=force_random)
    assert not torch.equal(other[rand], r_idx), "another ep_rank draws other routes"


def test_ties_go_to_the_lower_index():
    logits = torch.zeros(5, 64, device="cuda")
    logits[1, 40:] = 1.0  # 24 equal leaders
    bias = torch.zeros(64, device="cuda")
    idx, w = tkaot.moe.moe_topk_gate_forward(logits, 8, False, 0, 1.0, 0, bias=bias)
    assert idx[0].tolist() == list(range(8)) and idx[1].tolist() == list(range(40, 48))
    torch.testing.assert_close(w[0], torch.full((8,), 1 / 8, device="cuda"), rtol=1e-6, atol=0)
    bias[:60] = -float("inf")  # -inf biased scores still rank, after the finite ones, by index
    idx, _ = tkaot.moe.moe_topk_gate_forward(logits, 6, False, 0, 1.0, 0, bias=bias)
    assert idx[0].tolist() == [60, 61, 62, 63, 0, 1]


def test_fixed_index_outside_the_experts_weighs_zero():
    logits = make_logits(3, 128, 8, torch.zeros(128, device="cuda"))
    unmapped = torch.tensor([[5, -1, 7, 200, 1, 2, 3, 4]] * 3, device="cuda")
    fixed = torch.tensor([True, False, True], device="cuda")
    idx, w = tkaot.moe.moe_topk_gate_forward(logits, 8, False, 0, 1.0, 0, fix_routing_mask=fixed, unmapped_topk_idx=unmapped)
    assert idx[0].tolist() == [5, -1, 7, 200, 1, 2, 3, 4] and (w[0, [1, 3]] == 0).all() and (w[0] > 0).sum() == 6
    want = ref.moe_topk_gate_forward(logits, 8, False, 0, 1.0, 0)
    assert torch.equal(idx[1], want.topk_idx[1])


@pytest.mark.parametrize("experts, topk", [(256, 8), (128, 8), (64, 6), (64, 8), (8, 4)])
def test_topk_gate_matches_reference(seed, experts, topk):
    for tokens in TOKENS:
        scores = torch.randint(-20, 20, (tokens, experts), device="cuda").float() / 4  # many exact ties
        got = tkaot.moe.topk_gate(scores, topk)
        torch.cuda.synchronize()
        assert got.dtype == torch.int64 and got.is_contiguous()
        assert torch.equal(got, ref.topk_gate(scores, topk))


@pytest.mark.parametrize("topk", [6, 8, 9])
def test_normalize_weight_matches_reference(seed, topk):
    for tokens in TOKENS:
        weights = torch.rand(tokens, topk, device="cuda") * 3
        denominator, normalized = tkaot.moe.normalize_weight(weights)
        want_den, want_norm = ref.normalize_weight(weights)
        torch.testing.assert_close(denominator, want_den, rtol=2e-7, atol=0)
        torch.testing.assert_close(normalized, want_norm, rtol=3e-7, atol=0)


def test_normalize_weight_denominator_is_the_gate_sum(seed):
    # with scaling 1 the gate divides by exactly the denominator normalize_weight computes
    logits = make_logits(127, 256, 8, torch.zeros(256, device="cuda"))
    idx, w = tkaot.moe.moe_topk_gate_forward(logits, 8, False, 0, 1.0, 0)
    chosen = ref.sqrt_softplus(logits).gather(1, idx)
    denominator, normalized = tkaot.moe.normalize_weight(chosen)
    torch.testing.assert_close(w, normalized, rtol=1e-6, atol=1e-7)


def test_empty_input_launches_nothing():
    idx, w = tkaot.moe.moe_topk_gate_forward(torch.empty(0, 256, device="cuda"), 8, True, 1, 2.5, 0)
    assert idx.shape == (0, 9) and w.shape == (0, 9)
    assert tkaot.moe.topk_gate(torch.empty(0, 64, device="cuda"), 6).shape == (0, 6)
    den, norm = tkaot.moe.normalize_weight(torch.empty(0, 8, device="cuda"))
    assert den.shape == (0,) and norm.shape == (0, 8)


def test_cuda_graph_capture_and_replay(seed):
    logits = torch.randn(16, 256, device="cuda")
    bias = torch.randn(256, device="cuda") * 0.1
    tkaot.moe.moe_topk_gate_forward(logits, 8, True, 1, 2.5, 0, bias=bias)  # load outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx, w = tkaot.moe.moe_topk_gate_forward(logits, 8, True, 1, 2.5, 0, bias=bias)
    for _ in range(3):
        logits.copy_(make_logits(16, 256, 8, bias[None, :].expand(16, -1)))
        idx.fill_(-7)
        w.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = ref.moe_topk_gate_forward(logits, 8, True, 1, 2.5, 0, bias=bias)
        assert torch.equal(idx, want.topk_idx)
        torch.testing.assert_close(w, want.topk_weights, **WEIGHT_TOL)


def test_missing_variant_raises_variant_not_built_in_strict_mode(monkeypatch):
    monkeypatch.setenv("TKAOT_STRICT", "1")
    monkeypatch.setattr(moe_ops._GATE, "cache", {})
    with pytest.raises(tkaot.VariantNotBuilt, match="num_experts=72"):
        tkaot.moe.moe_topk_gate_forward(torch.randn(4, 72, device="cuda"), 8, False, 0, 1.0, 0)


@pytest.mark.parametrize("option", ["none", "all", "random_physical"])
def test_gate_agrees_with_tile_kernels(seed, option):
    tk = pytest.importorskip("tile_kernels")
    experts, topk, shared = 256, 8, 1
    logits, kwargs = make_case(4097, experts, topk, shared, OPTIONS[option])
    kwargs.pop("scores", None)
    ours_unmapped = kwargs["unmapped_topk_idx"].clone() if "unmapped_topk_idx" in kwargs else None
    ours = tkaot.moe.moe_topk_gate_forward(logits, topk, True, shared, 2.5, 5, **kwargs)
    if ours_unmapped is not None:
        ours_unmapped, kwargs["unmapped_topk_idx"] = kwargs["unmapped_topk_idx"], ours_unmapped
    theirs = tk.moe.moe_topk_gate_forward(logits, topk, True, shared, 2.5, 5, **kwargs)
    torch.cuda.synchronize()
    assert torch.equal(ours[0], theirs[0])
    torch.testing.assert_close(ours[1], theirs[1], **WEIGHT_TOL)
    if ours_unmapped is not None:
        assert torch.equal(ours_unmapped, kwargs["unmapped_topk_idx"])
    scores = torch.randint(-20, 20, (4097, 64), device="cuda").float()
    assert torch.equal(tkaot.moe.topk_gate(scores, 6), tk.moe.topk_gate(scores, 6))
    weights = torch.rand(4097, 9, device="cuda")
    for a, b in zip(tkaot.moe.normalize_weight(weights), tk.moe.normalize_weight(weights)):
        torch.testing.assert_close(a, b, rtol=2e-7, atol=0)


# ---- the generic tier ----

# (experts, top-k, shared slots) that no specialised variant of the default set has: the generic gate serves them
GENERIC_SHAPES = [
    (4, 4, 0), (4, 2, 2), (8, 2, 1), (8, 8, 0), (16, 4, 0), (16, 6, 2), (60, 4, 0), (96, 11, 1), (100, 8, 0),
    (256, 6, 1), (384, 8, 1), (512, 32, 0), (512, 30, 2),
]  # fmt: skip


def same_bytes(got: torch.Tensor, want: torch.Tensor, what: str):
    """Equal element for element as bits (NaNs included), after checking that nothing is left poisoned."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    as_int = {torch.float32: torch.int32, torch.int64: torch.int64}[got.dtype]
    same = got.view(as_int) == want.view(as_int)
    assert same.all(), f"{what}: {int((~same).sum())} of {same.numel()} elements differ, first at {tuple((~same).nonzero()[0].tolist())}"


def gate_outputs(logits, topk, shared, scale, ep_rank, kwargs, with_scores) -> dict:
    """Every tensor the gate writes, each a fresh poisoned buffer (unmapped_topk_idx a copy of the given one,
    with its row stride: the op reads the fixed routes from it and writes it)."""
    tokens, experts = logits.shape
    kwargs = dict(kwargs)
    out = (torch.full((tokens, topk + shared), -7, dtype=torch.int64, device="cuda"),
           torch.full((tokens, topk + shared), float("nan"), device="cuda"))  # fmt: skip
    written = {"topk_idx": out[0], "topk_weights": out[1]}
    if "unmapped_topk_idx" in kwargs:
        given = kwargs["unmapped_topk_idx"]
        rows = torch.full((tokens, given.stride(0)), 99999, dtype=torch.int64, device="cuda")
        kwargs["unmapped_topk_idx"] = written["unmapped_topk_idx"] = rows[:, :topk]
        written["unmapped_topk_idx"].copy_(given)
    if with_scores:
        kwargs["scores"] = written["scores"] = torch.full((tokens, experts), float("nan"), device="cuda")
    tkaot.moe.moe_topk_gate_forward(logits, topk, shared > 0, shared, scale, ep_rank, out=out, **kwargs)
    return written


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("experts, topk, shared", SHAPES)
def test_generic_gate_writes_the_specialised_bytes(seed, experts, topk, shared, option):
    """Every specialised gate of the default set, every option, against the generic gate on the same inputs:
    indices, fp32 weights, unmapped indices and scores byte for byte."""
    options = OPTIONS[option]
    for i, tokens in enumerate(TOKENS):
        logits, kwargs = make_case(tokens, experts, topk, shared, options)
        scale, ep_rank = (2.5, 3) if i % 2 else (1.0, 0)
        want = gate_outputs(logits, topk, shared, scale, ep_rank, kwargs, "scores" in options)
        with on_generic("moe_topk_gate"):
            got = gate_outputs(logits, topk, shared, scale, ep_rank, kwargs, "scores" in options)
        torch.cuda.synchronize()
        for name in want:
            same_bytes(got[name], want[name], f"{name}, {tokens} tokens")


@pytest.mark.parametrize("experts, topk, shared", SHAPES)
def test_generic_gate_agrees_with_the_specialised_one_on_non_finite_logits(seed, experts, topk, shared):
    """Outside the op's contract (logits must be finite), the two kernels still route alike: one body."""
    for tokens in TOKENS:
        logits = torch.randn(tokens, experts, device="cuda")
        logits[::5, ::7] = float("nan")
        logits[::3, 1::9] = float("inf")
        logits[1::4, 2::11] = -float("inf")
        kwargs = {"bias": torch.randn(experts, device="cuda")}
        want = gate_outputs(logits, topk, shared, 2.5, 1, kwargs, True)
        with on_generic("moe_topk_gate"):
            got = gate_outputs(logits, topk, shared, 2.5, 1, kwargs, True)
        torch.cuda.synchronize()
        for name in want:
            same_bytes(got[name], want[name], f"{name}, {tokens} tokens")


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("experts, topk, shared", GENERIC_SHAPES)
def test_generic_gate_matches_reference(seed, experts, topk, shared, option):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenericVariantWarning)
        assert_gate_matches_reference(experts, topk, shared, OPTIONS[option])
    launcher = moe_ops._GATE.cache[(0, experts, topk)]
    assert getattr(launcher, "__self__", launcher).kernel.kernel == "moe_topk_gate_generic"


def test_generic_gate_rows_past_two_billion_elements(seed):
    """A runtime row length: a row's offset (token * experts) passes 2**31 within the op's token limit."""
    experts, topk = 512, 8
    tokens = 2**31 // experts + 300
    needed = tokens * experts * 4 + (1 << 30)
    if torch.cuda.mem_get_info()[0] < needed:
        pytest.skip(f"needs about {needed / 2**30:.0f} GiB of free GPU memory")
    logits = torch.randn(tokens, experts, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenericVariantWarning)
        idx, weights = tkaot.moe.moe_topk_gate_forward(logits, topk, True, 1, 2.5, 0)
    tail = slice(tokens - 600, tokens)  # rows on both sides of element 2**31
    want = ref.moe_topk_gate_forward(logits[tail], topk, True, 1, 2.5, 0)
    torch.cuda.synchronize()
    assert torch.equal(idx[tail], want.topk_idx)
    torch.testing.assert_close(weights[tail], want.topk_weights, **WEIGHT_TOL)


@pytest.mark.parametrize("experts, topk, shared", [(8, 2, 0), (16, 4, 1), (60, 4, 0), (100, 6, 2)])
def test_generic_gate_agrees_with_tile_kernels_where_tkaot_once_refused(seed, monkeypatch, experts, topk, shared):
    tk = pytest.importorskip("tile_kernels")
    monkeypatch.setattr(_op, "_WARNED", set())  # each fallback warns once a process: this test must see it
    monkeypatch.setattr(moe_ops._GATE, "cache", {})
    logits, kwargs = make_case(4097, experts, topk, shared, OPTIONS["all"])
    kwargs.pop("scores", None)
    theirs_unmapped = kwargs["unmapped_topk_idx"].clone()
    with pytest.warns(GenericVariantWarning, match=f"--set num_experts={experts} --set num_topk={topk}"):
        ours = tkaot.moe.moe_topk_gate_forward(logits, topk, shared > 0, shared, 2.5, 5, **kwargs)
    ours_unmapped, kwargs["unmapped_topk_idx"] = kwargs["unmapped_topk_idx"], theirs_unmapped
    theirs = tk.moe.moe_topk_gate_forward(logits, topk, shared > 0, shared, 2.5, 5, **kwargs)
    torch.cuda.synchronize()
    same_bytes(ours[0], theirs[0], "topk_idx")
    torch.testing.assert_close(ours[1], theirs[1], **WEIGHT_TOL)
    same_bytes(ours_unmapped, theirs_unmapped, "unmapped_topk_idx")


def normalize_outputs(weights):
    """normalize_weight's outputs, allocated where poisoned blocks of their sizes were just freed (the op takes no
    out=), so an element it leaves unwritten reads NaN with the caching allocator."""
    for shape in (weights.shape[:1], weights.shape):
        torch.full(shape, float("nan"), device="cuda")
    return tkaot.moe.normalize_weight(weights)


@pytest.mark.parametrize("topk", [6, 8, 9])
def test_generic_normalize_weight_writes_the_specialised_bytes(seed, topk):
    for tokens in TOKENS:
        weights = torch.rand(tokens, topk, device="cuda") * 3
        weights[0] = 0  # a row summing to nothing
        weights[1 % tokens, 0] = -0.0
        want = normalize_outputs(weights)
        with on_generic("normalize_weight"):
            got = normalize_outputs(weights)
        torch.cuda.synchronize()
        same_bytes(got[0], want[0], f"denominator, {tokens} tokens")
        same_bytes(got[1], want[1], f"normalized weights, {tokens} tokens")


@pytest.mark.parametrize("topk", range(1, 33))
def test_generic_normalize_weight_matches_reference(seed, topk):
    for tokens in TOKENS:
        weights = torch.rand(tokens, topk, device="cuda") * 3
        with on_generic("normalize_weight"):
            denominator, normalized = normalize_outputs(weights)
        want_den, want_norm = ref.normalize_weight(weights)
        torch.cuda.synchronize()
        torch.testing.assert_close(denominator, want_den, rtol=2e-7, atol=0)
        torch.testing.assert_close(normalized, want_norm, rtol=3e-7, atol=0)


def test_generic_normalize_weight_denominator_is_the_generic_gate_sum(seed):
    """With scaling 1 the generic gate (20 experts, top-11) divides by the generic normalisation's denominator."""
    logits = make_logits(127, 20, 11, torch.zeros(20, device="cuda"))
    with on_generic("moe_topk_gate"):
        idx, w = tkaot.moe.moe_topk_gate_forward(logits, 11, False, 0, 1.0, 0)
    with on_generic("normalize_weight"):
        _, normalized = tkaot.moe.normalize_weight(ref.sqrt_softplus(logits).gather(1, idx))
    torch.testing.assert_close(w, normalized, rtol=1e-6, atol=1e-7)
