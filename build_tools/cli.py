"""tkaot-build: the command line over the build pipeline. It only parses into Variants."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
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


def _variants_from_options(shapeset, op, sets) -> list:
    from build_tools.ops import Variant
    from build_tools.sweep import expand_table, load_shapeset

    if bool(shapeset) == bool(op):
        _fail("give exactly one of --shapeset NAME|FILE or --op NAME --set key=value ...")
    try:
        if shapeset:
            return load_shapeset(shapeset)
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


@main.command()
@click.option("--shapeset", help="a named shape set (build_tools/shapesets) or a .toml file")
@click.option("--op", "op", help="one kernel, with its axes given by --set")
@click.option("--set", "sets", multiple=True, help="static axis value, key=value (value may be a|b|c)")
@click.option("--arch", default="sm90", show_default=True)
@click.option("--out", "out_dir", default="tkaot-artifacts", show_default=True, type=click.Path(file_okay=False))
@click.option("-j", "--jobs", default=1, show_default=True, help="parallel compile processes")
@click.option("--shard", help="build only shard i/n of the sweep (0-based)")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="build cache (default ~/.cache/tkaot/build)")
def build(shapeset, op, sets, arch, out_dir, jobs, shard, cache_dir) -> None:
    """Compile variants into OUT (manifest.json + cubins/)."""
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.compile import ARCHES, BuildError
    from build_tools.sweep import shard as take_shard

    if arch not in ARCHES:
        _fail(f"unknown arch {arch!r}; this build knows {sorted(ARCHES)}")
    variants = _variants_from_options(shapeset, op, sets)
    try:
        variants = take_shard(variants, shard)
    except ValueError as exc:
        _fail(str(exc))
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
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def inspect(directory) -> None:
    """Print a table of the variants in an artifact directory."""
    manifest = _read(directory)
    rows = [
        (e["kernel"], e["key"], " x ".join(e["launch"]["grid"]), e["launch"]["smem"], e["cubin"][:12]) for e in manifest["variants"]
    ]
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
