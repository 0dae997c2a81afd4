"""tkaot-build through click's test runner."""

import json

from click.testing import CliRunner

from build_tools.cli import main


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_ops_lists_kernels_and_axes():
    result = run("ops")
    assert result.exit_code == 0
    assert "rmsnorm" in result.output and "tkaot.quant.norm_forward" in result.output
    assert "with_residual" in result.output and "bfloat16|float32" in result.output


def test_build_inspect_verify(tmp_path, build_cache):
    out = tmp_path / "art"
    sets = ["hidden=1536", "dtype=bfloat16|float32", "with_weight=true", "with_residual=false", "with_rstd=false"]
    result = run("build", "--op", "rmsnorm", *(a for s in sets for a in ("--set", s)), "--out", str(out), "-j", "2")
    assert result.exit_code == 0, result.output
    assert "2 variants" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["variants"]) == 2
    table = run("inspect", str(out))
    assert table.exit_code == 0 and table.output.count("rmsnorm ") == 2 and "hidden=1536" in table.output
    ok = run("verify", str(out))
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
