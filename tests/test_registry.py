"""Registry discovery, selection, and the error for every way an artifact can be wrong (CPU only)."""

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

import tkaot
from tkaot import registry as reg
from tkaot.errors import ArtifactError, ManifestError, NoGPUError, UnsupportedArchError, VariantNotBuilt

KEY = "hidden=512,dtype=bfloat16,with_weight=true,with_residual=true,with_rstd=true"


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory, build_cache):
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    out = tmp_path_factory.mktemp("set")
    v = Variant.make("rmsnorm", dict(hidden=512, dtype="bfloat16", with_weight=True, with_residual=True, with_rstd=True))
    build_variants([v], out, "sm90", cache=BuildCache(build_cache))
    return out


def copy_set(src: Path, dst: Path, **manifest_changes) -> Path:
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest.update(manifest_changes)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_tkaot_path_set_is_found_and_selected(registry, artifact_dir, monkeypatch):
    monkeypatch.setenv("TKAOT_PATH", str(artifact_dir))
    k = registry.kernel("op", "rmsnorm", KEY, 0)
    assert k.key == KEY and k.origin.startswith("TKAOT_PATH")
    assert k.read_cubin()[:4] == b"\x7fELF"
    # asked twice, the same Kernel comes back (modules load once)
    assert registry.kernel("op", "rmsnorm", KEY, 0) is k


def test_arch_root_layout_and_priority(registry, artifact_dir, tmp_path, monkeypatch):
    first = copy_set(artifact_dir, tmp_path / "root" / "sm90")
    second = copy_set(artifact_dir, tmp_path / "second")
    monkeypatch.setenv("TKAOT_PATH", f"{tmp_path / 'root'}:{second}")
    sets = registry.artifact_sets("sm90")
    assert [s.root for s in sets] == [first, second]
    assert Path(registry.kernel("op", "rmsnorm", KEY, 0).cubin_path).parent.parent == first


def test_source_checkout_prebuilt_is_last(registry, artifact_dir, tmp_path, monkeypatch):
    prebuilt = tmp_path / "prebuilt"
    copy_set(artifact_dir, prebuilt / "sm90")
    monkeypatch.setattr(reg, "SOURCE_PREBUILT", prebuilt)
    monkeypatch.setenv("TKAOT_PATH", str(artifact_dir))
    assert [s.origin.split(":")[0].split(" ")[0] for s in registry.artifact_sets("sm90")] == ["TKAOT_PATH", "source"]


def test_missing_variant_names_nearest_keys_and_command(registry, artifact_dir, monkeypatch):
    monkeypatch.setenv("TKAOT_PATH", str(artifact_dir))
    missing = KEY.replace("hidden=512", "hidden=640")
    with pytest.raises(VariantNotBuilt) as info:
        registry.kernel("tkaot.quant.norm_forward", "rmsnorm", missing, 0)
    err = info.value
    assert err.nearest == [KEY]
    assert err.command == (
        "tkaot-build build --op rmsnorm --set hidden=640 --set dtype=bfloat16 --set with_weight=true "
        "--set with_residual=true --set with_rstd=true --arch sm90 --out ./tkaot-artifacts"
    )
    text = str(err)
    assert "tkaot.quant.norm_forward" in text and missing in text and err.command in text and "TKAOT_PATH" in text


def test_the_suggested_command_builds_the_missing_variant(registry, artifact_dir, monkeypatch, tmp_path, build_cache):
    from click.testing import CliRunner

    from tkaot.cli import main

    monkeypatch.setenv("TKAOT_PATH", str(artifact_dir))
    missing = KEY.replace("with_rstd=true", "with_rstd=false")
    with pytest.raises(VariantNotBuilt) as info:
        registry.kernel("op", "rmsnorm", missing, 0)
    argv = info.value.command.split()[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "new")
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("TKAOT_PATH", f"{artifact_dir}:{tmp_path / 'new'}")
    registry.reset()
    assert registry.kernel("op", "rmsnorm", missing, 0).key == missing


def test_corrupt_and_missing_cubins(registry, artifact_dir, tmp_path, monkeypatch):
    bad = copy_set(artifact_dir, tmp_path / "bad")
    cubin = next((bad / "cubins").iterdir())
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))
    monkeypatch.setenv("TKAOT_PATH", str(bad))
    with pytest.raises(ArtifactError, match="corrupt"):
        registry.kernel("op", "rmsnorm", KEY, 0).read_cubin()
    cubin.unlink()
    registry.reset()
    with pytest.raises(ArtifactError, match="cannot be read"):
        registry.kernel("op", "rmsnorm", KEY, 0).read_cubin()


def test_bad_manifests(registry, artifact_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TKAOT_PATH", str(copy_set(artifact_dir, tmp_path / "schema", schema=99)))
    with pytest.raises(ManifestError, match="schema"):
        registry.kernel("op", "rmsnorm", KEY, 0)
    registry.reset()
    monkeypatch.setenv("TKAOT_PATH", str(copy_set(artifact_dir, tmp_path / "version", tkaot_version="0.0.1")))
    with pytest.raises(ArtifactError, match="tkaot 0.0.1"):
        registry.kernel("op", "rmsnorm", KEY, 0)
    registry.reset()
    broken = copy_set(artifact_dir, tmp_path / "json")
    (broken / "manifest.json").write_text("{not json")
    monkeypatch.setenv("TKAOT_PATH", str(broken))
    with pytest.raises(ManifestError, match="not valid JSON"):
        registry.kernel("op", "rmsnorm", KEY, 0)


def test_no_gpu_and_unsupported_arch(monkeypatch, artifact_dir):
    import torch

    r = reg.Registry()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGPUError):
        r.device_arch(0)
    with pytest.raises(NoGPUError):
        r.preload()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA A100")
    monkeypatch.setenv("TKAOT_PATH", str(artifact_dir))
    with pytest.raises(UnsupportedArchError, match="sm80"):
        r.device_arch(0)


def test_driver_missing_is_a_clear_error(monkeypatch):
    from tkaot import _cuda

    monkeypatch.setattr(_cuda, "_lib", None)

    class NoDriver:
        def dlopen(self, name):
            raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(_cuda, "ffi", NoDriver())
    with pytest.raises(NoGPUError, match="libcuda"):
        _cuda.lib()


def test_driver_errors_carry_name_and_text(monkeypatch):
    from tkaot import _cuda
    from tkaot.errors import CudaDriverError

    class FakeLib:
        def cuGetErrorName(self, code, out):
            out[0] = _cuda.ffi.new("char[]", b"CUDA_ERROR_INVALID_IMAGE")
            keep.append(out[0])
            return 0

        def cuGetErrorString(self, code, out):
            out[0] = keep_text
            return 0

    keep = []
    keep_text = _cuda.ffi.new("char[]", b"device kernel image is invalid")
    with pytest.raises(CudaDriverError) as info:
        _cuda._check(FakeLib(), 200, "cuModuleLoadData")
    assert info.value.name == "CUDA_ERROR_INVALID_IMAGE" and "device kernel image is invalid" in str(info.value)


def test_public_errors_are_exported():
    assert issubclass(tkaot.VariantNotBuilt, tkaot.TkaotError)


def test_pre_parsed_driver_declarations_are_current(tmp_path):
    """tkaot/_cuda_ffi.py is generated from _cuda.CDEF; regenerate it (python -m tkaot._cuda) after editing CDEF."""
    from pathlib import Path

    from tkaot import _cuda

    fresh = tmp_path / "_cuda_ffi.py"
    _cuda.write_ffi_module(str(fresh))
    committed = Path(_cuda.__file__).with_name("_cuda_ffi.py")
    assert fresh.read_text() == committed.read_text()
    assert _cuda.ffi.sizeof("CUfunction") == 8


def test_a_useless_tkaot_path_entry_is_warned_about_once(tmp_path, monkeypatch, artifact_dir):
    from tkaot.registry import discover

    (tmp_path / "empty").mkdir()
    entries = [tmp_path / "typo", tmp_path / "empty", artifact_dir]
    monkeypatch.setenv("TKAOT_PATH", os.pathsep.join(map(str, entries)))
    with pytest.warns(UserWarning) as caught:
        first = discover("sm90")
        discover("sm90")
        discover("sm100")  # a set for another arch is not useless: no warning for artifact_dir
    messages = sorted(str(w.message) for w in caught)
    assert messages == [
        f"TKAOT_PATH entry {tmp_path / 'empty'} holds no artifact set (manifest.json, or <arch>/manifest.json); skipping it",
        f"TKAOT_PATH entry {tmp_path / 'typo'} does not exist; skipping it",
    ]
    assert [s.root for s in first][:1] == [artifact_dir]


def test_preload_reads_checks_and_loads_every_variant_once(monkeypatch):
    """preload() of the committed set on a fake driver: every variant's cubin (sha256-checked by the reader thread)
    reaches the driver exactly once, each kernel keeping its own function; a second preload loads nothing new; a
    corrupt cubin fails it by name."""
    import torch

    from tkaot import _kernel
    from tkaot._decl import all_kernels

    loaded, lock = [], threading.Lock()

    class FakeModule:
        def __init__(self, image, device_index):
            with lock:
                loaded.append(image)
                self.number = len(loaded)

        def function(self, symbol, smem):
            return self.number

    r = reg.Registry()
    monkeypatch.delenv("TKAOT_PATH", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(r, "device_arch", lambda index: "sm90")
    monkeypatch.setattr(_kernel._cuda, "Module", FakeModule)
    (prebuilt,) = r.artifact_sets("sm90")
    generic = {d.name for d in all_kernels().values() if d.generic_of}
    assert generic and any(kernel in generic for kernel, _ in prebuilt.index())
    variants = [(kernel, key) for kernel, key in prebuilt.index() if kernel not in generic]
    assert r.preload() == len(variants) > 600
    kernels = [r.kernel("op", kernel, key, 0) for kernel, key in variants]
    assert sorted(loaded) == sorted(k.read_cubin() for k in kernels)
    assert all(loaded[k.functions[0] - 1] == k.read_cubin() for k in kernels)  # its own module's function
    assert len({k.functions[0] for k in kernels}) == len(kernels)
    assert r.preload() == len(variants) and len(loaded) == len(variants)
    # the generic tier too, when asked: only its variants are new
    assert r.preload(generic=True) == len(prebuilt.index()) == len(loaded)

    bad = reg.Registry()
    monkeypatch.setattr(bad, "device_arch", lambda index: "sm90")
    victim = bad.kernel("op", *variants[7], 0)
    monkeypatch.setattr(victim, "cubin_sha256", "0" * 64)
    with pytest.raises(ArtifactError, match="is corrupt"):
        bad.preload()


def test_a_kernel_read_from_its_manifest_line_has_the_parsed_entry_s_launch():
    """ArtifactSet.kernel() builds a CUDA kernel from its manifest line without parsing it: for every variant of the
    committed sets, the cubin sha256, symbol and shared memory read from the line, and the spec parsed at first use,
    are the whole entry's."""
    from tkaot._spec import LaunchSpec

    for arch in ("sm90", "sm100"):
        s = reg.ArtifactSet(reg.SOURCE_PREBUILT / arch, f"prebuilt/{arch}")
        lines = dict(s.index())
        assert lines and all(isinstance(line, str) for line in lines.values())
        for (kernel, key), line in lines.items():
            entry = json.loads(line.rstrip(","))
            k = s.kernel(kernel, key)
            spec = LaunchSpec.from_json(entry["launch"])
            assert k.cubin_sha256 == entry["cubin"] and k.fixed == entry.get("fixed", {})
            assert k._entry() == (spec.symbol, spec.smem)
            assert k.spec == spec


def test_a_generic_kernel_is_named_after_the_kernel_it_serves():
    """Preload tells the generic tier by name alone (tkaot._decl.is_generic), so a declaration must follow the rule."""
    from tkaot._decl import GENERIC_SUFFIX, all_kernels, is_generic

    decls = all_kernels().values()
    assert all(is_generic(d.name) == bool(d.generic_of) for d in decls)
    rmsnorm = next(d for d in decls if d.name == "rmsnorm")
    with pytest.raises(ValueError, match="named after the kernel it serves"):
        rmsnorm.generic("rmsnorm_any", rmsnorm.source, ("hidden",))
    assert rmsnorm.generic("rmsnorm" + GENERIC_SUFFIX, rmsnorm.source, ("hidden",)).generic_of == "rmsnorm"
