"""tkaot-build: the command line over the build pipeline. It only parses into Variants."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import click


def _fail(message: str) -> None:
    raise click.ClickException(message)


@click.group()
def main() -> None:
    """Build tkaot's kernels ahead of time into cubins and manifests."""


@main.command()
def ops() -> None:
    """List the kernels, the tkaot ops they serve, and their static axes."""
    from build_tools.ops import KERNEL_MODULES, kernel_axes, kernel_ops

    for kernel in sorted(KERNEL_MODULES):
        click.echo(f"{kernel}  (serves {', '.join(kernel_ops(kernel))})")
        for axis in kernel_axes(kernel):
            click.echo(f"    {axis.name:<16} {axis.describe()}")


def _variants_from_options(shapeset, op, sets, hf_configs=()) -> list:
    from build_tools.ops import Variant
    from build_tools.sweep import expand_table, load_shapeset, model_shapeset, sweep

    if sum(map(bool, (shapeset, op, hf_configs))) != 1:
        _fail("give exactly one of --shapeset NAME|FILE, --hf-config config.json, or --op NAME --set key=value ...")
    try:
        if shapeset:
            return load_shapeset(shapeset)
        if hf_configs:
            merged: dict[str, list] = {}
            for config in hf_configs:
                for kernel, tables in model_shapeset(config).items():
                    merged.setdefault(kernel, []).extend(tables)
            refused: list[str] = []
            variants = sweep(merged, refused)
            for line in refused:
                click.echo(f"skipped (no kernel builds it): {line}", err=True)
            return variants
        table: dict[str, list] = {}
        for item in sets:
            if "=" not in item:
                _fail(f"--set wants key=value, got {item!r}")
            k, v = item.split("=", 1)
            table.setdefault(k, []).extend(v.split("|"))
        variants = expand_table(op, table)
        return [Variant.make(v.kernel, v.params) for v in variants]
    except ValueError as exc:
        _fail(str(exc))


def _selection(command):
    """The options that choose variants, shared by build and plan."""
    options = [
        click.option("--shapeset", help="a named shape set (build_tools/shapesets) or a .toml file"),
        click.option(
            "--hf-config",
            "hf_configs",
            multiple=True,
            type=click.Path(dir_okay=False),
            help="a model's config.json: every variant it needs",
        ),
        click.option("--op", "op", help="one kernel, with its axes given by --set"),
        click.option("--set", "sets", multiple=True, help="static axis value, key=value (value may be a|b|c)"),
        click.option("--arch", default="sm90", show_default=True),
        click.option("-j", "--jobs", default=1, show_default=True, help="parallel compile processes"),
        click.option("--shard", help="build only shard i/n of the sweep (0-based)"),
        click.option("--cache-dir", type=click.Path(file_okay=False), help="build cache (default ~/.cache/tkaot/build)"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _selected(shapeset, hf_configs, op, sets, arch, shard) -> list:
    from build_tools.compile import ARCHES
    from build_tools.sweep import shard as take_shard

    if arch not in ARCHES:
        _fail(f"unknown arch {arch!r}; this build knows {sorted(ARCHES)}")
    variants = _variants_from_options(shapeset, op, sets, hf_configs)
    try:
        return take_shard(variants, shard)
    except ValueError as exc:
        _fail(str(exc))


@main.command()
@_selection
@click.option("--out", "out_dir", default="tkaot-artifacts", show_default=True, type=click.Path(file_okay=False))
def build(shapeset, hf_configs, op, sets, arch, jobs, shard, cache_dir, out_dir) -> None:
    """Compile variants into OUT (manifest.json + cubins/)."""
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.compile import BuildError

    variants = _selected(shapeset, hf_configs, op, sets, arch, shard)
    click.echo(f"{len(variants)} variants for {arch} -> {out_dir}")
    with click.progressbar(length=len(variants), label="building", file=sys.stderr) as bar:

        def progress(variant, cached):
            bar.update(1)

        try:
            report = build_variants(variants, Path(out_dir), arch, jobs, BuildCache(cache_dir), progress)
        except BuildError as exc:
            _fail(str(exc))
    click.echo(f"built {report.built}, from cache {report.cached}; manifest has {len(report.manifest['variants'])} variants")


@main.command()
@_selection
def plan(shapeset, hf_configs, op, sets, arch, jobs, shard, cache_dir) -> None:
    """Print what a build would make (variants per kernel, size, time) without building."""
    from build_tools.artifacts import BuildCache
    from build_tools.compile import BuildError

    variants = _selected(shapeset, hf_configs, op, sets, arch, shard)
    try:
        rows, notes = estimate(variants, arch, BuildCache(cache_dir))
    except BuildError as exc:
        _fail(str(exc))
    click.echo(f"{len(variants)} variants for {arch}, -j {jobs}")
    click.echo(f"{'kernel':<16} {'variants':>8} {'cached':>7} {'cubins':>10} {'compile':>9}")
    for r in rows:
        click.echo(f"{r.kernel:<16} {r.variants:>8} {r.cached:>7} {_mb(r.size_bytes):>10} {_duration(r.seconds):>9}")
    total_seconds = sum(r.seconds for r in rows) / max(jobs, 1)
    click.echo(f"estimated: {_mb(sum(r.size_bytes for r in rows))} of cubins, {_duration(total_seconds)} on {jobs} jobs")
    for note in notes:
        click.echo(f"  ({note})")


# Core-seconds to lower + nvcc one variant: each kernel's share of a from-scratch build of
# the default set (495 variants, -j 2, empty cache: 569 s) on a 2-core CPU machine that
# other builds were also using, so they are rough (the 529-variant set later built from
# scratch in 354 s on an idle machine: 1.34 core-seconds a variant on average). A kernel
# not listed is assumed to cost the listed ones' mean.
COMPILE_SECONDS = {
    "cast": 1.8,
    "cast_back": 1.0,
    "moe_topk_gate": 4.6,
    "norm_cast": 1.2,
    "normalize_weight": 1.5,
    "per_block_cast": 1.3,
    "per_channel_cast": 1.3,
    "per_token_cast": 1.4,
    "rmsnorm": 2.6,
    "rotary": 5.0,
    "swiglu": 6.6,
    "topk_gate": 6.4,
}
DEFAULT_CUBIN_BYTES = 12_000


@dataclass
class PlanRow:
    kernel: str
    variants: int
    cached: int
    size_bytes: float
    seconds: float  # core-seconds to compile what the cache lacks


def measured_cubin_bytes(arch: str) -> dict[str, float]:
    """Mean cubin size per kernel over the artifact sets this machine can see."""
    from tkaot.registry import discover

    sizes: dict[str, list[int]] = {}
    for s in discover(arch):
        try:
            entries = s.manifest["variants"]
        except Exception:  # an unreadable set measures nothing; check and sets report it
            continue
        for e in entries:
            path = s.root / "cubins" / f"{e['cubin']}.cubin"
            if path.exists():
                sizes.setdefault(e["kernel"], []).append(path.stat().st_size)
    return {k: sum(v) / len(v) for k, v in sizes.items()}


def estimate(variants: list, arch: str, cache) -> tuple[list[PlanRow], list[str]]:
    """Per-kernel counts and estimates for building `variants`, given what `cache` holds."""
    from build_tools.compile import cache_key
    from build_tools.ops import source_sha256

    sizes = measured_cubin_bytes(arch)
    mean_size = sum(sizes.values()) / len(sizes) if sizes else DEFAULT_CUBIN_BYTES
    mean_seconds = sum(COMPILE_SECONDS.values()) / len(COMPILE_SECONDS)
    by_kernel: dict[str, list] = {}
    for v in variants:
        by_kernel.setdefault(v.kernel, []).append(v)
    rows, notes = [], []
    for kernel, kernel_variants in sorted(by_kernel.items()):
        source = source_sha256(kernel)
        cached = sum(cache.get(v, arch, cache_key(v, arch, source), source) is not None for v in kernel_variants)
        if kernel not in sizes:
            notes.append(f"{kernel}: no built cubin to measure; assumed {mean_size / 1e3:.0f} kB each")
        if kernel not in COMPILE_SECONDS:
            notes.append(f"{kernel}: compile time not measured; assumed {mean_seconds:.1f} core-s each")
        per_variant = COMPILE_SECONDS.get(kernel, mean_seconds)
        rows.append(
            PlanRow(
                kernel,
                len(kernel_variants),
                cached,
                len(kernel_variants) * sizes.get(kernel, mean_size),
                (len(kernel_variants) - cached) * per_variant,
            )
        )
    return rows, notes


def _mb(size: float) -> str:
    return f"{size / 1e6:.2f} MB"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def inspect(directory) -> None:
    """Print a table of the variants in an artifact directory."""
    manifest = _read(directory)
    rows = [(e["kernel"], e["key"], " x ".join(e["launch"]["grid"]), e["launch"]["smem"], e["cubin"][:12]) for e in manifest["variants"]]
    head = f"arch {manifest['arch']}, tkaot {manifest['tkaot_version']}, {len(rows)} variants"
    click.echo(f"{head}, provenance {json.dumps(manifest['provenance'])}")
    width = max([len(r[1]) for r in rows] + [3])
    click.echo(f"{'kernel':<10} {'key':<{width}}  {'grid':<28} {'smem':>6}  cubin")
    for kernel, key, grid, smem, cubin in rows:
        click.echo(f"{kernel:<10} {key:<{width}}  {grid:<28} {smem:>6}  {cubin}")


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
def verify(directory) -> None:
    """Check every cubin's sha256 and target arch against the manifest."""
    manifest = _read(directory)
    want = {"sm90": "sm_90a"}.get(manifest["arch"])
    bad = []
    for e in manifest["variants"]:
        path = Path(directory) / "cubins" / f"{e['cubin']}.cubin"
        if not path.exists():
            bad.append(f"{e['kernel']} [{e['key']}]: missing {path}")
            continue
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != e["cubin"]:
            bad.append(f"{e['kernel']} [{e['key']}]: sha256 mismatch in {path}")
        arch = cubin_arch(data)
        if want and arch != want:
            bad.append(f"{e['kernel']} [{e['key']}]: cubin is {arch}, expected {want}")
    for line in bad:
        click.echo(line, err=True)
    if bad:
        _fail(f"{len(bad)} of {len(manifest['variants'])} variants failed verification")
    click.echo(f"ok: {len(manifest['variants'])} variants, every cubin matches its sha256 and is {want}")


@main.command()
@click.option("--arch", default="sm90", show_default=True)
@click.option("--variants", "show_variants", is_flag=True, help="also list every variant")
def sets(arch, show_variants) -> None:
    """List the artifact sets the runtime would use for ARCH, in priority order, and the launcher in use."""
    from tkaot._kernel import LAUNCHER_KIND, LAUNCHER_WHY
    from tkaot.errors import TkaotError
    from tkaot.registry import check_version, discover

    click.echo(f"launcher: {LAUNCHER_KIND} ({LAUNCHER_WHY})")
    found = discover(arch)
    if not found:
        click.echo(f"no artifact set for {arch}: pip install 'tkaot[{arch}]', or build one and put it on TKAOT_PATH")
    for s in found:
        try:
            check_version(s, arch)
            variants = s.manifest["variants"]
            status = f"tkaot {s.manifest.get('tkaot_version')}, {len(variants)} variants"
        except TkaotError as exc:
            variants, status = [], f"REFUSED: {exc}"
        counts: dict[str, int] = {}
        for e in variants:
            counts[e["kernel"]] = counts.get(e["kernel"], 0) + 1
        click.echo(f"{s.origin}: {status}" + "".join(f"\n    {k}: {n}" for k, n in sorted(counts.items())))
        if show_variants:
            for e in variants:
                click.echo(f"        {e['kernel']} {e['key']}")


@main.command()
@click.option("--hf-config", "hf_configs", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--artifacts", "artifact_dirs", multiple=True, type=click.Path(exists=True, file_okay=False), help="check these sets instead")
@click.option("--arch", default="sm90", show_default=True)
def check(hf_configs, artifact_dirs, arch) -> None:
    """Report the variants a model needs that the artifact sets lack; exit 1 if any.

    Without --artifacts, checks the sets the runtime would use (TKAOT_PATH,
    installed packages, a source checkout's prebuilt/). Run it before serving.
    """
    from build_tools.model_shapes import load_config, shape_tables, static_keys
    from build_tools.ops import format_value
    from tkaot.errors import TkaotError
    from tkaot.registry import ArtifactSet, Registry, _arch_dir

    try:
        if artifact_dirs:
            found = []
            for d in artifact_dirs:
                root = _arch_dir(Path(d), arch)
                if root is None:
                    _fail(f"{d} has no manifest.json (nor {arch}/manifest.json)")
                found.append(ArtifactSet(root, str(root)))
            found = [s for s in found if s.arch == arch]
        else:
            found = Registry().artifact_sets(arch)
        have = set()
        for s in found:
            have |= {(e["kernel"], frozenset((k, format_value(v)) for k, v in e["static"].items())) for e in s.manifest["variants"]}
    except TkaotError as exc:
        _fail(str(exc))
    sources = ", ".join(s.origin for s in found) or f"no artifact set for {arch}"
    gaps = 0
    for config in hf_configs:
        try:
            model = load_config(config)
        except ValueError as exc:
            _fail(str(exc))
        need = static_keys(shape_tables(model))
        missing = sorted((kernel, key) for (kernel, static), key in need.items() if (kernel, static) not in have)
        kernels = sorted({kernel for kernel, _ in need})
        click.echo(f"{model.name}: needs {len(need)} variants of {', '.join(kernels) or 'no kernel tkaot has'}; {len(missing)} missing")
        for kernel, key in missing:
            click.echo(f"    missing {kernel} {key}")
        if missing:
            fix = f"tkaot-build build --hf-config {config} --arch {arch} --out DIR"
            click.echo(f"    build them: {fix}; then serve with TKAOT_PATH=DIR, or pack them: tkaot-build wheel DIR --name NAME")
        gaps += len(missing)
    click.echo(f"checked against: {sources}")
    if gaps:
        _fail(f"{gaps} variants missing")


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--name", help="the set's name: the package becomes tkaot_<arch>_<name> (default: the tkaot_<arch> set itself)")
@click.option("--out", "out_dir", default="dist", show_default=True, type=click.Path(file_okay=False))
def wheel(directory, name, out_dir) -> None:
    """Pack a build directory into an installable artifact wheel, found beside tkaot-<arch>."""
    from build_tools.wheel import WheelError, artifact_wheel

    try:
        path = artifact_wheel(Path(directory), Path(out_dir), name)
    except WheelError as exc:
        _fail(str(exc))
    click.echo(f"{path} ({path.stat().st_size / 1e6:.2f} MB): pip install {path}")


def _read(directory) -> dict:
    path = Path(directory) / "manifest.json"
    if not path.exists():
        _fail(f"{directory} has no manifest.json")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        _fail(f"{path}: {exc}")


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
