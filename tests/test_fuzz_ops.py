"""Property-based checks of the ops declared on Signatures (norm, rotary, MoE gate, SwiGLU + cast), on CPU.

Valid calls are drawn within the declared limits: each must reach exactly the launches its kernel declaration keys
(every static value allowed by the kernel's axes, every runtime argument supplied). Each invalid call is a valid one
with one thing broken (dtype, rank, shape, stride, alignment, device, option): it must raise ValueError or TypeError
and launch nothing. Meta tensors stand in for CUDA ones (device 0) and a recorder stands in for the launcher, so no
GPU, driver or kernel is needed. The example count is bounded for CI.
"""

from __future__ import annotations

import functools

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tkaot  # noqa: E402
from tests.helpers import meta  # noqa: E402
from tkaot import _op  # noqa: E402
from tkaot._decl import generic_kernel  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BF16, F32 = torch.bfloat16, torch.float32
TOKENS = st.sampled_from([1, 3, 127, 4097])


@pytest.fixture
def launches(monkeypatch):
    """Meta tensors read as device 0; every op's launcher records (kernel, key) instead of launching."""
    get_device = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "meta" else get_device(self))
    recorded: list[tuple[str, str]] = []

    def get(self, device, *values, general_tiling=None):
        decl, static = self.decl, values
        generic = generic_kernel(decl.name)
        if generic and not all(axis.allows(value) for axis, value in zip(decl.axes, values)):
            # values only the generic kernel takes (swiglu's hidden a multiple of 64 but not of 256): its variant
            decl, (static, _) = generic, generic.split(decl, values)
        for axis, value in zip(decl.axes, static):
            axis.validate(value)  # every static value a declared axis allows
        key = decl.key(static)

        def launch(dev, stream, *args):
            assert len(args) == len(self.args), f"{self.kernel}: {len(args)} values for {len(self.args)} arguments"
            recorded.append((decl.name, key))

        return launch

    monkeypatch.setattr(_op.OpKernels, "get", get)
    for family in (tkaot.quant, tkaot.moe, tkaot.transform):
        for name in family.__all__:
            module = __import__(getattr(family, name).__module__, fromlist=["_"])
            if hasattr(module, "current_stream"):
                monkeypatch.setattr(module, "current_stream", lambda device: 0)
            for value in vars(module).values():
                if isinstance(value, _op.OpKernels):
                    monkeypatch.setattr(value, "cache", {})
    return recorded


def examples(**strategies):
    """@given(**strategies) under SETTINGS, for a test of the `launches` recorder: cleared before each example, since
    one function-scoped fixture serves every example hypothesis draws."""

    def decorate(test):
        @SETTINGS
        @given(**strategies)
        @functools.wraps(test)
        def run(launches, **drawn):
            launches.clear()
            test(launches, **drawn)

        return run

    return decorate


def refuses(call, recorded) -> None:
    with pytest.raises((ValueError, TypeError)):
        call()
    assert not recorded, f"an invalid call launched {recorded}"


def _name(dtype) -> str:
    return "bfloat16" if dtype is BF16 else "float32"


# ---- norm_forward ----

NORM = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([BF16, F32]),
        "tokens": TOKENS,
        "hidden": st.integers(1, 512).map(lambda v: v * 16),
        "batch": st.sampled_from([None, 1, 3]),
        "weight": st.booleans(),
        "residual": st.booleans(),
        "out": st.booleans(),
        "with_rstd": st.booleans(),
    }
)


def norm_args(d):
    lead = (d["tokens"],) if d["batch"] is None else (d["batch"], d["tokens"])
    x = meta(*lead, d["hidden"], dtype=d["dtype"])
    kwargs = {"with_rstd": d["with_rstd"]}
    if d["residual"]:
        kwargs["residual"] = meta(*lead, d["hidden"], dtype=d["dtype"])
    if d["out"]:
        kwargs["out"] = meta(*lead, d["hidden"], dtype=d["dtype"])
    weight = meta(d["hidden"], dtype=d["dtype"]) if d["weight"] else None
    return x, weight, kwargs


@examples(d=NORM)
def test_norm_forward_valid_calls_launch_their_declared_variant(launches, d):
    x, weight, kwargs = norm_args(d)
    out, rstd, _ = tkaot.quant.norm_forward(x, weight, 1e-6, **kwargs)
    key = f"hidden={d['hidden']},dtype={_name(d['dtype'])},with_weight={str(d['weight']).lower()}," \
          f"with_residual={str(d['residual']).lower()},with_rstd={str(d['with_rstd']).lower()}"  # fmt: skip
    assert launches == [("rmsnorm", key)]
    assert out.shape == x.shape and out.dtype == x.dtype and (rstd is not None) == d["with_rstd"]


NORM_BREAKS = [
    lambda x, w, kw: (x.to(torch.float16), w, kw),
    lambda x, w, kw: (x.reshape(-1)[: x.shape[-1]], w, kw),
    lambda x, w, kw: (x.unsqueeze(0).unsqueeze(0), w, kw),
    lambda x, w, kw: (misaligned_rows(x), w, kw),
    lambda x, w, kw: (x, meta(x.shape[-1] + 16, dtype=x.dtype), kw),
    lambda x, w, kw: (x, meta(x.shape[-1], dtype=F32 if x.dtype is BF16 else BF16), kw),
    lambda x, w, kw: (x, w, {**kw, "residual": meta(*x.shape[:-1], x.shape[-1] + 16, dtype=x.dtype)}),
    lambda x, w, kw: (x, w, {**kw, "out": meta(*x.shape, dtype=F32 if x.dtype is BF16 else BF16)}),
    lambda x, w, kw: (torch.empty(x.shape, dtype=x.dtype), w, kw),  # a CPU tensor
    lambda x, w, kw: ([1.0, 2.0], w, kw),  # not a tensor
]


def misaligned_rows(x):
    """x's shape with at least two rows, its rows 4 bytes further apart than 16-byte vectors allow."""
    shape = (*x.shape[:-2], max(x.shape[-2], 2), x.shape[-1])
    row = shape[-1] + 4 // x.element_size()
    return meta(*shape, dtype=x.dtype, strides=(shape[-2] * row, row, 1)[-len(shape) :])


@examples(d=NORM, which=st.integers(0, len(NORM_BREAKS) - 1))
def test_norm_forward_invalid_calls_raise_before_any_launch(launches, d, which):
    x, weight, kwargs = NORM_BREAKS[which](*norm_args(d))
    refuses(lambda: tkaot.quant.norm_forward(x, weight, 1e-6, **kwargs), launches)


# ---- apply_rotary ----

ROTARY = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([BF16, F32]),
        "tokens": TOKENS,
        "heads": st.integers(1, 16),
        "key_heads": st.sampled_from([None, 1, 4]),
        "rot": st.sampled_from([64, 128]),
        "positions": st.sampled_from([None, torch.int32, torch.int64]),
        "interleaved": st.booleans(),
        "conjugate": st.booleans(),
    }
)


def rotary_args(d):
    query = meta(d["tokens"], d["heads"], d["rot"], dtype=d["dtype"])
    cache = meta(d["tokens"] + 5, d["rot"], dtype=F32)
    kwargs = {"interleaved": d["interleaved"], "conjugate": d["conjugate"]}
    if d["key_heads"] is not None:
        kwargs["key"] = meta(d["tokens"], d["key_heads"], d["rot"], dtype=d["dtype"])
    if d["positions"] is not None:
        kwargs["positions"] = meta(d["tokens"], dtype=d["positions"])
    return query, cache, kwargs


@examples(d=ROTARY)
def test_apply_rotary_valid_calls_launch_their_declared_variant(launches, d):
    query, cache, kwargs = rotary_args(d)
    assert tkaot.transform.apply_rotary(query, cache, **kwargs) is None
    key = f"rot_dim={d['rot']},dtype={_name(d['dtype'])},interleaved={str(d['interleaved']).lower()}"
    assert launches == [("rotary", key)] * (1 if d["key_heads"] is None else 2)


ROTARY_BREAKS = [
    lambda q, c, kw: (q, meta(c.shape[0], 96, dtype=F32), kw),
    lambda q, c, kw: (q, c.to(BF16), kw),
    lambda q, c, kw: (q.to(torch.float16), c, kw),
    lambda q, c, kw: (q, c, {**kw, "key": meta(*q.shape[:-1], q.shape[-1], dtype=F32 if q.dtype is BF16 else BF16)}),
    lambda q, c, kw: (q, c, {**kw, "positions": meta(q.shape[0], dtype=F32)}),
    lambda q, c, kw: (q, c, {k: v for k, v in kw.items() if k != "positions"} | {"seqlen_offset": c.shape[0]}),
    lambda q, c, kw: (q[..., : q.shape[-1] // 2], c, kw),
    lambda q, c, kw: (q.reshape(-1), c, kw),
]


@examples(d=ROTARY, which=st.integers(0, len(ROTARY_BREAKS) - 1))
def test_apply_rotary_invalid_calls_raise_before_any_launch(launches, d, which):
    query, cache, kwargs = ROTARY_BREAKS[which](*rotary_args(d))
    refuses(lambda: tkaot.transform.apply_rotary(query, cache, **kwargs), launches)


# ---- moe_topk_gate_forward ----

GATE = st.fixed_dictionaries(
    {
        "tokens": TOKENS,
        "experts": st.integers(16, 128).map(lambda v: v * 4),
        "topk": st.integers(1, 8),
        "shared": st.sampled_from([0, 1, 2]),
        "bias": st.booleans(),
        "mask": st.booleans(),
    }
)


def gate_args(d):
    logits = meta(d["tokens"], d["experts"], dtype=F32)
    kwargs = {}
    if d["bias"]:
        kwargs["bias"] = meta(d["experts"], dtype=F32)
    if d["mask"]:
        kwargs["mask"] = meta(d["tokens"], dtype=torch.bool)
    return logits, (d["topk"], d["shared"] > 0, max(d["shared"], 1), 2.5, 0), kwargs


@examples(d=GATE)
def test_moe_gate_valid_calls_launch_their_declared_variant(launches, d):
    logits, args, kwargs = gate_args(d)
    idx, weights = tkaot.moe.moe_topk_gate_forward(logits, *args, **kwargs)
    assert launches == [("moe_topk_gate", f"num_experts={d['experts']},num_topk={d['topk']},tiling=ballot4")]
    assert idx.shape == weights.shape == (d["tokens"], d["topk"] + d["shared"]) and idx.dtype == torch.int64


GATE_BREAKS = [
    lambda lg, a, kw: (meta(lg.shape[0], lg.shape[1] + 1, dtype=F32), a, kw),
    lambda lg, a, kw: (lg.to(BF16), a, kw),
    lambda lg, a, kw: (lg, (0, *a[1:]), kw),
    lambda lg, a, kw: (lg, (33, *a[1:]), kw),
    lambda lg, a, kw: (lg, (a[0], True, 3, *a[3:]), kw),
    lambda lg, a, kw: (lg, a, {**kw, "bias": meta(lg.shape[1] + 4, dtype=F32)}),
    lambda lg, a, kw: (lg, a, {**kw, "image_bias": meta(lg.shape[1], dtype=F32)}),
    lambda lg, a, kw: (lg, a, {**kw, "scoring_func": "softmax"}),
    lambda lg, a, kw: (lg, a, {**kw, "mask": meta(lg.shape[0] + 1, dtype=torch.bool)}),
]


@examples(d=GATE, which=st.integers(0, len(GATE_BREAKS) - 1))
def test_moe_gate_invalid_calls_raise_before_any_launch(launches, d, which):
    logits, args, kwargs = GATE_BREAKS[which](*gate_args(d))
    refuses(lambda: tkaot.moe.moe_topk_gate_forward(logits, *args, **kwargs), launches)


# ---- swiglu_forward_and_per_token_cast ----

SWIGLU = st.fixed_dictionaries(
    {
        "tokens": TOKENS,
        "hidden": st.integers(1, 512).map(lambda v: v * 64),
        "group": st.sampled_from([128, 32]),
        "sf": st.sampled_from(["fp32", "pow2", "ue8m0"]),
        "col_major": st.booleans(),
        "weights": st.booleans(),
        "clamp": st.sampled_from([None, 0.0, 7.5]),
    }
)


def swiglu_args(d):
    d["hidden"] += 64 if d["hidden"] % d["group"] else 0  # a multiple of the group
    x = meta(d["tokens"], 2 * d["hidden"])
    kwargs = {
        "use_tma_aligned_col_major_sf": d["col_major"],
        "round_sf": d["sf"] != "fp32",
        "use_packed_ue8m0": d["sf"] == "ue8m0",
        "clamp_value": d["clamp"],
    }
    if d["weights"]:
        kwargs["topk_weights"] = meta(d["tokens"], dtype=F32)
    return x, d["group"], kwargs


@examples(d=SWIGLU)
def test_swiglu_cast_valid_calls_launch_their_declared_variant(launches, d):
    x, group, kwargs = swiglu_args(d)
    out, sf = tkaot.quant.swiglu_forward_and_per_token_cast(x, "e4m3", group, **kwargs)
    from tkaot._quant.kernels import SWIGLU_TILINGS

    tiling = SWIGLU_TILINGS["default" if d["clamp"] is None else "clamp"]
    if d["hidden"] % 256:  # only the generic kernel takes it
        assert launches == [("swiglu_generic", f"dtype=bfloat16,fmt=e4m3,sf={d['sf']},tiling={tiling}")]
    else:
        assert launches == [("swiglu", f"hidden={d['hidden']},dtype=bfloat16,fmt=e4m3,group={group},sf={d['sf']},tiling={tiling}")]
    assert out.shape == (d["tokens"], d["hidden"]) and out.dtype == torch.float8_e4m3fn and sf.shape[0] == d["tokens"]


SWIGLU_BREAKS = [
    lambda x, g, kw: (meta(x.shape[0], x.shape[1] + 2), g, kw),
    lambda x, g, kw: (meta(x.shape[0], x.shape[1] + 64), g, kw),  # hidden not a multiple of 64
    lambda x, g, kw: (meta(x.shape[0], 2 * 192), 128, kw),  # hidden not a multiple of the group
    lambda x, g, kw: (x.to(torch.float16), g, kw),
    lambda x, g, kw: (x, 64, kw),
    lambda x, g, kw: (x, g, {**kw, "round_sf": False, "use_packed_ue8m0": True}),
    lambda x, g, kw: (x, g, {**kw, "clamp_value": -1.0}),
    lambda x, g, kw: (x, g, {**kw, "clamp_value": None, "clamped_count": meta(4, dtype=torch.int64)}),
    lambda x, g, kw: (x, g, {**kw, "topk_weights": meta(x.shape[0] + 1, dtype=F32)}),
    lambda x, g, kw: (x, g, {**kw, "routed_scaling_factor": 2.0, "topk_weights": None}),
]


@examples(d=SWIGLU, which=st.integers(0, len(SWIGLU_BREAKS) - 1))
def test_swiglu_cast_invalid_calls_raise_before_any_launch(launches, d, which):
    x, group, kwargs = SWIGLU_BREAKS[which](*swiglu_args(d))
    refuses(lambda: tkaot.quant.swiglu_forward_and_per_token_cast(x, "e4m3", group, **kwargs), launches)
