"""tkaot.engram and tkaot.modeling.engram on a GPU against the pure-torch references (tkaot.reference.engram).

Every op on 1, 3, 127 and 4097 tokens (rows), with every CUDA tensor an op allocates poisoned (0xFF bytes: NaN for
floats, -1 for int32) so that an element nobody writes shows. Bit-exact where the math is deterministic and the
reference computes it the same way (hash, fused weight, masked rows, momentum bar double-rounding ties); elsewhere the
sums run in another order than the reference's, and the tolerances say by how much they may differ:
  bf16 outputs: one bf16 rounding step (rtol = atol = 2**-7 on unit-scale data);
  fp32 sums over a row (dot, rstd, Sinkhorn norms): rtol 1e-5;
  fp32 sums over tokens or partials (grad_w, column sums): rtol 1e-4, atol 1e-5 x the scale.
Also: the Sinkhorn iteration run to convergence with the ops equals the reference's; the autograd gate trains a tiny
model with the same loss curve as plain autograd through the reference forward (fp32 tolerance).
"""

from __future__ import annotations

import pytest
import torch

import tkaot
import tkaot.engram as E
from tests.helpers import poisoned_allocations
from tests.test_engram import reference_gate, train
from tkaot.modeling.engram import engram_gate
from tkaot.reference import engram as ref

pytestmark = pytest.mark.gpu

TOKENS = [1, 3, 127, 4097]
# the forward's items of 4 chunks of 256: 256 and 1792 end on a partial item (its chunks tested); 9216 and 16384 run
# x past the 28 chunks parked in shared memory
GATE_HIDDEN = [256, 512, 1792, 2048, 4096, 7168, 9216, 16384]
BF16_TOL = dict(rtol=2**-7, atol=2**-7)
ROW_SUM_TOL = dict(rtol=1e-5, atol=1e-6)
# the gate's saved (dot, gate_score, rstd_x, rstd_k): dot sums hidden products of unit-scale terms in another order
# than the reference (fp32 ulps of sqrt(hidden) where it cancels); the gate's sqrt(|dot|) carries that on
# seen on the H200: |dot - reference| up to 1.2e-4 at hidden 16384, where the kernel is byte-identical to TileKernels
# (tests/gpu/test_parity_gpu.py)
GATE_SAVED_TOL = (dict(rtol=1e-4, atol=5e-4), dict(rtol=1e-4, atol=5e-5), ROW_SUM_TOL, ROW_SUM_TOL)
BF16, F32 = torch.bfloat16, torch.float32


def sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


# ---- hash and fused weight: bit-exact


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("ngram", [3])  # the order the default set builds
@pytest.mark.parametrize("masked", [False, True])
def test_engram_hash_is_bit_exact(seed, tokens, ngram, masked):
    layers, tables = 2, 8
    ids = torch.randint(-3, 2**31 - 1, (tokens, ngram), dtype=torch.int32, device="cuda")
    mult = torch.randint(-(2**62), 2**62, (layers, ngram), dtype=torch.int64, device="cuda")
    vocab = torch.randint(1, 2**31 - 1, (layers, ngram - 1, tables), dtype=torch.int32, device="cuda")
    offsets = torch.randint(0, 2**30, (layers, (ngram - 1) * tables), dtype=torch.int32, device="cuda")
    mask = torch.rand(tokens, device="cuda") < 0.3 if masked else None
    with poisoned_allocations():
        out = E.engram_hash(ids, mult, vocab, offsets, mask)
    assert torch.equal(out, ref.engram_hash(ids, mult, vocab, offsets, mask))


@pytest.mark.parametrize("hc, hidden", [(1, 256), (4, 7168), (8, 16384)])
def test_fused_weight_is_bit_exact(seed, hc, hidden):
    wh, we = torch.randn(hc, hidden, dtype=BF16, device="cuda"), torch.randn(hc, hidden, dtype=BF16, device="cuda")
    with poisoned_allocations():
        out = E.fused_weight(wh, we)
    assert torch.equal(out, wh.float() * we.float())


# ---- the gate


def gate_data(tokens, hc, hidden, masked):
    x = torch.randn(tokens, hc, hidden, dtype=BF16, device="cuda")
    kv = torch.randn(tokens, hc + 1, hidden, dtype=BF16, device="cuda")
    w = torch.randn(hc, hidden, dtype=BF16, device="cuda").float() * torch.randn(hc, hidden, dtype=BF16, device="cuda").float()
    mask = torch.rand(tokens, device="cuda") < 0.3 if masked else None
    return x, kv, w, mask


@pytest.mark.parametrize("hidden", GATE_HIDDEN)
@pytest.mark.parametrize("hc", [1, 4])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("clamp", [1e-6, 0.05])
def test_engram_gate_fwd_matches_reference(seed, hidden, hc, masked, clamp):
    for tokens in TOKENS:
        x, kv, w, mask = gate_data(tokens, hc, hidden, masked)
        want = ref.engram_gate_fwd(x, kv, w, 1e-20, clamp, True, mask)
        with poisoned_allocations():
            got = E.engram_gate_fwd(x, kv, w, 1e-20, clamp, True, mask)
            inference = E.engram_gate_fwd(x, kv, w, 1e-20, clamp, False, mask)
        torch.testing.assert_close(got[0], want[0], **BF16_TOL)
        for name, ours, theirs, tol in zip(("dot", "gate_score", "rstd_x", "rstd_k"), got[1:], want[1:], GATE_SAVED_TOL):
            torch.testing.assert_close(ours, theirs, **tol, msg=lambda m, name=name: f"{name}: {m}")
        assert inference[1:] == (None, None, None, None) and torch.equal(inference[0], got[0])
        if mask is not None:
            assert torch.equal(got[0][mask], x[mask]) and all(torch.equal(s[mask], torch.zeros_like(s[mask])) for s in got[1:])
        in_place = x.clone()
        out = E.engram_gate_fwd(in_place, kv, w, 1e-20, clamp, False, mask, True)[0]
        assert out is in_place and torch.equal(in_place, got[0])


@pytest.mark.parametrize("hidden", [512, 4096, 7168, 16384])
@pytest.mark.parametrize("masked", [False, True])
def test_engram_gate_bwd_matches_reference(seed, hidden, masked):
    for tokens in TOKENS:
        x, kv, w, mask = gate_data(tokens, 4, hidden, masked)
        go = torch.randn(tokens, 4, hidden, dtype=BF16, device="cuda")
        _, *saved = E.engram_gate_fwd(x, kv, w, 1e-20, 1e-6, True, mask)
        with poisoned_allocations():
            grad_x, grad_kv, partial = E.engram_gate_bwd(go, x, kv, w, *saved, 1e-6, mask)
        want_x, want_kv, want_partial = ref.engram_gate_bwd(go, x, kv, w, *saved, 1e-6, mask, num_partials=sms())
        torch.testing.assert_close(grad_x, want_x, **BF16_TOL)
        torch.testing.assert_close(grad_kv, want_kv, **BF16_TOL)
        assert partial.shape == (sms(), 4, hidden) and partial.dtype == F32
        scale = want_partial.abs().max().item() + 1e-30
        torch.testing.assert_close(partial, want_partial, rtol=1e-4, atol=1e-5 * scale)
        if mask is not None:
            assert torch.equal(grad_x[mask], go[mask]) and not grad_kv[mask].any()


@pytest.mark.parametrize("partials", [1, 113, 132])
def test_grad_w_reduce_matches_reference(seed, partials):
    p = torch.randn(partials, 4, 7168, device="cuda")
    wh, we = torch.randn(4, 7168, dtype=BF16, device="cuda"), torch.randn(4, 7168, dtype=BF16, device="cuda")
    gh, ge = torch.randn(4, 7168, device="cuda"), torch.randn(4, 7168, device="cuda")
    want = ref.grad_w_reduce(p, wh, we, gh, ge)
    assert E.grad_w_reduce(p, wh, we, gh, ge) is None
    for got, theirs in zip((gh, ge), want):
        torch.testing.assert_close(got, theirs, rtol=1e-4, atol=1e-4 * partials**0.5)


def _at_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of t starting `offset` elements into a larger buffer (off 16-byte boundaries for 1-3)."""
    buf = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    out = buf[offset:].view(t.shape)
    out.copy_(t)
    return out


# (partials, hc_mult, hidden, input placed off 16-byte boundaries, offset in elements): the kernel's 4-byte path
# (kernels_src/engram/grad_w_reduce.py) where numel is not a multiple of 4 or any input is misaligned, and partial
# counts past the 148 rows staged at once
REDUCE_ODD = [
    (300, 4, 7168, None, 0),
    (149, 4, 7168, None, 0),
    (132, 3, 333, None, 0),
    (300, 1, 5, None, 0),
    (1, 1, 1, None, 0),
    (132, 4, 7168, "grad_w_partial", 1),
    (132, 4, 7168, "grad_w_partial", 2),
    (132, 4, 7168, "weight_hidden", 1),
    (132, 4, 7168, "weight_embed", 2),
    (132, 4, 7168, "grad_weight_hidden", 1),
    (300, 4, 7168, "grad_weight_embed", 2),
    (300, 3, 333, "grad_w_partial", 1),
]


@pytest.mark.parametrize("partials, hc, hidden, moved, offset", REDUCE_ODD)
def test_grad_w_reduce_odd_sizes_and_misaligned_inputs(seed, partials, hc, hidden, moved, offset):
    """Each column summed in partial order whichever path the kernel takes: the same bytes as the 16-byte path on
    aligned copies of the same values (where numel allows it), and the reference's values."""
    names = ("grad_w_partial", "weight_hidden", "weight_embed", "grad_weight_hidden", "grad_weight_embed")
    p = torch.randn(partials, hc, hidden, device="cuda")
    wh, we = torch.randn(hc, hidden, dtype=BF16, device="cuda"), torch.randn(hc, hidden, dtype=BF16, device="cuda")
    gh, ge = torch.randn(hc, hidden, device="cuda"), torch.randn(hc, hidden, device="cuda")
    want = ref.grad_w_reduce(p, wh, we, gh, ge)
    aligned = [t.clone() for t in (p, wh, we, gh, ge)]
    E.grad_w_reduce(*aligned)
    args = [_at_offset(t, offset) if name == moved else t.clone() for name, t in zip(names, (p, wh, we, gh, ge))]
    if moved is not None:
        assert dict(zip(names, args))[moved].data_ptr() % 16
    assert E.grad_w_reduce(*args) is None
    for got, same, theirs in zip(args[3:], aligned[3:], want):
        assert torch.equal(got, same)
        torch.testing.assert_close(got, theirs, rtol=1e-4, atol=1e-4 * partials**0.5)


# ---- Sinkhorn


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("grad_dtype", [BF16, F32])
@pytest.mark.parametrize("momentum_dtype", [BF16, F32])
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_update_matches_reference(seed, tokens, grad_dtype, momentum_dtype, nesterov):
    numel = tokens * 256
    grad = torch.randn(numel, dtype=grad_dtype, device="cuda")
    momentum = torch.randn(numel, dtype=momentum_dtype, device="cuda")
    want, want_momentum = ref.engram_sinkhorn_momentum_update(grad, momentum, 0.95, nesterov)
    with poisoned_allocations():
        got = E.engram_sinkhorn_momentum_update(grad, momentum, 0.95, nesterov)
    # float32 fma against its float64 emulation: equal but in rare double-rounding ties (one ulp)
    torch.testing.assert_close(got, want, rtol=2**-23, atol=0)
    torch.testing.assert_close(momentum.float(), want_momentum.float(), rtol=2**-7 if momentum_dtype == BF16 else 2**-23, atol=0)
    assert (got == want).float().mean().item() > 0.999


@pytest.mark.parametrize("rows", TOKENS)
@pytest.mark.parametrize("head_dim", [256, 5120])
def test_sinkhorn_step_reduce_finalize_match_reference(seed, rows, head_dim):
    matrix = torch.randn(rows, head_dim, device="cuda")
    row_scale, col_scale = torch.rand(rows, device="cuda") + 0.5, torch.rand(head_dim, device="cuda") + 0.5
    want_norm, want_scale, want_sumsq = ref.engram_sinkhorn_step(matrix, row_scale, col_scale, 1e-20)
    want_out = ref.engram_sinkhorn_finalize(matrix, row_scale, col_scale, 1e-20, head_dim**0.5)
    with poisoned_allocations():
        out = E.engram_sinkhorn_finalize(matrix, row_scale, col_scale, 1e-20, head_dim**0.5)
        norm, partial = E.engram_sinkhorn_step(matrix, row_scale, col_scale, 1e-20)
        col_sumsq = torch.empty(head_dim, device="cuda")
    torch.testing.assert_close(out, want_out, **ROW_SUM_TOL)
    torch.testing.assert_close(norm, want_norm, **ROW_SUM_TOL)
    torch.testing.assert_close(row_scale, want_scale, **ROW_SUM_TOL)
    assert partial.shape == (3 * sms(), head_dim)
    E.engram_sinkhorn_step_reduce(partial, col_sumsq)
    torch.testing.assert_close(col_sumsq, want_sumsq, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(col_sumsq, ref.engram_sinkhorn_step_reduce(partial), rtol=3e-6, atol=1e-5)


def in_row_order(partial):
    """The partials added one row at a time from 0.0: the order the op promises (and TileKernels keeps)."""
    acc = torch.zeros(partial.shape[1], device=partial.device)
    for row in partial:
        acc += row
    return acc


# (partials, head_dim, offset): the op takes any count of either; an offset of one element puts the views' first
# element off a 16-byte boundary (4-byte copies), as does a head_dim not a multiple of 4
@pytest.mark.parametrize(
    "partials, head_dim, offset",
    [(1, 5120, 0), (3, 256, 0), (127, 5120, 0), (396, 5120, 0), (444, 8192, 0), (4097, 256, 0), (396, 5120, 1),
     (3, 5121, 0), (127, 3, 0), (201, 260, 1), (0, 256, 0)],
)  # fmt: skip
def test_sinkhorn_step_reduce_adds_in_row_order(seed, partials, head_dim, offset):
    flat = torch.rand(partials * head_dim + offset, device="cuda")
    partial = flat[offset:].view(partials, head_dim)
    col_sumsq = torch.full((head_dim + offset,), float("nan"), device="cuda")[offset:]
    E.engram_sinkhorn_step_reduce(partial, col_sumsq)
    assert torch.equal(col_sumsq.view(torch.int32), in_row_order(partial).view(torch.int32))


def sinkhorn(matrix, iterations, ops):
    """Alternate row normalisation (the ops' step) and column scaling to columns of norm sqrt(rows / head_dim)."""
    rows, head_dim = matrix.shape
    row_scale, col_scale = torch.ones(rows, device="cuda"), torch.ones(head_dim, device="cuda")
    target = (rows / head_dim) ** 0.5
    for _ in range(iterations):
        if ops:
            _, partial = E.engram_sinkhorn_step(matrix, row_scale, col_scale, 1e-20)
            col_sumsq = torch.empty(head_dim, device="cuda")
            E.engram_sinkhorn_step_reduce(partial, col_sumsq)
        else:
            _, row_scale, col_sumsq = ref.engram_sinkhorn_step(matrix, row_scale, col_scale, 1e-20)
        col_scale = col_scale * target / (col_sumsq.sqrt() + 1e-20)
    finalize = E.engram_sinkhorn_finalize if ops else ref.engram_sinkhorn_finalize
    return finalize(matrix, row_scale, col_scale, 1e-20, 1.0)


@pytest.mark.parametrize("head_dim", [256, 5120])
def test_sinkhorn_iteration_converges_to_the_reference(seed, head_dim):
    matrix = torch.randn(4097, head_dim, device="cuda").abs() + 0.05
    ours, theirs = sinkhorn(matrix, 60, ops=True), sinkhorn(matrix, 60, ops=False)
    torch.testing.assert_close(ours.norm(dim=1), torch.ones(4097, device="cuda"), rtol=1e-5, atol=0)
    col_norms = ours.norm(dim=0)
    assert (col_norms.max() / col_norms.min()).item() < 1.001, "not converged"
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)


# ---- the autograd gate


def test_autograd_gate_trains_like_the_reference_layer():
    model = dict(hc=4, hidden=256, dtype=BF16, device="cuda")
    device = model.pop("device")
    ours = train(engram_gate, steps=8, device=device, **model)
    theirs = train(reference_gate, steps=8, device=device, **model)
    assert ours[-1] < 0.8 * ours[0], ours
    assert ours == pytest.approx(theirs, rel=1e-3), (ours, theirs)


def test_autograd_gate_matches_reference_gradients(seed):
    x, kv, w, mask = gate_data(127, 4, 7168, masked=True)
    wh = torch.randn(4, 7168, dtype=BF16, device="cuda").requires_grad_()
    we = torch.randn(4, 7168, dtype=BF16, device="cuda").requires_grad_()
    go = torch.randn(127, 4, 7168, dtype=BF16, device="cuda")
    leaves = (x.requires_grad_(), kv.view(127, -1).requires_grad_())
    engram_gate(*leaves, wh, we, 1e-6, 1e-20, mask).backward(go)
    grads = [t.grad.clone() for t in (*leaves, wh, we)]
    for t in (*leaves, wh, we):
        t.grad = None
    reference_gate(*leaves, wh, we, 1e-6, 1e-20, mask).backward(go)
    for ours, t in zip(grads, (*leaves, wh, we)):
        scale = t.grad.float().abs().max().item()
        torch.testing.assert_close(ours.float(), t.grad.float(), rtol=2**-6, atol=2**-6 * scale)
    assert tkaot.engram.engram_gate_fwd is E.engram_gate_fwd
