"""The casts' generic tier on CPU: rows that end in a partial group, cast backs of any width, and what the default set
serves.

A per-token cast whose row ends in a partial group (hidden a multiple of 64, not of the group: TileKernels takes it)
has no specialised variant; the generic per_token_cast_generic serves it with no warning, TKAOT_STRICT or not. A cast
back whose specialised variant is not built falls back to cast_back_generic like any generic fallback. A fake registry
stands in for the artifact sets (it holds the keys a test says are built) and records what the ops ask it for; meta
tensors stand in for CUDA ones.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import pytest
import torch

import tkaot
from build_tools.sweep import load_shapeset
from tests.helpers import meta
from tkaot import _op
from tkaot._decl import build_command
from tkaot._quant import casts
from tkaot._quant.kernels import CAST_BACK, CAST_BACK_GENERIC, PER_TOKEN_CAST, PER_TOKEN_CAST_GENERIC
from tkaot.errors import GenericVariantWarning, VariantNotBuilt

ROOT = Path(__file__).resolve().parent.parent
FP8, F32 = torch.float8_e4m3fn, torch.float32


class FakeKernel:
    def __init__(self, registry, kernel, key):
        self.registry, self.kernel, self.key = registry, kernel, key

    def bind(self, arg_names, kind=None, pdl=None, fixed=None):
        def launch(device, stream, *values):
            assert len(values) == len(arg_names)
            self.registry.launches.append((self.kernel, self.key, fixed))

        return launch


class FakeRegistry:
    """Artifact sets holding exactly `built` ((kernel, key) pairs) for an sm90 device."""

    def __init__(self, built=()):
        self.built, self.asked, self.launches = set(built), [], []

    def device_arch(self, device):
        return "sm90"

    def kernel(self, op, kernel, key, device):
        self.asked.append((kernel, key))
        if (kernel, key) not in self.built:
            raise VariantNotBuilt(op, kernel, key, [], build_command(kernel, key, "sm90"), ["(fake)"])
        return FakeKernel(self, kernel, key)


@pytest.fixture
def sets(monkeypatch, fake_cuda):
    """Install a FakeRegistry (its `built` filled by the test) with the casts' caches emptied."""
    registry = FakeRegistry()
    monkeypatch.setattr(_op, "REGISTRY", registry)
    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(casts, "current_stream", lambda device: 0)
    monkeypatch.setattr(casts, "_PLANS", {})
    for kernels in (*casts._PER_TOKEN.values(), *casts._CAST_BACK.values()):
        monkeypatch.setattr(kernels, "cache", {})
    monkeypatch.delenv("TKAOT_STRICT", raising=False)
    return registry


def token_values(hidden, fmt="e2m1", group=128, sf="ue8m0", layout="col", mode="cast", in_dtype="bfloat16"):
    return (hidden, in_dtype, "none", "none", fmt, group, sf, layout, mode, False)


def generic_key(values) -> str:
    return PER_TOKEN_CAST_GENERIC.key(PER_TOKEN_CAST_GENERIC.split(PER_TOKEN_CAST, values)[0])


PACKED_COL = dict(round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True)


@pytest.mark.parametrize("strict", ["", "1"])
def test_a_partial_group_runs_on_the_generic_variant_silently(sets, monkeypatch, strict):
    monkeypatch.setenv("TKAOT_STRICT", strict)
    sets.built.add(("per_token_cast_generic", generic_key(token_values(1088))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data, sf = tkaot.quant.per_token_cast(meta(3, 1088), "e2m1", 128, **PACKED_COL)
        again = tkaot.quant.per_token_cast(meta(5, 1088), "e2m1", 128, **PACKED_COL)
    # no specialised variant is asked for: none can exist (9 groups, the last of 64 channels)
    assert sets.asked == [("per_token_cast_generic", generic_key(token_values(1088)))]
    assert [fixed for *_, fixed in sets.launches] == [{"hidden": 1088}] * 2
    assert data.shape == (3, 544) and sf.shape == (3, 3) and sf.dtype == torch.int32 and sf.stride() == (1, 4)
    assert again[1].shape == (5, 3)
    assert not PER_TOKEN_CAST.can_specialise(token_values(1088)) and PER_TOKEN_CAST.can_specialise(token_values(1152))


@pytest.mark.parametrize(
    "call, values",
    [
        (lambda q: q.per_token_cast_with_sf_only(meta(2, 192), "e4m3", 128), token_values(192, "e4m3", 128, "fp32", "row", "sf_only")),
        (lambda q: q.per_token_cast_with_precomputed_sf(meta(2, 64, dtype=torch.float32), "e4m3", 128, meta(2, 1, dtype=F32)),
         token_values(64, "e4m3", 128, "fp32", "row", "precomputed_sf", "float32")),
        (lambda q: q.per_token_cast(meta(2, 320), "e4m3", 128, out=(meta(2, 320, dtype=FP8), meta(2, 3, dtype=F32))),
         token_values(320, "e4m3", 128, "fp32", "row")),
        (lambda q: q.per_token_cast((meta(2, 320, dtype=FP8), meta(2, 5, dtype=F32)), "e2m1", 128, x_block_size=(1, 64)),
         (320, "e4m3", "1x64", "fp32", "e2m1", 128, "fp32", "row", "cast", False)),
    ],
)  # fmt: skip
def test_every_per_token_mode_takes_a_partial_group(sets, call, values):
    sets.built.add(("per_token_cast_generic", generic_key(values)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(tkaot.quant)
    assert sets.asked == [("per_token_cast_generic", generic_key(values))]


def test_the_round_trip_keeps_whole_groups(sets):
    with pytest.raises(ValueError, match="a multiple of 64 and of num_per_channels=128 channels wide, got 320 channels"):
        tkaot.quant.per_token_cast_and_cast_back(meta(2, 320), "e4m3", 128)
    assert sets.asked == []


def test_a_partial_group_without_its_generic_variant_names_that_variant(sets):
    with pytest.raises(VariantNotBuilt) as missing:
        tkaot.quant.per_token_cast(meta(3, 1088), "e2m1", 128, **PACKED_COL)
    key = generic_key(token_values(1088))
    assert (missing.value.kernel, missing.value.key) == ("per_token_cast_generic", key)
    assert missing.value.command == build_command("per_token_cast_generic", key, "sm90")


def cast_back_values(hidden, in_block="1x128", in_sf="ue8m0_col", out="bfloat16", in_dtype="e4m3"):
    return (hidden, in_dtype, in_block, in_sf, out)


def test_a_cast_back_of_any_width_falls_back_to_the_generic_variant(sets):
    values = cast_back_values(3072)
    generic = CAST_BACK_GENERIC.key(CAST_BACK_GENERIC.split(CAST_BACK, values)[0])
    sets.built |= {("cast_back_generic", generic), ("cast_back", CAST_BACK.key(cast_back_values(7168)))}
    pair = (meta(5, 3072, dtype=FP8), meta(6, 8, dtype=torch.int32).t()[:5])  # column-major packed UE8M0, 1 x 128 blocks
    with pytest.warns(GenericVariantWarning) as caught:
        out = tkaot.quant.per_token_cast_back(pair, "bf16", 128)
    assert out.shape == (5, 3072) and len(caught) == 1
    assert build_command("cast_back", CAST_BACK.key(values), "sm90") in str(caught[0].message)
    assert sets.launches == [("cast_back_generic", generic, {"hidden": 3072})]
    sets.launches.clear()
    tkaot.quant.per_token_cast_back((meta(5, 7168, dtype=FP8), meta(14, 8, dtype=torch.int32).t()[:5]), "bf16", 128)
    assert sets.launches == [("cast_back", CAST_BACK.key(cast_back_values(7168)), None)]


# ---- what the default set serves ----


@pytest.fixture(scope="module")
def default_keys() -> set[tuple[str, str]]:
    return {(v.kernel, v.key) for v in load_shapeset("default")}


def recorded_get(launched: list):
    def get(self, device, *values, general_tiling=None):
        for axis, value in zip(self.decl.axes, values):
            axis.validate(value)
        launched.append((self.decl, values))
        return lambda *args: None

    return get


def served(keys: set, decl, values) -> bool:
    """Whether the default set has the variant of a call: specialised (where it can be), else generic."""
    from tkaot._decl import generic_kernel

    if decl.can_specialise(values) and (decl.name, decl.key(values)) in keys:
        return True
    generic = generic_kernel(decl.name)
    return (generic.name, generic.key(generic.split(decl, values)[0])) in keys


def cast_outputs(q) -> list[tuple[tuple, tuple]]:
    """((data, sf), x_block_size) of every kind of input the casts make, on meta tensors."""
    made = []
    for fmt, group, kind, col in itertools.product(("e4m3", "e2m1"), (16, 32, 64, 128), ("fp32", "ue8m0", "e4m3"), (False, True)):
        flags = dict(round_sf=kind == "ue8m0", use_packed_ue8m0=kind == "ue8m0", use_e4m3_sf=kind == "e4m3")
        made.append((q.per_token_cast(meta(130, 1024), fmt, group, use_tma_aligned_col_major_sf=col, **flags), (1, group)))
    for fmt, block, kind, col in itertools.product(("e4m3", "e2m1"), ((32, 32), (32, 128), (128, 32), (128, 128)), ("fp32", "ue8m0"),
                                                   (False, True)):  # fmt: skip
        flags = dict(round_sf=kind == "ue8m0", use_packed_ue8m0=kind == "ue8m0")
        made.append((q.per_block_cast(meta(256, 1024), fmt, block, use_tma_aligned_col_major_sf=col, **flags), block))
    for m, kind in itertools.product((32, 128), ("fp32", "ue8m0")):
        made.append((q.per_channel_cast(meta(256, 1024), "e4m3", m, round_sf=kind == "ue8m0", use_packed_ue8m0=kind == "ue8m0"), (m, 1)))
    return made


def test_the_default_set_casts_back_everything_the_casts_make_at_any_width(default_keys, monkeypatch, fake_cuda):
    launched: list = []
    monkeypatch.setattr(_op.OpKernels, "get", recorded_get(launched))
    monkeypatch.setattr(casts, "current_stream", lambda device: 0)
    monkeypatch.setattr(casts, "_PLANS", {})
    made = cast_outputs(tkaot.quant)
    launched.clear()
    for pair, block in made:
        for out in ("bf16", "fp32"):
            tkaot.quant.cast_back(pair, out, block)
    assert len(launched) == 2 * len(made) == 2 * (48 + 32 + 4)
    for decl, values in launched:
        assert decl is CAST_BACK
        width_free = (3072, *values[1:])  # a width no specialised variant has
        assert served(default_keys, decl, width_free), decl.key(width_free)


def test_the_default_set_serves_every_partial_group_of_a_bf16_or_fp32_input(default_keys):
    for dtype, fmt, group, sf, layout, mode in itertools.product(
        ("bfloat16", "float32"), ("e4m3", "e2m1"), (128,), ("fp32", "pow2", "ue8m0", "e4m3"), ("row", "col"), ("cast", "sf_only")
    ):
        values = (1088, dtype, "none", "none", fmt, group, sf, layout, mode, False)
        assert served(default_keys, PER_TOKEN_CAST, values), PER_TOKEN_CAST.key(values)
    for dtype, fmt, sf in itertools.product(("bfloat16", "float32"), ("e4m3", "e2m1"), ("fp32", "pow2", "e4m3")):
        values = (1088, dtype, "none", "none", fmt, 128, sf, "row", "precomputed_sf", False)
        assert served(default_keys, PER_TOKEN_CAST, values), PER_TOKEN_CAST.key(values)
