"""Time moe_topk_gate_backward's 128-bit candidates (kernels_src/moe/moe_topk_gate_backward.py) beside TileKernels.

Each candidate is the kernel module built with some of its switches patched (SHIPPED_SUM_ORDER, U_FROM_ROW,
H_EARLY, FTZ_FAR), another tiling or launch bound, or the module as it was at BEFORE, into its own artifact set
ARTIFACTS/<candidate>/, on a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_moe4 build --out tune-artifacts/moe4

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_moe4 --artifacts tune-artifacts/moe4 --out DIR [--budget 55]

Rows: bench/cases/backward.py's shapes (8192 x 256, top-8, without and with the aux term), each candidate's launcher
called with the op's argument order, CUDA-graph replay over rotating inputs larger than L2 (bench.timing), two
rounds (TileKernels, before, the candidates; then again), the lower median of each kept. Before timing, each
candidate's output is compared with "before"'s bytes (the kernel shipped until now) and with TileKernels' within the
parity suite's tolerance (bench/tuning/tune_train2.py's check: rtol 1e-5, atol 1e-6); a last check-only input
repeats experts within a token and leaves slots empty (-1), against the torch reference, and one with 250 experts
(not a multiple of 4: the element-by-element path). The rows run in a child process that announces each candidate
before it runs it; a child silent for STALL_S seconds (a hung kernel: a full-mask warp intrinsic some lane skips) or
past the budget is killed, its candidate's row says so, and the rows are run again without it. Prints one table last
(candidate, shape, µs, TileKernels µs, ratio, identical?) and writes DIR/tune_moe4.log.

The candidates (session 13): a lane holds 16-byte vectors (experts 128c + 4 lane + j), so a 256-expert row is 2
LDG.128 and 2 STG.128 a lane (8 guarded LDG.32 / STG.32 before); the derivative's two forms are both evaluated and
one selected (before: three nested branch regions an expert, a warp straddling u^2 = 1 ran both forms); the scores
are read back from the warp's scores row for the output and the aux term's h where its sums need it (L1 hits), so
the kernel holds 40 registers rather than 53 (12 blocks an SM rather than 9: 8192 tokens in 1.3 waves, not 1.7).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.tuning.tune_train2 import cli

ARTIFACTS = "tune-artifacts/moe4"
KERNEL, MODULE = "moe_topk_gate_backward", "kernels_src.moe.moe_topk_gate_backward"
BEFORE = "cbe24e7"  # main before this change: the strided kernel of session 12
ROUNDS = 2


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    values: dict = field(default_factory=dict)  # module values patched while it is built ("before": the old module)
    note: str = ""
    warps: int = 4  # tokens a block (the shipped tiling's 4 unless said)
    min_blocks: int = 1  # the launch bound's blocks an SM


CANDIDATES = (
    Candidate("before", note="as shipped (cbe24e7): strided scalar accesses, branchy derivative, 53 registers"),
    Candidate("vec", {}, "the new default: 16-byte vectors, selected derivative, scores re-read from the row, 40 registers"),
    Candidate("vec.ureg", {"U_FROM_ROW": False}, "vec with the scores held in registers to the output (48 registers)"),
    Candidate("vec.w2", {}, "vec at 2 tokens a block (25 blocks of 64 threads an SM: 50 warps, not 48)", warps=2),
    Candidate("vec.b13", {}, "vec bound to 13 blocks an SM (32 registers, one 4-byte spill: 52 warps, not 48)", min_blocks=13),
    Candidate("vec.ftz", {"FTZ_FAR": True}, "vec, the derivative above v = 1 by ftz ex2 and rcp: same values, -6 instructions an expert"),
    Candidate("vec.b13.ftz", {"FTZ_FAR": True}, "vec.b13 and vec.ftz together", min_blocks=13),
    Candidate("vec.hearly", {"H_EARLY": True}, "vec, aux: h loaded with the scores (before's way; 54 registers), not where it sums"),
    Candidate("vec.regsum", {"SHIPPED_SUM_ORDER": False}, "vec, aux sums over a lane's vectors (h in registers): not before's aux bytes"),
)  # fmt: skip


# ---- build (CPU)


@contextlib.contextmanager
def _patched(c: Candidate, tmp: Path):
    module = importlib.import_module(MODULE)
    if c.name == "before":
        from bench.tuning.tune_mhc_perf import _build_at

        values = {"build": _build_at(MODULE, BEFORE, tmp)}
    else:
        values = dict(c.values)
        if (c.warps, c.min_blocks) != (4, 1):
            values["build"] = lambda tiling: module.gate_backward_kernel(c.warps, c.min_blocks)
    saved = {k: getattr(module, k) for k in values}
    try:
        for k, v in values.items():
            setattr(module, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def build(out: Path) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant
    from tkaot._moe.kernels import MOE_GATE_BWD_TILINGS

    t0 = time.perf_counter()
    # A cache of its own: a patched module value does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-moe4-cache-") as cache:
        for c in CANDIDATES:
            t = time.perf_counter()
            with _patched(c, Path(cache)):
                variant = Variant.make(KERNEL, {"tiling": MOE_GATE_BWD_TILINGS["default"]})
                build_variants([variant], out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name))
            print(f"{c.name:12s} built in {time.perf_counter() - t:5.1f} s", flush=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- time (GPU)


def measure(artifacts: Path, say, started=lambda name, shape: None, skip=()) -> list[tuple]:
    """The rows (candidate, shape, µs, TK µs, ratio, verdict) of every candidate not in `skip`; `started(name, shape)`
    is called before each call of a candidate (or of TileKernels, "TK"), so a hang shows where it is."""
    import torch

    if not torch.cuda.is_available():
        say("no GPU: nothing measured")
        return []
    import tile_kernels as tk

    from bench.timing import device_us
    from bench.tuning.tune_train2 import ATOL, EXPERTS, RTOL, SCALE, SETS, TOKENS, TOPK, _call, _inputs, _launcher, _run, _theirs, _verdict
    from tkaot.reference import backward as ref

    device = torch.cuda.current_device()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[tuple] = []
    calls, launchers = {}, {}
    for c in CANDIDATES:
        if c.name in skip:
            continue
        try:
            launchers[c.name] = _launcher(artifacts, c)
            calls[c.name] = _call(launchers[c.name], device)
        except Exception as exc:  # a candidate that fails to load is reported, not fatal
            say(f"{c.name}: not loaded ({type(exc).__name__}: {exc})")
    for aux in (False, True):
        shape = f"{TOKENS}x{EXPERTS}, top-{TOPK}" + (", aux" if aux else "")
        sets = [_inputs(gen, aux) for _ in range(SETS)]
        started("TK", shape)
        want = _run(_theirs(tk), sets[0])
        started("before", shape)
        control = _run(calls["before"], sets[0]) if "before" in calls else None
        verdicts = {}
        for name, call in calls.items():
            started(name, shape)
            verdicts[name] = _verdict(_run(call, sets[0]), control, want, RTOL, ATOL, "TK")
        best = {}
        for _ in range(ROUNDS):
            started("TK", shape)
            best["TK"] = min(best.get("TK", math.inf), device_us(_theirs(tk), sets, reps=30)[0])
            for name, call in calls.items():
                started(name, shape)
                best[name] = min(best.get(name, math.inf), device_us(call, sets, reps=30)[0])
        for name in calls:
            say(f"{name:12s} {shape:24s} {best[name]:7.2f} µs  TK {best['TK']:6.2f}  {verdicts[name]}")
            rows.append((name, shape, best[name], best["TK"], best[name] / best["TK"], verdicts[name]))
        del sets
    # Repeated experts and empty slots, against the torch reference and before's bytes
    for aux in (False, True):
        shape = "repeats" + (" + aux" if aux else "")
        a = _inputs(gen, aux, tokens=1000, repeats=True)
        want = ref.moe_topk_gate_backward(a["scores"], a["idx"], a["w"], a["dw"], SCALE, a["mask"], a["h"])
        started("before", shape)
        control = _run(calls["before"], a) if "before" in calls else None
        for name, call in calls.items():
            started(name, shape)
            say(f"{shape}: {name}: {_verdict(_run(call, a), control, want, 1e-4, 1e-6, 'the reference')}")
    # 250 experts (rows not 16-byte aligned: the element-by-element path), with aux, against the reference
    say(_odd_rows(launchers, started, gen, ref, SCALE, TOPK))
    return rows


def _odd_rows(launchers: dict, started, gen, ref, scale: float, topk: int) -> str:
    import torch

    from bench.tuning.tune_train2 import _verdict

    tokens, experts, seqs = 999, 250, 3
    scores = torch.nn.functional.softplus(torch.randn(tokens, experts, device="cuda", generator=gen) * 2).sqrt()
    a = {
        "scores": scores,
        "idx": torch.argsort(torch.rand(tokens, experts, device="cuda", generator=gen), dim=1)[:, :topk].contiguous(),
        "w": torch.rand(tokens, topk, device="cuda", generator=gen),
        "dw": torch.randn(tokens, topk, device="cuda", generator=gen),
        "mask": torch.rand(tokens, device="cuda", generator=gen) > 0.1,
        "h": torch.randn(seqs, experts, device="cuda", generator=gen),
        "out": torch.empty(tokens, experts, device="cuda"),
    }
    want = ref.moe_topk_gate_backward(a["scores"], a["idx"], a["w"], a["dw"], scale, a["mask"], a["h"])
    from tkaot._op import current_stream

    device = torch.cuda.current_device()
    control, lines = None, []
    for name, launch in launchers.items():
        started(name, "250 experts + aux")
        out = a["out"].fill_(float("nan"))
        launch(
            device, current_stream(device),
            a["scores"].data_ptr(), a["idx"].data_ptr(), a["w"].data_ptr(), a["dw"].data_ptr(), a["mask"].data_ptr(),
            a["h"].data_ptr(), out.data_ptr(), scale, 1, tokens // seqs, tokens, experts, topk,
        )  # fmt: skip
        torch.cuda.synchronize()
        got = out.clone()
        control = got if name == "before" else control
        lines.append(f"250 experts + aux: {name}: {_verdict(got, control, want, 1e-4, 1e-6, 'the reference')}")
    return "\n".join(lines)


# ---- the run: the rows in a child process, watched (a candidate that hangs is killed and skipped)

TOTAL_S = 55  # the whole run's budget (--budget S)
STALL_S = 15  # a candidate silent this long is taken as hung
LOAD_S = 45  # the same for the imports (tilelang's) and TileKernels' first calls (JIT compiles)
START, ROW = "START ", "ROW "  # the child's protocol lines


def _child(argv) -> None:
    """Child: the rows, each candidate announced (START name|shape) before it runs, each row as ROW json."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--skip", default="")
    args = parser.parse_args(argv)

    def started(name: str, shape: str) -> None:
        print(f"{START}{name}|{shape}", flush=True)

    started("load", "")
    rows = measure(args.artifacts, functools.partial(print, flush=True), started, tuple(s for s in args.skip.split(",") if s))
    for row in rows:
        print(ROW + json.dumps(row), flush=True)


def _run_child(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run the rows in a child until it ends, stalls or passes the deadline; the candidate it hung in, if any."""
    import os
    import queue
    import signal
    import subprocess
    import sys
    import threading

    cmd = [sys.executable, "-m", "bench.tuning.tune_moe4", "child", "--artifacts", str(artifacts), "--skip", ",".join(skip)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in child.stdout] + [lines.put(None)], daemon=True).start()
    name, shape = "load", ""
    while True:
        limit = STALL_S if name not in ("load", "TK") else LOAD_S
        try:
            line = lines.get(timeout=max(0.0, min(limit, deadline - time.perf_counter())))
        except queue.Empty:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            why = "past the run's budget" if time.perf_counter() >= deadline else f"silent for {limit} s"
            return _stopped(name, shape, f"KILLED ({why})", say, rows)
        if line is None:
            if child.wait() != 0:  # an exception (its traceback on stderr), a CUDA error
                return _stopped(name, shape, f"FAILED (exit {child.returncode})", say, rows)
            return None
        line = line.rstrip("\n")
        if line.startswith(START):
            name, shape = line[len(START) :].split("|", 1)
            print(f"  ({name} at {shape or '-'})", flush=True)
        elif line.startswith(ROW):
            row = tuple(json.loads(line[len(ROW) :]))
            rows.setdefault(row[:2], row)
        else:
            say(line)


def _stopped(name: str, shape: str, what: str, say, rows: dict) -> str | None:
    """Say where the child stopped; a candidate's (not TileKernels' or the loading's) row says so and is returned."""
    say(f"{what} in {name} at {shape or '-'}")
    if name in ("load", "TK"):
        return None
    rows.setdefault((name, shape), (name, shape, math.nan, math.nan, math.nan, what))
    return name


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    """The rows in a child; a candidate that hangs is killed and the rows rerun without it."""
    from bench.tuning.tune_train2 import finish

    start = time.perf_counter()
    deadline = start + total_s
    log: list[str] = []
    rows: dict = {}

    def say(line: str) -> None:
        print(line, flush=True)
        log.append(line)

    for c in CANDIDATES:
        say(f"# {c.name}: {c.note}")
    skip: list[str] = []
    hung = _run_child(artifacts, skip, deadline, say, rows)
    while hung is not None and hung not in skip and time.perf_counter() < deadline - 10:  # time for a rerun
        skip.append(hung)
        say(f"rerun without {', '.join(skip)}")
        hung = _run_child(artifacts, skip, deadline, say, rows)
    finish(say, list(rows.values()), start, out / "tune_moe4.log", log, (12, 24, 7))


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["child"]:
        _child(argv[1:])
        return
    total_s = TOTAL_S
    if "--budget" in argv:  # the whole run's seconds
        at = argv.index("--budget")
        total_s = float(argv[at + 1])
        del argv[at : at + 2]
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=total_s))


if __name__ == "__main__":
    main()
