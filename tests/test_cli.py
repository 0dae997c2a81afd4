"""tkaot-build through click's test runner: both wings, and the serving wing without the build extra."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from tkaot._model_shapes import load_config, needed_variants, shape_tables
from tkaot._spec import MANIFEST_SCHEMA
from tkaot.cli import WIDTH, main

ROOT = Path(__file__).resolve().parent.parent
PREBUILT = ROOT / "prebuilt"
# Mixtral-8x7B's shape fields with 6 experts (a made-up model): top-2 of a count that no moe_topk_gate variant takes
# (TileKernels' gate asserts a multiple of 4 too)
SIX_EXPERTS = {
    "_name_or_path": "example/mixtral-6-experts",
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 6,
    "num_experts_per_tok": 2,
}


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_ops_lists_kernels_and_axes():
    result = run("ops")
    assert result.exit_code == 0
    assert "rmsnorm" in result.output and "tkaot.quant.norm_forward" in result.output
    assert "with_residual" in result.output and "bfloat16|float32" in result.output


def test_build_inspect_verify(tmp_path, build_cache):
    out = tmp_path / "art" / "sm90"  # inspect and verify take the root, as TKAOT_PATH does
    sets = ["hidden=1536", "dtype=bfloat16|float32", "with_weight=true", "with_residual=false", "with_rstd=false"]
    result = run("build", "--op", "rmsnorm", *(a for s in sets for a in ("--set", s)), "--out", str(out), "-j", "2")
    assert result.exit_code == 0, result.output
    assert "2 variants" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["variants"]) == 2
    table = run("inspect", str(out.parent))
    assert table.exit_code == 0 and table.output.count("rmsnorm ") == 2 and "hidden=1536" in table.output
    ok = run("verify", str(out.parent))
    assert ok.exit_code == 0 and "sm_90a" in ok.output
    cubin = next((out / "cubins").iterdir())
    cubin.write_bytes(b"\x7fELF" + cubin.read_bytes()[4:-1])
    bad = run("verify", str(out))
    assert bad.exit_code != 0 and "sha256 mismatch" in bad.output


def test_build_errors_are_clear(tmp_path):
    r = run("build", "--op", "rmsnorm", "--set", "hidden=100", "--set", "dtype=bfloat16", "--out", str(tmp_path))
    assert r.exit_code != 0 and "multiple of 16" in r.output
    r = run("build", "--out", str(tmp_path))
    assert r.exit_code != 0 and "exactly one of" in r.output
    r = run("build", "--shapeset", "nope", "--out", str(tmp_path))
    assert r.exit_code != 0 and "no shape set" in r.output
    r = run("build", "--shapeset", "default", "--arch", "sm75", "--out", str(tmp_path))
    assert r.exit_code != 0 and "unknown arch" in r.output
    r = run("inspect", str(tmp_path))
    assert r.exit_code != 0 and "no manifest.json" in r.output
    for arch in ("sm90", "sm100"):
        (tmp_path / arch).mkdir()
        (tmp_path / arch / "manifest.json").write_text("{}")
    r = run("inspect", str(tmp_path))
    assert r.exit_code != 0 and "holds sets for sm100, sm90: pick one with --arch" in r.output


def test_inspect_and_verify_take_a_root_and_fit_a_terminal():
    manifest = json.loads((PREBUILT / "sm90" / "manifest.json").read_text())
    several = run("inspect", str(PREBUILT))  # a root holding sm90/ and sm100/: which one?
    assert several.exit_code != 0 and "pick one with --arch" in several.output
    table = run("inspect", str(PREBUILT), "--arch", "sm90")  # a root holding sm90/manifest.json
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert max(map(len, lines)) <= WIDTH, max(lines, key=len)
    assert f"{len(manifest['variants'])} variants" in lines[0] and "built with nvcc" in lines[1]
    unwrapped = table.output.replace("\n    ", "")  # long keys (130-odd characters) wrap after a comma
    assert all(f"{e['kernel']} {e['key']}".rstrip() in unwrapped for e in manifest["variants"])  # a kernel of no static axes: ""
    ok = run("verify", str(PREBUILT), "--arch", "sm90")
    assert ok.exit_code == 0 and f"{len(manifest['variants'])} variants" in ok.output
    every = run("verify", str(PREBUILT))  # without --arch: each arch's set of the root
    assert every.exit_code == 0 and every.output.count("ok: ") == 3 and "sm_100a" in every.output and "sm_90a" in every.output
    assert "ascend950: 1493 variants, every file matches its sha256" in every.output  # its sources (binaries: CANN)


def fake_set(directory: Path, variants) -> Path:
    """A manifest (no cubins: check reads only the manifest) holding `variants` (NeededVariant)."""
    directory.mkdir(parents=True)
    entries = [{"kernel": v.kernel, "key": v.key, "static": v.params} for v in variants]
    manifest = {"schema": MANIFEST_SCHEMA, "arch": "sm90", "tkaot_version": "0.1.0", "variants": entries}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def test_check_reports_unsupported_not_missing_and_build_agrees(tmp_path, monkeypatch):
    """Issue 21.1: one rule (the declarations' axes) for check and build; exit 1 only on missing."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SIX_EXPERTS))
    needed = needed_variants(shape_tables(load_config(config)))
    buildable = [v for v in needed if v.reason is None]
    unsupported = "unsupported moe_topk_gate num_experts=6,num_topk=2,tiling=ballot4: num_experts=6 is not supported: a multiple of 4"
    complete = run("check", "--hf-config", config, "--artifacts", fake_set(tmp_path / "all", buildable))
    assert complete.exit_code == 0, complete.output
    assert f"example/mixtral-6-experts ({config}): needs {len(needed)} variants" in complete.output
    assert "; 0 missing; 1 unsupported" in complete.output and unsupported in complete.output
    assert "moe_topk_gate: keep your framework's router" in complete.output and "tkaot.moe.topk_gate" in complete.output

    gap = run("check", "--hf-config", config, "--artifacts", fake_set(tmp_path / "none", []))
    assert gap.exit_code == 1 and f"{len(buildable)} variants missing" in gap.output
    missing = {line.split()[1:3] and tuple(line.split()[1:3]) for line in gap.output.splitlines() if line.startswith("    missing ")}
    assert ("moe_topk_gate", "num_experts=6,num_topk=2,tiling=ballot4") not in missing
    assert f"tkaot-build build --hf-config {config} --arch sm90 -j {len(os.sched_getaffinity(0))} --out DIR" in gap.output

    # the suggested build makes exactly what check called missing, and skips the unsupported key with the same line
    import build_tools.build

    built = []
    monkeypatch.setattr(build_tools.build, "build_variants", lambda variants, *a, **k: built.extend(variants) or fake_report())
    result = run("build", "--hf-config", config, "-j", "2", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert {(v.kernel, v.key) for v in built} == missing
    assert f"skipped, {unsupported}" in result.output


def fake_report(built=0, cached=0):
    from build_tools.build import BuildReport

    return BuildReport(built, cached, {"variants": []})


def test_build_off_a_terminal_prints_progress_lines(tmp_path, monkeypatch):
    """Issue 21.4: into a log, a line at least every 30 s with done/total, rate and ETA (nothing compiles here)."""
    import build_tools.build
    import build_tools.cli

    now = [0.0]
    monkeypatch.setattr(build_tools.cli, "_clock", lambda: now[0])
    monkeypatch.setattr(build_tools.cli, "_selected", lambda *args: list(range(100)))

    def fake_build(variants, out_dir, arch, jobs, cache, progress):
        for i, v in enumerate(variants):
            now[0] += 10.0  # 10 s a variant: a line every third variant
            progress(v, i < 10)
        return fake_report(90, 10)

    monkeypatch.setattr(build_tools.build, "build_variants", fake_build)
    result = run("build", "--op", "rmsnorm", "-j", "2", "--out", tmp_path / "out")  # CliRunner's stderr is no TTY
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("built ") and "/100" in line]
    assert len(lines) == 34  # every 30 s, and the last one
    assert lines[0] == "built 3/100 (3 from cache) in 30 s, 0.0 variants/min, ETA unknown"
    assert lines[10] == "built 33/100 (10 from cache) in 5.5 min, 4.2 variants/min, ETA 16.0 min"
    assert lines[-1].startswith("built 100/100 (10 from cache) in 16.7 min") and lines[-1].endswith("ETA done")


def test_plan_columns_align_and_say_core_time():
    result = run("plan", "--shapeset", "default", "-j", "2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("kernel"))
    rows = lines[head : next(i for i, line in enumerate(lines) if line.startswith("estimated"))]
    assert "core-time" in rows[0] and len({len(r) for r in rows}) == 1, rows  # right-aligned columns end together
    assert "wall on 2 jobs" in result.output and "core-time / jobs" in result.output


BLOCK_BUILD_EXTRA = textwrap.dedent(
    """
    import sys

    class BlockBuildExtra:  # stands in for a runtime-only install: neither TileLang nor build_tools importable
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tilelang", "build_tools", "kernels_src"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, BlockBuildExtra())
    from tkaot.cli import main

    main(prog_name="tkaot-build")
    """
)


def without_build_extra(*argv, env=None):
    """tkaot-build in a subprocess that cannot import the build wing (a runtime-only venv is tests/test_wheels.py's job)."""
    environ = {k: v for k, v in os.environ.items() if k != "TKAOT_PATH"} | (env or {})
    return subprocess.run([sys.executable, "-c", BLOCK_BUILD_EXTRA, *map(str, argv)], capture_output=True, text=True, cwd=ROOT, env=environ)


def test_without_the_build_extra(tmp_path):
    """Issue 21.2: build commands say in one line what to install; the serving commands work (check among them)."""
    helped = without_build_extra("--help")
    assert helped.returncode == 0, helped.stderr
    assert "ops, plan and build need the build extra" in " ".join(helped.stdout.split())
    assert helped.stdout.count("[needs tkaot[build]]") == 5  # ops, plan, build, wheel, merge: all need build_tools
    for argv in (["ops"], ["plan", "--shapeset", "default"], ["build", "--hf-config", "x.json", "-j", "8", "--out", "d"], ["wheel", "d"]):
        refused = without_build_extra(*argv)
        assert refused.returncode == 1 and refused.stdout == "", refused.stderr
        assert refused.stderr.splitlines() == [f"Error: tkaot-build {argv[0]} needs the build extra: pip install 'tkaot[build]'"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SIX_EXPERTS))
    needed = [v for v in needed_variants(shape_tables(load_config(config))) if v.reason is None]
    checked = without_build_extra("check", "--hf-config", config, "--artifacts", fake_set(tmp_path / "set", needed))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "0 missing; 1 unsupported" in checked.stdout


@pytest.mark.parametrize("entry", ["missing", "empty"])
def test_sets_warns_about_a_useless_path_entry_once(tmp_path, entry):
    """Issue 21.6: a TKAOT_PATH entry that does not exist or holds no set is warned about, once."""
    (tmp_path / "empty").mkdir()
    listed = without_build_extra("sets", env={"TKAOT_PATH": f"{tmp_path / entry}{os.pathsep}{tmp_path / entry}"})
    assert listed.returncode == 0, listed.stderr
    why = "does not exist" if entry == "missing" else "holds no artifact set"
    assert listed.stderr.count(f"TKAOT_PATH entry {tmp_path / entry} {why}") == 1, listed.stderr


def test_sets_fails_when_a_set_is_refused(tmp_path):
    old = tmp_path / "old" / "sm90"
    old.mkdir(parents=True)
    (old / "manifest.json").write_text(json.dumps({"schema": MANIFEST_SCHEMA, "arch": "sm90", "tkaot_version": "0.0.1", "variants": []}))
    listed = without_build_extra("sets", env={"TKAOT_PATH": str(tmp_path / "old")})
    assert listed.returncode == 1 and "REFUSED" in listed.stdout and "tkaot 0.0.1" in listed.stdout
    assert "1 of 2 artifact sets refused" in listed.stderr
