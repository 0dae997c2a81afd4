"""Build a list of Variants into an artifact directory: cache, parallel compile, manifest.

A variant whose cache key (compile.cache_key: its declaration and sources, static values, tool
versions and flags) is in the build cache is not compiled again; the rest compile in `jobs`
processes, each checked against its kernel's declaration. The artifact directory gets the cubins,
manifest.json and build-info.json (build_tools/artifacts.py).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from build_tools.artifacts import BuildCache, write_artifacts
from build_tools.compile import CompiledVariant, cache_key, compile_variant
from build_tools.ops import Variant, source_sha256


@dataclass
class BuildReport:
    built: int
    cached: int
    manifest: dict


def _compile_in_worker(variant: Variant, arch: str) -> CompiledVariant:
    return compile_variant(variant, arch)


def build_variants(
    variants: list[Variant],
    out_dir: Path,
    arch: str = "sm90",
    jobs: int = 1,
    cache: BuildCache | None = None,
    progress: Callable[[Variant, bool], None] | None = None,
) -> BuildReport:
    """Compile what the cache lacks (in `jobs` processes), then write out_dir."""
    cache = cache or BuildCache()
    done: list[CompiledVariant] = []
    todo: list[tuple[Variant, str]] = []
    sharing: dict[str, list[Variant]] = {}  # key -> the variants that share its cubin (RUNTIME_AXES), the compiled one first
    hashes = {k: source_sha256(k) for k in {v.kernel for v in variants}}
    for v in variants:
        key = cache_key(v, arch, hashes[v.kernel])
        if key in sharing:
            sharing[key].append(v)
            continue
        sharing[key] = [v]
        hit = cache.get(v, arch, key, hashes[v.kernel])
        if hit is not None:
            done.append(hit.serving(v))
            if progress:
                progress(v, True)
        else:
            todo.append((v, key))
    if todo:
        if jobs <= 1 or len(todo) == 1:
            for v, _ in todo:
                compiled = compile_variant(v, arch)
                cache.put(compiled)
                done.append(compiled)
                if progress:
                    progress(v, False)
        else:
            # spawn: TileLang/TVM state must not be forked mid-use
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
                futures = {pool.submit(_compile_in_worker, v, arch): v for v, _ in todo}
                try:
                    for fut in as_completed(futures):
                        compiled = fut.result()
                        cache.put(compiled)
                        done.append(compiled)
                        if progress:
                            progress(futures[fut], False)
                except BaseException:
                    # The first failure ends the build: the variants not started are dropped, not compiled first
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    compiled_for = {c.variant: c for c in done}
    for first, *others in sharing.values():
        for v in others:  # the shared cubin, launched with the variant's own runtime values
            done.append(compiled_for[first].serving(v))
            if progress:
                progress(v, True)
    manifest = write_artifacts(Path(out_dir), arch, done)
    return BuildReport(built=len(todo), cached=len(variants) - len(todo), manifest=manifest)
