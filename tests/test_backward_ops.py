"""The backward ops on CPU: valid calls launch the variants their declarations key, with every runtime argument, and
return TileKernels' shapes and dtypes; invalid calls raise a clear ValueError / TypeError before any launch. Meta
tensors stand in for CUDA ones and a recorder for the launcher (tests/fuzz.py's `launches` fixture)."""

from __future__ import annotations

import pytest
import torch

import tkaot
from tests.fuzz import launches  # noqa: F401 (a fixture)
from tests.helpers import F32, FP8, I32, meta

BF16 = torch.bfloat16


def I64(*shape):
    return meta(*shape, dtype=torch.int64)


def BOOL(*shape):
    return meta(*shape, dtype=torch.bool)


# ---- valid calls


@pytest.mark.parametrize("tokens", [1, 3, 127, 4097])
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_norm_backward_launches_both_passes(launches, tokens, dtype):  # noqa: F811
    x, dy = meta(tokens, 7168, dtype=dtype), meta(tokens, 7168, dtype=dtype)
    name = "bfloat16" if dtype is BF16 else "float32"
    x_grad, w_grad = tkaot.quant.norm_backward(dy, x, meta(7168, dtype=dtype), F32(tokens), meta(tokens, 7168, dtype=dtype))
    # with a residual gradient: its own kernel where built (bf16), else rmsnorm_backward's generic tier (fp32)
    residual = "rmsnorm_backward_residual" if dtype is BF16 else "rmsnorm_backward"
    assert launches == [(residual, f"hidden=7168,dtype={name}"), ("weight_grad_reduce", f"dtype={name}")]
    assert x_grad.shape == x.shape and x_grad.dtype == dtype and w_grad.shape == (7168,) and w_grad.dtype == dtype
    launches.clear()
    given = F32(7168)
    _, w_grad = tkaot.quant.norm_backward(dy, x, meta(7168, dtype=dtype), F32(tokens), weight_grad=given)
    assert w_grad is given and launches[-1] == ("weight_grad_reduce", "dtype=float32")
    launches.clear()
    assert tkaot.quant.norm_backward(dy, x, None, F32(tokens))[1] is None
    # with neither a weight nor a residual gradient: its own kernel where built (bf16), else the generic tier (fp32)
    plain = "rmsnorm_backward_plain" if dtype is BF16 else "rmsnorm_backward"
    assert launches == [(plain, f"hidden=7168,dtype={name}")]


def test_norm_backward_of_no_tokens_launches_nothing(launches):  # noqa: F811
    x_grad, _ = tkaot.quant.norm_backward(meta(0, 512), meta(0, 512), None, F32(0))
    assert x_grad.shape == (0, 512) and not launches


@pytest.mark.parametrize("tokens", [1, 3, 127, 4097])
def test_swiglu_backward_returns_tile_kernels_fields(launches, tokens):  # noqa: F811
    x, dy = meta(tokens, 2 * 1536), meta(tokens, 1536)
    out = tkaot.quant.swiglu_backward(x, dy, "bf16")
    assert len(out) == 1 and out[0].shape == (tokens, 3072) and out[0].dtype == BF16
    out = tkaot.quant.swiglu_backward(x, dy, "fp32", I32(8), F32(tokens), 2.5, 7.0, do_recompute=True)
    assert [t.shape for t in out] == [(tokens, 3072), (tokens,), (tokens, 1536)] and out[0].dtype == torch.float32
    assert launches == [
        ("swiglu_backward", "x_dtype=bfloat16,grad_dtype=bfloat16,fmt=bf16,group=0,sf=none"),
        ("swiglu_backward", "x_dtype=bfloat16,grad_dtype=bfloat16,fmt=fp32,group=0,sf=none"),
    ]


@pytest.mark.parametrize("group, round_sf, packed, col", [(128, False, False, False), (128, True, True, True), (32, True, False, True)])
def test_swiglu_backward_and_per_token_cast_returns_tile_kernels_fields(launches, group, round_sf, packed, col):  # noqa: F811
    x = (FP8(127, 2 * 2048), F32(127, 2 * 2048 // group))
    out = tkaot.quant.swiglu_backward_and_per_token_cast(
        x, meta(127, 2048), "e4m3", group, topk_weights=F32(127), use_tma_aligned_col_major_sf=col, round_sf=round_sf,
        use_packed_ue8m0=packed,
    )  # fmt: skip
    x_grad, (q, sf), weight_grad = out
    groups = 4096 // group
    assert x_grad.dtype == BF16 and q.shape == (127, 4096) and q.dtype == torch.float8_e4m3fn and weight_grad.shape == (127,)
    assert sf.shape == ((127, -(-groups // 4)) if packed else (127, groups)) and sf.dtype == (torch.int32 if packed else torch.float32)
    assert sf.stride()[0] == (1 if col else sf.shape[1])
    kind = "ue8m0" if packed else "pow2" if round_sf else "fp32"
    assert launches == [("swiglu_backward", f"x_dtype=e4m3,grad_dtype=bfloat16,fmt=e4m3,group={group},sf={kind}")]


@pytest.mark.parametrize("tokens", [1, 3, 127, 4097])
def test_moe_topk_gate_backward_launches_its_default_tiling(launches, tokens):  # noqa: F811
    scores, idx = F32(tokens, 256), I64(tokens, 8)
    out = tkaot.moe.moe_topk_gate_backward(scores, idx, F32(tokens, 8), F32(tokens, 8), 2.5)
    assert out.shape == (tokens, 256) and out.dtype == torch.float32
    given = F32(tokens, 256)
    assert (
        tkaot.moe.moe_topk_gate_backward(scores, idx, F32(tokens, 8), F32(tokens, 8), 2.5, "sqrtsoftplus", BOOL(tokens), F32(1, 256), given)
        is given
    )
    assert launches == [("moe_topk_gate_backward", "tiling=scatter4")] * 2


# ---- refusals: each call is a valid one with one thing broken


def _norm(**kw):
    args = {"out_grad": meta(4, 512), "x": meta(4, 512), "weight": meta(512), "rstd": F32(4)}
    args.update(kw)
    return lambda: tkaot.quant.norm_backward(**args)


def _swiglu(**kw):
    args = {"x": meta(4, 1024), "act_x_grad": meta(4, 512), "fmt": "bf16"}
    args.update(kw)
    return lambda: tkaot.quant.swiglu_backward(**args)


def _cast(**kw):
    args = {"x": (FP8(4, 1024), F32(4, 8)), "act_x_grad": meta(4, 512), "fmt": "e4m3", "num_per_channels": 128}
    args.update(kw)
    return lambda: tkaot.quant.swiglu_backward_and_per_token_cast(**args)


def _gate(**kw):
    args = {
        "scores": F32(4, 64),
        "topk_idx": I64(4, 6),
        "topk_weights": F32(4, 6),
        "grad_topk_weights": F32(4, 6),
        "routed_scaling_factor": 1.0,
    }
    args.update(kw)
    return lambda: tkaot.moe.moe_topk_gate_backward(**args)


REFUSALS = [
    (_norm(x=meta(4, 512, dtype=torch.float32)), ValueError, "x must be torch.bfloat16 like out_grad"),
    (_norm(out_grad=meta(4, 500), x=meta(4, 500), weight=meta(500)), ValueError, "multiple of 32"),
    (_norm(out_grad=meta(4, 4, 512), x=meta(4, 4, 512)), ValueError, "2-D"),
    (_norm(rstd=F32(5)), ValueError, r"rstd must be of shape \(4,\)"),
    (_norm(rstd=meta(4)), ValueError, "rstd must be torch.float32"),
    (_norm(x=meta(4, 512, strides=(512, 2))), ValueError, "contiguous in its last dimension"),
    (_norm(weight=None, weight_grad=F32(512)), ValueError, "weight_grad needs weight"),
    (_norm(weight_grad=F32(256)), ValueError, r"weight_grad must be of shape \(512,\)"),
    (_norm(residual_out_grad=meta(4, 256)), ValueError, "residual_out_grad must be of shape"),
    (_norm(out_grad=torch.empty(4, 512, dtype=BF16)), ValueError, "a CUDA tensor"),
    (_norm(x="x"), TypeError, "x must be a torch.Tensor"),
    (_swiglu(fmt="e4m3"), ValueError, "fmt must be 'bf16' or 'fp32'"),
    (_swiglu(x=meta(4, 1000), act_x_grad=meta(4, 500)), ValueError, "multiple of 64"),
    (_swiglu(act_x_grad=meta(4, 512, dtype=torch.float32)), ValueError, "act_x_grad must be of x's dtype"),
    (_swiglu(act_x_grad=meta(5, 512)), ValueError, "act_x_grad must be of 4 rows"),
    (_swiglu(x=meta(4, 1024, strides=(2048, 1))), ValueError, "x must be contiguous"),
    (_swiglu(topk_weights=F32(5)), ValueError, r"topk_weights must be of shape \(4,\)"),
    (_swiglu(routed_scaling_factor=2.0), ValueError, "routed_scaling_factor must be None without topk_weights"),
    (_swiglu(topk_weights=F32(4), routed_scaling_factor="2"), TypeError, "routed_scaling_factor must be a float"),
    (_swiglu(psum_num_tokens_per_expert=F32(3)), ValueError, "psum_num_tokens_per_expert must be torch.int32"),
    (_swiglu(x=FP8(4, 1024)), ValueError, "fmt must be 'bf16' or 'fp32'|x must be"),
    (_cast(x=FP8(4, 1024)), TypeError, r"x must be a \(data, sf\) pair"),
    (_cast(num_per_channels=64), ValueError, "num_per_channels must be 32 or 128"),
    (_cast(x=(FP8(4, 1024), F32(4, 16))), ValueError, r"x\[1\] \(sf\) must be of shape \(4, 8\)"),
    (_cast(x=(meta(4, 1024), F32(4, 8))), ValueError, "x must be an"),
    (_cast(use_packed_ue8m0=True), ValueError, "use_packed_ue8m0 must be used with round_sf=True"),
    (_cast(x=(FP8(4, 1024), None)), ValueError, "an fp32 tensor for fmt='e4m3'"),
    (_cast(x=(FP8(4, 2 * 320), F32(4, 5)), act_x_grad=meta(4, 320)), ValueError, "multiple of num_per_channels"),
    (_gate(scoring_func="softmax"), ValueError, "scoring_func must be 'sqrtsoftplus'"),
    (_gate(scores=F32(4, 600)), ValueError, "of 1 to 512 experts"),
    (_gate(topk_idx=meta(4, 6, dtype=torch.int32)), ValueError, "topk_idx must be torch.int64"),
    (_gate(topk_weights=F32(4, 5)), ValueError, "topk_weights must be of shape"),
    (_gate(topk_idx=I64(4, 40), topk_weights=F32(4, 40), grad_topk_weights=F32(4, 40), scores=F32(4, 64)), ValueError, "at most"),
    (_gate(mask=BOOL(4)), ValueError, "mask and grad_scores_sum come together"),
    (_gate(grad_scores_sum=F32(2, 64)), ValueError, "grad_scores_sum and mask come together"),
    (_gate(mask=BOOL(4), grad_scores_sum=F32(3, 64)), ValueError, "row count dividing num_tokens"),
    (_gate(out=F32(4, 32)), ValueError, "out must be of shape"),
    (_gate(scores=F32(4, 64).t()), ValueError, "must be 2-D|contiguous"),
]


@pytest.mark.parametrize("call, error, match", REFUSALS)
def test_bad_inputs_raise_before_any_launch(launches, call, error, match):  # noqa: F811
    with pytest.raises(error, match=match):
        call()
    assert not launches


def test_rand_follows_torch_and_set_seed():
    tkaot.rand.set_seed(1234)
    a = tkaot.rand.randn(3, 5, device="cpu")
    b = tkaot.rand.randn((3, 5), dtype=torch.float64, device="cpu")
    torch.manual_seed(1234)
    assert torch.equal(a, torch.randn(3, 5)) and torch.equal(b, torch.randn(3, 5, dtype=torch.float64))
    like = tkaot.rand.randn_like(torch.empty(2, 7, dtype=torch.bfloat16))
    assert like.shape == (2, 7) and like.dtype == torch.bfloat16


def test_the_plain_kernels_grid_is_its_blocks(monkeypatch):
    """rmsnorm_backward_plain is built with one row slot of 128 threads a block at bf16 4096 and 5120 (2 blocks an SM):
    the op's grid follows, one row a block up to 264 blocks; the other widths and kernels keep 256 threads a block."""
    from tkaot import _op
    from tkaot._quant import norm_backward as nb

    monkeypatch.setattr(nb._PASS1, "cache", {})
    monkeypatch.setattr(_op.OpKernels, "get", lambda self, device, *values, **kw: self.kernel)
    assert nb._pass1(0, 4096, "bfloat16", False, False) == ("rmsnorm_backward_plain", 1, 264)
    assert nb._pass1(0, 5120, "bfloat16", False, False) == ("rmsnorm_backward_plain", 1, 264)
    assert nb._pass1(0, 7168, "bfloat16", False, False) == ("rmsnorm_backward_plain", 2, 132)
    assert nb._pass1(0, 8192, "bfloat16", False, False) == ("rmsnorm_backward_plain", 1, 132)
    assert nb._pass1(0, 4096, "bfloat16", False, True) == ("rmsnorm_backward", 2, 132)
    assert nb._pass1(0, 4096, "bfloat16", True, False) == ("rmsnorm_backward_residual", 2, 132)
