"""The generic tier of the per-block, per-channel and lossless casts on CPU: which variant a call reaches, with which
runtime values, and that the default set serves every call of these ops (and every parity case of the casts) at any
width.

per_block_cast_generic takes hidden, the block and the sf layout at run time, per_channel_cast_generic hidden, the
token block and the input's scale block, per_block_cast_lossless_generic hidden, both blocks and the sf layout; a
string axis reaches the kernel as its index among the axis's choices. A fake registry stands in for the artifact sets
(tests/test_generic_casts.py) and meta tensors for CUDA ones.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import tkaot
from build_tools.sweep import load_shapeset
from tests import parity_cases
from tests.helpers import meta
from tests.test_generic_casts import FakeRegistry, recorded_get, served
from tests.test_parity_cases import fake_sm90, run_on_meta  # noqa: F401 (fake_sm90: a fixture)
from tkaot import _op
from tkaot._decl import build_command
from tkaot._quant import casts, weight_casts
from tkaot._quant.kernels import (
    CAST_BACK,
    PER_BLOCK_CAST,
    PER_BLOCK_CAST_GENERIC,
    PER_BLOCK_CAST_LOSSLESS,
    PER_BLOCK_CAST_LOSSLESS_GENERIC,
    PER_CHANNEL_CAST,
    PER_CHANNEL_CAST_GENERIC,
)
from tkaot.errors import GenericVariantWarning

FP8, F32, I32 = torch.float8_e4m3fn, torch.float32, torch.int32
WIDTH = 3200  # 25 x 128: no specialised variant of any of these kernels has it
BLOCKS = ((32, 32), (32, 128), (128, 32), (128, 128))
SF_KINDS = {"fp32": {}, "pow2": {"round_sf": True}, "ue8m0": {"round_sf": True, "use_packed_ue8m0": True}}


def forget(monkeypatch):
    """Empty the launcher caches of the ops these tests call."""
    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(casts, "_PLANS", {})
    for kernels in (*casts._PER_TOKEN.values(), *casts._CAST_BACK.values(), *casts._PER_BLOCK.values(), casts._PER_CHANNEL,
                    weight_casts._LOSSLESS):  # fmt: skip
        monkeypatch.setattr(kernels, "cache", {})


@pytest.fixture
def sets(monkeypatch, fake_cuda):
    registry = FakeRegistry()
    monkeypatch.setattr(_op, "REGISTRY", registry)
    monkeypatch.setattr(casts, "current_stream", lambda device: 0)
    monkeypatch.setattr(weight_casts, "current_stream", lambda device: 0)
    monkeypatch.setattr(weight_casts, "_values_unchecked", lambda: True)  # meta tensors hold no values to check
    monkeypatch.delenv("TKAOT_STRICT", raising=False)
    forget(monkeypatch)
    return registry


def generic_key(generic, specialised, values) -> str:
    return generic.key(generic.split(specialised, values)[0])


# ---- string runtime axes ----


def test_string_runtime_axes_reach_the_kernel_as_their_choice_index():
    values = (WIDTH, "float32", "e2m1", 32, 128, "ue8m0", "col", "cast")
    static, fixed = PER_BLOCK_CAST_GENERIC.split(PER_BLOCK_CAST, values)
    assert static == ("float32", "e2m1", "ue8m0", "cast")
    assert fixed == {"hidden": WIDTH, "block_m": 32, "block_k": 128, "sf_layout": 1}
    values = (WIDTH, "e4m3", "1x128", "e4m3_col", 32, "pow2")
    assert PER_CHANNEL_CAST_GENERIC.split(PER_CHANNEL_CAST, values) == (("e4m3", "e4m3_col", "pow2"),
                                                                         {"hidden": WIDTH, "in_block": 2, "block_m": 32})  # fmt: skip
    values = (WIDTH, "1x16", "fp32", "128x32", "pow2", "row")
    assert PER_BLOCK_CAST_LOSSLESS_GENERIC.split(PER_BLOCK_CAST_LOSSLESS, values) == (
        ("fp32", "pow2"),
        {"hidden": WIDTH, "in_block": 0, "out_block": 6, "sf_layout": 0},
    )
    assert PER_BLOCK_CAST_GENERIC.dims == ("num_tokens", "sf_stride", "hidden", "block_m", "block_k", "sf_layout")


# ---- the fallback, through the ops ----


@pytest.mark.parametrize(
    "mode, call",
    [
        ("cast", lambda q: q.per_block_cast(meta(256, WIDTH), "e4m3", (32, 128), use_tma_aligned_col_major_sf=True, **SF_KINDS["ue8m0"])),
        ("sf_only", lambda q: q.per_block_cast_with_sf_only(meta(256, WIDTH), "e4m3", (32, 128), use_tma_aligned_col_major_sf=True,
                                                            **SF_KINDS["ue8m0"])),
    ],
)  # fmt: skip
def test_a_per_block_cast_of_an_unbuilt_width_runs_on_the_generic_variant(sets, mode, call):
    values = (WIDTH, "bfloat16", "e4m3", 32, 128, "ue8m0", "col", mode)
    key = generic_key(PER_BLOCK_CAST_GENERIC, PER_BLOCK_CAST, values)
    sets.built.add(("per_block_cast_generic", key))
    with pytest.warns(GenericVariantWarning) as caught:
        call(tkaot.quant)
        call(tkaot.quant)
    assert len(caught) == 1 and build_command("per_block_cast", PER_BLOCK_CAST.key(values), "sm90") in str(caught[0].message)
    assert sets.asked == [("per_block_cast", PER_BLOCK_CAST.key(values)), ("per_block_cast_generic", key)]
    assert sets.launches == [("per_block_cast_generic", key, {"hidden": WIDTH, "block_m": 32, "block_k": 128, "sf_layout": 1})] * 2


def test_precomputed_per_block_sf_run_on_the_generic_variant(sets):
    values = (WIDTH, "float32", "e2m1", 128, 32, "pow2", "row", "precomputed_sf")
    key = generic_key(PER_BLOCK_CAST_GENERIC, PER_BLOCK_CAST, values)
    sets.built.add(("per_block_cast_generic", key))
    sf = meta(2, WIDTH // 32, dtype=F32)
    with pytest.warns(GenericVariantWarning):
        out = tkaot.quant.per_block_cast_with_precomputed_sf(meta(256, WIDTH, dtype=F32), "e2m1", (128, 32), sf, round_sf=True)
    assert out.shape == (256, WIDTH // 2) and out.dtype == torch.int8
    assert sets.launches == [("per_block_cast_generic", key, {"hidden": WIDTH, "block_m": 128, "block_k": 32, "sf_layout": 0})]


def test_a_per_channel_cast_of_an_unbuilt_width_runs_on_the_generic_variant(sets):
    values = (WIDTH, "e4m3", "1x32", "ue8m0_col", 128, "fp32")
    key = generic_key(PER_CHANNEL_CAST_GENERIC, PER_CHANNEL_CAST, values)
    sets.built.add(("per_channel_cast_generic", key))
    pair = (meta(256, WIDTH, dtype=FP8), meta(WIDTH // 128, 256, dtype=I32).t())  # packed UE8M0, column-major
    with pytest.warns(GenericVariantWarning):
        data, sf = tkaot.quant.per_channel_cast(pair, "e4m3", 128, num_per_channels=32)
    assert data.shape == (256, WIDTH) and sf.shape == (2, WIDTH) and sf.dtype == F32
    assert sets.launches == [("per_channel_cast_generic", key, {"hidden": WIDTH, "in_block": 1, "block_m": 128})]


def test_a_lossless_cast_of_an_unbuilt_width_runs_on_the_generic_variant(sets):
    values = (WIDTH, "1x32", "ue8m0", "1x128", "ue8m0", "col")
    key = generic_key(PER_BLOCK_CAST_LOSSLESS_GENERIC, PER_BLOCK_CAST_LOSSLESS, values)
    sets.built.add(("per_block_cast_lossless_generic", key))
    pair = (meta(256, WIDTH // 2, dtype=torch.int8), meta(256, WIDTH // 32 // 4, dtype=I32))
    with pytest.warns(GenericVariantWarning):
        data, sf = tkaot.quant.per_block_cast_lossless(pair, "e4m3", (1, 32), (1, 128), use_tma_aligned_col_major_sf=True,
                                                       **SF_KINDS["ue8m0"])  # fmt: skip
    assert data.shape == (256, WIDTH) and sf.shape == (256, -(-WIDTH // 128 // 4)) and sf.stride(0) == 1
    assert sets.launches == [("per_block_cast_lossless_generic", key, {"hidden": WIDTH, "in_block": 1, "out_block": 3, "sf_layout": 1})]


# ---- what the default set serves ----


@pytest.fixture(scope="module")
def default_keys() -> set[tuple[str, str]]:
    return {(v.kernel, v.key) for v in load_shapeset("default")}


@pytest.fixture
def recorded(monkeypatch, fake_cuda):
    """Every op call records its kernel and static values instead of looking a variant up."""
    launched: list = []
    monkeypatch.setattr(_op.OpKernels, "get", recorded_get(launched))
    monkeypatch.setattr(casts, "current_stream", lambda device: 0)
    monkeypatch.setattr(weight_casts, "current_stream", lambda device: 0)
    monkeypatch.setattr(weight_casts, "_values_unchecked", lambda: True)
    monkeypatch.setattr(casts, "_PLANS", {})
    return launched


def assert_served(default_keys, launched, expected: int):
    assert len(launched) == expected
    missing = [decl.key(values) for decl, values in launched if not served(default_keys, decl, values)]
    assert not missing, f"{len(missing)} calls find no variant in the default set, e.g. {missing[:3]}"


def test_the_default_set_serves_every_per_block_cast_at_any_width(default_keys, recorded):
    q = tkaot.quant
    for hidden in (128, WIDTH, 16384 + 128):
        for dtype, fmt, block, kind, col in itertools.product((torch.bfloat16, F32), ("e4m3", "e2m1"), BLOCKS, SF_KINDS, (False, True)):
            x, flags = meta(200, hidden, dtype=dtype), dict(SF_KINDS[kind], use_tma_aligned_col_major_sf=col)
            q.per_block_cast(x, fmt, block, **flags)
            q.per_block_cast_with_sf_only(x, fmt, block, **flags)
            if kind != "ue8m0" and not col:
                sf = meta(-(-200 // block[0]), hidden // block[1], dtype=F32)
                q.per_block_cast_with_precomputed_sf(x, fmt, block, sf, **SF_KINDS[kind])
    assert_served(default_keys, recorded, 3 * (2 * 2 * 4 * 3 * 2 * 2 + 2 * 2 * 4 * 2))


def test_the_default_set_serves_every_per_channel_cast_at_any_width(default_keys, recorded):
    q = tkaot.quant
    sf_inputs = {"fp32": (F32, 1), "ue8m0": (I32, 4), "e4m3": (FP8, 1)}
    calls = 0
    for hidden, m, kind in itertools.product((128, WIDTH, 16384 + 128), (32, 128), SF_KINDS):
        for dtype in (torch.bfloat16, F32):
            q.per_channel_cast(meta(256, hidden, dtype=dtype), "e4m3", m, **SF_KINDS[kind])
            calls += 1
        for group, (sf_dtype, per_word), col in itertools.product((32, 128), sf_inputs.values(), (False, True)):
            cols = -(-hidden // group // per_word)
            sf = meta(cols, 256, dtype=sf_dtype).t() if col else meta(256, cols, dtype=sf_dtype)
            q.per_channel_cast((meta(256, hidden, dtype=FP8), sf), "e4m3", m, num_per_channels=group, **SF_KINDS[kind])
            calls += 1
    assert_served(default_keys, recorded, calls)


def test_the_default_set_serves_every_lossless_cast_at_any_width(default_keys, recorded):
    q = tkaot.quant
    in_blocks = [tuple(int(n) for n in b.split("x")) for b in PER_BLOCK_CAST_LOSSLESS.axis("in_block").choices]
    out_blocks = [tuple(int(n) for n in b.split("x")) for b in PER_BLOCK_CAST_LOSSLESS.axis("out_block").choices]
    calls = 0
    for hidden, block, out_block in itertools.product((128, WIDTH, 16384 + 128), in_blocks, out_blocks):
        if out_block[0] % block[0] or out_block[1] % block[1]:
            continue
        m_blocks, k_blocks = -(-256 // block[0]), hidden // block[1]
        for packed, col, kind, out_col in itertools.product((False, True), (False, True), ("pow2", "ue8m0"), (False, True)):
            cols = -(-k_blocks // 4) if packed else k_blocks
            dtype = I32 if packed else F32
            sf = meta(cols, m_blocks, dtype=dtype).t() if col else meta(m_blocks, cols, dtype=dtype)
            q.per_block_cast_lossless((meta(256, hidden // 2, dtype=torch.int8), sf), "e4m3", block, out_block,
                                      use_tma_aligned_col_major_sf=out_col, **SF_KINDS[kind])  # fmt: skip
            calls += 1
    assert_served(default_keys, recorded, calls)


def test_the_default_set_casts_back_every_per_block_input_at_any_width(default_keys, recorded):
    sf_inputs = {"fp32": (F32, 1), "ue8m0": (I32, 4), "e4m3": (FP8, 1)}
    calls = 0
    for hidden, data_dtype, block, (sf_dtype, per_word), col, out in itertools.product(
        (128, WIDTH), (FP8, torch.int8), BLOCKS, sf_inputs.values(), (False, True), ("bf16", "fp32")
    ):
        m_blocks, cols = -(-256 // block[0]), -(-hidden // block[1] // per_word)
        sf = meta(cols, m_blocks, dtype=sf_dtype).t() if col else meta(m_blocks, cols, dtype=sf_dtype)
        data = meta(256, hidden // 2 if data_dtype == torch.int8 else hidden, dtype=data_dtype)
        tkaot.quant.cast_back((data, sf), out, block)
        calls += 1
    assert_served(default_keys, recorded, calls)
    assert {decl.name for decl, _ in recorded} == {CAST_BACK.name}


# ---- the parity cases ----

# The ops whose parity cases once missed a variant (issue 15): each case now reaches one the default set builds, at the
# parity run's seed and at others (the per-block, per-channel and lossless casts and the cast backs serve every
# option; per_token_cast's pre-quantized inputs, in blocks and sf kinds and layouts past those the default set
# builds, only at the parity run's seed)
PARITY_OPS = (
    "quant.per_block_cast", "quant.per_block_cast_with_sf_only", "quant.per_block_cast_with_precomputed_sf",
    "quant.per_block_cast_lossless", "quant.per_channel_cast", "quant.cast_back", "quant.per_token_cast_back",
)  # fmt: skip
PARITY_CALLS = [(op, seed) for op in PARITY_OPS for seed in range(parity_cases.SEED, parity_cases.SEED + 4)]


@pytest.mark.parametrize("op, seed", [*PARITY_CALLS, ("quant.per_token_cast", parity_cases.SEED)])
def test_every_parity_case_finds_a_variant_of_the_default_set(fake_sm90, default_keys, monkeypatch, op, seed):  # noqa: F811
    monkeypatch.setattr(_op, "REGISTRY", FakeRegistry(default_keys))
    monkeypatch.setattr(parity_cases, "SEED", seed)
    outcomes = [(case.label, *run_on_meta(case, fake_sm90)) for case in parity_cases.cases(op)]
    missed = [f"{label}: {detail}" for label, outcome, detail in outcomes if outcome != "variant"]
    assert not missed, "\n".join(missed)
