"""Time candidate kernels of the slow mHC rows beside TileKernels, at the bench shapes (bench/cases/mhc*.py), and
check each candidate's output bytes against TileKernels'.

A candidate is an op's kernels built with some module constants changed, with builder options (Options: the
shipped `build` called with keyword arguments), or from an older source (Source, a commit): the shipped
default ("new", the control) and a few alternatives. Each is built into its own artifact set,
ARTIFACTS/<candidate>/, on a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_mhc_perf build --out tune-artifacts/mhc_perf

(6 sets, 0.1 MB, a minute on two shared cores; the build CLI's shape sets cannot patch module constants
or build an older source, hence this command), then timed on the GPU, where tile_kernels imports (its first
calls compile; rows past --budget seconds, 55 by default, are listed as skipped):

    python -m bench.tuning.tune_mhc_perf --artifacts tune-artifacts/mhc_perf --out DIR

Each candidate's launcher replaces the op's own for its rows (OpKernels' cache), so the op's validation and
argument packing are the shipped ones. "identical" compares every tensor the call writes, and what it returns,
byte for byte with TileKernels' on one input set; timing is bench/run.py's (CUDA-graph replay over rotating
inputs larger than L2, median).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import importlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ARTIFACTS = "tune-artifacts/mhc_perf"


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    kernel: str  # the declaration's name (kernels: the op's kernels, all built with the patches and launched)
    op: str  # the bench case's op (bench/cases/mhc*.py)
    patches: tuple[tuple[str, str, object], ...] = ()  # (module, attribute, value) set while it is built
    note: str = ""
    values: dict = field(default_factory=lambda: {"mhc_mult": 4})
    also: tuple[str, ...] = ()  # more kernels of the op

    @property
    def kernels(self) -> tuple[str, ...]:
        return (self.kernel, *self.also)


# The kernels as shipped before these candidates (main at 2eeec7c): the controls are built from that source
BEFORE = "2eeec7c"


@dataclass(frozen=True)
class Source:
    """A patch value: the `build` of this kernel module as it was at a commit (read with git show)."""

    commit: str


@dataclass(frozen=True)
class Options:
    """A patch value for a module's `build`: the shipped one, called with these keyword arguments."""

    values: tuple[tuple[str, object], ...]


def options(module: str, **values) -> tuple[tuple[str, str, object], ...]:
    return ((module, "build", Options(tuple(values.items()))),)


def _before(module: str) -> tuple[tuple[str, str, object], ...]:
    return ((module, "build", Source(BEFORE)),)


def _set(module: str, **values) -> tuple[tuple[str, str, object], ...]:
    return tuple((module, k, v) for k, v in values.items())


_FWD, _BWD, _LANES = "kernels_src.mhc.sinkhorn_fwd", "kernels_src.mhc.sinkhorn_bwd", "kernels_src.mhc.sinkhorn_lanes"
_MERGE, _RC = "kernels_src.mhc.normw_merge_bwd", "kernels_src.mhc.multilayer_recompute"
_F32 = {"dtype": "float32"}
_FUSE = "kernels_src.mhc.pre_big_fuse"
_FUSE_OP = dict(kernel="mhc_pre_big_fuse", op="mhc_pre_big_fuse_fwd")
_HEAD = "kernels_src.mhc.head_mix_bwd"
_HEAD_OP = dict(kernel="mhc_head_mix_bwd", op="mhc_head_compute_mix_bwd", values=_F32)
_SPLIT, _SPLIT_R = "kernels_src.mhc.split_mixes_bwd", "kernels_src.mhc.split_mixes_bwd_reduce"
_SPLIT_OP = dict(kernel="mhc_split_mixes_bwd", op="mhc_pre_split_mixes_bwd", also=("mhc_split_mixes_bwd_reduce",))


# Round 1 on an H200 (us; TileKernels in brackets), the shipped kernels now its winners: Sinkhorn forward 256 threads
# 5.14 (6.08; 128 threads 5.34, 64 5.39, a thread a token 21.14); Sinkhorn backward 28.02 (17.03; 64 threads 27.80,
# 20 records shared 30.81, a thread a token 61.96); normw_merge_bwd 8 rows 5.85 (5.39; 12 rows 6.81, 24 6.84, 1 12.99);
# multilayer recompute 1041.64 (826.24; next layer loaded ahead 1053.32, uncapped 1185.30, 5 blocks 1443.25);
# split_mixes_bwd reduce-only change 7.20 (6.13; staged rows 13.13-13.68); big fuse warp 0 never a residual share
# 141.96 / 5.27 at 8192 / 1 token (145.77 / 4.87; above 264 tokens only 145.69 / 5.28, always 145.78 / 7.36,
# uncapped 192.22 / 5.09); head_mix_bwd a round at a time 2.12 (2.28; 4 rounds 2.55).
CANDIDATES = (
    Candidate("sinkhorn_fwd.new", "mhc_sinkhorn_fwd", "mhc_sinkhorn_fwd", (), "an element a lane, 256 threads"),
    # Sinkhorn backward, multilayer recompute: bench/tuning/tune_mhc2.py
    Candidate("normw_merge_bwd.new", "mhc_normw_merge_bwd", "mhc_fn_normw_merge_bwd", (), "8 rows in flight", _F32),
    Candidate("split_bwd.new", note="a row a thread, the reduce's rows in flight", **_SPLIT_OP),
    Candidate("big_fuse.new", note="16 splits in flight, 64 regs, warp 0 no residual share", **_FUSE_OP),
    Candidate("head_mix_bwd.new", note="a round at a time, shuffles", **_HEAD_OP),
)  # fmt: skip


# ---- build (CPU: TileLang, nvcc)


def _build_at(module_name: str, commit: str, tmp: Path):
    """`build` of the kernel module as it was at `commit`, loaded from a file (TileLang reads the functions' source)."""
    import importlib.util
    import subprocess

    path = module_name.replace(".", "/") + ".py"
    text = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout
    file = tmp / f"{module_name.rsplit('.', 1)[-1]}_{commit}.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(f"{module_name}_{commit}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


@contextlib.contextmanager
def _patched(patches, tmp: Path):
    saved = []
    try:
        for module_name, attr, value in patches:
            module = importlib.import_module(module_name)
            saved.append((module, attr, getattr(module, attr)))
            if isinstance(value, Source):
                value = _build_at(module_name, value.commit, tmp)
            elif isinstance(value, Options):
                value = functools.partial(getattr(module, attr), **dict(value.values))
            setattr(module, attr, value)
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)


def build(out: Path, only: str | None = None, candidates: tuple = CANDIDATES) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    # A cache of its own: patched constants do not change a kernel's source hash, so a shared cache would mix them up
    with tempfile.TemporaryDirectory(prefix="tune-mhc-cache-") as cache:
        for c in candidates:
            if only and only not in c.name:
                continue
            t = time.perf_counter()
            with _patched(c.patches, Path(cache)):
                variants = [Variant.make(k, c.values) for k in c.kernels]
                build_variants(variants, out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name))
            print(f"{c.name:28s} built in {time.perf_counter() - t:5.1f} s", flush=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- time (GPU)


class _Every(dict):
    """An OpKernels cache that answers every key with one launcher."""

    def __init__(self, launcher):
        super().__init__()
        self.launcher = launcher

    def get(self, key, default=None):
        return self.launcher

    def __getitem__(self, key):
        return self.launcher

    def __setitem__(self, key, value):
        pass


def _op_kernels(kernel: str) -> list:
    """Every OpKernels of tkaot's mHC ops that launches `kernel`."""
    from tkaot._op import OpKernels

    found = []
    for name in ("big_fuse", "expand", "head_mix", "norm_fn", "post", "pre_apply_mix", "recompute", "sinkhorn", "split_mixes"):
        module = importlib.import_module(f"tkaot._mhc.{name}")
        found += [v for v in vars(module).values() if isinstance(v, OpKernels) and v.kernel == kernel]
    return found


@contextlib.contextmanager
def _launching(candidate: Candidate, artifacts: Path):
    """Launch the candidate's builds of its kernels wherever tkaot's ops launch those kernels."""
    from tkaot._kernel import Kernel

    set_dir = artifacts / candidate.name
    manifest = json.loads((set_dir / "manifest.json").read_text())
    saved = []
    for name in candidate.kernels:
        (entry,) = [e for e in manifest["variants"] if e["kernel"] == name]
        cubin = set_dir / "cubins" / f"{entry['cubin']}.cubin"
        kernel = Kernel(name, entry["key"], entry["launch"], cubin, entry["cubin"], candidate.name)
        for opk in _op_kernels(name):
            saved.append((opk, opk.cache))
            opk.cache = _Every(kernel.bind(opk.args))
    try:
        yield
    finally:
        for opk, cache in saved:
            opk.cache = cache


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _identical(case, tk, inputs: dict) -> str:
    """ "yes" if the call writes and returns the same bytes as TileKernels' on copies of one input set, else how
    many of the tensors differ and by how much at most."""
    import torch

    if tk is None or case.tile_kernels is None:
        return "no TK"
    ours, theirs = copy.deepcopy(inputs), copy.deepcopy(inputs)
    got = _tensors(case.tkaot(ours)) + _tensors(ours)
    want = _tensors(case.tile_kernels(tk, theirs)) + _tensors(theirs)
    torch.cuda.synchronize()
    if len(got) != len(want) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(got, want, strict=False)):
        return "MISMATCH (outputs differ in number, shape or dtype)"
    differ = [
        (a, b)
        for a, b in zip(got, want, strict=True)
        if not torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    ]
    if not differ:
        return "yes"
    worst = max(float((a.float() - b.float()).abs().max()) for a, b in differ)
    return f"no: {len(differ)} of {len(got)} tensors, max |diff| {worst:.3g}"


def _cases() -> dict:
    from bench.cases import mhc, mhc_fused

    cases = {}
    for c in mhc.cases() + mhc_fused.cases():
        cases.setdefault(c.op, []).append(c)
    return cases


def _row_text(name: str, shape: str, us, tk_us, same: str) -> str:
    ratio = f"{us / tk_us:6.2f}" if us and tk_us else f"{'-':>6s}"
    us_text = f"{us:8.2f}" if us else f"{'-':>8s}"
    tk_text = f"{tk_us:8.2f}" if tk_us else f"{'-':>8s}"
    return f"{name:26s} {shape[:40]:40s} {us_text} {tk_text} {ratio}  {same}"


def time_candidates(
    artifacts: Path, out: Path, only: str | None = None, budget: float = 55.0, candidates: tuple = CANDIDATES,
    log_name: str = "tune_mhc_perf.json",
) -> None:  # fmt: skip
    """Time every candidate at its op's bench shapes, in `candidates`' order (most important rows first); past
    `budget` seconds the rest are listed as skipped, so one run stays within its time."""
    import torch

    from bench import timing
    from bench.run import _tile_kernels, rotating_inputs

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / log_name
    tk = _tile_kernels()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    cases = _cases()
    rows, log = [], []
    print(f"{torch.cuda.get_device_name()}; tile_kernels {'yes' if tk else 'no'}; artifacts {artifacts}", flush=True)
    for op in dict.fromkeys(c.op for c in candidates if not only or only in c.name):
        for case in cases.get(op, []):
            chosen = [c for c in candidates if c.op == op and (not only or only in c.name)]
            if time.perf_counter() - t0 > budget:
                rows += [(c.name, case.shape, None, None, "skipped (time budget)") for c in chosen]
                continue
            inputs = rotating_inputs(case, l2)
            tk_us = None
            if tk is not None and case.tile_kernels is not None:
                tk_us, _ = timing.device_us(lambda a, case=case: case.tile_kernels(tk, a), inputs)
            for c in chosen:
                try:
                    with _launching(c, artifacts):
                        same = _identical(case, tk, inputs[0])
                        us, mode = timing.device_us(case.tkaot, inputs)
                except Exception as exc:  # a candidate that fails to load or launch is reported, not fatal
                    us, mode, same = None, "-", f"error: {type(exc).__name__}: {exc}"[:100]
                rows.append((c.name, case.shape, us, tk_us, same + ("" if mode in ("graph", "-") else " (events)")))
                print(_row_text(*rows[-1]), flush=True)
                log.append({"candidate": c.name, "note": c.note, "op": op, "shape": case.shape, "us": us, "tk_us": tk_us,
                            "identical": same, "mode": mode, "bytes": case.bytes})  # fmt: skip
                log_path.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": log}, indent=1))
            del inputs
            torch.cuda.empty_cache()
    print(f"\n{'candidate':26s} {'shape':40s} {'µs':>8s} {'TK µs':>8s} {'ratio':>6s}  identical to TileKernels")
    for row in rows:
        print(_row_text(*row))
    print(f"{time.perf_counter() - t0:.0f} s; log in {log_path}")


def main(argv=None, candidates: tuple = CANDIDATES, artifacts: str = ARTIFACTS, log_name: str = "tune_mhc_perf.json",
         description: str = __doc__) -> None:  # fmt: skip
    """The command line of this script, and of tuning scripts that pass their own candidates (tune_mhc2.py)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("build", "time"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(artifacts), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the artifact sets go; time: the log's directory")
    parser.add_argument("--only", help="only the candidates whose name contains this")
    parser.add_argument("--budget", type=float, default=55.0, help="time: seconds after which the rest is skipped")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.out, args.only, candidates)
    else:
        time_candidates(args.artifacts, args.out, args.only, args.budget, candidates, log_name)


if __name__ == "__main__":
    sys.exit(main())
