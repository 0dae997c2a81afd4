"""Finds artifact sets and hands out Kernels, loading nothing until asked.

Search order (first match wins for a variant):
  1. directories on TKAOT_PATH (os.pathsep-separated), each either an arch
     directory holding manifest.json or a root holding <arch>/manifest.json;
  2. installed custom artifact packages, tkaot_<arch>_<name> (made by
     `tkaot-build wheel DIR --name NAME`), in order of name;
  3. the installed default artifact package, tkaot_<arch> (the tkaot-sm90 wheel);
  4. prebuilt/<arch> of a source checkout.

Installed packages are found by listing the directories on sys.path, never by
importing them or scanning distribution metadata; each one's __version__ is
read from its __init__.py as text and must equal this tkaot's.
"""

from __future__ import annotations

import contextlib
import gc
import json
import operator
import os
import re
import sys
import threading
import warnings
from pathlib import Path

from tkaot import __version__
from tkaot._ascend import ARCH as ASCEND_ARCH
from tkaot._ascend import AscendKernel, npu_process
from tkaot._decl import build_command, is_generic, parse_key
from tkaot._kernel import Kernel
from tkaot._spec import MANIFEST_SCHEMA
from tkaot.errors import ArtifactError, ManifestError, NoGPUError, UnsupportedArchError, VariantNotBuilt

SOURCE_PREBUILT = Path(__file__).resolve().parent.parent / "prebuilt"
KNOWN_ARCHES = ("sm90", "sm100", ASCEND_ARCH)


def arch_of_capability(major: int, minor: int) -> str:
    return f"sm{major}{minor}"


@contextlib.contextmanager
def collector_paused():
    """Pause the garbage collector: reading a manifest or loading a whole set makes many small objects, and with the
    collector on they would set off full collections over everything `import torch` left behind (~100 ms each)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class ArtifactSet:
    """One directory holding manifest.json and cubins/ for one arch.

    root: the directory; origin: where it was found, for messages; package: the installed package it came from,
    if any, and package_version that package's __version__. The manifest is read on first use.
    """

    def __init__(self, root: Path, origin: str, package: str | None = None, package_version: str | None = None):
        self.root, self.origin, self.package, self.package_version = root, origin, package, package_version
        self._cubins = os.path.join(root, "cubins")
        self._manifest: dict | None = None
        self._header: dict | None = None
        self._index: dict | None = None

    def __repr__(self) -> str:
        return f"ArtifactSet({self.origin})"

    @property
    def manifest(self) -> dict:
        """The whole manifest, parsed (for tools that list or check a set; kernels are found through index())."""
        if self._manifest is None:
            self._manifest = self._checked(_parse_json(self._text(), self.root / "manifest.json"))
        return self._manifest

    @property
    def header(self) -> dict:
        """The manifest without its variants: arch, schema, tkaot_version, provenance."""
        if self._header is None:
            self._read_index()
        return self._header

    @property
    def arch(self) -> str:
        return self.header.get("arch", "?")

    def index(self) -> dict[tuple[str, str], dict | str]:
        """(kernel, key) -> the variant's manifest entry, or its line of JSON until the entry is first needed."""
        if self._index is None:
            self._read_index()
        return self._index

    def kernel(self, kernel: str, key: str) -> Kernel | None:
        entry = self.index().get((kernel, key))
        if entry is None:
            return None
        if isinstance(entry, str):
            if self.arch != ASCEND_ARCH and _FIXED not in entry:  # the line as tkaot-build writes it: the cubin
                # first, the launch spec read from the text when first needed (preload: its symbol and smem only)
                cubin = entry[_CUBIN_AT : _CUBIN_AT + 64]
                return Kernel(kernel, key, entry, os.path.join(self._cubins, cubin + ".cubin"), cubin, self.origin)
            entry = self._index[(kernel, key)] = _parse_json(entry.rstrip(","), self.root / "manifest.json")
        if self.arch == ASCEND_ARCH:  # Ascend hook: binaries (or only sources) and their launcher, tkaot/_ascend.py
            return AscendKernel(kernel, key, entry, str(self.root), self.origin)
        cubin = os.path.join(self._cubins, entry["cubin"] + ".cubin")
        return Kernel(kernel, key, entry.get("launch"), cubin, entry["cubin"], self.origin, entry.get("fixed"))

    def _text(self) -> str:
        path = self.root / "manifest.json"
        try:
            return path.read_text()
        except OSError as exc:
            raise ArtifactError(f"cannot read {path}: {exc.strerror}") from None

    def _checked(self, data: dict) -> dict:
        if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
            schema = data.get("schema") if isinstance(data, dict) else None
            raise ManifestError(f"{self.root / 'manifest.json'} has schema {schema!r}; this tkaot reads schema {MANIFEST_SCHEMA}")
        return data

    def _read_index(self) -> None:
        """Index the variants by (kernel, key). A manifest as tkaot-build writes it (one variant a line, keys sorted)
        is indexed from each line's start and each entry parsed when first used: finding one kernel reads no other
        entry. Any other layout of the same JSON is parsed whole."""
        text = self._text()
        head, found, body = text.partition(_VARIANTS_OPEN)
        lines = body[: -len(_VARIANTS_CLOSE)].split("\n") if found and body.endswith(_VARIANTS_CLOSE) else None
        index = {}
        for line in lines or ():
            match = _VARIANT_LINE.match(line)
            if match is None:
                index = None
                break
            index[(match.group(1), match.group(2))] = line
        if lines is not None and index is not None:
            self._header = self._checked(_parse_json(head + ' "variants": []}', self.root / "manifest.json"))
            self._index = index
        else:
            data = self.manifest
            self._header = {k: v for k, v in data.items() if k != "variants"}
            self._index = {(e["kernel"], e["key"]): e for e in data.get("variants", [])}


# How tkaot-build writes a manifest's variants (build_tools/artifacts.py): one entry a line, keys sorted (a cubin that
# serves several variants: each entry's values of the axes the kernel takes at run time under "fixed")
_VARIANTS_OPEN, _VARIANTS_CLOSE = ' "variants": [\n', "\n ]\n}\n"
_VARIANT_LINE = re.compile(
    r'  \{"cubin": "[0-9a-f]{64}", (?:"fixed": \{[^{}]*\}, )?"kernel": "([a-z0-9_]+)", "key": "([^"\\]*)", "launch": '
)
_CUBIN_AT, _FIXED = len('  {"cubin": "'), '"fixed": {'  # where a line's cubin sha256 starts; a line with fixed values


def _parse_json(text: str, path: Path):
    try:
        with collector_paused():
            return json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"{path} is not valid JSON: {exc}") from None


def _arch_dir(path: Path, arch: str) -> Path | None:
    if (path / "manifest.json").is_file():
        return path
    if (path / arch / "manifest.json").is_file():
        return path / arch
    return None


_PACKAGE_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


def package_version(package_dir: Path) -> str | None:
    """An artifact package's __version__, read from its __init__.py without importing it."""
    try:
        match = _PACKAGE_VERSION.search((package_dir / "__init__.py").read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def installed_packages(arch: str) -> list[tuple[str, Path]]:
    """(name, directory) of the artifact packages for `arch` on sys.path, custom sets first.

    A name found in two sys.path entries is taken from the first, as import would.
    """
    pattern = re.compile(rf"tkaot_{arch}(_[a-z0-9_]+)?")
    found: dict[str, Path] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # zip files, path hooks, missing directories
            continue
        for name in names:
            if name not in found and pattern.fullmatch(name) and os.path.isfile(os.path.join(entry or ".", name, "manifest.json")):
                found[name] = Path(entry or ".", name).resolve()
    default = f"tkaot_{arch}"
    return sorted(found.items(), key=lambda item: (item[0] == default, item[0]))


_WARNED_PATH_ENTRIES: set[str] = set()


def _warn_unusable_path_entry(entry: str) -> None:
    """Warn, once per entry, about a TKAOT_PATH entry that holds no set for any arch (a typo, a build not run yet)."""
    path = Path(entry)
    if not path.is_dir():
        why = "does not exist" if not path.exists() else "is not a directory"
    elif (path / "manifest.json").is_file() or any(path.glob("*/manifest.json")):
        return  # a set for another arch
    else:
        why = "holds no artifact set (manifest.json, or <arch>/manifest.json)"
    if entry not in _WARNED_PATH_ENTRIES:
        _WARNED_PATH_ENTRIES.add(entry)
        warnings.warn(f"TKAOT_PATH entry {entry} {why}; skipping it", stacklevel=3)


def discover(arch: str) -> list[ArtifactSet]:
    """Artifact sets for `arch`, in priority order. Reads directory listings only."""
    sets: list[ArtifactSet] = []
    for entry in filter(None, os.environ.get("TKAOT_PATH", "").split(os.pathsep)):
        found = _arch_dir(Path(entry), arch)
        if found is not None:
            sets.append(ArtifactSet(found, f"TKAOT_PATH:{found}"))
        else:
            _warn_unusable_path_entry(entry)
    for name, directory in installed_packages(arch):
        sets.append(ArtifactSet(directory, f"package {name} ({directory})", name, package_version(directory)))
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
                check_version(s, arch)
            self._sets[arch] = sets
        return sets

    def device_arch(self, device_index: int) -> str:
        arch = self._device_arch.get(device_index)
        if arch is None and npu_process():  # Ascend hook: torch_npu without CUDA, every device an NPU (tkaot/_ascend.py)
            if not self.artifact_sets(ASCEND_ARCH):
                raise UnsupportedArchError(f"an NPU tensor needs an {ASCEND_ARCH} artifact set: pip install 'tkaot[{ASCEND_ARCH}]'")
            arch = self._device_arch[device_index] = ASCEND_ARCH
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

    def preload(self, device_index: int | None = None, generic: bool = False) -> int:
        """Load every variant of the device's arch now (the generic tier's too with `generic`); returns how many
        were loaded. Generic variants are fallbacks for calls no specialised variant serves (each warns when first
        used), so by default they load at their first call.

        Nothing is parsed but the variants' lines: each kernel reads its cubin's sha256 and its symbol from its
        line. One reader thread reads and checks (sha256) the cubins in order while this thread hands each to the
        driver as it arrives: file reads and hashing run without the GIL, so they overlap the driver's loads. (On
        the H200's host, 741 kernels: 69 ms this way, 110 ms with four threads each reading and loading a batch,
        92 ms with one: the driver's loads do not run in parallel, and threads contending for them cost time.)"""
        from concurrent.futures import ThreadPoolExecutor

        import torch

        if not torch.cuda.is_available():
            raise NoGPUError("tkaot.preload() needs a CUDA GPU, and torch sees none")
        device_index = torch.cuda.current_device() if device_index is None else device_index
        arch = self.device_arch(device_index)
        with collector_paused():
            todo: dict[tuple[str, str], ArtifactSet] = {}  # the first set holding a variant serves it, as in kernel()
            for s in self.artifact_sets(arch):
                for name in s.index():
                    if generic or not is_generic(name[0]):
                        todo.setdefault(name, s)
            kernels = []
            with self._lock:
                for (kernel, key), s in todo.items():
                    found = self._kernels.get((arch, kernel, key))
                    if found is None:
                        found = self._kernels[(arch, kernel, key)] = s.kernel(kernel, key)
                    if device_index not in found.functions:
                        kernels.append(found)
            with ThreadPoolExecutor(max_workers=1) as reader:
                images = reader.map(operator.methodcaller("read_cubin"), kernels)
                try:
                    for found, image in zip(kernels, images):
                        found.load(device_index, image)
                except BaseException:
                    reader.shutdown(cancel_futures=True)  # a corrupt cubin: stop reading the rest
                    raise
        return len(todo)


def check_version(s: ArtifactSet, arch: str) -> None:
    """Refuse an artifact set built for another tkaot, naming what to install."""
    if s.package is not None:
        distribution = s.package.replace("_", "-")
        if s.package_version != __version__:
            if s.package == f"tkaot_{arch}":
                fix = f"pip install '{distribution}=={__version__}' (or 'tkaot[{arch}]=={s.package_version}' to match it)"
            else:
                fix = (
                    f"rebuild it with tkaot {__version__} and repack it (tkaot-build wheel DIR --name NAME), "
                    f"or pip install 'tkaot=={s.package_version}'"
                )
            raise ArtifactError(f"{s.origin} is version {s.package_version}, but this is tkaot {__version__}: {fix}")
    elif s.origin.startswith("source checkout"):
        return  # a checkout's own prebuilt set moves with its code
    # a package of the right version may still hold a manifest another tkaot wrote
    version = s.header.get("tkaot_version")
    if version != __version__:
        raise ArtifactError(
            f"{s.origin} was built for tkaot {version}, but this is tkaot {__version__}: "
            f"install matching versions (pip install 'tkaot[{arch}]=={__version__}') or rebuild it with tkaot-build"
        )


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


REGISTRY = Registry()
