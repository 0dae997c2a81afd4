"""tkaot-build merge: shards of a build joined into exactly what the unsharded build writes (real compiles)."""

import json
import shutil

import pytest
from click.testing import CliRunner

from build_tools.artifacts import BuildCache, MergeError, merge_artifacts
from build_tools.build import build_variants
from build_tools.ops import Variant
from build_tools.sweep import shard

VARIANTS = [
    Variant.make("rmsnorm", dict(hidden=h, dtype=d, with_weight=True, with_residual=False, with_rstd=False))
    for h in (512, 1024)
    for d in ("bfloat16", "float32")
] + [Variant.make("normalize_weight", dict(num_topk=8))]


@pytest.fixture(scope="module")
def builds(tmp_path_factory, build_cache):
    """The set built whole, and as three shards."""
    root = tmp_path_factory.mktemp("merge")
    build_variants(VARIANTS, root / "whole", "sm90", cache=BuildCache(build_cache))
    shards = []
    for i in range(3):
        build_variants(shard(VARIANTS, f"{i}/3"), root / f"shard{i}", "sm90", cache=BuildCache(build_cache))
        shards.append(root / f"shard{i}")
    return root, shards


def _files(directory):
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_three_shards_merge_into_the_unsharded_build(builds):
    root, shards = builds
    assert all(len(json.loads((s / "manifest.json").read_text())["variants"]) < len(VARIANTS) for s in shards)
    merge_artifacts(root / "merged", shards)
    assert _files(root / "merged") == _files(root / "whole")  # manifest.json, build-info.json and every cubin, byte for byte


def test_the_command_merges_and_refuses_an_existing_output(builds, tmp_path):
    from build_tools.cli import merge

    _, shards = builds
    result = CliRunner().invoke(merge, [str(tmp_path / "out"), *map(str, shards)])
    assert result.exit_code == 0 and f"{len(VARIANTS)} sm90 variants" in result.output
    again = CliRunner().invoke(merge, [str(tmp_path / "out"), *map(str, shards)])
    assert again.exit_code != 0 and "already holds a manifest" in again.output


def _copy(shards, tmp_path):
    copies = []
    for s in shards:
        shutil.copytree(s, tmp_path / s.name)
        copies.append(tmp_path / s.name)
    return copies


def test_a_variant_that_differs_between_shards_is_refused(builds, tmp_path):
    _, shards = builds
    a, b, c = _copy(shards, tmp_path)
    first = json.loads((a / "manifest.json").read_text())["variants"][0]
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["variants"].append({**first, "launch": {**first["launch"], "smem": 1024}})
    (b / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MergeError, match="differs between"):
        merge_artifacts(tmp_path / "out", [a, b, c])


def test_a_corrupt_cubin_is_refused(builds, tmp_path):
    _, shards = builds
    copies = _copy(shards, tmp_path)
    cubin = next((copies[1] / "cubins").iterdir())
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))
    with pytest.raises(MergeError, match="does not match its sha256"):
        merge_artifacts(tmp_path / "out", copies)


@pytest.mark.parametrize("field, value", [("arch", "sm100"), ("tkaot_version", "0.0.1"), ("provenance", {"nvcc": "12.0"})])
def test_shards_of_different_builds_are_refused(builds, tmp_path, field, value):
    _, shards = builds
    copies = _copy(shards, tmp_path)
    manifest = json.loads((copies[2] / "manifest.json").read_text())
    manifest[field] = value
    (copies[2] / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MergeError, match=f"differ in {field}"):
        merge_artifacts(tmp_path / "out", copies)
