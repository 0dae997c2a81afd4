"""Content-addressed build cache and the artifact directory: manifest.json, cubins/, build-info.json.

manifest.json is what the runtime reads, and only that: per variant its key,
static values, launch spec and cubin sha256, plus the set's tool versions and
flags. It holds nothing that changes when no cubin and no launch spec does, and
is written one variant a line, sorted, so a rebuild that changes nothing
rewrites the same bytes and a one-variant change is a one-line diff. What
the build needs to stay incremental and traceable (each variant's cache key,
each kernel's source hash) goes to build-info.json beside it, which the runtime
never reads and the repository does not commit.

Every write goes to a temporary name first and is renamed into place, so a
killed build never leaves half an artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from build_tools.compile import CompiledVariant, nvcc_flags, nvcc_version, tilelang_version
from build_tools.ops import Variant
from tkaot import __version__
from tkaot._spec import MANIFEST_SCHEMA, LaunchSpec


def default_cache_dir() -> Path:
    root = os.environ.get("TKAOT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tkaot", "build"
    )
    return Path(root)


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are read by other users and packed in wheels
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BuildCache:
    """cache_key -> (launch spec, cubin). Entries are immutable once written."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_cache_dir()

    def _paths(self, key: str) -> tuple[Path, Path]:
        d = self.root / key[:2]
        return d / f"{key}.json", d / f"{key}.cubin"

    def get(self, variant: Variant, arch: str, key: str, source_hash: str) -> CompiledVariant | None:
        meta_path, cubin_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text())
            cubin = cubin_path.read_bytes()
        except (OSError, ValueError):
            return None
        if sha256(cubin) != meta.get("cubin_sha256"):
            return None  # a damaged entry is rebuilt, never used
        return CompiledVariant(variant, arch, LaunchSpec.from_json(meta["launch"]), cubin, key, source_hash)

    def put(self, compiled: CompiledVariant) -> None:
        meta_path, cubin_path = self._paths(compiled.cache_key)
        atomic_write(cubin_path, compiled.cubin)
        meta = {"launch": compiled.spec.to_json(), "cubin_sha256": sha256(compiled.cubin)}
        atomic_write(meta_path, json.dumps(meta, sort_keys=True).encode())


BUILD_INFO = "build-info.json"


def variant_entry(compiled: CompiledVariant) -> dict:
    entry = {
        "kernel": compiled.variant.kernel,
        "key": compiled.variant.key,
        "static": {k: v for k, v in compiled.variant.static},
        "launch": compiled.spec.to_json(),
        "cubin": sha256(compiled.cubin),
    }
    if compiled.fixed:  # the static axes the kernel takes at run time: the launcher passes these after the op's arguments
        entry["fixed"] = dict(compiled.fixed)
    return entry


def read_manifest(out_dir: Path) -> dict | None:
    path = Path(out_dir) / "manifest.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def read_build_info(out_dir: Path) -> dict:
    try:
        return json.loads((Path(out_dir) / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return {}


def manifest_text(manifest: dict) -> str:
    """The manifest as JSON: keys sorted, one variant a line (in the order given)."""
    lines = ["{"]
    items = sorted(manifest.items())
    for n, (name, value) in enumerate(items):
        comma = "," if n < len(items) - 1 else ""
        if name == "variants" and value:
            lines.append(' "variants": [')
            lines += [f"  {json.dumps(e, sort_keys=True)}{',' if m < len(value) - 1 else ''}" for m, e in enumerate(value)]
            lines.append(f" ]{comma}")
        else:
            lines.append(f" {json.dumps(name)}: {json.dumps(value, sort_keys=True)}{comma}")
    return "\n".join(lines) + "\n}\n"


def write_artifacts(out_dir: Path, arch: str, compiled: list[CompiledVariant], *, merge: bool = True) -> dict:
    """Write cubins, manifest.json and build-info.json into out_dir; keeps entries already there unless replaced."""
    out_dir = Path(out_dir)
    cubin_dir = out_dir / "cubins"
    entries: dict[tuple[str, str], dict] = {}
    cache_keys: dict[tuple[str, str], str] = {}
    kernels: dict[str, dict] = {}
    old = read_manifest(out_dir) if merge else None
    if old is not None:
        if old.get("schema") != MANIFEST_SCHEMA or old.get("arch") != arch:
            raise ValueError(f"{out_dir} holds a manifest for arch {old.get('arch')} schema {old.get('schema')}; use another --out")
        info = read_build_info(out_dir)
        kernels.update(old.get("kernels", {}))  # manifests written before build-info.json held these
        kernels.update(info.get("kernels", {}))
        for e in old["variants"]:
            e = dict(e)
            cache_key = e.pop("cache_key", None)
            entries[(e["kernel"], e["key"])] = e
            if cache_key:
                cache_keys[(e["kernel"], e["key"])] = cache_key
        cache_keys.update({(v["kernel"], v["key"]): v["cache_key"] for v in info.get("variants", [])})
    for c in compiled:
        digest = sha256(c.cubin)
        path = cubin_dir / f"{digest}.cubin"
        if not path.exists() or sha256(path.read_bytes()) != digest:
            atomic_write(path, c.cubin)
        entries[(c.variant.kernel, c.variant.key)] = variant_entry(c)
        cache_keys[(c.variant.kernel, c.variant.key)] = c.cache_key
        kernels[c.variant.kernel] = {"source_sha256": c.source_sha256}
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "arch": arch,
        "tkaot_version": __version__,
        "provenance": {
            "tilelang": tilelang_version(),
            "nvcc": nvcc_version(),
            "nvcc_flags": nvcc_flags(arch),
        },
        "variants": [entries[k] for k in sorted(entries)],
    }
    write_build_info(out_dir, arch, kernels, cache_keys, entries)
    atomic_write(out_dir / "manifest.json", manifest_text(manifest).encode())
    return manifest


def write_build_info(out_dir: Path, arch: str, kernels: dict, cache_keys: dict, entries: dict) -> None:
    """build-info.json: each kernel's source hash and each variant's cache key (what the manifest leaves out)."""
    variants = [{"kernel": k, "key": key, "cache_key": cache_keys[(k, key)]} for k, key in sorted(cache_keys) if (k, key) in entries]
    build_info = {"arch": arch, "kernels": dict(sorted(kernels.items())), "variants": variants}
    atomic_write(Path(out_dir) / BUILD_INFO, (json.dumps(build_info, indent=1, sort_keys=True) + "\n").encode())


class MergeError(ValueError):
    """Shard outputs that cannot be joined: the message says which directory and why."""


def merge_artifacts(out_dir: Path, shard_dirs: list[Path]) -> dict:
    """Join the artifact directories of `tkaot-build build --shard i/n` runs into `out_dir`, as one unsharded build
    would have written it: the same manifest.json (bytes), cubins and build-info.json. The shards must share schema,
    arch, tkaot version and provenance (the same tools and flags); a variant in two shards must be the same entry; every
    cubin is checked against its sha256 before it is copied. `out_dir` must not hold a set already."""
    out_dir = Path(out_dir)
    if (out_dir / "manifest.json").exists():
        raise MergeError(f"{out_dir} already holds a manifest; merge into a new directory")
    if not shard_dirs:
        raise MergeError("no shard directories given")
    header: dict | None = None
    entries: dict[tuple[str, str], dict] = {}
    origin: dict[tuple[str, str], Path] = {}
    cubins: dict[str, bytes] = {}
    kernels: dict[str, dict] = {}
    cache_keys: dict[tuple[str, str], str] = {}
    for shard in map(Path, shard_dirs):
        manifest = read_manifest(shard)
        if manifest is None:
            raise MergeError(f"{shard} holds no manifest.json")
        this = {k: v for k, v in manifest.items() if k != "variants"}
        if this.get("schema") != MANIFEST_SCHEMA:
            raise MergeError(f"{shard}: manifest schema {this.get('schema')!r}, this tkaot writes {MANIFEST_SCHEMA}")
        if header is None:
            header, first = this, shard
        elif this != header:
            differ = sorted(k for k in set(this) | set(header) if this.get(k) != header.get(k))
            raise MergeError(f"{shard} and {first} differ in {', '.join(differ)}: they are not shards of one build")
        for e in manifest["variants"]:
            name = (e["kernel"], e["key"])
            if name in entries and entries[name] != e:
                raise MergeError(f"{e['kernel']} [{e['key']}] differs between {origin[name]} and {shard}")
            entries[name], origin[name] = e, shard
            if e["cubin"] not in cubins:
                path = shard / "cubins" / f"{e['cubin']}.cubin"
                try:
                    data = path.read_bytes()
                except OSError as exc:
                    raise MergeError(f"{shard}: cannot read {path.name}: {exc.strerror}") from None
                if sha256(data) != e["cubin"]:
                    raise MergeError(f"{shard}: {path.name} does not match its sha256 (corrupt or altered)")
                cubins[e["cubin"]] = data
        info = read_build_info(shard)
        kernels.update(info.get("kernels", {}))
        cache_keys.update({(v["kernel"], v["key"]): v["cache_key"] for v in info.get("variants", [])})
    for digest, data in sorted(cubins.items()):
        atomic_write(out_dir / "cubins" / f"{digest}.cubin", data)
    manifest = {**header, "variants": [entries[k] for k in sorted(entries)]}
    if cache_keys or kernels:
        write_build_info(out_dir, header["arch"], kernels, cache_keys, entries)
    atomic_write(out_dir / "manifest.json", manifest_text(manifest).encode())
    return manifest
