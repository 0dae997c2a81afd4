"""The sm100 (Blackwell) artifact set: built here with nvcc for sm_100a, not yet run on a Blackwell GPU (none is lent).

What can be checked without one: every cubin is a CUDA ELF for sm_100a matching its sha256 and differs from sm90's;
every launch spec is well formed; the set serves exactly the sm90 set's variants; a device of compute capability 10.x
selects it; its wheel packs and stays under 50 MB.
"""

import hashlib
import json
from pathlib import Path

import pytest

from tkaot._spec import LaunchSpec
from tkaot.cli import cubin_arch

ROOT = Path(__file__).resolve().parent.parent
SM100, SM90 = ROOT / "prebuilt" / "sm100", ROOT / "prebuilt" / "sm90"


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def test_every_cubin_is_an_sm100a_elf_and_not_an_sm90_copy():
    entries = manifest(SM100)["variants"]
    digests = {e["cubin"] for e in entries}
    for digest in digests:
        data = (SM100 / "cubins" / f"{digest}.cubin").read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest
        assert cubin_arch(data) == "sm_100a", digest
    assert not digests & {e["cubin"] for e in manifest(SM90)["variants"]}


def test_launch_specs_are_well_formed_and_wait_for_the_grid_before():
    by_key = {(e["kernel"], e["key"]): e for e in manifest(SM90)["variants"]}
    for e in manifest(SM100)["variants"]:
        spec = LaunchSpec.from_json(e["launch"])  # checks every field and grid expression
        assert spec.pdl == LaunchSpec.from_json(by_key[(e["kernel"], e["key"])]["launch"]).pdl


def test_the_sm100_set_serves_the_sm90_variants():
    have = {(e["kernel"], e["key"]) for e in manifest(SM100)["variants"]}
    want = {(e["kernel"], e["key"]) for e in manifest(SM90)["variants"]}
    assert sorted(want - have) == [] and sorted(have - want) == []
    assert manifest(SM100)["arch"] == "sm100" and "arch=compute_100a,code=sm_100a" in manifest(SM100)["provenance"]["nvcc_flags"]


@pytest.mark.parametrize("capability, arch", [((10, 0), "sm100"), ((9, 0), "sm90")])
def test_the_device_capability_picks_the_set(monkeypatch, capability, arch):
    import torch

    from tkaot import registry as reg

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: capability)
    monkeypatch.delenv("TKAOT_PATH", raising=False)
    r = reg.Registry()
    assert r.device_arch(0) == arch
    kernel = r.kernel("op", "rmsnorm", "hidden=7168,dtype=bfloat16,with_weight=true,with_residual=false,with_rstd=false", 0)
    assert Path(kernel.cubin_path).parent.parent == ROOT / "prebuilt" / arch


def test_the_sm100_wheel_packs_under_50_mb(tmp_path):
    import tkaot
    from build_tools.wheel import artifact_wheel

    wheel = artifact_wheel(SM100, tmp_path, expect_version=tkaot.__version__)
    assert wheel.name == f"tkaot_sm100-{tkaot.__version__}-py3-none-any.whl"
    assert wheel.stat().st_size <= 50 * 2**20
