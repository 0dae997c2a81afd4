"""Wheels: the PEP 427 writer, the runtime wheels (pure, and with the compiled launcher), artifact wheels,
custom sets, precedence, the version lock, and installs into fresh virtual environments with no index."""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import tkaot
from build_tools import ext
from build_tools.wheel import WheelError, artifact_wheel, platform_tag, runtime_wheel, tkaot_version
from tkaot import registry as reg
from tkaot.cli import main
from tkaot.errors import ArtifactError

ROOT = Path(__file__).resolve().parent.parent
PREBUILT = ROOT / "prebuilt" / "sm90"
CONFIGS = ROOT / "build_tools" / "model_configs"
KEY = "hidden=512,dtype=bfloat16,with_weight=true,with_residual=true,with_rstd=true"


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    return out, runtime_wheel(out), artifact_wheel(PREBUILT, out, expect_version=tkaot.__version__)


@pytest.fixture(scope="module")
def platform_wheel(dist):
    """The runtime wheel with the compiled launcher, beside the others in dist (`make test` builds the .so first)."""
    if not ext.TARGET.exists() or ext.stale():
        pytest.skip("tkaot/_launch.abi3.so is not built (make ext)")
    return runtime_wheel(dist[0], ext.TARGET)


def small_set(dst: Path, keys=(KEY,), **manifest_changes) -> Path:
    """A copy of prebuilt/sm90 cut down to `keys`."""
    manifest = json.loads((PREBUILT / "manifest.json").read_text())
    manifest["variants"] = [e for e in manifest["variants"] if e["key"] in keys]
    manifest.update(manifest_changes)
    (dst / "cubins").mkdir(parents=True)
    for e in manifest["variants"]:
        shutil.copy(PREBUILT / "cubins" / f"{e['cubin']}.cubin", dst / "cubins")
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def unpack(wheel: Path, site: Path) -> Path:
    """What pip does with a pure wheel: unzip it into site-packages."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_wheels_are_well_formed(dist):
    _, runtime, artifacts = dist
    assert runtime.name == f"tkaot-{tkaot.__version__}-py3-none-any.whl"
    assert artifacts.name == f"tkaot_sm90-{tkaot.__version__}-py3-none-any.whl"
    for wheel in (runtime, artifacts):
        files = members(wheel)
        dist_info = next(n.split("/")[0] for n in files if n.endswith(".dist-info/WHEEL"))
        assert b"Root-Is-Purelib: true" in files[f"{dist_info}/WHEEL"] and b"Tag: py3-none-any" in files[f"{dist_info}/WHEEL"]
        rows = [line.split(",") for line in files[f"{dist_info}/RECORD"].decode().splitlines()]
        assert sorted(r[0] for r in rows) == sorted(files) and rows[-1] == [f"{dist_info}/RECORD", "", ""]
        for name, digest, size in rows[:-1]:
            data = files[name]
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
    runtime_files = members(runtime)
    assert not [n for n in runtime_files if n.endswith(".cubin") or n.startswith("prebuilt/") or n.startswith("tests/")]
    # nothing at top level but tkaot: the build wing rides under tkaot/_build_wing (issue 21.3)
    assert {n.split("/")[0] for n in runtime_files} == {"tkaot", f"tkaot-{tkaot.__version__}.dist-info"}
    wing = "tkaot/_build_wing/build_tools"
    assert f"{wing}/model_configs/deepseek-v3.json" in runtime_files and f"{wing}/shapesets/default.toml" in runtime_files
    assert f"{wing}/cli.py" in runtime_files and "tkaot/_build_wing/kernels_src/pdl.py" in runtime_files
    meta = runtime_files[f"tkaot-{tkaot.__version__}.dist-info/METADATA"].decode()
    assert f'Requires-Dist: tkaot-sm90=={tkaot.__version__}; extra == "sm90"' in meta
    assert "Provides-Extra: sm100" in meta and "Provides-Extra: ascend950" in meta
    assert 'Requires-Dist: tilelang==0.1.15; extra == "build"' in meta and "Requires-Dist: torch>=2.4\n" in meta
    assert b"tkaot-build = tkaot.cli:main" in runtime_files[f"tkaot-{tkaot.__version__}.dist-info/entry_points.txt"]
    art_files = members(artifacts)
    manifest = json.loads(art_files["tkaot_sm90/manifest.json"])
    assert {f"tkaot_sm90/cubins/{e['cubin']}.cubin" for e in manifest["variants"]} == {n for n in art_files if n.endswith(".cubin")}
    assert f'__version__ = "{tkaot.__version__}"' in art_files["tkaot_sm90/__init__.py"].decode()
    assert f"Requires-Dist: tkaot=={tkaot.__version__}\n" in art_files[f"tkaot_sm90-{tkaot.__version__}.dist-info/METADATA"].decode()


def test_platform_wheel_is_the_runtime_plus_the_extension(dist, platform_wheel):
    _, runtime, _ = dist
    data = ext.TARGET.read_bytes()
    tag = f"cp311-abi3-{platform_tag(data)}"
    assert platform_wheel.name == f"tkaot-{tkaot.__version__}-{tag}.whl"
    assert tag.startswith("cp311-abi3-manylinux_2_17_")  # nothing newer than glibc 2.17 needed
    files, pure = members(platform_wheel), members(runtime)
    dist_info = f"tkaot-{tkaot.__version__}.dist-info"
    assert files["tkaot/_launch.abi3.so"] == data
    assert f"Root-Is-Purelib: false\nTag: {tag}\n".encode() in files[f"{dist_info}/WHEEL"]
    same = [n for n in pure if not n.endswith(("/WHEEL", "/RECORD"))]
    assert sorted(files) == sorted([*pure, "tkaot/_launch.abi3.so"]) and all(files[n] == pure[n] for n in same)
    with zipfile.ZipFile(platform_wheel) as zf:
        assert zf.getinfo("tkaot/_launch.abi3.so").external_attr >> 16 == 0o100755
    rows = files[f"{dist_info}/RECORD"].decode().splitlines()
    assert any(r.startswith("tkaot/_launch.abi3.so,sha256=") for r in rows)


def test_wheels_are_reproducible(dist, tmp_path):
    _, runtime, artifacts = dist
    assert runtime_wheel(tmp_path).read_bytes() == runtime.read_bytes()
    assert artifact_wheel(PREBUILT, tmp_path).read_bytes() == artifacts.read_bytes()
    if ext.TARGET.exists() and not ext.stale():
        first = runtime_wheel(tmp_path / "a", ext.TARGET)
        assert runtime_wheel(tmp_path / "b", ext.TARGET).read_bytes() == first.read_bytes()


def test_one_version_everywhere():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == tkaot.__version__ == tkaot_version()
    for arch in ("sm90", "sm100", "ascend950"):
        assert project["optional-dependencies"][arch] == [f"tkaot-{arch}=={tkaot.__version__}"]
    assert json.loads((PREBUILT / "manifest.json").read_text())["tkaot_version"] == tkaot.__version__


def test_custom_wheel_and_its_errors(tmp_path):
    custom = small_set(tmp_path / "custom")
    result = CliRunner().invoke(main, ["wheel", str(custom), "--name", "my-model", "--out", str(tmp_path / "dist")])
    assert result.exit_code == 0, result.output
    wheel = tmp_path / "dist" / f"tkaot_sm90_my_model-{tkaot.__version__}-py3-none-any.whl"
    assert wheel.exists() and f"pip install {wheel}" in result.output
    assert "tkaot_sm90_my_model/manifest.json" in members(wheel)
    bad = CliRunner().invoke(main, ["wheel", str(custom), "--name", "My Model"])
    assert bad.exit_code != 0 and "lowercase letters" in bad.output
    cubin = next((custom / "cubins").iterdir())
    cubin.write_bytes(cubin.read_bytes()[:-1])
    with pytest.raises(WheelError, match="does not match its sha256"):
        artifact_wheel(custom, tmp_path, "x")
    cubin.unlink()
    with pytest.raises(WheelError, match="is missing"):
        artifact_wheel(custom, tmp_path, "x")
    with pytest.raises(WheelError, match="no manifest.json"):
        artifact_wheel(tmp_path / "dist", tmp_path, "x")
    with pytest.raises(WheelError, match="built by tkaot 0.0.9"):
        artifact_wheel(small_set(tmp_path / "old", tkaot_version="0.0.9"), tmp_path, expect_version=tkaot.__version__)


def test_precedence_tkaot_path_then_custom_then_default_then_checkout(registry, tmp_path, monkeypatch):
    site = tmp_path / "site"
    for name in (None, "zeta", "alpha"):  # three packages, each providing KEY
        unpack(artifact_wheel(small_set(tmp_path / f"set-{name}"), tmp_path / "dist", name), site)
    monkeypatch.syspath_prepend(str(site))
    prebuilt = tmp_path / "prebuilt"
    small_set(prebuilt / "sm90")
    monkeypatch.setattr(reg, "SOURCE_PREBUILT", prebuilt)
    origins = [s.origin.split(" (")[0] for s in registry.artifact_sets("sm90")]
    assert origins == ["package tkaot_sm90_alpha", "package tkaot_sm90_zeta", "package tkaot_sm90", f"source checkout {prebuilt / 'sm90'}"]
    assert registry.kernel("op", "rmsnorm", KEY, 0).origin.startswith("package tkaot_sm90_alpha")
    plain = small_set(tmp_path / "plain")
    monkeypatch.setenv("TKAOT_PATH", str(plain))
    registry.reset()
    assert registry.kernel("op", "rmsnorm", KEY, 0).origin == f"TKAOT_PATH:{plain}"
    # found by listing directories: nothing was imported
    assert not [m for m in sys.modules if m.startswith("tkaot_sm90")]


def test_version_lock_refuses_installed_packages_of_another_version(registry, tmp_path, monkeypatch):
    old = tmp_path / "old-site"
    unpack(artifact_wheel(small_set(tmp_path / "old", tkaot_version="0.0.9"), tmp_path / "dist"), old)
    monkeypatch.syspath_prepend(str(old))
    with pytest.raises(ArtifactError) as info:
        registry.kernel("op", "rmsnorm", KEY, 0)
    text = str(info.value)
    assert "tkaot_sm90" in text and "version 0.0.9" in text and f"tkaot {tkaot.__version__}" in text
    assert f"pip install 'tkaot-sm90=={tkaot.__version__}'" in text and "'tkaot[sm90]==0.0.9'" in text
    # the package's own version decides, even when its manifest agrees with this tkaot
    init = old / "tkaot_sm90" / "__init__.py"
    init.write_text(init.read_text().replace('"0.0.9"', '"0.0.8"'))
    registry.reset()
    with pytest.raises(ArtifactError, match="version 0.0.8"):
        registry.artifact_sets("sm90")
    shutil.rmtree(old / "tkaot_sm90")
    custom = tmp_path / "custom-site"
    unpack(artifact_wheel(small_set(tmp_path / "c", tkaot_version="0.0.9"), tmp_path / "dist", "mine"), custom)
    monkeypatch.syspath_prepend(str(custom))
    registry.reset()
    with pytest.raises(ArtifactError, match=r"tkaot_sm90_mine .*version 0.0.9.*tkaot-build wheel"):
        registry.artifact_sets("sm90")


def _dependency_site(tmp_path: Path) -> Path | None:
    """The running environment's packages minus tkaot and the build extra, as a directory of links."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    if not (purelib / "torch").is_dir():
        return None
    skip = (
        "tkaot",
        "__editable__",
        "build_tools",
        "kernels_src",
        "tilelang",
        "tvm",
        "apache_tvm",
        "z3",
        "pip",
        "_distutils_hack",
        "__pycache__",
    )
    farm = tmp_path / "deps"
    farm.mkdir()
    for entry in purelib.iterdir():
        if not entry.name.startswith(skip) and entry.suffix != ".pth":
            (farm / entry.name).symlink_to(entry)
    return farm


def _fresh_venv(path: Path, deps: Path) -> Path:
    """A venv without pip whose site-packages sees `deps` (torch, cffi, click, ... without downloading them)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
        ).stdout.strip()
    )
    (site / "tkaot-test-deps.pth").write_text(f"{deps}\n")
    return python


def test_install_into_fresh_venv_and_check(dist, tmp_path):
    out, runtime, _ = dist
    deps = _dependency_site(tmp_path)
    if deps is None:
        pytest.skip("torch is not in this environment's purelib to lend the fresh venv")
    compiled = ext.TARGET.exists() and not ext.stale()
    if compiled:
        runtime_wheel(out, ext.TARGET)  # beside the pure one: pip must prefer it
    custom = artifact_wheel(small_set(tmp_path / "custom", keys=(KEY.replace("512", "2048"),)), out, "extra")
    venv = tmp_path / "venv"
    python = _fresh_venv(venv, deps)
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--find-links", str(out)]
    proc = subprocess.run([*pip, "tkaot[sm90]", str(custom)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("TKAOT_PATH", "PYTHONPATH", "TKAOT_LAUNCHER")}

    def run(*argv):
        return subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env)

    code = (
        "import sys, tkaot; assert tkaot.__file__.startswith(sys.prefix), tkaot.__file__;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tilelang', 'tvm', 'tvm_ffi', 'build_tools', 'kernels_src')];"
        "assert not bad, bad; import importlib.util; assert importlib.util.find_spec('tilelang') is None;"
        "print(tkaot.launcher_kind())"
    )
    imported = run(python, "-c", code)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert imported.stdout.split() == ["compiled" if compiled else "abi"]
    tkaot_build = venv / "bin" / "tkaot-build"
    listed = run(tkaot_build, "sets", "--variants")
    assert listed.returncode == 0, listed.stderr
    if compiled:
        assert f"launcher: compiled ({venv}/lib/" in listed.stdout and "/site-packages/tkaot/_launch.abi3.so)" in listed.stdout
    want = len(json.loads((PREBUILT / "manifest.json").read_text())["variants"])
    assert listed.stdout.index("package tkaot_sm90_extra") < listed.stdout.index("package tkaot_sm90 ")
    assert f"tkaot {tkaot.__version__}, {want} variants" in listed.stdout and f"rmsnorm {KEY}" in listed.stdout
    ok = run(tkaot_build, "check", "--hf-config", CONFIGS / "deepseek-v3.json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"{CONFIGS / 'deepseek-v3.json'}: needs" in ok.stdout and "per_token_cast" in ok.stdout and "; 0 missing" in ok.stdout
    odd = tmp_path / "odd-model.json"
    odd.write_text(json.dumps({"model_type": "llama", "hidden_size": 1040, "num_attention_heads": 8}))
    gap = run(tkaot_build, "check", "--hf-config", odd)  # an unbuilt width: the generic tier serves it, and says so
    assert gap.returncode == 0, gap.stdout + gap.stderr
    assert f"{odd}: needs 16 variants of rmsnorm; 0 missing; 16 generic" in gap.stdout and "generic rmsnorm hidden=1040," in gap.stdout
    assert f"-j {len(os.sched_getaffinity(0))} --out DIR" in gap.stdout
    # issue 21.2: without TileLang the build commands say in one line what to install; --help says which
    helped = run(tkaot_build, "--help")
    assert helped.returncode == 0 and helped.stdout.count("[needs tkaot[build]]") == 2  # ops, plan; build says so itself
    refused = run(tkaot_build, "build", "--hf-config", odd, "-j", "2", "--out", tmp_path / "never")
    assert refused.returncode == 1 and refused.stderr == "Error: tkaot-build build needs the build extra: pip install 'tkaot[build]'\n"
    site = Path(tkaot_build.parent.parent / "lib").glob("python*/site-packages")
    assert not [p for s in site for p in s.iterdir() if p.name in ("build_tools", "kernels_src")]  # issue 21.3
    packed = run(tkaot_build, "wheel", tmp_path / "custom", "--name", "again", "--out", tmp_path / "again")  # the wing that ships
    assert packed.returncode == 0 and "tkaot_sm90_again-" in packed.stdout, packed.stderr
    # issue 21.6: inspect and verify take a root holding <arch>/manifest.json; a useless TKAOT_PATH entry is warned about
    assert run(tkaot_build, "verify", PREBUILT.parent).returncode == 0
    warned = subprocess.run(
        [tkaot_build, "sets"], capture_output=True, text=True, cwd=tmp_path, env={**env, "TKAOT_PATH": str(tmp_path / "typo")}
    )
    assert warned.returncode == 0 and warned.stderr.count(f"TKAOT_PATH entry {tmp_path / 'typo'} does not exist") == 1
    if compiled:  # the pure wheel, where no platform wheel fits, runs the ABI launcher
        pure = _fresh_venv(tmp_path / "pure", deps)
        pip = [sys.executable, "-m", "pip", "--python", str(pure), "install", "-q", "--no-index", "--no-deps", str(runtime)]
        proc = subprocess.run(pip, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        imported = run(pure, "-c", code)
        assert imported.returncode == 0 and imported.stdout.split() == ["abi"], imported.stdout + imported.stderr
