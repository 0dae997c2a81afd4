"""tkaot.engram and tkaot.modeling.engram on CPU: the references against independent formulations (the backward
against autograd of the forward), gradcheck and a few training steps of the autograd gate on its reference path, and
every op's input checks (meta tensors on a fake device, a recorder for the launcher: bad input raises before any
launch, good input launches exactly the declared variant)."""

from __future__ import annotations

import pytest
import torch

import tkaot
import tkaot.engram
from tests.helpers import record_launches, registry_holding
from tkaot._engram import device as engram_device
from tkaot.modeling.engram import EngramGateFn, engram_gate
from tkaot.reference import engram as ref

F64 = torch.float64


def hash_inputs(tokens=7, ngram=3, layers=2, tables=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-5, 2**31 - 1, (tokens, ngram), generator=g, dtype=torch.int32)
    mult = torch.randint(-(2**62), 2**62, (layers, ngram), generator=g, dtype=torch.int64)
    vocab = torch.randint(1, 200000, (layers, ngram - 1, tables), generator=g, dtype=torch.int32)
    offsets = torch.cat([torch.zeros(layers, 1, dtype=torch.int64), vocab.reshape(layers, -1).long().cumsum(1)[:, :-1]], 1).int()
    return ids, mult, vocab, offsets


def _wrap64(v: int) -> int:
    return (v + 2**63) % 2**64 - 2**63


@pytest.mark.parametrize("ngram, tables", [(2, 1), (3, 8), (5, 3)])
def test_hash_reference_matches_python_integers(ngram, tables):
    ids, mult, vocab, offsets = hash_inputs(ngram=ngram, tables=tables)
    mask = torch.tensor([i % 3 == 1 for i in range(ids.shape[0])])
    out = ref.engram_hash(ids, mult, vocab, offsets, mask)
    for layer in range(mult.shape[0]):
        for t in range(ids.shape[0]):
            h = 0
            for i in range(ngram):
                h ^= _wrap64(int(ids[t, i]) * int(mult[layer, i]))
                if i == 0:
                    continue
                for j in range(tables):
                    c = (i - 1) * tables + j
                    want = -1 if mask[t] else _wrap64(h % int(vocab[layer, i - 1, j]) + int(offsets[layer, c]))
                    assert int(out[layer, t, c]) == (want + 2**31) % 2**32 - 2**31, (layer, t, c)


def gate_inputs(tokens=5, hc=4, hidden=16, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hc, hidden, generator=g, dtype=F64).to(dtype)
    kv = torch.randn(tokens, hc + 1, hidden, generator=g, dtype=F64).to(dtype)
    wh = (1 + 0.3 * torch.randn(hc, hidden, generator=g, dtype=F64)).to(dtype)
    we = (1 + 0.3 * torch.randn(hc, hidden, generator=g, dtype=F64)).to(dtype)
    go = torch.randn(tokens, hc, hidden, generator=g, dtype=F64).to(dtype)
    return x, kv, wh, we, go


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("clamp", [1e-6, 0.3])  # 0.3 clamps some tokens: their gate gets no gradient
def test_gate_backward_reference_is_autograd_of_the_forward(masked, clamp):
    x, kv, wh, we, go = gate_inputs()
    mask = torch.tensor([False, True, False, False, True]) if masked else None
    leaves = [t.clone().requires_grad_(True) for t in (x, kv, wh, we)]
    fused = leaves[2] * leaves[3]
    out, *_ = ref.engram_gate_fwd(leaves[0], leaves[1], fused, 1e-6, clamp, save_for_backward=True, image_token_mask=mask)
    (out * go).sum().backward()
    _, dot, gate, rx, rk = ref.engram_gate_fwd(x, kv, ref.fused_weight(wh, we), 1e-6, clamp, image_token_mask=mask)
    grad_x, grad_kv, partial = ref.engram_gate_bwd(go, x, kv, wh * we, dot, gate, rx, rk, clamp, mask, num_partials=3)
    gwh, gwe = ref.grad_w_reduce(partial, wh, we, torch.zeros_like(wh), torch.zeros_like(we))
    for ours, theirs in ((grad_x, leaves[0].grad), (grad_kv, leaves[1].grad), (gwh, leaves[2].grad), (gwe, leaves[3].grad)):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    assert partial.shape == (3, 4, 16)
    single = ref.engram_gate_bwd(go, x, kv, wh * we, dot, gate, rx, rk, clamp, mask)[2]
    torch.testing.assert_close(partial.sum(0, keepdim=True), single)
    assert [len(r) for r in ref.token_ranges(5, 3)] == [2, 2, 1] and [len(r) for r in ref.token_ranges(2, 4)] == [1, 1, 0, 0]


@pytest.mark.parametrize("masked", [False, True])
def test_modeling_gate_passes_gradcheck_on_its_reference_path(masked):
    x, kv, wh, we, _ = gate_inputs(tokens=3, hc=2, hidden=8)
    mask = torch.tensor([False, True, False]) if masked else None
    leaves = (x.requires_grad_(), kv.reshape(3, -1).requires_grad_(), wh.requires_grad_(), we.requires_grad_())
    assert torch.autograd.gradcheck(lambda a, b, c, d: engram_gate(a, b, c, d, 1e-6, 1e-6, mask), leaves)


def test_modeling_gate_accumulates_into_main_grad():
    x, kv, wh, we, go = gate_inputs(tokens=4, hc=2, hidden=8)
    wh.main_grad = torch.ones_like(wh)
    leaves = (x.requires_grad_(), kv.reshape(4, -1).requires_grad_(), wh.requires_grad_(), we.requires_grad_())
    engram_gate(*leaves, 1e-6, 1e-6, None).backward(go)
    assert wh.grad is None and we.grad is not None
    wh2 = wh.detach().clone().requires_grad_()
    engram_gate(x, leaves[1], wh2, we, 1e-6, 1e-6, None).backward(go)
    torch.testing.assert_close(wh.main_grad, 1 + wh2.grad)


class TinyEngramModel(torch.nn.Module):
    """Token embeddings as the residual streams, an Engram table as kv, the gate, then a linear read-out; the gate's
    inputs and weights in `dtype` (bf16 for the kernels)."""

    def __init__(self, gate, vocab=11, hc=2, hidden=16, classes=3, dtype=torch.float32, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.hc, self.hidden, self.gate, self.dtype = hc, hidden, gate, dtype
        self.streams = torch.nn.Parameter(torch.randn(vocab, hc * hidden, generator=g) * 0.5)
        self.table = torch.nn.Parameter(torch.randn(vocab, (hc + 1) * hidden, generator=g) * 0.5)
        self.weight_hidden = torch.nn.Parameter((1 + 0.1 * torch.randn(hc, hidden, generator=g)).to(dtype))
        self.weight_embed = torch.nn.Parameter((1 + 0.1 * torch.randn(hc, hidden, generator=g)).to(dtype))
        self.head = torch.nn.Parameter(torch.randn(hc * hidden, classes, generator=g) * 0.1)

    def forward(self, tokens):
        x = self.streams[tokens].view(-1, self.hc, self.hidden).to(self.dtype)
        out = self.gate(x, self.table[tokens].to(self.dtype), self.weight_hidden, self.weight_embed, 1e-6, 1e-6, None)
        return out.reshape(len(tokens), -1).float() @ self.head


def reference_gate(hidden_states, kv, weight_hidden, weight_embed, clamp_value, eps, image_token_mask):
    """The same layer by plain autograd through the reference forward."""
    hc, hidden = hidden_states.shape[-2:]
    fused = weight_hidden.float() * weight_embed.float()
    return ref.engram_gate_fwd(hidden_states, kv.view(-1, hc + 1, hidden), fused, eps, clamp_value, False, image_token_mask)[0]


def train(gate, steps=6, device="cpu", **model):
    """The losses of `steps` SGD steps of TinyEngramModel(gate, **model) on a fixed batch."""
    torch.manual_seed(0)
    net = TinyEngramModel(gate, **model).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 11, (64,), generator=g).to(device)
    labels = tokens % 3
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(net(tokens), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_modeling_gate_trains_a_tiny_model():
    ours, theirs = train(engram_gate), train(reference_gate)
    assert ours[-1] < 0.7 * ours[0], ours
    assert ours == pytest.approx(theirs, rel=1e-5), (ours, theirs)


def test_sinkhorn_references_iterate_to_a_balanced_matrix():
    g = torch.Generator().manual_seed(0)
    matrix = torch.randn(64, 256, generator=g).abs() + 0.1
    row_scale, col_scale = torch.ones(64), torch.ones(256)
    for _ in range(40):
        row_norm, row_scale, col_sumsq = ref.engram_sinkhorn_step(matrix, row_scale, col_scale, 1e-20)
        col_scale = col_scale / (col_sumsq.sqrt() / (64 / 256) ** 0.5 + 1e-20)
    out = ref.engram_sinkhorn_finalize(matrix, row_scale, col_scale, 1e-20, 2.0)
    torch.testing.assert_close(out.norm(dim=1), torch.full((64,), 2.0))
    col_norms = out.norm(dim=0)
    assert (col_norms.max() / col_norms.min()).item() < 1.01
    row_by_row = torch.stack([(row_scale[i] * matrix[i] * col_scale).norm() for i in range(64)])
    torch.testing.assert_close(ref.engram_sinkhorn_step(matrix, row_scale, col_scale, 1e-20)[0], row_by_row)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_reference_is_the_momentum_formula(nesterov):
    g = torch.Generator().manual_seed(0)
    grad, momentum = torch.randn(256, generator=g), torch.randn(256, generator=g).bfloat16()
    out, new = ref.engram_sinkhorn_momentum_update(grad, momentum, 0.95, nesterov)
    m = momentum.double() * 0.95 + 0.05 * grad.double()
    want = grad.double() * 0.05 + 0.95 * m if nesterov else m
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)
    assert new.dtype == torch.bfloat16 and torch.equal(new, m.float().bfloat16())


# ---- input checks: meta tensors on a fake device 0, launches recorded


@pytest.fixture
def launches(monkeypatch):
    monkeypatch.setattr(engram_device, "sm_count", lambda device: 132)
    modules = {__import__(getattr(tkaot.engram, name).__module__, fromlist=["_"]) for name in tkaot.engram.__all__}
    return record_launches(monkeypatch, modules)


def M(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


BF16, F32, I32, I64, BOOL = torch.bfloat16, torch.float32, torch.int32, torch.int64, torch.bool
E = tkaot.engram


def _gate(t=4097, hc=4, h=7168):
    return M(t, hc, h), M(t, hc + 1, h), M(hc, h, dtype=F32)


def _saved(t=4097, hc=4):
    return tuple(M(t, hc, dtype=F32) for _ in range(4))


VALID = [
    (lambda: E.engram_hash(M(127, 3, dtype=I32), M(2, 3, dtype=I64), M(2, 2, 8, dtype=I32), M(2, 16, dtype=I32)),
     [("engram_hash", "max_ngram_size=3")]),
    (lambda: E.engram_hash(M(3, 2, dtype=I32), M(1, 2, dtype=I64), M(1, 1, 4, dtype=I32), M(1, 4, dtype=I32), M(3, dtype=BOOL)),
     [("engram_hash", "max_ngram_size=2")]),
    (lambda: E.fused_weight(M(4, 7168), M(4, 7168)), [("engram_fused_weight", "dtype=bfloat16")]),
    (lambda: E.engram_gate_fwd(*_gate(), 1e-20, 1e-6), [("engram_gate_fwd", "tiling=c1584s2x28w")]),
    (lambda: E.engram_gate_fwd(*_gate(1, 2, 512), 1e-20, 1e-6, False, M(1, dtype=BOOL), True), [("engram_gate_fwd", "tiling=c2048d28w4")]),
    # one tiling at every hidden: fewer groups than it keeps on chip, more (7424, the plain loop), the most
    (lambda: E.engram_gate_bwd(M(3, 4, 4096), *_gate(3, 4, 4096), *_saved(3), 1e-6), [("engram_gate_bwd", "tiling=k28d14v16xw")]),
    (lambda: E.engram_gate_bwd(M(0, 4, 256), *_gate(0, 4, 256), *_saved(0), 1e-6, M(0, dtype=BOOL)),
     [("engram_gate_bwd", "tiling=k28d14v16xw")]),
    (lambda: E.engram_gate_bwd(M(3, 4, 7424), *_gate(3, 4, 7424), *_saved(3), 1e-6), [("engram_gate_bwd", "tiling=k28d14v16xw")]),
    (lambda: E.engram_gate_bwd(M(2, 4, 16384), *_gate(2, 4, 16384), *_saved(2), 1e-6, M(2, dtype=BOOL)),
     [("engram_gate_bwd", "tiling=k28d14v16xw")]),
    (lambda: E.grad_w_reduce(M(132, 4, 7168, dtype=F32), M(4, 7168), M(4, 7168), M(4, 7168, dtype=F32), M(4, 7168, dtype=F32)),
     [("engram_grad_w_reduce", "dtype=bfloat16,tiling=t32r44d")]),
    # numel not a multiple of 4 and more partials than the 148 rows staged at once: the same kernel (its 4-byte path)
    (lambda: E.grad_w_reduce(M(300, 3, 333, dtype=F32), M(3, 333), M(3, 333), M(3, 333, dtype=F32), M(3, 333, dtype=F32)),
     [("engram_grad_w_reduce", "dtype=bfloat16,tiling=t32r44d")]),
    (lambda: E.engram_sinkhorn_momentum_update(M(1001 * 256, dtype=F32), M(1001 * 256), 0.95),
     [("engram_sinkhorn_momentum", "grad_dtype=float32,momentum_dtype=bfloat16,tiling=t128v4x1")]),
    (lambda: E.engram_sinkhorn_step(M(1001, 5120, dtype=F32), M(1001, dtype=F32), M(5120, dtype=F32), 1e-20),
     [("engram_sinkhorn_step", "head_dim=5120")]),
    (lambda: E.engram_sinkhorn_step_reduce(M(396, 256, dtype=F32), M(256, dtype=F32)),
     [("engram_sinkhorn_step_reduce", "dtype=float32,tiling=t24r200d")]),
    (lambda: E.engram_sinkhorn_finalize(M(3, 256, dtype=F32), M(3, dtype=F32), M(256, dtype=F32), 1e-20, 16.0),
     [("engram_sinkhorn_finalize", "head_dim=256")]),
]  # fmt: skip


@pytest.mark.parametrize("call, expected", VALID)
def test_valid_calls_launch_their_declared_variant(launches, call, expected):
    call()
    assert launches == expected


def test_outputs_have_tile_kernels_shapes(launches):
    out, dot, gate, rx, rk = E.engram_gate_fwd(*_gate(5, 4, 512), 1e-20, 1e-6)
    assert out.shape == (5, 4, 512) and all(t.shape == (5, 4) and t.dtype == F32 for t in (dot, gate, rx, rk))
    x = M(5, 4, 512)
    assert E.engram_gate_fwd(x, *_gate(5, 4, 512)[1:], 1e-20, 1e-6, False, None, True) == (x, None, None, None, None)
    gx, gkv, gw = E.engram_gate_bwd(M(5, 4, 512), *_gate(5, 4, 512), *_saved(5), 1e-6)
    assert gx.shape == (5, 4, 512) and gkv.shape == (5, 5, 512) and gw.shape == (132, 4, 512) and gw.dtype == F32
    norm, partial = E.engram_sinkhorn_step(M(7, 256, dtype=F32), M(7, dtype=F32), M(256, dtype=F32), 1e-20)
    assert norm.shape == (7,) and partial.shape == (396, 256)
    assert E.engram_hash(M(9, 3, dtype=I32), M(2, 3, dtype=I64), M(2, 2, 8, dtype=I32), M(2, 16, dtype=I32)).shape == (2, 9, 16)


def _hash(ids=(7, 3, I32), mult=(2, 3, I64), vocab=(2, 2, 8, I32), offsets=(2, 16, I32), mask=None):
    """engram_hash on meta tensors of the given (*shape, dtype)."""

    def make(*shape_and_dtype):
        return M(*shape_and_dtype[:-1], dtype=shape_and_dtype[-1])

    return E.engram_hash(make(*ids), make(*mult), make(*vocab), make(*offsets), None if mask is None else make(*mask))


REFUSED = [
    (lambda: _hash(ids=(7, 3, I64)), "ngram_token_ids must be torch.int32"),
    (lambda: _hash(mult=(2, 3, I32)), "multipliers must be torch.int64"),
    (lambda: _hash(vocab=(2, 3, 8, I32)), "vocab_sizes must be of shape"),
    (lambda: _hash(vocab=(2, 2, 8, I64)), "vocab_sizes must be torch.int32"),
    (lambda: _hash(offsets=(2, 15, I32)), "offsets must be of shape"),
    (lambda: _hash(mult=(3, 3, I64)), "vocab_sizes must be of shape"),
    (lambda: _hash(ids=(7, 9, I32), mult=(2, 9, I64), vocab=(2, 8, 8, I32), offsets=(2, 64, I32)), "of 2 to 8 n-gram"),
    (lambda: _hash(mask=(7, I32)), "image_token_mask must be torch.bool"),
    (lambda: _hash(mask=(8, BOOL)), "image_token_mask must be of shape"),
    (lambda: E.fused_weight(M(4, 7168), M(4, 7168, dtype=F32)), "weight_embed must be torch.bfloat16"),
    (lambda: E.fused_weight(M(4, 7168), M(4, 4096)), "weight_embed must be of shape"),
    (lambda: E.engram_gate_fwd(M(5, 4, 7168, dtype=F32), *_gate(5)[1:], 1e-20, 1e-6), "hidden_states must be torch.bfloat16"),
    (lambda: E.engram_gate_fwd(*_gate(5, 4, 7000), 1e-20, 1e-6), "multiple of 256"),
    (lambda: E.engram_gate_fwd(*_gate(5, 4, 16640), 1e-20, 1e-6), "multiple of 256"),
    (lambda: E.engram_gate_fwd(M(5, 4, 512), M(5, 4, 512), M(4, 512, dtype=F32), 1e-20, 1e-6), "kv must be of shape"),
    (lambda: E.engram_gate_fwd(*_gate(5)[:2], M(4, 7168), 1e-20, 1e-6), "weight_fused must be torch.float32"),
    (lambda: E.engram_gate_fwd(*_gate(5)[:2], M(2, 7168, dtype=F32), 1e-20, 1e-6), "weight_fused must be of shape"),
    (lambda: E.engram_gate_fwd(*_gate(5), 1e-20, 1e-6, True, None, True), "inplace=True overwrites hidden_states"),
    (lambda: E.engram_gate_fwd(*_gate(5), 1e-20, 1e-6, False, M(6, dtype=BOOL)), "image_token_mask must be of shape"),
    (lambda: E.engram_gate_fwd(*_gate(5), 1e-20, 1e-6, False, M(5, dtype=torch.uint8)), "image_token_mask must be torch.bool"),
    (lambda: E.engram_gate_fwd(M(5, 4, 7168).transpose(0, 1), *_gate(4)[1:], 1e-20, 1e-6), "must be contiguous"),
    (lambda: E.engram_gate_fwd(torch.empty(5, 4, 512, dtype=BF16), *_gate(5, 4, 512)[1:], 1e-20, 1e-6), "must be a CUDA tensor"),
    (lambda: E.engram_gate_fwd([1.0], *_gate(5)[1:], 1e-20, 1e-6), "must be a torch.Tensor"),
    (lambda: E.engram_gate_bwd(M(3, 2, 512), *_gate(3, 2, 512), *_saved(3, 2), 1e-6), "of 4 heads"),
    (lambda: E.engram_gate_bwd(M(3, 4, 512), *_gate(3, 4, 512), *_saved(4), 1e-6), "dot must be of shape"),
    (lambda: E.engram_gate_bwd(M(3, 4, 512), *_gate(3, 4, 512), *_saved(3)[:3], M(3, 4), 1e-6), "rstd_k must be torch.float32"),
    (lambda: E.engram_gate_bwd(M(3, 4, 512), *_gate(3, 4, 512), *_saved(3), 1e-6, M(2, dtype=BOOL)), "image_token_mask must be of shape"),
    (lambda: E.grad_w_reduce(M(132, 4, 512, dtype=F32), M(4, 512), M(4, 512), M(4, 512), M(4, 512, dtype=F32)),
     "grad_weight_hidden must be torch.float32"),
    (lambda: E.grad_w_reduce(M(132, 4, 512, dtype=F32), M(4, 256), M(4, 512), M(4, 512, dtype=F32), M(4, 512, dtype=F32)),
     "weight_hidden must be of shape"),
    (lambda: E.engram_sinkhorn_momentum_update(M(256, dtype=torch.float16), M(256), 0.95), "grad must be bfloat16 or float32"),
    (lambda: E.engram_sinkhorn_momentum_update(M(256, dtype=F32), M(512), 0.95), "of 256 elements like grad"),
    (lambda: E.engram_sinkhorn_momentum_update(M(260, dtype=F32), M(260), 0.95), "multiple of 8"),
    (lambda: E.engram_sinkhorn_step(M(9, 200, dtype=F32), M(9, dtype=F32), M(200, dtype=F32), 1e-20), "head_dim a multiple of 256"),
    (lambda: E.engram_sinkhorn_step(M(9, 256, dtype=F32), M(8, dtype=F32), M(256, dtype=F32), 1e-20), "row_scale must be of shape"),
    (lambda: E.engram_sinkhorn_step(M(9, 256, dtype=F32), M(9, dtype=F32), M(256), 1e-20), "col_scale must be torch.float32"),
    (lambda: E.engram_sinkhorn_step_reduce(M(396, 256, dtype=F32), M(512, dtype=F32)), "col_sumsq must be of shape"),
    (lambda: E.engram_sinkhorn_finalize(M(9, 256, dtype=F32), M(9, dtype=F32), M(256, dtype=F32), 1e-20, 1.0, M(9, 512, dtype=F32)),
     "out must be of shape"),
]  # fmt: skip


@pytest.mark.parametrize("call, match", REFUSED)
def test_bad_input_raises_before_any_launch(launches, call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
    assert not launches


DECODE, STREAMING = "tiling=c2048d28w4", "tiling=c1584s2x28w"


@pytest.mark.parametrize(
    "tokens, hidden, save, expected",
    [
        (1, 7168, False, DECODE), (16, 7168, False, DECODE), (17, 7168, False, STREAMING), (128, 7168, False, STREAMING),
        (1, 256, False, DECODE), (1, 7424, False, STREAMING), (16, 16384, False, STREAMING),
        (1, 7168, True, STREAMING), (16, 512, True, STREAMING),  # the decode form was timed on the inference path only
    ],
)  # fmt: skip
def test_gate_forward_takes_the_decode_form_for_few_tokens_it_serves(launches, tokens, hidden, save, expected):
    E.engram_gate_fwd(*_gate(tokens, 4, hidden), 1e-20, 1e-6, save)
    assert launches == [("engram_gate_fwd", expected)]


@pytest.mark.parametrize("decode_built", [False, True])
def test_gate_forward_without_the_decode_variant_launches_the_streaming_one(monkeypatch, decode_built):
    """A set built without the decode variant (a custom one, or one from before it shipped): its calls launch the
    streaming variant, no error and no warning; later calls take the cached launcher."""
    import warnings

    from tkaot._engram import gate

    looked_up, launched = registry_holding(monkeypatch, gate, gate._FWD, {STREAMING, DECODE} if decode_built else {STREAMING})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            E.engram_gate_fwd(*_gate(1, 4, 7168), 1e-20, 1e-6, False)
    served = DECODE if decode_built else STREAMING
    assert launched == [served, served]
    assert looked_up == ([DECODE] if decode_built else [DECODE, STREAMING])


def test_modeling_on_cuda_tensors_runs_the_kernels(launches, monkeypatch):
    """The autograd gate's CUDA path calls tkaot.engram's ops (the kernels): meta tensors stand in for CUDA ones."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: self.device.type in ("cuda", "meta")))
    x = M(6, 4, 512).requires_grad_()
    kv = M(6, 5 * 512).requires_grad_()
    wh, we = M(4, 512).requires_grad_(), M(4, 512).requires_grad_()
    out = EngramGateFn.apply(x, kv, wh, we, 1e-6, 1e-20, None)
    assert out.shape == x.shape
    assert [k for k, _ in launches] == ["engram_fused_weight", "engram_gate_fwd"]
    out.backward(M(6, 4, 512))
    assert [k for k, _ in launches][2:] == ["engram_gate_bwd", "engram_grad_w_reduce"]
    assert x.grad.shape == x.shape and kv.grad.shape == kv.shape and wh.grad.dtype == BF16


def test_modeling_keeps_tile_kernels_call_shape():
    """tile_kernels.modeling.engram: EngramGateFn.apply(hidden_states, kv, weight_hidden, weight_embed, clamp_value, eps,
    image_token_mask), engram_gate its apply."""
    import inspect

    import tkaot.modeling

    params = list(inspect.signature(EngramGateFn.forward).parameters)
    assert params == ["ctx", "hidden_states", "kv", "weight_hidden", "weight_embed", "clamp_value", "eps", "image_token_mask"]
    assert tkaot.modeling.engram.engram_gate is engram_gate and engram_gate == EngramGateFn.apply


def test_gate_forward_tiling_is_the_weights_ahead_form():
    pytest.importorskip("tilelang")
    from kernels_src.engram.gate_fwd import parse_tiling
    from tkaot._engram.kernels import GATE_FWD_TILINGS

    assert parse_tiling(GATE_FWD_TILINGS["default"]) == (1584, 2, 28)
    for old in ("c1584s2x28", "c1584s2x28ww", "c0s2x28w", "c1584s1x28w", "c1584s2x65w"):
        with pytest.raises(ValueError):
            parse_tiling(old)


def test_gate_forward_decode_tiling_is_four_warps_over_the_row_it_serves():
    pytest.importorskip("tilelang")
    from kernels_src.engram.gate_fwd import CHUNK, parse_decode
    from tkaot._engram.kernels import GATE_FWD_DECODE_HIDDEN, GATE_FWD_TILINGS

    ctas, slice_, warps = parse_decode(GATE_FWD_TILINGS["decode"])
    assert (ctas, slice_, warps) == (2048, 28, 4) and slice_ * CHUNK == GATE_FWD_DECODE_HIDDEN
    assert parse_decode(GATE_FWD_TILINGS["default"]) is None and parse_decode("c2048d28w4o") is None  # "o": not shipped
    for bad in ("c2048d28w2", "c2048d28w3", "c0d28w4", "c2048d68w4"):  # the three sums need 3 warps; 28 % 3; 64 chunks at most
        with pytest.raises(ValueError):
            parse_decode(bad)


def test_gate_forward_decode_form_lowers_to_block_barriers_and_the_grid_runs():
    """The decode form: 4 warps a CTA with their own barriers, the runs read from gridDim.y."""
    pytest.importorskip("tilelang")
    from build_tools.compile import lower
    from build_tools.ops import Variant
    from tkaot._engram.kernels import GATE_FWD_TILINGS

    source = str(lower(Variant.make("engram_gate_fwd", {"tiling": GATE_FWD_TILINGS["decode"]}), "sm90")[2])
    assert "__launch_bounds__(128, 1)" in source and "__syncthreads" in source
    assert "return (int)gridDim.y;" in source and "tkaot_grid_y()" in source


def test_gate_forward_lowers_to_the_lean_body_with_weights_an_item_ahead():
    """The shipped forward: one warp, no barrier; pass 1's whole items (x parked: n <= 6 at slice 28) and the rest
    take separate bodies; every weight read fills the next item's registers, ahead of the staging and the wait."""
    pytest.importorskip("tilelang")
    from build_tools.compile import lower
    from build_tools.ops import Variant
    from tkaot._engram.kernels import GATE_FWD_TILINGS

    source = str(lower(Variant.make("engram_gate_fwd", {"tiling": GATE_FWD_TILINGS["default"]}), "sm90")[2])
    assert "__launch_bounds__(32, 1)" in source and "__syncthreads" not in source
    assert source.count("+ 4) <= (hidden >> 8)) && (n <= 6)") == 1 and source.count("+ 4) <= (hidden >> 8)) && (m <= 6)") == 1
    reads = [line for line in source.splitlines() if "weight_fused +" in line]
    assert len(reads) == 3  # the first item's, then one in each pass-1 body
    assert all(line.lstrip().startswith(("condval = ", "*(float4*)(w_next + ")) for line in reads)
    bodies = source.split("= w_next[")[1:]  # each pass-1 body, from its copy of the weights read an item before
    assert len(bodies) == 2
    for body in bodies:
        read, commit, wait = body.index("weight_fused +"), body.index("tl::cp_async_commit()"), body.index("tl::cp_async_wait<1>()")
        assert read < commit < wait


def test_gate_backward_and_reduction_tilings_are_the_shipped_forms():
    pytest.importorskip("tilelang")
    from kernels_src.engram import gate_bwd
    from kernels_src.engram.column_sums import parse_tiling
    from tkaot._engram.kernels import GATE_BWD_TILINGS, GRAD_W_REDUCE_TILINGS, SINKHORN_STEP_REDUCE_TILINGS

    assert gate_bwd.parse_tiling(GATE_BWD_TILINGS["default"]) == (28, 14, 16)
    assert parse_tiling("engram_grad_w_reduce", GRAD_W_REDUCE_TILINGS["default"]) == (32, 44, True)
    assert parse_tiling("engram_sinkhorn_step_reduce", SINKHORN_STEP_REDUCE_TILINGS["default"]) == (24, 200, True)
    # the forms shipped before (k28d11v16: the weight kept in shared memory, k28d14c) and round 10's other letters are
    # gone; the next token's go needs depth - 1 <= ahead and 2 * depth <= keep + 1; ahead past keep; 2.5 KB x 36 +
    # 8 KB x 18 past the shared memory
    for bad in ("k28d11v16", "k28d14c", "k28d14v16x", "k28d14v16w", "k28d14v16xfw", "k28d14v16xfpw", "k28d14v12xw",
                "k28d15v16xw", "k28d14v28xw", "k36d18v20xw"):  # fmt: skip
        with pytest.raises(ValueError):
            gate_bwd.parse_tiling(bad)
    # one thread a column (shipped before); threads not a multiple of 8 or below 8; 148 rows x 128 threads x 16 bytes
    # past 227 KB, as are two buffers of 256 rows x 32 threads; no rows; round gradw24's "l" (now "s")
    for bad in ("t224r132", "t60r148s", "t4r16s", "t128r148s", "t32r256d", "t56r0s", "t56r148l"):
        with pytest.raises(ValueError):
            parse_tiling("engram_grad_w_reduce", bad)


def test_gate_backward_lowers_to_the_streamed_weight_and_next_go_form():
    """The shipped backward: the weight read by 16-byte cp.async into the ring (the first slots and each grad_x group's)
    and by the plain loop past the kept groups, never copied whole into shared memory; four barriers: a first token's
    two, the dL/dg exchange and the one before the grad_x pass stages the next token's go."""
    pytest.importorskip("tilelang")
    from build_tools.compile import lower
    from build_tools.ops import Variant
    from tkaot._engram.kernels import GATE_BWD_TILINGS

    source = str(lower(Variant.make("engram_gate_bwd", {"tiling": GATE_BWD_TILINGS["default"]}), "sm90")[2])
    assert "__launch_bounds__(256, 1)" in source and source.count("__syncthreads") == 4
    reads = [line.lstrip() for line in source.splitlines() if "weight_fused[" in line or "weight_fused +" in line]
    assert len(reads) == 3
    assert sum(line.startswith("tl::cp_async_gs<16>((&(((float*)w_smem)[") for line in reads) == 2


@pytest.mark.parametrize(
    "kernel, static, threads, tensors",
    [("engram_grad_w_reduce", {"dtype": "bfloat16"}, 32,
      ("grad_w_partial", "weight_hidden", "weight_embed", "grad_weight_hidden", "grad_weight_embed")),
     ("engram_sinkhorn_step_reduce", {"dtype": "float32"}, 24, ("col_sumsq_partial", "col_sumsq"))],
)  # fmt: skip
def test_reductions_lower_to_a_16_byte_path_and_a_4_byte_fallback(kernel, static, threads, tensors):
    """The staged reductions (kernels_src/engram/column_sums.py): 16-byte copies only where the column count is a
    multiple of 4, the thread's four columns lie inside it and every tensor starts on a 16-byte boundary (tested in the
    kernel); else 4-byte copies a column. Two buffers: the copy of a batch issued before the one before it is waited
    for (wait_group 1), the last waited for whole (0). No barrier: a thread reads back only its own copies."""
    pytest.importorskip("tilelang")
    from build_tools.compile import lower
    from build_tools.ops import Variant
    from tkaot._engram import kernels

    tilings = {"engram_grad_w_reduce": kernels.GRAD_W_REDUCE_TILINGS, "engram_sinkhorn_step_reduce": kernels.SINKHORN_STEP_REDUCE_TILINGS}
    source = str(lower(Variant.make(kernel, {**static, "tiling": tilings[kernel]["default"]}), "sm90")[2])
    assert f"__launch_bounds__({threads}, 1)" in source and "__syncthreads" not in source
    test = next(line for line in source.splitlines() if "tkaot_aligned16(" in line and "if (" in line)
    columns = "numel" if kernel == "engram_grad_w_reduce" else "head_dim"
    assert f"({columns} % 4) == 0" in test and f"+ 4) <= {columns}" in test
    for name in tensors:
        assert f"tkaot_aligned16((&({name}[0])))" in test
    # each path: the first batch's copies, then the next batch's in each of the two buffers' turns
    assert source.count("tl::cp_async_gs<16>(") == 3 and source.count("tl::cp_async_gs<4>(") == 3
    assert "cp_async_wait<1>" in source and "cp_async_wait<0>" in source
