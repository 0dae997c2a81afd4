"""Time rmsnorm_backward's row tilings (kernels_src/norm/rmsnorm_backward.py) beside TileKernels' norm_backward.

Each candidate is pass 1 built with other module values (patched while it is built) or the module as it was at
BEFORE, specialised (bf16 7168) and generic (bf16, fp32), into its own artifact set ARTIFACTS/<candidate>/; pass 2
(weight_grad_reduce, unchanged) into ARTIFACTS/common/. On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_train3 build --out tune-artifacts/train3

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_train3 --artifacts tune-artifacts/train3 --out DIR

Rows: bench/cases/backward.py's shapes at 8192 tokens (bf16 7168 with a weight, and with a residual gradient, on
the specialised variant; fp32 7168 and bf16 3168 on the generic one), each candidate's two launches with its own
grid (rows a block from its tiling, at most its max_blocks blocks), CUDA-graph replay over rotating inputs larger
than L2 (bench.timing). Before timing, each candidate's outputs are compared with TileKernels' within the parity
suite's tolerance (tests/parity_backward_cases.py, as bench/tuning/tune_train_perf.py does: both libraries add the
weight gradient in their own order, so no candidate is byte-identical to TileKernels, "before" included) and with
"before"'s bytes; at bf16 7168 its generic variant's bytes with its specialised variant's (they must be identical).
moe_topk_gate_backward's candidates (bench/tuning/tune_train2.py) are built into ARTIFACTS/gate/ and timed after,
by that script's code, so one build and one call cover both kernels. Each kernel's rows run in a child process that
announces each candidate before it runs it; a child silent for STALL_S seconds (a hung kernel) or past the run's
budget (--budget S, 70 by default, the last GATE_S of it kept for the gate) is killed, its candidate's row says so,
and the kernel's rows are run again without it. Prints one table last (candidate, shape, µs, TileKernels µs, ratio,
identical?) and writes DIR/tune_train3.log. Session 12, round 1 on the H200: the run hung after the gate's first
row ("before" 10.61 µs, TileKernels 8.21): "new"'s repeat test took its full-mask __match_any_sync behind `&&`, so
the lanes of empty slots never reached it (fixed; the MATCH is now straight-line code); nothing else was measured.
Since session 13 only "before" (and the gate's candidates) build: the others' generic variant was the body over
RuntimeTiling, deleted when the generic kernel became a body per width class (bench/tuning/tune_normbwd.py); `build`
says so for each and goes on.

Why TileKernels was faster (its source, session 12): at bf16 7168 it gives a row 128 threads (7 vectors of 8 a
thread), 2 rows a block of 256 threads, one block an SM with up to 255 registers, so x, out_grad (as fp32) and the
weight stay in registers and both staged rows are refilled before the row's reduction; one named barrier a row
(double-buffered warp sums); fp32 7168 one row of 256 threads (7 vectors of 4), 2 stages; bf16 3168 64 threads a
row. Ours before: rows of up to 256 threads at 2 vectors a thread (4 at 7168, the 4th idle in half the threads),
2 blocks an SM of 128 registers, out_grad read from the stage again after the reduction (its refill after the
row's stores), fp32 1 stage with the weight read from L1 each row, 2 barriers a row, 264 partial rows.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.tuning.tune_train2 import cli
from bench.tuning.watch import ROW, START, Log, budget, run_child, stopped, with_reruns

ARTIFACTS = "tune-artifacts/train3"
SPEC, GENERIC, PASS2 = "rmsnorm_backward", "rmsnorm_backward_generic", "weight_grad_reduce"
MODULE, GENERIC_MODULE = "kernels_src.norm.rmsnorm_backward", "kernels_src.norm.rmsnorm_backward_generic"
BEFORE = "a3a2081"  # main before this change
HIDDEN = 7168  # the specialised variant's width


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    max_vectors: int  # norm_backward_tiling's max_vectors: the rows' threads
    max_blocks: int  # the op's grid cap (NORM_BACKWARD_MAX_BLOCKS)
    min_blocks: int | None  # MIN_BLOCKS_PER_SM patched (None: the module's)
    note: str


CANDIDATES = (
    Candidate("before", 2, 264, None, "as shipped until now (BEFORE): 256-thread rows at 7168, 2 blocks an SM, og re-read"),
    Candidate("new", 7, 132, None, "the new default: <= 7 vectors a thread (bf16 7168: 128-thread rows, 2 a block), 1 block an SM"),
    Candidate("new.v4", 4, 132, None, "new body, <= 4 vectors a thread (bf16 7168: 256-thread rows), 1 block an SM"),
    # (its fp32 stage, 2 x 3 x 32 KiB, leaves room for 1 block an SM: its fp32 row runs 2 waves, not a candidate there)
    Candidate("new.v4b2", 4, 264, 2, "new body at before's rows and grid: <= 4 vectors, 2 blocks an SM (128 registers)"),
)  # fmt: skip
# (name, dtype, hidden, residual gradient, kernel): every row with a weight, out_scale 1
ROWS = (
    ("bf16, weight", "bfloat16", HIDDEN, False, SPEC),
    ("bf16, weight + residual grad", "bfloat16", HIDDEN, True, SPEC),
    ("fp32, weight (generic)", "float32", HIDDEN, False, GENERIC),
    ("bf16, weight (generic)", "bfloat16", 3168, False, GENERIC),
)


# ---- build (CPU)

# Why the candidates other than "before" no longer build: their generic variant is their rmsnorm_backward module's
# body over RuntimeTiling (the row's threads computed from hidden), which that module no longer has
RETIRED = (
    "its generic variant was the body over RuntimeTiling, deleted from kernels_src/norm/rmsnorm_backward.py in "
    "session 13 (the generic kernel is a body per width class since: bench/tuning/tune_normbwd.py)"
)


class NotBuildable(Exception):
    """A candidate the tree can no longer build."""


def _builders(c: Candidate, tmp: Path):
    """(specialised build, generic build) of candidate c."""
    import tilelang.language as T

    from tkaot._quant.kernels import norm_backward_tiling

    if c.name == "before":
        from bench.tuning.tune_mhc_perf import _build_at

        spec = _build_at(MODULE, BEFORE, tmp)
        module = spec.__globals__  # the old module's namespace: its tiling rule is max_vectors=2
        module["norm_backward_tiling"] = functools.partial(norm_backward_tiling, max_vectors=c.max_vectors)
    else:
        module = vars(importlib.import_module(MODULE))
        spec = module["build"]
        if "RuntimeTiling" not in module:
            raise NotBuildable(f"{c.name}: no longer buildable from the tree: {RETIRED}")
    return spec, lambda dtype: module["rmsnorm_backward_kernel"](module["RuntimeTiling"](T.dynamic("hidden"), dtype), dtype)


@contextlib.contextmanager
def _patched(c: Candidate, tmp: Path):
    from tkaot._quant.kernels import norm_backward_tiling

    module, generic = importlib.import_module(MODULE), importlib.import_module(GENERIC_MODULE)
    patches = [(module, "build"), (generic, "build")]
    values = list(_builders(c, tmp))
    if c.name != "before":
        patches.append((module, "norm_backward_tiling"))
        values.append(functools.partial(norm_backward_tiling, max_vectors=c.max_vectors))
        if c.min_blocks is not None:
            patches.append((module, "MIN_BLOCKS_PER_SM"))
            values.append(c.min_blocks)
    saved = [getattr(m, a) for m, a in patches]
    try:
        for (m, a), v in zip(patches, values):
            setattr(m, a, v)
        yield
    finally:
        for (m, a), v in zip(patches, saved):
            setattr(m, a, v)


def build(out: Path) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    # A cache of its own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-train3-cache-") as cache:
        common = [Variant.make(PASS2, {"dtype": d}) for d in ("bfloat16", "float32")]
        build_variants(common, out / "common", "sm90", jobs=1, cache=BuildCache(Path(cache) / "common"))
        for c in CANDIDATES:
            t = time.perf_counter()
            variants = [Variant.make(SPEC, {"hidden": HIDDEN, "dtype": "bfloat16"})]
            variants += [Variant.make(GENERIC, {"dtype": d}) for d in ("bfloat16", "float32")]
            try:
                with _patched(c, Path(cache)):
                    build_variants(variants, out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name))
            except NotBuildable as exc:
                print(f"{c.name:10s} not built: {exc}", flush=True)
                continue
            print(f"{c.name:10s} built in {time.perf_counter() - t:5.1f} s", flush=True)
    from bench.tuning import tune_train2

    tune_train2.build(out / "gate")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- time (GPU)


def _launchers(set_dir: Path) -> dict:
    """{(kernel, key): Kernel} of an artifact set."""
    from tkaot._kernel import Kernel

    entries = json.loads((set_dir / "manifest.json").read_text())["variants"]
    cubins = set_dir / "cubins"
    return {
        (e["kernel"], e["key"]): Kernel(e["kernel"], e["key"], e["launch"], cubins / f"{e['cubin']}.cubin", e["cubin"], set_dir.name)
        for e in entries
    }


def _op(c: Candidate, kernels: dict, pass2: dict, kernel: str, dtype: str, hidden: int, device: int):
    """The candidate's norm_backward (a weight, out_scale 1) as a call on an input dict of tune_train_perf._inputs."""
    from tkaot._op import current_stream
    from tkaot._quant.kernels import NORM_BACKWARD_THREADS, RMSNORM_BACKWARD, WEIGHT_GRAD_REDUCE, norm_backward_tiling

    key = f"dtype={dtype}" if kernel == GENERIC else f"hidden={hidden},dtype={dtype}"
    fixed = {"hidden": hidden} if kernel == GENERIC else None
    pass1 = kernels[(kernel, key)].bind(RMSNORM_BACKWARD.args, fixed=fixed)
    reduce = pass2[(PASS2, f"dtype={dtype}")].bind(WEIGHT_GRAD_REDUCE.args)
    rows = NORM_BACKWARD_THREADS // norm_backward_tiling(hidden, dtype, c.max_vectors)[1]

    def call(a: dict):
        tokens = a["x"].shape[0]
        blocks = min(-(-tokens // rows), c.max_blocks)
        stream, dr = current_stream(device), a["dr"]
        pass1(
            device, stream, a["dy"].data_ptr(), a["x"].data_ptr(), a["w"].data_ptr(), a["rstd"].data_ptr(),
            0 if dr is None else dr.data_ptr(), a["x_grad"].data_ptr(), a["partials"].data_ptr(), 1.0, 1, 0 if dr is None else 1,
            tokens, blocks, a["dy"].stride(0), a["x"].stride(0), 0 if dr is None else dr.stride(0),
        )  # fmt: skip
        reduce(device, stream, a["partials"].data_ptr(), a["weight_grad"].data_ptr(), 0, blocks, hidden)
        return a["x_grad"], a["weight_grad"]

    return call


def _result(call, a: dict):
    import torch

    x_grad, weight_grad = call(a)
    torch.cuda.synchronize()
    return x_grad.clone(), weight_grad.clone()


def measure(artifacts: Path, say, started=lambda name, shape: None, skip=()) -> list[tuple]:
    """The rows (candidate, shape, µs, TK µs, ratio, verdict) of every candidate not in `skip`; `started(name, shape)`
    is called before each call of a candidate (or of TileKernels, "TK"), so a hang shows where it is."""
    import tile_kernels as tk
    import torch

    from bench.timing import device_us
    from bench.tuning.tune_train_perf import SETS, _close, _inputs, _same, _theirs

    device = torch.cuda.current_device()
    torch.manual_seed(0)
    rows: list[tuple] = []
    pass2 = _launchers(artifacts / "common")
    sets = {}
    for c in CANDIDATES:
        if c.name in skip:
            continue
        try:
            sets[c.name] = _launchers(artifacts / c.name)
        except Exception as exc:  # a candidate that fails to load is reported, not fatal
            say(f"{c.name}: not loaded ({type(exc).__name__}: {exc})")
    for name, dtype, hidden, residual, kernel in ROWS:
        torch_dtype = getattr(torch, dtype)
        shape = f"8192x{hidden} {name}"
        inputs = [_inputs(torch_dtype, hidden, True, residual) for _ in range(SETS)]
        for a in inputs:  # the outputs, before any graph capture
            a["partials"] = torch.empty(max(x.max_blocks for x in CANDIDATES), hidden, device="cuda")
            a["x_grad"], a["weight_grad"] = torch.empty_like(a["x"]), torch.empty_like(a["w"])
        started("TK", shape)
        want = _theirs(tk)(inputs[0])
        torch.cuda.synchronize()
        tk_us, _ = device_us(_theirs(tk), inputs)
        control = None
        for c in CANDIDATES:
            if c.name not in sets:
                continue
            started(c.name, shape)
            call = _op(c, sets[c.name], pass2, kernel, dtype, hidden, device)
            got = _result(call, inputs[0])
            control = got if c.name == "before" else control
            same = control is not None and _same(got, control)
            verdict = ("=before" if same else "differs from before") + f", TK {_close(got, want, torch_dtype)}"
            if kernel == SPEC:  # the generic variant must write the specialised variant's bytes
                generic = _result(_op(c, sets[c.name], pass2, GENERIC, dtype, hidden, device), inputs[0])
                verdict += ", generic =spec" if _same(generic, got) else ", generic DIFFERS from spec"
            us, mode = device_us(call, inputs)
            say(f"{c.name:10s} {shape:44s} {us:8.2f} µs ({mode})  TK {tk_us:8.2f}  {verdict}")
            rows.append((c.name, shape, us, tk_us, us / tk_us, verdict))
        del inputs
    return rows


# ---- the run: each kernel's rows in a child process, watched (a candidate that hangs is killed and skipped)

PARTS = ("norm", "gate")  # rmsnorm_backward first, then moe_topk_gate_backward (tune_train2's candidates)
TOTAL_S = 70  # the whole run's budget (--budget S)
GATE_S = 25  # the part of it kept for the gate's rows: norm_backward's child is stopped before
STALL_S = 20  # a candidate silent this long is taken as hung (TileKernels' first calls compile: 40 s for those)


def _part(argv) -> None:
    """Child: one part's rows, each candidate announced (START name|shape) before it runs, each row as ROW json."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--skip", default="")
    args = parser.parse_args(argv)
    skip = tuple(s for s in args.skip.split(",") if s)

    def started(name: str, shape: str) -> None:
        print(f"{START}{name}|{shape}", flush=True)

    started("load", "")
    if args.part == "norm":
        rows = measure(args.artifacts, functools.partial(print, flush=True), started, skip)
    else:
        from bench.tuning import tune_train2

        rows = tune_train2.measure(args.artifacts / "gate", functools.partial(print, flush=True), started, skip)
    for row in rows:
        print(ROW + json.dumps(row), flush=True)


def _run_part(part: str, artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run one part in a child until it ends, stalls or passes the deadline; the candidate it hung in, if any."""
    stop = run_child(
        "bench.tuning.tune_train3", part, artifacts, skip, deadline, say,
        on_row=lambda row: rows.setdefault(row[:2], row),  # a rerun's repeat of a row keeps the first
        stall_s=lambda name: STALL_S if name not in ("load", "TK") else 2 * STALL_S,
        on_start=lambda name, shape: print(f"  ({part}: {name} at {shape or '-'})", flush=True),
    )  # fmt: skip
    return None if stop is None else stopped(stop, say, rows, 3, f"{part}: ")


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    """Each part in its own child, norm_backward first; a candidate that hangs is killed and the part rerun without it."""

    from bench.tuning.tune_train2 import finish

    start = time.perf_counter()
    say = Log()
    rows: dict = {}

    for part in PARTS:
        deadline = start + (total_s if part == PARTS[-1] else total_s - GATE_S)
        with_reruns(part, deadline, say, lambda skip, part=part, deadline=deadline: _run_part(part, artifacts, skip, deadline, say, rows))
    finish(say, list(rows.values()), start, out / "tune_train3.log", say.lines, (14, 44, 8))


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:
        _part(argv[1:])
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
