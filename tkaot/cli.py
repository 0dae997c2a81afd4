"""tkaot-build: one command for both wings.

The serving commands (sets, check, inspect, verify) live here and read only the runtime's
registry, the kernel declarations and manifests, so they run where only `pip install tkaot`
is. The build commands (ops, plan, build, wheel, merge) live in build_tools/cli.py and join this
group where the build extra is installed; where it is not, each still shows in --help and,
when called, says in one line how to get it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import sys
from pathlib import Path

import click

from tkaot._decl import format_value

# Where the runtime wheel puts build_tools and kernels_src (a checkout has them at its root instead)
BUILD_WING = Path(__file__).resolve().parent / "_build_wing"
WIDTH = 120  # inspect's lines fit a terminal this wide
BUILD_EXTRA = "pip install 'tkaot[build]'"
# The build wing's commands: name -> (summary for --help, the modules it needs)
BUILD_COMMANDS = {
    # build runs without TileLang only to compile an ascend950 set's sources (--sources); it says so itself otherwise
    "build": ("Compile variants into OUT (manifest.json + cubins/).", ("build_tools",)),
    "ops": ("List the kernels, the tkaot ops they serve, and their static axes.", ("build_tools", "tilelang")),
    "plan": ("Print what a build would make (variants, size, compile time); builds nothing.", ("build_tools", "tilelang")),
    "wheel": ("Pack a build directory into an installable artifact wheel.", ("build_tools",)),
    "merge": ("Join the outputs of sharded builds (--shard i/n) into one artifact directory.", ("build_tools",)),
}


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _absent(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` that cannot be imported here, found without importing it."""
    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ImportError, ValueError):
            return module
    return None


def _needs_build_extra(name: str, summary: str) -> click.Command:
    """A stand-in for a build command where the build extra is not installed: one line, exit 1."""

    def refuse(args) -> None:
        _fail(f"tkaot-build {name} needs the build extra: {BUILD_EXTRA}")

    return click.Command(
        name,
        callback=refuse,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        help=f"{summary}\n\nNeeds the build extra: {BUILD_EXTRA}",
        short_help=f"[needs tkaot[build]] {summary}",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


class _TkaotBuild(click.Group):
    """Adds the build wing's commands when one is asked for (or listed), so the serving commands never import it."""

    _attached = False

    def _attach(self) -> None:
        if self._attached:
            return
        self._attached = True
        if BUILD_WING.is_dir() and str(BUILD_WING) not in sys.path:
            sys.path.insert(0, str(BUILD_WING))
        real = {}
        if _absent(("build_tools",)) is None:
            try:
                from build_tools.cli import BUILD_COMMANDS as real
            except ImportError:  # another project's build_tools, or a broken one: offer the stand-ins
                pass
        for name, (summary, needs) in BUILD_COMMANDS.items():
            if name in real and _absent(needs) is None:
                self.add_command(real[name], name)
            else:
                self.add_command(_needs_build_extra(name, summary))

    def list_commands(self, ctx):
        self._attach()
        return super().list_commands(ctx)

    def get_command(self, ctx, name):
        if name in BUILD_COMMANDS:
            self._attach()
        return super().get_command(ctx, name)


@click.group(cls=_TkaotBuild, epilog=f"ops, plan and build need the build extra (TileLang): {BUILD_EXTRA}")
def main() -> None:
    """Serve tkaot's ahead-of-time kernels (sets, check, inspect, verify) and build more (ops, plan, build, wheel)."""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_directory(directory: str | Path, arch: str | None = None) -> Path:
    """The artifact set in `directory`: it holds manifest.json, or <arch>/manifest.json as on TKAOT_PATH."""
    path = Path(directory)
    if (path / "manifest.json").is_file():
        return path
    if arch is not None:
        if (path / arch / "manifest.json").is_file():
            return path / arch
        _fail(f"{directory} has no manifest.json (nor {arch}/manifest.json)")
    found = sorted(p.parent for p in path.glob("*/manifest.json"))
    if len(found) == 1:
        return found[0]
    if found:
        _fail(f"{directory} holds sets for {', '.join(p.name for p in found)}: pick one with --arch")
    _fail(f"{directory} has no manifest.json (nor <arch>/manifest.json)")


def _read(directory: Path) -> dict:
    path = directory / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        _fail(f"{path}: {exc}")


def _fit(text: str, indent: str) -> list[str]:
    """`text` in lines of at most WIDTH: broken after commas, then at spaces."""
    out, line = [], ""
    for token in text.replace(",", ",\0").replace(" ", " \0").split("\0"):
        if line and len(line) + len(token.rstrip()) > WIDTH:
            out.append(line.rstrip())
            line = indent
        line += token
    out.append(line.rstrip())
    return out


arch_option = click.option("--arch", help="the arch directory to read when DIRECTORY holds several (<arch>/manifest.json)")


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@arch_option
def inspect(directory, arch) -> None:
    """Print the variants of an artifact set: key, then grid, block, shared memory and cubin."""
    root = set_directory(directory, arch)
    manifest = _read(root)
    variants = manifest.get("variants", [])
    provenance = manifest.get("provenance", {})
    built_with = ", ".join(f"{k} {' '.join(v) if isinstance(v, list) else v}" for k, v in sorted(provenance.items()))
    for line in _fit(f"{root}: arch {manifest.get('arch')}, tkaot {manifest.get('tkaot_version')}, {len(variants)} variants", "    "):
        click.echo(line)
    for line in _fit(f"built with {built_with or 'no provenance recorded'}", "    "):
        click.echo(line)
    for e in variants:
        launch = e["launch"]
        for line in _fit(f"{e['kernel']} {e['key']}", "    "):
            click.echo(line)
        block = "x".join(map(str, launch["block"]))
        detail = f"    grid {' x '.join(launch['grid'])}  block {block}  smem {launch['smem']}  cubin {e['cubin'][:12]}"
        for line in _fit(detail, "        "):
            click.echo(line)


def cubin_arch(data: bytes) -> str | None:
    """The SM arch a CUDA ELF cubin was built for ("sm_90a", "sm_90"), or None if not a cubin."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    flags = struct.unpack_from("<I", data, 48)[0]
    # CUDA 12.8+ ELF ABI keeps the SM in bits 8-15 (low byte = ABI version); older cubins in bits 0-7
    sm = (flags >> 8) & 0xFF if flags & 0xFF < 0x10 else flags & 0xFF
    # ptxas records its target in the cubin; the "a" suffix marks arch-specific code
    suffix = "a" if f"-arch sm_{sm}a".encode() in data else ""
    return f"sm_{sm}{suffix}"


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@arch_option
def verify(directory, arch) -> None:
    """Check every cubin's sha256 and target arch against the manifest (every arch's set of a root, without --arch)."""
    path = Path(directory)
    several = arch is None and not (path / "manifest.json").is_file() and len(list(path.glob("*/manifest.json"))) > 1
    roots = sorted(p.parent for p in path.glob("*/manifest.json")) if several else [set_directory(directory, arch)]
    failed = sum(_verify_set(root) for root in roots)
    if failed:
        _fail(f"{failed} variants failed verification")


def _verify_set(root: Path) -> int:
    """Verify one artifact set; print what failed (or one ok line) and return how many variants failed. A CUDA set's
    cubins are checked against their sha256 and arch; an Ascend set's AscendC sources (and binaries, where built)."""
    manifest = _read(root)
    want = {"sm90": "sm_90a", "sm100": "sm_100a"}.get(manifest["arch"])
    bad = []
    for e in manifest["variants"]:
        files = [("cubins", e["cubin"], ".cubin")] if "cubin" in e else [("sources", e["source"], ".asc")]
        if "binary" in e:
            files.append(("binaries", e["binary"], ".o"))
        for folder, digest, suffix in files:
            path = root / folder / f"{digest}{suffix}"
            if not path.exists():
                bad.append(f"{e['kernel']} [{e['key']}]: missing {path}")
                continue
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != digest:
                bad.append(f"{e['kernel']} [{e['key']}]: sha256 mismatch in {path}")
            found = cubin_arch(data) if folder == "cubins" and want else want
            if found != want:
                bad.append(f"{e['kernel']} [{e['key']}]: cubin is {found}, expected {want}")
    for line in bad:
        click.echo(line, err=True)
    if bad:
        click.echo(f"{root}: {len(bad)} of {len(manifest['variants'])} variants failed verification", err=True)
    elif want:
        click.echo(f"ok: {root}: {len(manifest['variants'])} variants, every cubin matches its sha256 and is {want}")
    else:
        click.echo(f"ok: {root}: {len(manifest['variants'])} variants, every file matches its sha256")
    return len(bad)


@main.command()
@click.option("--arch", default="sm90", show_default=True)
@click.option("--variants", "show_variants", is_flag=True, help="also list every variant")
def sets(arch, show_variants) -> None:
    """List the artifact sets the runtime would use for ARCH, in priority order, and the launcher in use.

    Exits 1 if a set on the path is refused (another tkaot version, an unreadable manifest).
    """
    from tkaot._kernel import LAUNCHER_KIND, LAUNCHER_WHY
    from tkaot.errors import TkaotError
    from tkaot.registry import check_version, discover

    click.echo(f"launcher: {LAUNCHER_KIND} ({LAUNCHER_WHY})")
    found = discover(arch)
    if not found:
        click.echo(f"no artifact set for {arch}: pip install 'tkaot[{arch}]', or build one and put it on TKAOT_PATH")
    refused = 0
    for s in found:
        try:
            check_version(s, arch)
            variants = s.manifest["variants"]
            status = f"tkaot {s.manifest.get('tkaot_version')}, {len(variants)} variants"
        except TkaotError as exc:
            variants, status = [], f"REFUSED: {exc}"
            refused += 1
        counts: dict[str, int] = {}
        for e in variants:
            counts[e["kernel"]] = counts.get(e["kernel"], 0) + 1
        click.echo(f"{s.origin}: {status}" + "".join(f"\n    {k}: {n}" for k, n in sorted(counts.items())))
        if show_variants:
            for e in variants:
                click.echo(f"        {e['kernel']} {e['key']}")
    if refused:
        _fail(f"{refused} of {len(found)} artifact sets refused; the runtime would refuse them too")


def _have(arch: str, artifact_dirs: tuple[str, ...]) -> tuple[set, str]:
    """{(kernel, frozenset of (axis, value text))} the sets hold, and where they were found."""
    from tkaot.errors import TkaotError
    from tkaot.registry import ArtifactSet, Registry

    try:
        if artifact_dirs:
            found = [ArtifactSet(root, str(root)) for root in (set_directory(d, arch) for d in artifact_dirs)]
            found = [s for s in found if s.arch == arch]
        else:
            found = Registry().artifact_sets(arch)
        have = set()
        for s in found:
            have |= {(e["kernel"], frozenset((k, format_value(v)) for k, v in e["static"].items())) for e in s.manifest["variants"]}
    except TkaotError as exc:
        _fail(str(exc))
    return have, ", ".join(s.origin for s in found) or f"no artifact set for {arch}"


def unsupported_lines(needed) -> list[str]:
    """The report of variants no kernel builds: one line each with the reason, then what to do per kernel.

    `check` and `build --hf-config` print the same lines.
    """
    from tkaot._model_shapes import advice

    lines, kernels = [], []
    for v in needed:
        if v.reason is not None:
            lines.append(f"unsupported {v.kernel} {v.key}: {v.reason}")
            kernels += [] if v.kernel in kernels else [v.kernel]
    lines += [f"  {kernel}: {advice(kernel)}" for kernel in kernels]
    return lines


def generic_static(v) -> tuple[str, frozenset] | None:
    """(generic kernel, its static values as check compares them) serving a needed variant, if its kernel has one."""
    from tkaot._decl import all_kernels, generic_kernel

    generic = generic_kernel(v.kernel)
    if generic is None:
        return None
    values, _ = generic.split(all_kernels()[v.kernel], v.values)
    return generic.name, frozenset(zip(generic.axis_names, map(format_value, values)))


@main.command()
@click.option("--hf-config", "hf_configs", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--artifacts", "artifact_dirs", multiple=True, type=click.Path(exists=True, file_okay=False), help="check these sets instead")
@click.option("--arch", default="sm90", show_default=True)
@click.option("--variants", "show_variants", is_flag=True, help="list every variant with how it is served")
def check(hf_configs, artifact_dirs, arch, show_variants) -> None:
    """Report how the artifact sets serve the variants a model needs: specialised, generic or missing.

    Without --artifacts, checks the sets the runtime would use (TKAOT_PATH,
    installed packages, a source checkout's prebuilt/). Run it before serving.

    A variant whose specialised build is absent but whose kernel's generic
    variant is there runs on that (the same results, slower; the runtime warns
    once): it is reported as generic, and does not fail the check. A variant no kernel can build (its values are
    outside a kernel's declared axes) is reported as unsupported, with the
    reason and what to do; building cannot fix it, so it does not fail the
    check either. Exit status 1 only when a variant that `tkaot-build build`
    can make is missing.
    """
    from tkaot._model_shapes import load_config, needed_variants, shape_tables

    have, sources = _have(arch, artifact_dirs)
    gaps = 0
    for config in hf_configs:
        try:
            model = load_config(config)
        except ValueError as exc:
            _fail(str(exc))
        needed = needed_variants(shape_tables(model))
        status = {}
        for v in needed:
            if v.reason is not None:
                status[v] = "unsupported"
            elif (v.kernel, v.static) in have:
                status[v] = "specialised"
            else:
                status[v] = "generic" if generic_static(v) in have else "missing"
        missing = [v for v in needed if status[v] == "missing"]
        generic = [v for v in needed if status[v] == "generic"]
        unsupported = sum(s == "unsupported" for s in status.values())
        kernels = sorted({v.kernel for v in needed})
        name = model.name if model.name == str(config) else f"{model.name} ({config})"
        tail = (f"; {len(generic)} generic" if generic else "") + (f"; {unsupported} unsupported" if unsupported else "")
        click.echo(f"{name}: needs {len(needed)} variants of {', '.join(kernels) or 'no kernel tkaot has'}; {len(missing)} missing{tail}")
        for v in needed if show_variants else missing + generic:
            if status[v] != "unsupported":
                click.echo(f"    {status[v]} {v.kernel} {v.key}")
        for line in unsupported_lines(needed):
            click.echo(f"    {line}")
        if missing or generic:
            fix = f"tkaot-build build --hf-config {config} --arch {arch} -j {_cores()} --out DIR"
            click.echo(f"    {'build them' if missing else 'specialise the generic ones'}: {fix}")
            click.echo("    then serve with TKAOT_PATH=DIR, or pack them: tkaot-build wheel DIR --name NAME")
        gaps += len(missing)
    click.echo(f"checked against: {sources}")
    if gaps:
        _fail(f"{gaps} variants missing")


if __name__ == "__main__":  # pragma: no cover
    main()
