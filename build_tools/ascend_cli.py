"""`tkaot-build build --arch ascend950`: the two stages of build_tools/ascend.py behind the build command.

With a selection (--shapeset, --hf-config or --op): stage 1 lowers the selected variants that have an
Ascend kernel (the others are counted and left out, each reason once) into OUT, then stage 2 compiles
them where bisheng is found; where it is not, the command says what is missing and stops after stage 1
(exit 0, or 1 with --require-binaries). With --sources DIR instead: stage 2 alone, from the sources of
the set in DIR (an installed tkaot-ascend950 package or a checkout's prebuilt/ascend950), no TileLang.
"""

from __future__ import annotations

from pathlib import Path

import click

from build_tools.cli import _fail, _needs_tilelang, _selected


def build_ascend(shapeset, hf_configs, op, sets, jobs, shard, cache_dir, out_dir, sources_dir, require_binaries) -> None:
    from build_tools import ascend
    from build_tools.compile import BuildError

    if sources_dir:
        if shapeset or hf_configs or op:
            _fail("--sources compiles the variants of that set; give no --shapeset, --hf-config or --op with it")
        _stage2(ascend, Path(out_dir), Path(sources_dir), cache_dir, require=True)
        return
    _needs_tilelang()
    variants = _selected(shapeset, hf_configs, op, sets, ascend.ARCH, shard)
    try:
        kept, left = ascend.select(variants)
    except ValueError as exc:
        _fail(str(exc))
    click.echo(f"{len(kept)} of {len(variants)} variants have an Ascend kernel -> {out_dir}")
    for reason, count in sorted(left.items()):
        click.echo(f"  left out {count}: {reason}", err=True)
    try:
        lowered, fresh = ascend.lower_all(kept, jobs, ascend.LoweringCache(cache_dir))
        manifest = ascend.write_sources(Path(out_dir), lowered)
    except BuildError as exc:
        _fail(str(exc))
    click.echo(f"stage 1: lowered {fresh}, from cache {len(kept) - fresh}; manifest has {len(manifest['variants'])} variants")
    _stage2(ascend, Path(out_dir), None, cache_dir, require=require_binaries)


def _stage2(ascend, out_dir: Path, sources_dir: Path | None, cache_dir, require: bool) -> None:
    from build_tools.compile import BuildError

    missing = ascend.missing_tools()
    if missing:
        message = ascend.tools_message(missing).replace("--sources DIR --out DIR", f"--sources {sources_dir or out_dir} --out {out_dir}")
        if require:
            _fail(message)
        click.echo(message, err=True)
        return
    try:
        manifest, compiled = ascend.compile_binaries(out_dir, sources_dir, cache_dir)
    except BuildError as exc:
        _fail(str(exc))
    click.echo(f"stage 2: compiled {compiled} binaries with bisheng; {len(manifest['variants'])} variants in {out_dir}")
