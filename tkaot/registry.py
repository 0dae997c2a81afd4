"""Finds artifact sets and hands out Kernels, loading nothing until asked.

Search order (first match wins for a variant):
  1. directories on TKAOT_PATH (os.pathsep-separated), each either an arch
     directory holding manifest.json or a root holding <arch>/manifest.json;
  2. installed artifact packages (tkaot_<arch>, e.g. tkaot_sm90);
  3. prebuilt/<arch> of a source checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tkaot import __version__
from tkaot._kernel import Kernel
from tkaot._spec import MANIFEST_SCHEMA, LaunchSpec
from tkaot.errors import ArtifactError, ManifestError, NoGPUError, UnsupportedArchError, VariantNotBuilt

SOURCE_PREBUILT = Path(__file__).resolve().parent.parent / "prebuilt"
KNOWN_ARCHES = ("sm90", "sm100")


def arch_of_capability(major: int, minor: int) -> str:
    return f"sm{major}{minor}"


@dataclass
class ArtifactSet:
    """One directory holding manifest.json and cubins/ for one arch."""

    root: Path
    origin: str  # where it was found, for messages
    _manifest: dict | None = field(default=None, repr=False)
    _index: dict | None = field(default=None, repr=False)

    @property
    def manifest(self) -> dict:
        if self._manifest is None:
            path = self.root / "manifest.json"
            try:
                data = json.loads(path.read_text())
            except OSError as exc:
                raise ArtifactError(f"cannot read {path}: {exc.strerror}") from None
            except ValueError as exc:
                raise ManifestError(f"{path} is not valid JSON: {exc}") from None
            if data.get("schema") != MANIFEST_SCHEMA:
                raise ManifestError(f"{path} has schema {data.get('schema')!r}; this tkaot reads schema {MANIFEST_SCHEMA}")
            self._manifest = data
        return self._manifest

    @property
    def arch(self) -> str:
        return self.manifest.get("arch", "?")

    def index(self) -> dict[tuple[str, str], dict]:
        if self._index is None:
            self._index = {(e["kernel"], e["key"]): e for e in self.manifest.get("variants", [])}
        return self._index

    def kernel(self, kernel: str, key: str) -> Kernel | None:
        entry = self.index().get((kernel, key))
        if entry is None:
            return None
        spec = LaunchSpec.from_json(entry["launch"])
        cubin = self.root / "cubins" / f"{entry['cubin']}.cubin"
        return Kernel(kernel, key, spec, cubin, entry["cubin"], self.origin)


def _arch_dir(path: Path, arch: str) -> Path | None:
    if (path / "manifest.json").is_file():
        return path
    if (path / arch / "manifest.json").is_file():
        return path / arch
    return None


def discover(arch: str) -> list[ArtifactSet]:
    """Artifact sets for `arch`, in priority order. Reads directory listings only."""
    sets: list[ArtifactSet] = []
    for entry in filter(None, os.environ.get("TKAOT_PATH", "").split(os.pathsep)):
        found = _arch_dir(Path(entry), arch)
        if found is not None:
            sets.append(ArtifactSet(found, f"TKAOT_PATH:{found}"))
    package = f"tkaot_{arch}"
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            found = _arch_dir(Path(location), arch)
            if found is not None:
                sets.append(ArtifactSet(found, f"package {package}"))
    found = _arch_dir(SOURCE_PREBUILT, arch)
    if found is not None:
        sets.append(ArtifactSet(found, f"source checkout {found}"))
    return sets


class Registry:
    """Per-process table of artifact sets and loaded kernels."""

    def __init__(self):
        self._sets: dict[str, list[ArtifactSet]] = {}
        self._kernels: dict[tuple[str, str, str], Kernel] = {}
        self._device_arch: dict[int, str] = {}
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget everything found so far (after changing TKAOT_PATH, say)."""
        with self._lock:
            self._sets.clear()
            self._kernels.clear()
            self._device_arch.clear()

    def artifact_sets(self, arch: str) -> list[ArtifactSet]:
        sets = self._sets.get(arch)
        if sets is None:
            # a TKAOT_PATH entry that is itself an arch directory serves only its own arch
            sets = [s for s in discover(arch) if s.arch == arch]
            for s in sets:
                version = s.manifest.get("tkaot_version")
                if version != __version__ and not s.origin.startswith("source checkout"):
                    raise ArtifactError(
                        f"{s.origin} was built for tkaot {version}, but this is tkaot {__version__}: "
                        f"install matching versions (pip install 'tkaot[{arch}]=={__version__}') or rebuild it with tkaot-build"
                    )
            self._sets[arch] = sets
        return sets

    def device_arch(self, device_index: int) -> str:
        arch = self._device_arch.get(device_index)
        if arch is None:
            import torch

            if not torch.cuda.is_available():
                raise NoGPUError("tkaot needs a CUDA GPU, and torch sees none (torch.cuda.is_available() is False)")
            arch = arch_of_capability(*torch.cuda.get_device_capability(device_index))
            if not self.artifact_sets(arch):
                have = [a for a in KNOWN_ARCHES if self.artifact_sets(a)]
                name = torch.cuda.get_device_name(device_index)
                raise UnsupportedArchError(
                    f"device {device_index} ({name}) is {arch}; tkaot has artifacts for {have or 'no arch'} here. "
                    f"Install tkaot[{arch}] or build a set with `tkaot-build build --arch {arch}`"
                )
            self._device_arch[device_index] = arch
        return arch

    def kernel(self, op: str, kernel: str, key: str, device_index: int) -> Kernel:
        arch = self.device_arch(device_index)
        cached = self._kernels.get((arch, kernel, key))
        if cached is not None:
            return cached
        sets = self.artifact_sets(arch)
        for s in sets:
            found = s.kernel(kernel, key)
            if found is not None:
                with self._lock:
                    return self._kernels.setdefault((arch, kernel, key), found)
        built = sorted({k for s in sets for (kn, k) in s.index() if kn == kernel})
        raise VariantNotBuilt(
            op,
            kernel,
            key,
            nearest_keys(key, built),
            build_command(kernel, key, arch),
            [s.origin for s in sets],
        )

    def preload(self, device_index: int | None = None) -> int:
        """Load every variant of the device's arch now; returns how many were loaded."""
        import torch

        if not torch.cuda.is_available():
            raise NoGPUError("tkaot.preload() needs a CUDA GPU, and torch sees none")
        device_index = torch.cuda.current_device() if device_index is None else device_index
        arch = self.device_arch(device_index)
        count = 0
        for s in self.artifact_sets(arch):
            for kernel, key in s.index():
                k = self.kernel("preload", kernel, key, device_index)
                k.load(device_index)
                count += 1
        return count


def parse_key(key: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in key.split(",") if part)


def nearest_keys(key: str, built: list[str], limit: int = 3) -> list[str]:
    """Built keys ranked by how many axes differ, then by numeric distance."""
    want = parse_key(key)

    def distance(candidate: str) -> tuple[int, float]:
        have = parse_key(candidate)
        differ = [a for a in want if have.get(a) != want[a]]
        numeric = 0.0
        for a in differ:
            try:
                numeric += abs(int(have.get(a, 0)) - int(want[a]))
            except ValueError:
                pass
        return len(differ), numeric

    return sorted(built, key=distance)[:limit]


def build_command(kernel: str, key: str, arch: str) -> str:
    sets = " ".join(f"--set {k}={v}" for k, v in parse_key(key).items())
    return f"tkaot-build build --op {kernel} {sets} --arch {arch} --out ./tkaot-artifacts"


REGISTRY = Registry()
