"""Time the generic rmsnorm_backward's width-class bodies (kernels_src/norm/rmsnorm_backward.py, ClassTiling) beside
the specialised variant, the generic kernel before them and TileKernels' norm_backward.

Candidates, each its own artifact set ARTIFACTS/<candidate>/, pass 2 (weight_grad_reduce, unchanged) in
ARTIFACTS/common/. On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_normbwd build --out tune-artifacts/normbwd

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_normbwd --artifacts tune-artifacts/normbwd --out DIR [--budget S]

- "before": the generic kernel as it was at BEFORE (one body, the row's threads computed from hidden), bf16 and fp32.
- "classes8": the shipped generic kernel (every width on the body of its width class), built from the tree, with the
  specialised variants at 7168 and 5120 (bf16).
- "classes" (round 1: rows of 64 threads or more on class bodies, the narrower on one body with the row's threads
  computed from hidden) is no longer buildable from the tree: that runtime body was deleted when classes8 shipped.
  `build` says so and builds the others; its round-1 rows are below.

Round 1 (H200, 2026-12-02, TileKernels 2.1.0 in the same process; µs, ratio to the specialised variant, else to
"before"; every candidate's bytes identical to the specialised variant's and to before's, 320 check calls, 0 mismatches):
    bf16 7168 weight:            spec 96.4, before 150.6 (1.56), classes 97.9 (1.02), classes8 102.0 (1.06), TK 97.2
    bf16 7168 weight + residual: spec 123.3, before 166.0 (1.35), classes 125.5 (1.02), classes8 127.0 (1.03), TK 119.1
    bf16 7168 no weight:         spec 98.6, before 145.2 (1.47), classes 99.9 (1.01), classes8 100.0 (1.01), TK 91.9
    fp32 7168 weight:            before 226.2, classes 177.7 (0.79), classes8 178.4 (0.79), TK 181.1
    bf16 3168 weight:            before 79.6, classes 48.8 (0.61), classes8 51.4 (0.65), TK 54.2
    bf16 5120 weight + residual: spec 88.1, before 139.5 (1.58), classes 91.2 (1.04), classes8 93.3 (1.06)
    bf16 1024 weight:            before 33.6, classes 47.8 (1.42, its runtime body), classes8 23.1 (0.69)
classes8 shipped: no width slower than "before", within 1.06x of the specialised variant.

The run, in a child process watched by this one (bench/tuning/watch.py: a candidate silent for STALL_S seconds, a hung
kernel, is killed and the run goes on without it; the whole run stops at --budget seconds, 80 by default):
1. checks (small calls, every flag combination): the shipped generic kernel's bytes against "before"'s at widths
   across every class of both dtypes (the same tiling, so they must be identical), against the specialised variant's
   at 7168 and 5120, and against the torch reference (tests/parity_backward_cases.py's tolerances); outputs are
   poisoned with NaN first, so an unwritten element shows.
2. times (8192 tokens, CUDA-graph replay over rotating inputs larger than L2, bench.timing), with each row's bytes
   checked again: bf16 7168 with a weight, with a residual gradient, without a weight (specialised, before,
   classes8), fp32 7168 and bf16 3168 (generic only), bf16 5120 with a residual gradient (specialised and generic),
   bf16 1024 (generic only).
3. TileKernels on the first five rows (its kernels compile at the first call, so last), checked within the parity
   tolerance against "classes8".
Prints one table last (candidate, shape, µs, ratio to the row's specialised variant or else to "before", TileKernels
µs, verdict) and writes DIR/tune_normbwd.log.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import tempfile
import time
from pathlib import Path

from bench.tuning.tune_train2 import cli
from bench.tuning.watch import ROW, START, Log, budget, run_child

ARTIFACTS = "tune-artifacts/normbwd"
SPEC, GENERIC, PASS2 = "rmsnorm_backward", "rmsnorm_backward_generic", "weight_grad_reduce"
MODULE, GENERIC_MODULE = "kernels_src.norm.rmsnorm_backward", "kernels_src.norm.rmsnorm_backward_generic"
BEFORE = "cbe24e7"  # main before the width classes
CANDIDATES = ("before", "classes8")
NEW = "classes8"  # the shipped generic kernel, built from the tree
RETIRED = {"classes": "its body for rows under 64 threads (the row's threads computed from hidden) was deleted when classes8 shipped"}
SPECIALISED = (7168, 5120)  # bf16 widths of the default set built beside NEW
TOKENS = 8192
SETS = 3  # rotating input sets, each larger than L2 at the timed shapes
# (name, dtype, hidden, weight, residual gradient, beside TileKernels): the timed rows
ROWS = (
    ("bf16, weight", "bfloat16", 7168, True, False, True),
    ("bf16, weight + residual grad", "bfloat16", 7168, True, True, True),
    ("bf16, no weight", "bfloat16", 7168, False, False, True),
    ("fp32, weight", "float32", 7168, True, False, True),
    ("bf16, weight", "bfloat16", 3168, True, False, True),
    ("bf16, weight + residual grad", "bfloat16", 5120, True, True, False),
    ("bf16, weight", "bfloat16", 1024, True, False, False),
)
# The checked widths: both ends of every class of threads a row (bf16 and fp32), widths a thread's vectors do not
# divide, and the specialised ones
CHECK_WIDTHS = (32, 96, 224, 256, 448, 480, 896, 928, 1792, 1824, 2880, 3168, 3584, 3616, 4000, 5120, 7168, 7200, 7776, 8192)
CHECK_TOKENS = (1, 300)
# (weight, residual gradient, out_scale): every flag combination
CHECK_CALLS = ((True, False, 1.0), (True, True, 0.5), (False, True, 2.5), (False, False, 1.0))


# ---- build (CPU)


@contextlib.contextmanager
def _before_generic(tmp: Path):
    """The generic module's `build` as it was at BEFORE: the old kernel module's one runtime-tiling body."""
    import tilelang.language as T

    from bench.tuning.tune_mhc_perf import _build_at

    old = _build_at(MODULE, BEFORE, tmp).__globals__  # the old kernel module's namespace
    generic = importlib.import_module(GENERIC_MODULE)
    saved = generic.build
    generic.build = lambda dtype: old["rmsnorm_backward_kernel"](old["RuntimeTiling"](T.dynamic("hidden"), dtype), dtype)
    try:
        yield
    finally:
        generic.build = saved


def build(out: Path) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    dtypes = ("bfloat16", "float32")
    generic = [Variant.make(GENERIC, {"dtype": d}) for d in dtypes]
    # A cache of its own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-normbwd-cache-") as cache:
        build_variants([Variant.make(PASS2, {"dtype": d}) for d in dtypes], out / "common", "sm90", jobs=1,
                       cache=BuildCache(Path(cache) / "common"))  # fmt: skip
        for name in CANDIDATES:
            t = time.perf_counter()
            if name == "before":
                with _before_generic(Path(cache)):
                    build_variants(generic, out / name, "sm90", jobs=1, cache=BuildCache(Path(cache) / name))
            else:
                spec = [Variant.make(SPEC, {"hidden": h, "dtype": "bfloat16"}) for h in SPECIALISED]
                build_variants(spec + generic, out / name, "sm90", jobs=1, cache=BuildCache(Path(cache) / name))
            print(f"{name:8s} built in {time.perf_counter() - t:5.1f} s", flush=True)
    for name, why in RETIRED.items():
        print(f"{name:8s} not built: no longer buildable from the tree ({why}); its round-1 rows are in the docstring")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- the calls (GPU)


def _inputs(dtype, hidden: int, tokens: int, weight: bool, residual: bool, seed: int, spread: float = 1.0) -> dict:
    """norm_backward's inputs (seeded) and its outputs' buffers; rows of x scaled by up to 2**spread."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    scale = torch.exp2(torch.rand(tokens, 1, device="cuda", generator=gen) * 2 * spread - spread)
    x = (torch.randn(tokens, hidden, device="cuda", generator=gen) * scale).to(dtype)
    dy = torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype)
    return {
        "dy": dy, "x": x, "rstd": torch.rsqrt(x.float().square().mean(-1) + 1e-6),
        "w": (torch.rand(hidden, device="cuda", generator=gen) + 0.5).to(dtype) if weight else None,
        "dr": torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype) if residual else None,
        "out_scale": 1.0, "x_grad": torch.empty_like(x), "weight_grad": torch.empty(hidden, dtype=dtype, device="cuda"),
        "partials": torch.empty(132, hidden, device="cuda"),
    }  # fmt: skip


def _launchers(set_dir: Path) -> dict:
    from bench.tuning.tune_train3 import _launchers as launchers

    return launchers(set_dir)


def _op(kernels: dict, pass2: dict, kernel: str, dtype: str, hidden: int, device: int):
    """norm_backward on the set's `kernel` variant (the op's grid, tkaot/_quant/norm_backward.py) as a call on _inputs."""
    from tkaot._op import current_stream
    from tkaot._quant.kernels import (
        NORM_BACKWARD_MAX_BLOCKS,
        NORM_BACKWARD_THREADS,
        RMSNORM_BACKWARD,
        WEIGHT_GRAD_REDUCE,
        norm_backward_tiling,
    )

    key = f"dtype={dtype}" if kernel == GENERIC else f"hidden={hidden},dtype={dtype}"
    pass1 = kernels[(kernel, key)].bind(RMSNORM_BACKWARD.args, fixed={"hidden": hidden} if kernel == GENERIC else None)
    reduce = pass2[(PASS2, f"dtype={dtype}")].bind(WEIGHT_GRAD_REDUCE.args)
    rows = NORM_BACKWARD_THREADS // norm_backward_tiling(hidden, dtype)[1]

    def call(a: dict):
        tokens = a["x"].shape[0]
        blocks = min(-(-tokens // rows), NORM_BACKWARD_MAX_BLOCKS)
        stream, w, dr = current_stream(device), a["w"], a["dr"]
        pass1(
            device, stream, a["dy"].data_ptr(), a["x"].data_ptr(), 0 if w is None else w.data_ptr(), a["rstd"].data_ptr(),
            0 if dr is None else dr.data_ptr(), a["x_grad"].data_ptr(), a["partials"].data_ptr(), a["out_scale"],
            0 if w is None else 1, 0 if dr is None else 1, tokens, blocks, a["dy"].stride(0), a["x"].stride(0),
            0 if dr is None else dr.stride(0),
        )  # fmt: skip
        if w is not None:
            reduce(device, stream, a["partials"].data_ptr(), a["weight_grad"].data_ptr(), 0, blocks, hidden)
        return a["x_grad"], (a["weight_grad"] if w is not None else None)

    return call


def _result(call, a: dict):
    """The call's outputs, its buffers poisoned with NaN first."""
    import torch

    for name in ("x_grad", "weight_grad", "partials"):
        a[name].fill_(math.nan)
    x_grad, weight_grad = call(a)
    torch.cuda.synchronize()
    return x_grad.clone(), None if weight_grad is None else weight_grad.clone()


def _same(a, b) -> bool:
    from bench.tuning.tune_train_perf import _same as same

    return same(a, b)


def _near_reference(got, a: dict, dtype) -> str:
    import torch

    from tests.parity_backward_cases import BF16_SUM, BF16_WEIGHT_GRAD, F32_SUM, WEIGHT_GRAD
    from tkaot.reference.backward import norm_backward

    x_grad, weight_grad = norm_backward(a["dy"], a["x"], a["w"], a["rstd"], a["dr"], a["out_scale"], None)
    bf16 = dtype is torch.bfloat16
    if got[0].isnan().any() or not torch.allclose(got[0].float(), x_grad.float(), *(BF16_SUM if bf16 else F32_SUM)):
        return "x_grad FAR from reference"
    if weight_grad is not None and not torch.allclose(got[1].float(), weight_grad.float(), *(BF16_WEIGHT_GRAD if bf16 else WEIGHT_GRAD)):
        return "weight_grad FAR from reference"
    return "ok"


class Sets:
    """The candidates' launchers, each candidate's only if its set loads and it is not skipped."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.pass2 = _launchers(artifacts / "common")
        self.sets = {}
        for name in CANDIDATES:
            if name in skip:
                continue
            try:
                self.sets[name] = _launchers(artifacts / name)
            except Exception as exc:  # a set that fails to load is reported, not fatal
                say(f"{name}: not loaded ({type(exc).__name__}: {exc})")

    def calls(self, dtype: str, hidden: int, device: int) -> dict:
        """{label: call} of every kernel that serves the width: "spec" (from NEW's set), then each candidate."""
        calls = {}
        for kernels in self.sets.values():
            if (SPEC, f"hidden={hidden},dtype={dtype}") in kernels:
                calls["spec"] = _op(kernels, self.pass2, SPEC, dtype, hidden, device)
        for name, kernels in self.sets.items():
            calls[name] = _op(kernels, self.pass2, GENERIC, dtype, hidden, device)
        return calls


def _verdict(outs: dict, label: str) -> str:
    """How candidate `label`'s bytes compare: with the specialised variant's and with before's."""
    parts = []
    for other in ("spec", "before"):
        if other != label and other in outs and label != "spec":
            parts.append(f"={other}" if _same(outs[label], outs[other]) else f"DIFFERS from {other}")
    return ", ".join(parts) or "-"


def check(sets: Sets, say, started) -> int:
    """Phase 1: the shipped kernel's bytes against before's and the specialised variant's, and against the reference."""
    import torch

    device, bad, done = torch.cuda.current_device(), 0, 0
    for dtype in ("bfloat16", "float32"):
        torch_dtype = getattr(torch, dtype)
        for hidden in CHECK_WIDTHS:
            started("check", f"{dtype} {hidden}")
            calls = sets.calls(dtype, hidden, device)
            for tokens in CHECK_TOKENS:
                for n, (weight, residual, out_scale) in enumerate(CHECK_CALLS):
                    a = _inputs(torch_dtype, hidden, tokens, weight, residual, seed=hidden * 31 + tokens * 7 + n)
                    a["out_scale"] = out_scale
                    outs = {label: _result(call, a) for label, call in calls.items()}
                    for label in outs:
                        verdict = _verdict(outs, label)
                        if label == NEW:
                            verdict += f", reference {_near_reference(outs[label], a, torch_dtype)}"
                        if "DIFFERS" in verdict or "FAR" in verdict:
                            bad += 1
                            say(f"check {label} {dtype} {tokens}x{hidden} weight={weight} residual={residual}: {verdict}")
                    done += 1
    say(f"checks: {done} calls, {bad} mismatches")
    return bad


def measure(sets: Sets, say, started, emit) -> None:
    """Phase 2: the timed rows; emit(row) for each (candidate, shape, µs, ratio, TK µs, verdict)."""
    import torch

    from bench.timing import device_us

    device = torch.cuda.current_device()
    for r, (name, dtype, hidden, weight, residual, _) in enumerate(ROWS):
        torch_dtype = getattr(torch, dtype)
        shape = f"{TOKENS}x{hidden} {name}"
        inputs = [_inputs(torch_dtype, hidden, TOKENS, weight, residual, seed=1000 * r + s) for s in range(SETS)]
        calls = sets.calls(dtype, hidden, device)
        outs = {}
        for label, call in calls.items():
            started(label, shape)
            outs[label] = _result(call, inputs[0])
        base = None
        for label, call in calls.items():
            started(label, shape)
            us, _ = device_us(call, inputs)
            base = us if label == "spec" or (base is None and label == "before") else base
            emit((label, shape, us, us / base if base else math.nan, math.nan, _verdict(outs, label)))
        del inputs, outs


def measure_tk(sets: Sets, say, started, emit) -> None:
    """Phase 3: TileKernels on the timed rows, checked within the parity tolerance against NEW's."""
    import tile_kernels as tk
    import torch

    from bench.timing import device_us
    from bench.tuning.tune_train_perf import _close

    device = torch.cuda.current_device()
    for r, (name, dtype, hidden, weight, residual, beside) in enumerate(ROWS):
        if not beside:
            continue
        torch_dtype = getattr(torch, dtype)
        shape = f"{TOKENS}x{hidden} {name}"
        inputs = [_inputs(torch_dtype, hidden, TOKENS, weight, residual, seed=1000 * r + s) for s in range(SETS)]

        def theirs(a):
            return tk.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"], a["dr"])

        started("TK", shape)
        want = theirs(inputs[0])
        torch.cuda.synchronize()
        verdict = "-"
        if NEW in sets.sets:
            verdict = f"{NEW} " + _close(_result(sets.calls(dtype, hidden, device)[NEW], inputs[0]), want, torch_dtype)
        us, _ = device_us(theirs, inputs)
        emit(("TK", shape, us, math.nan, us, verdict))
        del inputs


# ---- the run: the phases in a child process, watched (a candidate that hangs is killed and skipped)

TOTAL_S = 80  # the whole run's budget (--budget S)
STALL_S = 20  # a candidate silent this long is taken as hung (twice that while loading or in TileKernels' first calls)


def _child(argv) -> None:
    """Child: the three phases, each step announced (START name|what) before it runs, each row as ROW json."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--skip", default="")
    args = parser.parse_args(argv)
    skip = tuple(s for s in args.skip.split(",") if s)
    say = functools.partial(print, flush=True)

    def started(name: str, what: str) -> None:
        print(f"{START}{name}|{what}", flush=True)

    def emit(row) -> None:
        print(ROW + json.dumps(row), flush=True)

    started("load", "")
    sets = Sets(args.artifacts, skip, say)
    if "check" not in skip:
        check(sets, say, started)
    measure(sets, say, started, emit)
    measure_tk(sets, say, started, emit)


def _run_child(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run the child until it ends, stalls or passes the deadline; the candidate (or "check") it hung in, if any."""
    stop = run_child(
        "bench.tuning.tune_normbwd", "all", artifacts, skip, deadline, say,
        on_row=lambda row: rows.setdefault(row[:2], row),  # a rerun's repeat of a row keeps the first
        stall_s=lambda name: STALL_S if name not in ("load", "TK") else 2 * STALL_S,
        on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True),
    )  # fmt: skip
    if stop is None:
        return None
    name, what, stopped = stop
    say(f"{stopped} in {name} at {what or '-'}")
    return name if name in CANDIDATES or name == "check" else None


def table(rows: list[tuple], say) -> None:
    """The rows (candidate, shape, µs, ratio, TK µs, verdict), each shape's together, TileKernels' last."""
    order = {shape: n for n, (_, shape, *_) in reversed(list(enumerate(rows)))}
    say(f"\n{'candidate':9s} {'shape':44s} {'µs':>8s} {'ratio':>6s} {'TK µs':>8s}  verdict (ratio: to spec, else to before)")
    for name, shape, us, ratio, tk_us, verdict in sorted(rows, key=lambda r: (order[r[1]], r[0] == "TK")):
        say(f"{name:9s} {shape:44s} {us:8.2f} {ratio:6.2f} {tk_us:8.2f}  {verdict}")


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    import torch

    if not torch.cuda.is_available():
        print("no GPU: nothing to time (the build runs on a CPU: `build --out DIR`)")
        return
    start = time.perf_counter()
    deadline = start + total_s
    say = Log()
    rows: dict = {}

    skip: list[str] = []
    hung = _run_child(artifacts, skip, deadline, say, rows)
    while hung is not None and hung not in skip and time.perf_counter() < deadline - 10:  # time for a rerun
        skip += [hung, "check"] if hung != "check" else [hung]  # the checks are done (or hung) either way
        say(f"rerun without {', '.join(skip)}")
        hung = _run_child(artifacts, skip, deadline, say, rows)
    table(list(rows.values()), say)
    say(f"{time.perf_counter() - start:.1f} s")
    (out / "tune_normbwd.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        _child(argv[2:])
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
