"""Build a list of Variants into an artifact directory: cache, parallel compile, manifest.

A variant whose cache key (compile.cache_key: its declaration and sources, static values, tool
versions and flags) is in the build cache is not compiled again; the rest compile in `jobs`
processes, each checked against its kernel's declaration. A job either lowers up to BATCH variants of
one kernel (the costliest jobs first, so the processes finish together) or runs nvcc over up to NVCC_BATCH
lowered variants whose CUDA shares the text before the kernel, of any kernels: most kernels include the same
headers, so one pass of nvcc's front end over them serves many (compile.nvcc_compile_many; each cubin is the
bytes it alone would give). The artifact directory gets the cubins, manifest.json and build-info.json
(build_tools/artifacts.py).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from build_tools import nvcc_batch
from build_tools.artifacts import BuildCache, write_artifacts
from build_tools.compile import CompiledVariant, cache_key, lower_variants, nvcc_compile_many, where
from build_tools.ops import Variant, source_sha256

# Variants of one kernel lowered in one job: small enough for `jobs` processes to share the work evenly
BATCH = 16
# Variants in one nvcc job (one front-end pass over the headers, ~1.9 CPU-s, then ptxas for each): those lowered to
# the same preamble, whichever kernel they come from
NVCC_BATCH = 32

# Core-seconds to lower + nvcc one variant, measured when each variant had its own nvcc run (about 2 of these seconds;
# nvcc now spends about 0.25 a variant, its front end shared by NVCC_BATCH of them, so `plan` over-states a cold build
# by about that much): each kernel's share of a from-scratch build of
# the default set (495 variants, -j 2, empty cache: 569 s) on a 2-core CPU machine that
# other builds were also using, so they are rough (the 529-variant set later built from
# scratch in 354 s on an idle machine: 1.34 core-seconds a variant on average). A kernel
# not listed is assumed to cost the listed ones' mean. The generic kernels were timed side by side with their
# specialised ones (same machine, same load): per_token_cast_generic 1.22x per_token_cast, topk_gate_generic 1.8x topk_gate,
# swiglu_generic 1.06x swiglu (3.8-4.5 core-s against 3.1-3.8), moe_topk_gate_generic 1.4x moe_topk_gate,
# normalize_weight_generic 1.0x normalize_weight, cast_back_generic 1.09x cast_back;
# rmsnorm_generic and norm_cast_generic from a build of each kind alone, empty cache, a loaded 2-core machine;
# per_block_cast_generic, per_channel_cast_generic and per_block_cast_lossless_generic from a build of 8 generic
# variants beside one of 2 specialised ones (-j 1, empty caches, a loaded machine): 1.7x their specialised kernels.
# rmsnorm_backward, rmsnorm_backward_generic and swiglu_backward from a build of each kind alone (-j 1, empty cache,
# a loaded 2-core machine, the process's start subtracted; swiglu_backward's time is TileLang's lowering, 14 of 15 s;
# rmsnorm_backward_generic again in session 13, a body per width class: its 2 variants 43.7 core-s, 3.8 the start's).
# Seconds are a cubin's: per_token_cast_generic (the group and sf layout taken at run time, 78 cubins for 458 variants)
# lowers in 1.9-9.8 CPU-s a cubin against 1.3-2.1 a variant before, nvcc ~1.8 either way (a sample of 6 and 4, the
# same loaded machine): 2.0x; cast_back_generic (the block at run time, 24 cubins for 200) 2.6 against 2.8: 0.95x.
COMPILE_SECONDS = {
    "cast": 1.8,
    "cast_back": 1.0,
    "cast_back_generic": 1.0,
    "moe_topk_gate": 4.6,
    "moe_topk_gate_generic": 6.4,
    "norm_cast": 1.2,
    "norm_cast_generic": 9.5,
    "normalize_weight": 1.5,
    "normalize_weight_generic": 1.5,
    "per_block_cast": 1.3,
    "per_block_cast_generic": 2.2,
    "per_block_cast_lossless_generic": 2.2,
    "per_channel_cast": 1.3,
    "per_channel_cast_generic": 2.2,
    "per_token_cast": 1.4,
    "per_token_cast_generic": 3.4,
    "rmsnorm": 2.6,
    "rmsnorm_backward": 3.1,
    "rmsnorm_backward_generic": 20.0,
    "rmsnorm_backward_residual": 3.1,  # rmsnorm_backward's (one body of the same size)
    "rmsnorm_backward_plain": 3.1,  # as rmsnorm_backward's: its 7 default variants in 12-14 s on 2 jobs, rmsnorm_backward's in 13-17
    "rmsnorm_generic": 4.9,
    "rotary": 5.0,
    "swiglu": 6.6,
    "swiglu_backward": 15.0,
    "swiglu_generic": 7.0,
    "topk_gate": 6.4,
    "topk_gate_generic": 11.4,
}


@dataclass
class BuildReport:
    built: int
    cached: int
    manifest: dict


def schedule(variants: list[Variant], batch: int = BATCH) -> list[list[Variant]]:
    """The variants as jobs of up to `batch` of one kernel each, the costliest first (COMPILE_SECONDS)."""
    by_kernel: dict[str, list[Variant]] = {}
    for v in variants:
        by_kernel.setdefault(v.kernel, []).append(v)
    mean = sum(COMPILE_SECONDS.values()) / len(COMPILE_SECONDS)
    chunks = [vs[i : i + batch] for vs in by_kernel.values() for i in range(0, len(vs), batch)]
    return sorted(chunks, key=lambda c: -len(c) * COMPILE_SECONDS.get(c[0].kernel, mean))


class _InProcess:
    """Runs each job as it is submitted (-j 1): the same pipeline without worker processes; a job's error is raised
    by submit, so it ends the build at once."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def _compile(
    todo: list[tuple[Variant, str]], chunks: list[list[Variant]], arch: str, hashes: dict[str, str], pool, slots: int, finished: Callable
) -> None:
    """Lower the variants in jobs (`chunks`, from schedule), and nvcc them in batches of up to NVCC_BATCH that share their preamble,
    whichever kernels they come from. A full batch runs before the next lowering job, the rest once every lowering is
    done; `slots` jobs run at a time. `finished` gets each batch's CompiledVariants as they come."""
    keys = dict(todo)
    lowerings = deque(chunks)
    batches: deque[list] = deque()  # of (variant, spec, source), ready for nvcc
    waiting: dict[str, list] = {}  # preamble -> the lowered variants with it, not yet a batch
    running: dict[Future, tuple[bool, list]] = {}  # job -> (whether it is a lowering, its variants)

    def start() -> None:
        if batches:
            batch = batches.popleft()
            sources, wheres = [source for _, _, source in batch], [where(v) for v, _, _ in batch]
            running[pool.submit(nvcc_compile_many, sources, arch, wheres)] = (False, batch)
        else:
            chunk = lowerings.popleft()
            running[pool.submit(lower_variants, chunk, arch)] = (True, chunk)

    try:
        while lowerings or batches or waiting or running:
            if waiting and not lowerings and not any(lowering for lowering, _ in running.values()):
                batches.extend(sorted(waiting.values(), key=len, reverse=True))  # the last ones, the largest first
                waiting.clear()
            while len(running) < slots and (batches or lowerings):
                start()
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                lowering, variants = running.pop(future)
                if lowering:
                    for v, (spec, source) in zip(variants, future.result()):
                        head = nvcc_batch.preamble(source)
                        waiting.setdefault(head, []).append((v, spec, source))
                        if len(waiting[head]) == NVCC_BATCH:
                            batches.append(waiting.pop(head))
                else:
                    finished([
                        CompiledVariant(v, arch, spec, cubin, keys[v], hashes[v.kernel]).serving(v)
                        for (v, spec, _), cubin in zip(variants, future.result())
                    ])  # fmt: skip
    except BaseException:
        # The first failure ends the build: the jobs not started are dropped, not run first
        pool.shutdown(wait=True, cancel_futures=True)
        raise


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

    def finished(chunk: list[CompiledVariant]) -> None:
        for compiled in chunk:
            cache.put(compiled)
            done.append(compiled)
            if progress:
                progress(compiled.variant, False)

    chunks = schedule([v for v, _ in todo], BATCH)
    if chunks:
        if jobs <= 1 or len(chunks) == 1:  # one lowering job: no processes to start
            _compile(todo, chunks, arch, hashes, _InProcess(), 1, finished)
        else:
            # spawn: TileLang/TVM state must not be forked mid-use
            with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                _compile(todo, chunks, arch, hashes, pool, jobs, finished)
    compiled_for = {c.variant: c for c in done}
    for first, *others in sharing.values():
        for v in others:  # the shared cubin, launched with the variant's own runtime values
            done.append(compiled_for[first].serving(v))
            if progress:
                progress(v, True)
    manifest = write_artifacts(Path(out_dir), arch, done)
    return BuildReport(built=len(todo), cached=len(variants) - len(todo), manifest=manifest)
