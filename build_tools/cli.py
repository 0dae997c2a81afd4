"""The build wing of tkaot-build: ops, plan, build, wheel and merge (BUILD_COMMANDS). Each parses its options into
Variants or paths and leaves the work to build_tools' modules.

These commands join the one `tkaot-build` group (tkaot/cli.py, which holds the serving commands: sets, check,
inspect, verify) where the build extra is installed; `main` here is that whole group.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from tkaot.cli import cubin_arch  # noqa: F401  (tests and older callers import it from here)


def _fail(message: str) -> None:
    raise click.ClickException(message)


def _needs_tilelang() -> None:
    """`build` runs without TileLang only to compile Ascend sources (--arch ascend950 --sources); else one line."""
    from tkaot.cli import BUILD_EXTRA, _absent

    if _absent(("tilelang",)) is not None:
        _fail(f"tkaot-build build needs the build extra: {BUILD_EXTRA}")


def __getattr__(name: str):
    if name == "main":  # the whole tkaot-build group, read lazily: tkaot.cli adds these commands to it
        from tkaot.cli import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@click.command()
def ops() -> None:
    """List the kernels, the tkaot ops they serve, and their static axes."""
    from build_tools.ops import KERNEL_MODULES, kernel_axes, kernel_ops

    for kernel in sorted(KERNEL_MODULES):
        click.echo(f"{kernel}  (serves {', '.join(kernel_ops(kernel))})")
        for axis in kernel_axes(kernel):
            click.echo(f"    {axis.name:<16} {axis.describe()}")


def _variants_from_options(shapeset, op, sets, hf_configs=()) -> list:
    from build_tools.ops import Variant
    from build_tools.sweep import expand_table, load_shapeset

    if sum(map(bool, (shapeset, op, hf_configs))) != 1:
        _fail("give exactly one of --shapeset NAME|FILE, --hf-config config.json, or --op NAME --set key=value ...")
    try:
        if shapeset:
            return load_shapeset(shapeset)
        if hf_configs:
            return _model_variants(hf_configs)
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


def _model_variants(hf_configs) -> list:
    """What the models need, less what no kernel builds: decided and reported as `check` does."""
    from build_tools.ops import Variant
    from build_tools.sweep import model_shapeset
    from tkaot._model_shapes import needed_variants
    from tkaot.cli import unsupported_lines

    needed = {}
    for config in hf_configs:
        for v in needed_variants(model_shapeset(config)):
            needed.setdefault((v.kernel, v.key), v)
    for line in unsupported_lines(list(needed.values())):
        click.echo(f"skipped, {line}" if line.startswith("unsupported") else line, err=True)
    return [Variant.make(v.kernel, v.params) for v in needed.values() if v.reason is None]


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

    if arch not in ARCHES and arch != ASCEND_ARCH:
        _fail(f"unknown arch {arch!r}; this build knows {sorted([*ARCHES, ASCEND_ARCH])}")
    variants = _variants_from_options(shapeset, op, sets, hf_configs)
    try:
        return take_shard(variants, shard)
    except ValueError as exc:
        _fail(str(exc))


_clock = time.monotonic  # tests replace it


class ProgressLines:
    """Build progress for a log (stderr not a terminal): a line as variants finish, at most one every `interval`
    seconds, and one at the end."""

    def __init__(self, total: int, interval: float = 30.0):
        self.total, self.interval, self.clock = total, interval, _clock
        self.done = self.cached = 0
        self.start = self.last = self.clock()

    def __call__(self, variant, cached: bool) -> None:
        self.done += 1
        self.cached += cached
        now = self.clock()
        if now - self.last >= self.interval or self.done == self.total:
            self.last = now
            click.echo(self.line(now), err=True)

    def line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        compiled = self.done - self.cached
        rate = compiled / elapsed
        left = self.total - self.done
        eta = _duration(left / rate) if rate > 0 else "unknown"
        if not left:
            eta = "done"
        return f"built {self.done}/{self.total} ({self.cached} from cache) in {_duration(elapsed)}, {rate * 60:.1f} variants/min, ETA {eta}"


ASCEND_ARCH = "ascend950"  # built by build_tools/ascend.py: AscendC sources (TileLang), then binaries (CANN's bisheng)


@click.command()
@_selection
@click.option("--out", "out_dir", default="tkaot-artifacts", show_default=True, type=click.Path(file_okay=False))
@click.option(
    "--sources",
    "sources_dir",
    type=click.Path(exists=True, file_okay=False),
    help=f"{ASCEND_ARCH} only: compile the AscendC sources of this set into OUT with bisheng (no TileLang needed)",
)
@click.option("--require-binaries", is_flag=True, help=f"{ASCEND_ARCH} only: fail, rather than stop after the sources, without bisheng")
def build(shapeset, hf_configs, op, sets, arch, jobs, shard, cache_dir, out_dir, sources_dir, require_binaries) -> None:
    """Compile variants into OUT (manifest.json + cubins/; for ascend950 AscendC sources, then binaries)."""
    if arch == ASCEND_ARCH:
        from build_tools.ascend_cli import build_ascend

        build_ascend(shapeset, hf_configs, op, sets, jobs, shard, cache_dir, out_dir, sources_dir, require_binaries)
        return
    if sources_dir:
        _fail(f"--sources compiles an {ASCEND_ARCH} set; it does not apply to --arch {arch}")
    _needs_tilelang()
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.compile import BuildError

    variants = _selected(shapeset, hf_configs, op, sets, arch, shard)
    click.echo(f"{len(variants)} variants for {arch} -> {out_dir}")
    try:
        if sys.stderr.isatty():
            with click.progressbar(length=len(variants), label="building", file=sys.stderr) as bar:
                report = build_variants(variants, Path(out_dir), arch, jobs, BuildCache(cache_dir), lambda v, cached: bar.update(1))
        else:  # a log: a line as variants finish, at most one every 30 s
            click.echo(f"building {len(variants)} variants on {jobs} jobs", err=True)
            report = build_variants(variants, Path(out_dir), arch, jobs, BuildCache(cache_dir), ProgressLines(len(variants)))
    except BuildError as exc:
        _fail(str(exc))
    click.echo(f"built {report.built}, from cache {report.cached}; manifest has {len(report.manifest['variants'])} variants")


@click.command()
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
    width = max([len(r.kernel) for r in rows] + [len("kernel")])
    click.echo(f"{'kernel':<{width}} {'variants':>8} {'cached':>7} {'cubins':>10} {'core-time':>10}")
    for r in rows:
        click.echo(f"{r.kernel:<{width}} {r.variants:>8} {r.cached:>7} {_mb(r.size_bytes):>10} {_duration(r.seconds):>10}")
    total_seconds = sum(r.seconds for r in rows) / max(jobs, 1)
    click.echo(f"estimated: {_mb(sum(r.size_bytes for r in rows))} of cubins, {_duration(total_seconds)} wall on {jobs} jobs")
    click.echo("  (core-time: CPU time to compile what the cache lacks; wall time is about core-time / jobs)")
    for note in notes:
        click.echo(f"  ({note})")


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
    from build_tools.build import COMPILE_SECONDS
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
        # variants differing only in axes their kernel takes at run time (RUNTIME_AXES) share a key, so one cubin
        keys = {cache_key(v, arch, source): v for v in kernel_variants}
        cached = sum(cache.get(v, arch, key, source) is not None for key, v in keys.items())
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
                len(keys) * sizes.get(kernel, mean_size),
                (len(keys) - cached) * per_variant,
            )
        )
    return rows, notes


def _mb(size: float) -> str:
    return f"{size / 1e6:.2f} MB"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


@click.command()
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


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.argument("shard_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
def merge(out_dir, shard_dirs) -> None:
    """Join the outputs of sharded builds (--shard i/n) into OUT_DIR, as one unsharded build would have written it.

    The shards must come from one tkaot and toolchain for one arch; a variant in two shards must be identical,
    and every cubin's sha256 is checked before it is copied.
    """
    from build_tools.artifacts import MergeError, merge_artifacts

    try:
        manifest = merge_artifacts(Path(out_dir), [Path(d) for d in shard_dirs])
    except MergeError as exc:
        _fail(str(exc))
    click.echo(f"merged {len(shard_dirs)} shards: {len(manifest['variants'])} {manifest['arch']} variants -> {out_dir}")


BUILD_COMMANDS = {c.name: c for c in (build, ops, plan, wheel, merge)}


if __name__ == "__main__":  # pragma: no cover
    from tkaot.cli import main

    main()
