"""Model configs -> shape sets: the mapping registry, the presets, hf_config in TOML, plan and check."""

import json

import pytest
from click.testing import CliRunner

from build_tools import model_shapes
from build_tools.model_shapes import CONFIGS_DIR, ModelConfig, load_config, norm_widths, shape_tables, static_keys
from build_tools.ops import format_value, kernel_axes
from build_tools.sweep import SHAPESETS_DIR, load_shapeset, model_shapeset, read_shapeset, sweep
from tkaot.cli import main

PRESETS = {
    # preset -> the RMSNorm widths its forward pass applies
    "deepseek-v3": [512, 1536, 7168],  # kv_a / q_a layernorms, hidden
    "deepseek-v2-lite": [512, 2048],  # no q_lora_rank
    "qwen3-30b-a3b": [128, 2048],  # per-head q/k norm over head_dim
    "qwen3-235b-a22b": [128, 4096],
    "llama-3-8b": [4096],
}
DEFAULT_HIDDEN = {512, 1536, 2048, 4096, 5120, 7168, 8192}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def rmsnorm_keys(variants):
    return {v.key for v in variants if v.kernel == "rmsnorm"}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_is_its_model_config(preset):
    variants = load_shapeset(preset)
    assert sorted({v.params["hidden"] for v in variants if v.kernel == "rmsnorm"}) == PRESETS[preset]
    assert norm_widths(load_config(CONFIGS_DIR / f"{preset}.json")) == PRESETS[preset]
    # bf16 and fp32, with and without weight, residual and rstd: 16 variants per width
    assert len(rmsnorm_keys(variants)) == 16 * len(PRESETS[preset])
    assert variants == sweep(model_shapeset(CONFIGS_DIR / f"{preset}.json"))


def test_default_set_is_presets_plus_hidden_list():
    default = rmsnorm_keys(load_shapeset("default"))
    union = set().union(*(rmsnorm_keys(load_shapeset(p)) for p in PRESETS))
    assert union <= default
    widths = {int(k.split(",")[0].split("=")[1]) for k in default}
    assert widths == DEFAULT_HIDDEN | {w for ws in PRESETS.values() for w in ws}
    assert len(default) == 16 * len(widths) == 128


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_mappings_name_every_axis_and_match_the_sweep(preset):
    """check compares without importing kernels: its axes-free keys must equal the real Variants'."""
    tables = shape_tables(load_config(CONFIGS_DIR / f"{preset}.json"))
    for kernel, kernel_tables in tables.items():
        names = [a.name for a in kernel_axes(kernel)]
        for table in kernel_tables:
            assert list(table) == names, f"{kernel} mapping must name every axis in AXES order"
    expected = {(v.kernel, frozenset((k, format_value(x)) for k, x in v.static)): v.key for v in sweep(tables)}
    assert static_keys(tables) == expected


def test_mapping_for_a_kernel_not_written_yet_contributes_nothing(monkeypatch):
    monkeypatch.setitem(model_shapes.MAPPINGS, "not_a_kernel_yet", lambda model: [{"hidden": [model.hidden_size]}])
    tables = shape_tables(load_config(CONFIGS_DIR / "llama-3-8b.json"))
    assert "not_a_kernel_yet" not in tables and "rmsnorm" in tables
    with pytest.raises(RuntimeError, match="two model-shape mappings"):
        model_shapes.mapping("rmsnorm")(lambda model: [])


def test_config_aliases_and_defaults():
    qwen = ModelConfig.from_dict({"model_type": "qwen3_moe", "hidden_size": 2048, "num_attention_heads": 32, "num_experts": 128})
    assert qwen.head_dim == 64 and qwen.qk_norm and qwen.num_experts == 128 and not qwen.is_mla
    ds = load_config(CONFIGS_DIR / "deepseek-v3.json")
    assert (ds.num_experts, ds.experts_per_token, ds.n_group, ds.topk_group, ds.rope_head_dim) == (256, 8, 8, 4, 64)
    assert ds.is_mla and not ds.qk_norm
    nested = ModelConfig.from_dict({"model_type": "vlm", "text_config": {"hidden_size": 3072, "num_attention_heads": 24}})
    assert nested.hidden_size == 3072 and nested.head_dim == 128
    assert norm_widths(ModelConfig.from_dict({"hidden_size": 1024, "use_qk_norm": True, "head_dim": 96})) == [96, 1024]


def test_bad_configs_are_clear(tmp_path):
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_dict({"model_type": "x"})
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_config(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_toml_hf_config_key(tmp_path):
    config = tmp_path / "configs" / "tiny.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 640, "num_attention_heads": 5}))
    toml = tmp_path / "sets" / "tiny.toml"
    toml.parent.mkdir()
    toml.write_text('hf_config = "../configs/tiny.json"\n[[rmsnorm]]\nhidden = 256\ndtype = "float32"\n')
    variants = [v for v in sweep(read_shapeset(toml)) if v.kernel == "rmsnorm"]
    assert {v.params["hidden"] for v in variants} == {256, 640} and len(variants) == 16 + 8
    toml.write_text('hf_config = "../configs/none.json"\n')
    with pytest.raises(ValueError, match=r"tiny.toml: hf_config: cannot read"):
        read_shapeset(toml)
    toml.write_text("hf_config = 3\n")
    with pytest.raises(ValueError, match="a path or a list of paths"):
        read_shapeset(toml)


def test_plan_counts_without_building(tmp_path):
    result = run("plan", "--hf-config", CONFIGS_DIR / "deepseek-v3.json", "-j", "2", "--cache-dir", tmp_path / "empty-cache")
    assert result.exit_code == 0, result.output
    expected = len(sweep(model_shapeset(CONFIGS_DIR / "deepseek-v3.json")))
    assert f"{expected} variants for sm90" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith("rmsnorm"))
    assert row.split()[1:3] == ["48", "0"]  # 48 variants, none cached
    assert "estimated:" in result.output and "MB of cubins" in result.output
    assert not (tmp_path / "empty-cache").exists()  # plan builds nothing
    r = run("plan", "--shapeset", "default", "--hf-config", CONFIGS_DIR / "deepseek-v3.json")
    assert r.exit_code != 0 and "exactly one of" in r.output


def test_build_from_hf_config_skips_what_no_kernel_builds(tmp_path, build_cache):
    config = tmp_path / "wide.json"
    # 12288 is past rmsnorm's largest hidden size; its q/k head norm (96) is buildable
    config.write_text(json.dumps({"model_type": "qwen3", "hidden_size": 12288, "num_attention_heads": 128, "head_dim": 96}))
    out = tmp_path / "art"
    result = CliRunner().invoke(main, ["build", "--hf-config", str(config), "--shard", "0/16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "skipped, unsupported rmsnorm hidden=12288,dtype=bfloat16," in result.output
    assert "hidden=12288 is not supported" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["variants"], "the shard builds something"
    assert not any(e["kernel"] == "rmsnorm" and e["static"]["hidden"] == 12288 for e in manifest["variants"])


def test_check_reports_missing_variants(tmp_path):
    prebuilt = SHAPESETS_DIR.parent.parent / "prebuilt" / "sm90"
    ok = run("check", "--hf-config", CONFIGS_DIR / "qwen3-30b-a3b.json", "--artifacts", prebuilt)
    assert ok.exit_code == 0, ok.output
    assert f"{CONFIGS_DIR / 'qwen3-30b-a3b.json'}: needs" in ok.output and "; 0 missing" in ok.output
    assert "rmsnorm" in ok.output and "swiglu" in ok.output
    config = tmp_path / "odd.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 640, "num_attention_heads": 5}))
    # no rmsnorm of 640 is specialised: the generic kernel serves it, and check says so
    served = CliRunner().invoke(main, ["check", "--hf-config", str(config), "--artifacts", str(prebuilt)])
    assert served.exit_code == 0 and "0 missing" in served.output
    assert "generic rmsnorm hidden=640,dtype=bfloat16,with_weight=false,with_residual=false,with_rstd=false" in served.output
    # without the generic kernel it is missing
    manifest = json.loads((prebuilt / "manifest.json").read_text())
    manifest["variants"] = [e for e in manifest["variants"] if e["kernel"] != "rmsnorm_generic"]
    trimmed = tmp_path / "trimmed"
    trimmed.mkdir()
    (trimmed / "manifest.json").write_text(json.dumps(manifest))
    gap = CliRunner().invoke(main, ["check", "--hf-config", str(config), "--artifacts", str(trimmed)])
    assert gap.exit_code == 1
    assert f"{config}: needs" in gap.output
    assert (
        "missing rmsnorm hidden=640,dtype=bfloat16,with_weight=false,with_residual=false,with_rstd=false" in gap.output
        and f"--hf-config {config}" in gap.output
    )
    assert "variants missing" in gap.output


def test_mapped_tilings_are_the_ones_the_ops_launch():
    from tkaot._moe import ops as moe_ops
    from tkaot._quant import fused as _fused

    assert model_shapes.SWIGLU_TILING == _fused.SWIGLU_TILING
    assert model_shapes.SWIGLU_CLAMP_TILING == _fused.SWIGLU_CLAMP_TILING
    assert model_shapes.NORM_CAST_TILING == _fused.NORM_CAST_TILING
    assert model_shapes.NORM_CAST_RESIDUAL_TILING == _fused.NORM_CAST_RESIDUAL_TILING
    assert model_shapes.GATE_TILING == moe_ops._GATE_TILING == moe_ops._TOPK_TILING


def test_every_family_is_mapped_for_a_moe_model():
    model = model_shapes.load_config(model_shapes.CONFIGS_DIR / "deepseek-v3.json")
    tables = model_shapes.shape_tables(model)
    assert {"rmsnorm", "per_token_cast", "swiglu", "norm_cast", "rotary", "moe_topk_gate", "topk_gate"} <= set(tables)
    assert tables["swiglu"][0]["hidden"] == [2048, 18432]
    assert tables["rotary"][0]["rot_dim"] == [64]
    assert {"num_experts": [8], "num_topk": [4], "tiling": ["ballot4"]} in tables["topk_gate"]
    dense = model_shapes.load_config(model_shapes.CONFIGS_DIR / "llama-3-8b.json")
    assert "moe_topk_gate" not in model_shapes.shape_tables(dense)
