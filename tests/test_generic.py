"""The generic tier on CPU: declarations of generic kernels, the runtime's fallback to them, and `check`.

A generic kernel (tkaot/_decl.py, KernelDecl.generic) takes some of a specialised kernel's size axes at run time.
The runtime launches the specialised variant of a call when it is built, else the generic one with those axes fixed
at bind (one warning per variant and process, naming the command that builds the specialised one); TKAOT_STRICT=1
turns the fallback into VariantNotBuilt. Meta tensors stand in for CUDA ones and a fake driver records the launches.
"""

import importlib
import json
import struct
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

import tkaot
from tests.helpers import serve_ops
from tests.test_launcher import FUNCTION, SIZES, driver  # noqa: F401 (driver: the fake driver fixture)
from tkaot import _op
from tkaot._decl import all_kernels, build_command, generic_kernel
from tkaot._quant.kernels import PER_TOKEN_CAST, PER_TOKEN_CAST_GENERIC
from tkaot._spec import MANIFEST_SCHEMA
from tkaot.cli import main
from tkaot.errors import GenericVariantWarning, VariantNotBuilt

ROOT = Path(__file__).resolve().parent.parent
PREBUILT = ROOT / "prebuilt" / "sm90"
GENERIC = {name: decl for name, decl in all_kernels().items() if decl.generic_of}
OP = "tkaot.quant.per_token_cast"

# Valid calls that found no kernel before the generic tier: (hidden, per_token_cast's arguments after x)
ONCE_MISSING = [
    (5120, ("e2m1", 32), {}),
    (5120, ("e2m1", 16), {"use_e4m3_sf": True}),
    (5120, ("e4m3", 64), {"round_sf": True}),
    (7168, ("e4m3", 64), {"round_sf": True}),
    (1536, ("e2m1", 32), {"use_packed_ue8m0": True, "round_sf": True}),
    (4096, ("e2m1", 32), {"use_packed_ue8m0": True, "round_sf": True}),
]


def test_generic_declarations_derive_from_their_specialised_kernel():
    assert GENERIC, "no generic kernel is declared"
    for name, generic in GENERIC.items():
        spec = all_kernels()[generic.generic_of]
        runtime = [a.name for a in generic.runtime_axes]
        assert generic_kernel(spec.name) is generic
        assert generic.runtime_axes == tuple(spec.axis(n) for n in runtime)
        assert all(a.kind is int or (a.kind is str and a.choices) for a in generic.runtime_axes)
        assert generic.axes == tuple(a for a in spec.axes if a.name not in runtime)
        assert generic.args == (*spec.args, *(a.name for a in generic.runtime_axes))
        assert set(generic.dims) == set(spec.dims) | set(runtime)
        assert generic.ops == spec.ops and generic.tilings == spec.tilings
        assert importlib.import_module(generic.source).DECL is generic, name


def test_split_takes_the_runtime_axes_out_of_a_specialised_key():
    values = (5120, "bfloat16", "none", "none", "e2m1", 32, "fp32", "row", "cast", False)
    static, fixed = PER_TOKEN_CAST_GENERIC.split(PER_TOKEN_CAST, values)
    assert fixed == {"hidden": 5120} and static == values[1:]
    assert PER_TOKEN_CAST_GENERIC.key(static) == PER_TOKEN_CAST.key(values).replace("hidden=5120,", "")


def test_declarations_refuse_malformed_generic_kernels():
    with pytest.raises(ValueError, match="runtime axes must be integers or strings with a finite set of choices, not"):
        PER_TOKEN_CAST.generic("bad", "kernels_src.quant.per_token_cast_generic", ("stochastic",))
    with pytest.raises(ValueError, match="names both"):
        PER_TOKEN_CAST_GENERIC.replace(generic_of="")


# ---- the fallback, through the op ----


def trimmed_set(directory: Path, keep) -> Path:
    """The prebuilt manifest's entries that `keep(entry)` accepts, as an artifact set (no cubins: loads are faked)."""
    manifest = json.loads((PREBUILT / "manifest.json").read_text())
    manifest["variants"] = [e for e in manifest["variants"] if keep(e)]
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


@pytest.fixture
def served(monkeypatch, registry, fake_cuda, driver):  # noqa: F811 (the imported fixture)
    """per_token_cast on meta tensors against a registry of the sets on TKAOT_PATH; returns the driver's launches."""
    from tkaot._quant import casts

    monkeypatch.setattr(_op, "REGISTRY", registry)
    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(casts, "current_stream", lambda device: 0)
    monkeypatch.setattr(casts, "_PLANS", {})
    for kernels in casts._PER_TOKEN.values():
        monkeypatch.setattr(kernels, "cache", {})
    monkeypatch.delenv("TKAOT_STRICT", raising=False)
    monkeypatch.setenv("TKAOT_PATH", str(PREBUILT))
    return driver


def cast(hidden: int, *args, tokens: int = 3, **kwargs):
    return tkaot.quant.per_token_cast(torch.empty(tokens, hidden, dtype=torch.bfloat16, device="meta"), *args, **kwargs)


def launched(kernels: _op.OpKernels, key_values: tuple):
    """The Kernel behind the cached launcher of (device 0, *key_values)."""
    launcher = kernels.cache[(0, *key_values)]
    return getattr(launcher, "__self__", launcher).kernel


def values_of(hidden, fmt, group, sf="fp32"):
    return (hidden, "bfloat16", "none", "none", fmt, group, sf, "row", "cast", False)


def test_the_specialised_variant_is_preferred(served):
    kernels = importlib.import_module("tkaot._quant.casts")._PER_TOKEN[OP]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cast(7168, "e4m3", 128)
    assert launched(kernels, values_of(7168, "e4m3", 128)).kernel == "per_token_cast"


def test_a_missing_specialised_variant_runs_on_the_generic_one_with_one_warning(served):
    kernels = importlib.import_module("tkaot._quant.casts")._PER_TOKEN[OP]
    values = values_of(5120, "e2m1", 32)
    key, generic = PER_TOKEN_CAST.key(values), PER_TOKEN_CAST_GENERIC.key(values[1:])
    with pytest.warns(GenericVariantWarning) as caught:
        cast(5120, "e2m1", 32)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"no specialised per_token_cast variant [{key}] is built for sm90" in message
    assert f"generic per_token_cast_generic [{generic}]" in message and build_command("per_token_cast", key, "sm90") in message
    kernel = launched(kernels, values)
    assert (kernel.kernel, kernel.key) == ("per_token_cast_generic", generic)
    # once per variant and process; the op's hot path takes the same launcher, which passes the runtime axis
    # as the call's value, and the grid reads it: ceil(5120 / 512) segments by ceil(37 / 8) token blocks
    served.sizes = [SIZES[p.type] for p in kernel.spec.params]
    served.calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cast(5120, "e2m1", 32, tokens=37)
    (record,) = served.calls
    assert record[1] == FUNCTION and record[2] == (10, 5, 1)
    sent = {p.name: raw for p, raw in zip(kernel.spec.params, record[6])}
    assert struct.unpack("<i", sent["hidden"])[0] == 5120 and struct.unpack("<i", sent["num_tokens"])[0] == 37


def test_strict_mode_refuses_the_fallback(served, monkeypatch):
    monkeypatch.setenv("TKAOT_STRICT", "1")
    with pytest.raises(VariantNotBuilt) as refused:
        cast(5120, "e2m1", 32)
    assert refused.value.kernel == "per_token_cast" and "hidden=5120" in refused.value.key
    assert refused.value.command == build_command("per_token_cast", refused.value.key, "sm90")
    monkeypatch.setenv("TKAOT_STRICT", "yes")
    with pytest.raises(ValueError, match="TKAOT_STRICT='yes'"):
        cast(5120, "e2m1", 32)


def test_without_either_variant_the_error_names_the_specialised_one(served, tmp_path, monkeypatch):
    monkeypatch.setenv("TKAOT_PATH", str(trimmed_set(tmp_path / "set", lambda e: e["kernel"] != "per_token_cast_generic")))
    with pytest.raises(VariantNotBuilt) as refused:
        cast(5120, "e2m1", 32)
    assert refused.value.kernel == "per_token_cast" and refused.value.key.startswith("hidden=5120,")


@pytest.mark.parametrize(("hidden", "args", "kwargs"), ONCE_MISSING)
def test_calls_once_missing_resolve_to_generic_variants(served, hidden, args, kwargs):
    with pytest.warns(GenericVariantWarning, match="launching the generic per_token_cast_generic"):
        data, sf = cast(hidden, *args, **kwargs)
    fmt, group = args
    assert data.shape == (3, hidden // 2 if fmt == "e2m1" else hidden) and sf.shape[0] == 3
    (launcher,) = importlib.import_module("tkaot._quant.casts")._PER_TOKEN[OP].cache.values()
    assert getattr(launcher, "__self__", launcher).kernel.kernel == "per_token_cast_generic"


# ---- check ----


def fake_set(directory: Path, entries) -> Path:
    directory.mkdir(parents=True)
    manifest = {"schema": MANIFEST_SCHEMA, "arch": "sm90", "tkaot_version": tkaot.__version__, "variants": entries}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def test_check_reports_specialised_generic_and_missing(tmp_path):
    from tkaot._model_shapes import load_config, needed_variants, shape_tables

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 5120, "intermediate_size": 13824, "num_attention_heads": 40}))
    needed = [v for v in needed_variants(shape_tables(load_config(config))) if v.reason is None]
    casts_needed = [v for v in needed if v.kernel == "per_token_cast"]
    others = [v for v in needed if v.kernel != "per_token_cast"]
    assert casts_needed and others
    entry = lambda kernel, static: {"kernel": kernel, "key": all_kernels()[kernel].key(static.values()), "static": static}  # noqa: E731
    specialised = [entry(v.kernel, v.params) for v in others]
    generic = []
    for v in casts_needed:
        static, _ = PER_TOKEN_CAST_GENERIC.split(PER_TOKEN_CAST, v.values)
        generic.append(entry("per_token_cast_generic", dict(zip(PER_TOKEN_CAST_GENERIC.axis_names, static))))

    served = CliRunner().invoke(
        main, ["check", "--hf-config", str(config), "--artifacts", str(fake_set(tmp_path / "a", specialised + generic))]
    )
    assert served.exit_code == 0, served.output
    assert f"needs {len(needed)} variants of " in served.output and f"; 0 missing; {len(casts_needed)} generic" in served.output
    assert all(f"    generic per_token_cast {v.key}\n" in served.output for v in casts_needed)
    assert f"    specialise the generic ones: tkaot-build build --hf-config {config} --arch sm90 -j " in served.output
    listed = CliRunner().invoke(main, ["check", "--variants", "--hf-config", str(config), "--artifacts", str(tmp_path / "a")])
    assert listed.exit_code == 0 and all(f"    specialised {v.kernel} {v.key}" in listed.output for v in others)

    gap = CliRunner().invoke(main, ["check", "--hf-config", str(config), "--artifacts", str(fake_set(tmp_path / "b", specialised))])
    assert gap.exit_code == 1 and f"; {len(casts_needed)} missing" in gap.output
    assert all(f"    missing per_token_cast {v.key}" in gap.output for v in casts_needed) and " generic " not in gap.output


def test_topk_gate_256_experts_top6_runs_on_the_generic_gate(monkeypatch, registry, fake_cuda, driver):  # noqa: F811
    from tkaot._moe import ops

    serve_ops(monkeypatch, registry, [ops], [ops._TOPK], PREBUILT)
    scores = torch.empty(4097, 256, device="meta")
    with pytest.warns(GenericVariantWarning, match=r"no specialised topk_gate variant \[num_experts=256,num_topk=6,tiling=ballot4\]"):
        assert tkaot.moe.topk_gate(scores, 6).shape == (4097, 6)
    (launcher,) = ops._TOPK.cache.values()
    kernel = getattr(launcher, "__self__", launcher).kernel
    assert (kernel.kernel, kernel.key) == ("topk_gate_generic", "tiling=ballot4")
    driver.sizes = [SIZES[p.type] for p in kernel.spec.params]
    driver.calls.clear()
    tkaot.moe.topk_gate(scores, 6)
    (record,) = driver.calls
    sent = {p.name: raw for p, raw in zip(kernel.spec.params, record[6])}
    assert record[2] == (1025, 1, 1) and {n: struct.unpack("<i", sent[n])[0] for n in ("num_experts", "num_topk", "num_tokens")} == {
        "num_experts": 256,
        "num_topk": 6,
        "num_tokens": 4097,
    }
    # a specialised gate stays specialised
    tkaot.moe.topk_gate(torch.empty(5, 256, device="meta"), 8)
    launcher = ops._TOPK.cache[(0, 256, 8, "ballot4")]
    assert getattr(launcher, "__self__", launcher).kernel.kernel == "topk_gate"


# ---- swiglu: the generic kernel takes any hidden a multiple of 64 and either group ----

SWIGLU_OP = "tkaot.quant.swiglu_forward_and_per_token_cast"
# The formats the SwiGLU ops take: (fmt, num_per_channels, sf flags) -> the sf kind keyed
SWIGLU_FORMATS = [
    ("bf16", None, {}, "none"), ("fp32", None, {}, "none"), ("e4m3", 32, {}, "fp32"), ("e4m3", 128, {}, "fp32"),
    ("e4m3", 128, {"round_sf": True}, "pow2"), ("e4m3", 32, {"round_sf": True, "use_packed_ue8m0": True}, "ue8m0"),
    ("e4m3", 128, {"round_sf": True, "use_packed_ue8m0": True, "use_tma_aligned_col_major_sf": True}, "ue8m0"),
]  # fmt: skip
# Widths no specialised tiling takes (not multiples of 256: DeepSeek-V2-Lite's and Qwen1.5-MoE's 1408, ...), and one
# it takes that the default set does not build
SWIGLU_WIDTHS = [64, 320, 1408, 2880, 5120]


def swiglu(hidden: int, fmt: str, group, tokens: int = 3, dtype=torch.bfloat16, **kwargs):
    x = torch.empty(tokens, 2 * hidden, dtype=dtype, device="meta")
    if fmt in ("bf16", "fp32") and not kwargs.pop("cast", False):
        return tkaot.quant.swiglu_forward(x, fmt, **kwargs)
    return tkaot.quant.swiglu_forward_and_per_token_cast(x, fmt, group, **kwargs)


@pytest.fixture
def swiglu_on_the_default_set(monkeypatch, fake_cuda):
    """The SwiGLU ops on meta tensors against a registry holding exactly the default set's swiglu and swiglu_generic
    variants (read from the shape set, no manifest needed); returns the (kernel, key, fixed) of each bind."""
    from build_tools.sweep import load_shapeset
    from tkaot._quant import swiglu as ops

    built = {(v.kernel, v.key) for v in load_shapeset("default") if v.kernel in ("swiglu", "swiglu_generic")}
    bound: list[tuple[str, str, dict]] = []

    class Built:
        def __init__(self, kernel, key):
            self.kernel, self.key = kernel, key

        def bind(self, args, fixed=None):
            bound.append((self.kernel, self.key, dict(fixed or {})))
            return lambda device, stream, *values: None

    def kernel(op, name, key, device):
        if (name, key) not in built:
            raise VariantNotBuilt(op, name, key, [], build_command(name, key, "sm90"), [])
        return Built(name, key)

    monkeypatch.setattr(_op, "REGISTRY", SimpleNamespace(kernel=kernel, device_arch=lambda device: "sm90"))
    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(ops, "current_stream", lambda device: 0)
    monkeypatch.setattr(ops._SWIGLU, "cache", {})
    monkeypatch.delenv("TKAOT_STRICT", raising=False)
    return bound


@pytest.mark.parametrize("hidden", SWIGLU_WIDTHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("clamp", [None, 7.5])
def test_every_swiglu_call_at_any_width_resolves_to_a_default_set_generic_variant(swiglu_on_the_default_set, hidden, dtype, clamp):
    from tkaot._quant.kernels import SWIGLU_TILINGS

    tiling = SWIGLU_TILINGS["default" if clamp is None else "clamp"]
    for fmt, group, flags, sf in SWIGLU_FORMATS:
        if group and hidden % group:
            continue
        swiglu_on_the_default_set.clear()
        count = None if clamp is None else torch.empty(4, dtype=torch.int64, device="meta")
        kwargs = {**flags, "clamp_value": clamp, "clamped_count": count}
        with pytest.warns(GenericVariantWarning, match=r"launching the generic swiglu_generic"):
            out = swiglu(hidden, fmt, group, dtype=dtype, **kwargs)
        dtype_name = {torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
        key = f"dtype={dtype_name},fmt={fmt},sf={sf},tiling={tiling}"
        assert swiglu_on_the_default_set == [("swiglu_generic", key, {"hidden": hidden, "group": group or 0})], (fmt, group, flags)
        assert (out[0] if group else out).shape == (3, hidden)


def test_a_swiglu_width_no_specialised_tiling_takes_warns_without_a_build_command(swiglu_on_the_default_set):
    from tkaot._quant.kernels import SWIGLU

    values = (1408, "bfloat16", "e4m3", 128, "fp32", "wscc2v9b1g")
    with pytest.warns(GenericVariantWarning) as caught:
        swiglu(1408, "e4m3", 128)
    (warning,) = caught
    message = str(warning.message)
    assert f"no specialised swiglu variant can serve [{SWIGLU.key(values)}] (hidden=1408 is not supported: a multiple of 256" in message
    assert "launching the generic swiglu_generic [dtype=bfloat16,fmt=e4m3,sf=fp32,tiling=wscc2v9b1g]" in message
    assert "tkaot-build" not in message
    # a width the specialised kernel takes but the default set does not build: the command that builds it
    with pytest.warns(GenericVariantWarning, match=r"tkaot-build build --op swiglu --set hidden=5120 "):
        swiglu(5120, "e4m3", 128)
    # the specialised variant where it is built
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        swiglu(4096, "e4m3", 128)
        swiglu(1408, "e4m3", 128)  # once per variant and process
    assert [b[0] for b in swiglu_on_the_default_set] == ["swiglu_generic", "swiglu_generic", "swiglu"]


def test_strict_mode_refuses_swiglu_widths_only_the_generic_kernel_takes(swiglu_on_the_default_set, monkeypatch):
    monkeypatch.setenv("TKAOT_STRICT", "1")
    with pytest.raises(VariantNotBuilt) as refused:
        swiglu(1408, "bf16", None)
    assert refused.value.kernel == "swiglu" and refused.value.key.startswith("hidden=1408,")
    assert refused.value.command.startswith("(none: hidden=1408 is not supported") and "swiglu_generic" in refused.value.command
    with pytest.raises(VariantNotBuilt) as refused:
        swiglu(5120, "bf16", None)
    assert refused.value.command == build_command("swiglu", refused.value.key, "sm90")
    assert swiglu_on_the_default_set == []


def test_swiglu_widths_once_refused_launch_the_generic_variant_with_its_runtime_axes(served, monkeypatch):
    """Against the prebuilt set (its swiglu_generic entries), through the launcher: the call's hidden and group are
    sent, and the grid covers the rows' chunks (32 bf16 columns a thread, 128 threads a block)."""
    from tkaot._quant import swiglu as ops

    monkeypatch.setattr(ops, "current_stream", lambda device: 0)
    monkeypatch.setattr(ops._SWIGLU, "cache", {})
    with pytest.warns(GenericVariantWarning, match="launching the generic swiglu_generic"):
        swiglu(1408, "e4m3", 128, tokens=37, round_sf=True, use_packed_ue8m0=True)
    (launcher,) = {id(v): v for v in ops._SWIGLU.cache.values()}.values()  # cached under the op's key and the kernel's
    kernel = getattr(launcher, "__self__", launcher).kernel
    assert (kernel.kernel, kernel.key) == ("swiglu_generic", "dtype=bfloat16,fmt=e4m3,sf=ue8m0,tiling=wscc2v9b1g")
    served.sizes = [SIZES[p.type] for p in kernel.spec.params]
    served.calls.clear()
    swiglu(1408, "e4m3", 128, tokens=37, round_sf=True, use_packed_ue8m0=True)
    (record,) = served.calls
    sent = {p.name: raw for p, raw in zip(kernel.spec.params, record[6])}
    assert record[2] == (-(-37 * 1408 // 32 // 128), 1, 1)
    assert {n: struct.unpack("<i", sent[n])[0] for n in ("hidden", "group", "num_rows")} == {"hidden": 1408, "group": 128, "num_rows": 37}
