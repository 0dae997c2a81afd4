"""norm_forward on a GPU against the pure-torch reference: every default hidden size, both dtypes,
weight / residual / rstd on and off, odd token counts, NaN-poisoned outputs, streams and graphs."""

import pytest
import torch

import tkaot
from tkaot import reference

pytestmark = pytest.mark.gpu

HIDDENS = [512, 1536, 2048, 4096, 5120, 7168, 8192]
TOKENS = [1, 3, 127, 4097, 65537]
# bf16 outputs may differ from the reference by one rounding step (rsqrt and summation order differ)
TOL = {torch.bfloat16: dict(rtol=2**-7, atol=2**-7), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def check(x, weight, residual, with_rstd, out_scale=1.0, eps=1e-6):
    ref_out, ref_rstd, ref_sum = reference.norm_forward(x, weight, eps, residual, out_scale, with_rstd=True)
    out = poisoned(x.shape, x.dtype)
    residual_out = poisoned(x.shape, x.dtype) if residual is not None else None
    got, rstd, norm_input = tkaot.quant.norm_forward(
        x, weight, eps, residual=residual, out_scale=out_scale, out=out, residual_out=residual_out, with_rstd=with_rstd
    )
    torch.cuda.synchronize()
    assert got is out
    assert not torch.isnan(got).any(), "unwritten output elements"
    torch.testing.assert_close(got, ref_out, **TOL[x.dtype])
    if residual is not None:
        assert norm_input is residual_out
        assert torch.equal(norm_input, ref_sum), "residual sum must be bit-exact"
    else:
        assert norm_input is x
    if with_rstd:
        assert rstd.shape == x.shape[:-1] and rstd.dtype == torch.float32
        torch.testing.assert_close(rstd, ref_rstd, rtol=1e-5, atol=0)
    else:
        assert rstd is None


@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("with_residual", [True, False])
def test_norm_forward_matches_reference(seed, hidden, dtype, with_weight, with_residual):
    for i, tokens in enumerate(TOKENS):
        if tokens == 65537 and hidden > 2048 and dtype == torch.float32 and with_residual:
            tokens = 16385  # keep the largest fp32 residual cases within a few hundred MB
        x = torch.randn(tokens, hidden, dtype=dtype, device="cuda") * 3
        weight = torch.randn(hidden, dtype=dtype, device="cuda") if with_weight else None
        residual = torch.randn(tokens, hidden, dtype=dtype, device="cuda") if with_residual else None
        check(x, weight, residual, with_rstd=i % 2 == 0, out_scale=1.0 if i % 3 else 0.5)


def test_batched_and_strided_inputs(seed):
    hidden = 7168
    base = torch.randn(3, 130, hidden + 64, dtype=torch.bfloat16, device="cuda")
    x = base[:, 1:128, :hidden]  # 3-D view with row stride hidden+64 and a batch stride
    weight = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn(3, 127, hidden, dtype=torch.bfloat16, device="cuda")
    check(x, weight, residual, with_rstd=True)
    check(x[1], weight, None, with_rstd=True)


def test_empty_input_launches_nothing():
    x = torch.empty(0, 4096, dtype=torch.bfloat16, device="cuda")
    out, rstd, _ = tkaot.quant.norm_forward(x, None, 1e-6, with_rstd=True)
    assert out.shape == (0, 4096) and rstd.shape == (0,)


def test_non_default_stream(seed):
    x = torch.randn(4097, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)  # keep the stream busy so a launch on the wrong stream would race
        out, _, _ = tkaot.quant.norm_forward(x, w, 1e-6)
        ref, _, _ = reference.norm_forward(x, w, 1e-6)
    stream.synchronize()
    torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])


def test_cuda_graph_capture_and_replay(seed):
    hidden = 7168
    x = torch.randn(16, hidden, dtype=torch.bfloat16, device="cuda")
    r = torch.randn(16, hidden, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    tkaot.quant.norm_forward(x, w, 1e-6, residual=r)  # load the module outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _, summed = tkaot.quant.norm_forward(x, w, 1e-6, residual=r)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        r.copy_(torch.randn_like(r))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _, ref_sum = reference.norm_forward(x, w, 1e-6, r)
        torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])
        assert torch.equal(summed, ref_sum)


def test_preload_loads_every_variant():
    assert tkaot.preload() >= 112


def test_missing_variant_on_gpu_raises_variant_not_built(monkeypatch):
    """640 is not in the default set: the generic tier serves it, unless TKAOT_STRICT asks for specialised variants."""
    from tkaot import _op
    from tkaot._quant import norm as _norm

    monkeypatch.setenv("TKAOT_STRICT", "1")
    monkeypatch.setattr(_norm._NORM, "cache", {})
    monkeypatch.setattr(_op, "_WARNED", set())
    x = torch.randn(4, 640, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(tkaot.VariantNotBuilt, match="hidden=640"):
        tkaot.quant.norm_forward(x, None, 1e-6)
