"""Wheels without a network: a small PEP 427 writer, the runtime wheel, and artifact-set wheels.

    python -m build_tools.wheel --out dist     # tkaot (pure, and with the compiled launcher) + tkaot-sm90: `make wheels`
    tkaot-build wheel DIR --name NAME          # a custom build directory -> tkaot-sm90-NAME

The runtime comes as two wheels of one version: `py3-none-any` (pure Python, the
ABI launcher) and, where tkaot/_launch.abi3.so is built, a platform wheel with the
compiled launcher added, tagged cp311-abi3-manylinux_2_X_<arch> from what the .so
itself needs (its ELF machine and the newest glibc symbol version it references).
pip takes the platform wheel where its tag fits and the pure one everywhere else.

An artifact wheel holds one package, `tkaot_<arch>` (the default set) or
`tkaot_<arch>_<name>` (a custom one): `__init__.py` with `__version__`,
`manifest.json` and `cubins/`. The runtime finds it by that directory name.
Its version is the tkaot version that built it, and it requires exactly that
tkaot. Wheels are reproducible: fixed timestamps and modes, sorted entries.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_PACKAGES = ("tkaot",)
# The build wing rides inside tkaot's directory, so the wheel installs nothing at top level but tkaot
# (a generic `build_tools` there would collide with other projects'); tkaot-build puts this directory
# on sys.path before it imports build_tools (tkaot/cli.py BUILD_WING).
BUILD_WING = "tkaot/_build_wing"
BUILD_WING_PACKAGES = ("build_tools", "kernels_src")
BUILD_WING_DATA = ("build_tools/shapesets/*.toml", "build_tools/model_configs/*.json")
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the zip epoch: every entry gets it, so rebuilds are byte-identical
_NAME = re.compile(r"[a-z0-9]+(?:[_-][a-z0-9]+)*")


class WheelError(ValueError):
    """An artifact set or project that cannot be packed; the message says why."""


def tkaot_version() -> str:
    """The runtime's version, read from tkaot/__init__.py (importing tkaot would import torch)."""
    text = (ROOT / "tkaot" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    if match is None:
        raise WheelError(f"no __version__ line in {ROOT / 'tkaot' / '__init__.py'}")
    return match.group(1)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _entry(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, ZIP_DATE)
    info.external_attr = (0o100755 if name.endswith(".so") else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data, compresslevel=9)


def write_wheel(
    out_dir: Path,
    distribution: str,
    version: str,
    files: dict[str, bytes],
    metadata: list[tuple[str, str]],
    description: str = "",
    entry_points: str = "",
    tag: str = "py3-none-any",
) -> Path:
    """Write `{distribution}-{version}-{tag}.whl` holding `files` (archive name -> bytes).

    METADATA gets Metadata-Version, Name, Version, then `metadata`'s fields in
    order, then the description; RECORD lists every file's sha256 and size. A tag
    other than py3-none-any marks the wheel platlib (it carries a binary).
    """
    stem = f"{re.sub(r'[-_.]+', '_', distribution)}-{version}"
    dist_info = f"{stem}.dist-info"
    head = [("Metadata-Version", "2.1"), ("Name", distribution), ("Version", version), *metadata]
    text = "".join(f"{k}: {v}\n" for k, v in head)
    if description:
        text += "\n" + description
    meta = {
        f"{dist_info}/METADATA": text.encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: tkaot-build\nRoot-Is-Purelib: {str(tag == 'py3-none-any').lower()}\nTag: {tag}\n"
        ).encode(),
    }
    if entry_points:
        meta[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    tops = sorted({name.split("/")[0] for name in files})
    meta[f"{dist_info}/top_level.txt"] = "".join(f"{t}\n" for t in tops).encode()
    entries = [*sorted(files.items()), *meta.items()]
    record_name = f"{dist_info}/RECORD"
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries) + f"{record_name},,\n"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}-{tag}.whl"
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name, data in entries:
            _entry(zf, name, data)
        _entry(zf, record_name, record.encode())
    tmp.replace(path)
    return path


def _requirement(text: str, extra: str | None = None) -> str:
    if extra is None:
        return text
    spec, _, marker = text.partition(";")
    marker = f"({marker.strip()}) and " if marker.strip() else ""
    return f'{spec.strip()}; {marker}extra == "{extra}"'


_ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
_MANYLINUX_LIBS = ("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2")
_SHT_DYNAMIC, _SHT_VERNEED, _DT_NEEDED = 6, 0x6FFFFFFE, 1


def elf_needs(data: bytes) -> tuple[str, list[str], list[str]]:
    """(machine, the DT_NEEDED libraries, the symbol versions required) of a little-endian ELF64 shared object."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise WheelError("the compiled launcher is not a little-endian 64-bit ELF file")
    machine = _ELF_MACHINES.get(struct.unpack_from("<H", data, 18)[0])
    if machine is None:
        raise WheelError(f"the compiled launcher is for ELF machine {struct.unpack_from('<H', data, 18)[0]}, not one tkaot tags")
    shoff, (shentsize, shnum) = struct.unpack_from("<Q", data, 0x28)[0], struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(section: int, offset: int) -> str:
        start = sections[section][4] + offset
        return data[start : data.index(b"\0", start)].decode()

    needed, versions = [], []
    for _, kind, _, _, offset, size, link, info, _, _ in sections:
        if kind == _SHT_DYNAMIC:
            for pos in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == _DT_NEEDED:
                    needed.append(string(link, value))
        elif kind == _SHT_VERNEED:
            pos = offset
            for _ in range(info):  # Verneed entries, each with its Vernaux list
                _, count, _, aux, following = struct.unpack_from("<HHIII", data, pos)
                apos = pos + aux
                for _ in range(count):
                    _, _, _, name, next_aux = struct.unpack_from("<IHHII", data, apos)
                    versions.append(string(link, name))
                    apos += next_aux
                pos += following
    return machine, needed, versions


def platform_tag(data: bytes) -> str:
    """The honest manylinux tag of a shared object: its machine, and glibc 2.17 or the newest version it needs."""
    machine, needed, versions = elf_needs(data)
    foreign = [lib for lib in needed if lib not in _MANYLINUX_LIBS]
    if foreign:
        raise WheelError(f"the compiled launcher links {foreign}, which no manylinux system promises")
    glibc = [tuple(int(n) for n in v[6:].split(".")) for v in versions if re.fullmatch(r"GLIBC_\d+\.\d+", v)]
    major, minor = max([(2, 17), *glibc])
    return f"manylinux_{major}_{minor}_{machine}"


def runtime_wheel(out_dir: Path, extension: Path | None = None) -> Path:
    """The `tkaot` wheel: the runtime, with build_tools and kernels_src under tkaot/_build_wing for tkaot-build; no cubins.

    With `extension` (the built tkaot/_launch.abi3.so), the platform wheel that adds it.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    version = tkaot_version()
    if project["version"] != version:
        raise WheelError(f"pyproject.toml says version {project['version']} but tkaot/__init__.py says {version}")
    files: dict[str, bytes] = {}
    for package in (*RUNTIME_PACKAGES, *BUILD_WING_PACKAGES):
        prefix = "" if package in RUNTIME_PACKAGES else f"{BUILD_WING}/"
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                files[prefix + path.relative_to(ROOT).as_posix()] = path.read_bytes()
    for pattern in BUILD_WING_DATA:
        for path in sorted(ROOT.glob(pattern)):
            files[f"{BUILD_WING}/{path.relative_to(ROOT).as_posix()}"] = path.read_bytes()
    metadata = [("Summary", project["description"]), ("License", project["license"]), ("Requires-Python", project["requires-python"])]
    metadata += [("Requires-Dist", _requirement(r)) for r in project["dependencies"]]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        metadata.append(("Provides-Extra", extra))
        metadata += [("Requires-Dist", _requirement(r, extra)) for r in requirements]
    metadata.append(("Description-Content-Type", "text/markdown"))
    scripts = "".join(f"{name} = {target}\n" for name, target in project.get("scripts", {}).items())
    description = (ROOT / project["readme"]).read_text()
    tag = "py3-none-any"
    if extension is not None:
        from build_tools.ext import ABI3_SINCE

        data = Path(extension).read_bytes()
        files["tkaot/_launch.abi3.so"] = data
        tag = f"{ABI3_SINCE}-abi3-{platform_tag(data)}"
    entry_points = f"[console_scripts]\n{scripts}" if scripts else ""
    return write_wheel(out_dir, project["name"], version, files, metadata, description, entry_points, tag)


def artifact_package(arch: str, name: str | None = None) -> str:
    """The import name of an artifact set's package: tkaot_<arch>, or tkaot_<arch>_<name>."""
    if name is None:
        return f"tkaot_{arch}"
    if not _NAME.fullmatch(name):
        raise WheelError(f"--name {name!r}: use lowercase letters, digits, '-' and '_' (e.g. 'my-model')")
    return f"tkaot_{arch}_{name.replace('-', '_')}"


def artifact_wheel(set_dir: Path, out_dir: Path, name: str | None = None, expect_version: str | None = None) -> Path:
    """Pack an artifact directory (manifest.json + cubins/) into its own installable wheel.

    Every cubin the manifest names is checked against its sha256 first; cubins
    it does not name are left out. `expect_version` refuses a set another
    tkaot version built.
    """
    set_dir = Path(set_dir)
    manifest_path = set_dir / "manifest.json"
    try:
        manifest_bytes = manifest_path.read_bytes()
        manifest = json.loads(manifest_bytes)
    except OSError:
        raise WheelError(f"{set_dir} has no manifest.json; give a directory made by tkaot-build build") from None
    except ValueError as exc:
        raise WheelError(f"{manifest_path} is not valid JSON: {exc}") from None
    arch, version = manifest.get("arch"), manifest.get("tkaot_version")
    if not arch or not version or not isinstance(manifest.get("variants"), list):
        raise WheelError(f"{manifest_path} lacks arch, tkaot_version or variants; is it a tkaot manifest?")
    if expect_version is not None and version != expect_version:
        raise WheelError(f"{manifest_path} was built by tkaot {version}, not {expect_version}: rebuild it (make build)")
    package = artifact_package(arch, name)
    files = {f"{package}/manifest.json": manifest_bytes}
    if arch == ASCEND_ARCH:
        files.update(ascend_files(set_dir, package, manifest))
    for entry in manifest["variants"] if arch != ASCEND_ARCH else ():
        cubin = set_dir / "cubins" / f"{entry['cubin']}.cubin"
        try:
            data = cubin.read_bytes()
        except OSError:
            raise WheelError(f"{entry['kernel']} [{entry['key']}]: {cubin} is missing") from None
        if hashlib.sha256(data).hexdigest() != entry["cubin"]:
            raise WheelError(f"{entry['kernel']} [{entry['key']}]: {cubin} does not match its sha256")
        files[f"{package}/cubins/{entry['cubin']}.cubin"] = data
    counts: dict[str, int] = {}
    for entry in manifest["variants"]:
        counts[entry["kernel"]] = counts.get(entry["kernel"], 0) + 1
    summary = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
    what = "the default shape set" if name is None else f"the custom set {name!r}"
    files[f"{package}/__init__.py"] = (
        f'"""tkaot kernels for {arch}, {what}: {len(manifest["variants"])} variants ({summary}).\n\n'
        f'Data only: tkaot finds this package by its directory name and reads manifest.json.\n"""\n\n'
        f'__version__ = "{version}"\nARCH = "{arch}"\n'
    ).encode()
    distribution = package.replace("_", "-")
    metadata = [
        ("Summary", f"tkaot's prebuilt {arch} kernels, {what} ({len(manifest['variants'])} variants)"),
        ("License", "MIT"),
        ("Requires-Python", ">=3.10"),
        ("Requires-Dist", f"tkaot=={version}"),
    ]
    description = f"Cubins for tkaot {version} on {arch}: {summary}. Install beside `tkaot=={version}`.\n"
    return write_wheel(out_dir, distribution, version, files, metadata, description)


ASCEND_ARCH = "ascend950"


def ascend_files(set_dir: Path, package: str, manifest: dict) -> dict[str, bytes]:
    """An ascend950 set's files (build_tools/ascend.py): the TileLang headers, each variant's AscendC source and,
    where stage 2 ran, its binary; every one the manifest names checked against its sha256."""
    files = {f"{package}/{p.relative_to(set_dir).as_posix()}": p.read_bytes() for p in sorted((set_dir / "include").rglob("*.h"))}
    for entry in manifest["variants"]:
        for field, folder, suffix in (("source", "sources", ".asc"), ("binary", "binaries", ".o")):
            if field not in entry:
                continue
            path = set_dir / folder / f"{entry[field]}{suffix}"
            try:
                data = path.read_bytes()
            except OSError:
                raise WheelError(f"{entry['kernel']} [{entry['key']}]: {path} is missing") from None
            if hashlib.sha256(data).hexdigest() != entry[field]:
                raise WheelError(f"{entry['kernel']} [{entry['key']}]: {path} does not match its sha256")
            files[f"{package}/{folder}/{path.name}"] = data
    return files


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Build the tkaot and tkaot-<arch> wheels of this checkout.")
    parser.add_argument("--out", default="dist", help="where the wheels go (default: dist)")
    parser.add_argument("--arch", action="append", help="artifact sets from prebuilt/<arch> (default: every one there)")
    args = parser.parse_args(argv)
    arches = args.arch or sorted(p.parent.name for p in (ROOT / "prebuilt").glob("*/manifest.json"))
    from build_tools import ext

    try:
        paths = [runtime_wheel(Path(args.out))]
        if not ext.TARGET.exists():
            print(f"no {ext.TARGET.relative_to(ROOT)} (make ext): the pure runtime wheel only")
        elif ext.stale():
            raise WheelError(f"{ext.TARGET.relative_to(ROOT)} is older than its source: run make ext")
        else:
            paths.append(runtime_wheel(Path(args.out), ext.TARGET))
        paths += [artifact_wheel(ROOT / "prebuilt" / arch, Path(args.out), expect_version=tkaot_version()) for arch in arches]
    except WheelError as exc:
        raise SystemExit(f"error: {exc}") from None
    for path in paths:
        print(f"{path}  {path.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
