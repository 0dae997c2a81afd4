"""Time the Engram gate forward shipped (kernels_src/engram/gate_fwd.py, "c<ctas>s<stages>x<slice>w") beside the
kernel shipped before it and TileKernels, at 8192, 1, 16 and 128 tokens of 4 x 7168 (bench/cases/engram.py's shapes
and the decode sizes), bytes against TileKernels'.

Why ours was slower at few tokens (session 13, read from the SASS; no GPU counter behind it): one warp runs a
token's 14 items one after another, so its time is the item bodies' instruction latency, not the loads' round trip
(a whole row in flight did not help: 8.50 µs against 7.79). The body shipped before tested every chunk (in the row?
x parked?) and clamped every weight address in 64-bit arithmetic: 470 instructions an item of pass 1 against
TileKernels' 274 (static hidden), and ptxas placed 6 of an item's 8 weight loads behind the cp.async wait, so their L2
round trip followed the wait's instead of overlapping it (TileKernels' landed ahead of it). The lean body runs a
whole item (4 chunks in the row, x parked: every item at hidden 7168) without a test a chunk and reads an item's
weights ahead of the staging and the wait.

Round 1 (H200, 2026-12-02, TileKernels 2.1.0 in the same process; µs, ratio to TileKernels; every row's bytes
identical to TileKernels', and every candidate's to the control's on the masked / in-place / odd-hidden rows):

    candidate     8192 tokens    8192 save      1 token       16 tokens     128 tokens
    TileKernels   400.3          401.6          5.20          8.00          9.77
    c1585s2x28    420.1 1.050    421.7 1.050    7.85 1.508    10.19 1.273   11.70 1.198   the control (shipped before)
    c1584s2x28    398.3 0.995    400.0 0.996    5.58 1.073     6.87 0.859    8.84 0.905   lean, weights at their item
    c1584s2x28w   392.2 0.980    395.3 0.984    5.53 1.063     7.10 0.887    9.03 0.924   lean, weights an item ahead
    c1320s3x28    404.1 1.010    410.5 1.022    5.77 1.108     6.55 0.819    8.82 0.903   lean, 3 slots
    nopdl         393.9 0.984    396.1 0.986    6.02 1.156     7.47 0.934    9.36 0.958   c1584s2x28 without PDL

c1584s2x28w ships (the only form now). The other lean candidates (weights read at their own item) are no longer
buildable from the tree: they are kernels_src/engram/gate_fwd.py at commit 69a9cfe. This script now times the
shipped tiling beside the control (main's kernel at CONTROL_COMMIT, under a key of its own, the same grid).

Each timed row checks the outputs (out; with save, dot / gate_score / rstd_x / rstd_k) byte for byte against
TileKernels' on the same inputs, then times by CUDA-graph replay over rotating inputs larger than L2
(bench.timing.device_us). Then the shipped kernel's bytes against the control's where TileKernels is not run: image
tokens (30 %), in place, hidden 256 / 1280 / 1792 / 4096 / 8192 / 16384 (partial items, x past the slice), 1, 2, 3
and 5 tokens.

The rows run in a child process that announces each kernel before it runs it; a child silent for STALL_S seconds
(a hung kernel) or past the run's budget is killed, its row says so, and the rows are run again without it.

    python -m bench.tuning.tune_engram4 build --out tune-artifacts/engram4          (CPU: TileLang and nvcc)
    python -m bench.tuning.tune_engram4 --artifacts tune-artifacts/engram4 --out DIR  (GPU, tile_kernels importable)
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from bench.tuning import tune_engram2 as harness
from bench.tuning.tune_engram2 import CLAMP, EPS, HC, HIDDEN
from bench.tuning.watch import ROW, START, Log, budget, run_child, stopped, with_reruns
from tkaot._engram.kernels import GATE_FWD_TILINGS

ARTIFACTS = "tune-artifacts/engram4"
CONTROL_COMMIT = "cbe24e7"  # main before these candidates (H200: 421.0 / 7.79 / 11.74 µs at 8192 / 1 / 128 tokens)
CONTROL = "c1585s2x28"  # main's c1584s2x28, under a key of its own beside the candidates (1585 // 4 = 1584 // 4 runs)
CONTROL_MODULE = "bench.tuning._engram4_control"
FWD = (GATE_FWD_TILINGS["default"],)  # the shipped tiling
ROWS = ((8192, False), (8192, True), (1, False), (16, False), (128, False))  # (tokens, save_for_backward)
TOTAL_S = 90  # the whole run's budget (--budget S)
STALL_S = 25  # a candidate silent this long is taken as hung (TileKernels' first call compiles: twice this for it)
NAN = math.nan


# ---- build (CPU)


def build(out: Path) -> None:
    """The control from CONTROL_COMMIT, then the shipped tiling from the kernel source, into one artifact set."""
    import kernels_src.engram.gate_fwd as fwd_source
    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from tkaot._engram.kernels import GATE_FWD

    start = time.perf_counter()
    built = harness.build_control(CONTROL_COMMIT, "kernels_src/engram/gate_fwd.py", CONTROL_MODULE, CONTROL, GATE_FWD, str(out))
    harness.declare(fwd_source, {"default": FWD[0]}, fwd_source.__name__, GATE_FWD)  # build_control declared the control
    variants = [ops.Variant(GATE_FWD.name, (("tiling", t),)) for t in FWD]
    report = build_variants(variants, out, "sm90", 1, BuildCache())
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"built {built + report.built}, from cache {report.cached} -> {out} ({size / 1e6:.2f} MB) in {time.perf_counter() - start:.0f} s")


# ---- the rows (GPU, in the child)


def _use(tiling: str) -> None:
    """Make tkaot.engram.engram_gate_fwd launch `tiling`."""
    from tkaot._engram import kernels

    kernels.GATE_FWD_TILINGS = {"default": tiling}  # the op reads its tiling here at every call


def _timed_rows(tk, gen, started, skip) -> list[tuple]:
    """Each ROWS shape: TileKernels, then the control and the shipped tiling, on the same inputs."""
    import torch

    import tkaot

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for tokens, save in ROWS:
        per_set = tokens * (2 * HC + HC + 1) * HIDDEN * 2 + HC * HIDDEN * 4
        inputs = harness._inputs(tokens, min(64, max(2, -(-3 * l2 // per_set))), gen)
        shape = f"{tokens}x{HC}x{HIDDEN}{' save' if save else ''}"

        def run(lib, save=save):
            return lambda a: lib.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, save)

        started("TK", shape)
        want, tk_us = harness._beside(tk, run, inputs)
        for tiling in (CONTROL, *FWD):
            if tiling in skip:
                continue
            started(tiling, shape)
            _use(tiling)
            rows.append(harness._timed(tiling, shape, run(tkaot), inputs, want, tk_us, _Log()))
        del inputs
        torch.cuda.empty_cache()
    return rows


class _Log:
    """harness._timed's log: the row goes out as the child's ROW line instead."""

    def write(self, _line: str) -> None:
        pass


def _checks(gen, started, skip) -> list[tuple]:
    """The shipped tiling's bytes against the control's where TileKernels is not run."""
    import torch

    import tkaot

    def case(tokens, hidden, masked, in_place=False):
        def randn(*shape):
            return torch.randn(*shape, generator=gen, device="cuda").bfloat16()

        x, kv, w = randn(tokens, HC, hidden), randn(tokens, HC + 1, hidden), randn(HC, hidden).float() * randn(HC, hidden).float()
        mask = torch.rand(tokens, generator=gen, device="cuda") < masked if masked else None

        def call():
            if in_place:
                y = x.clone()
                return (tkaot.engram.engram_gate_fwd(y, kv, w, EPS, CLAMP, False, mask, True)[0],)
            return tkaot.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP, True, mask)

        label = f"{tokens}x{hidden}{' masked' if masked else ''}{' in place' if in_place else ''}"
        return label, call

    cases = [
        case(1000, HIDDEN, 0.3), case(1000, HIDDEN, 0.3, True), case(100, 4096, 0), case(3, 256, 0), case(5, 16384, 0.3),
        case(1000, 1792, 0.3), case(300, 8192, 0), case(1, HIDDEN, 0), case(2, 1280, 0),
    ]  # fmt: skip
    rows = []
    for label, call in cases:
        want = None
        for tiling in (CONTROL, *FWD):
            if tiling in skip:
                continue
            started(tiling, label + " (ctl)")
            _use(tiling)
            try:
                got = tuple(g if g is None else g.clone() for g in call())
                torch.cuda.synchronize()
            except Exception as exc:  # not built, or a launch error: the row says which
                rows.append((tiling, label + " (ctl)", NAN, NAN, type(exc).__name__))
                continue
            if tiling == CONTROL:
                want, same = got, "control"
            else:
                same = "yes" if want is not None and harness._same(got, want) else "NO"
            rows.append((tiling, label + " (ctl)", NAN, NAN, same))
    return rows


def _child(artifacts: Path, skip: tuple[str, ...]) -> None:
    """The child: every row, each candidate announced (START name|shape) before it runs, each row as ROW json."""
    import torch

    def started(name: str, shape: str) -> None:
        print(f"{START}{name}|{shape}", flush=True)

    started("load", "")
    try:
        import tile_kernels as tk
    except Exception as exc:  # not installed, or no TileLang: the TileKernels columns stay empty
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})", flush=True)
        tk = None
    gen = torch.Generator(device="cuda").manual_seed(0)
    for row in _timed_rows(tk, gen, started, skip) + _checks(gen, started, skip):
        print(ROW + json.dumps(row), flush=True)


# ---- the run (GPU): the child, watched (bench/tuning/watch.py)


def _run_child(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run the rows in a child until it ends, stalls or passes the deadline; the tiling it hung in, if any."""

    def on_row(row: tuple) -> None:
        if tuple(row[:2]) not in rows:  # a rerun's repeat of a row keeps the first
            rows[tuple(row[:2])] = row
            if not math.isnan(row[2]):
                say(f"{row[0]:12s} {row[1]:28s} {row[2]:9.2f} µs  TK {row[3]:9.2f}  identical: {row[4]}")

    os.environ["TKAOT_PATH"] = str(artifacts.resolve())  # the child's artifact set
    stop = run_child(
        "bench.tuning.tune_engram4", "all", artifacts, skip, deadline, say, on_row,
        stall_s=lambda name: STALL_S if name not in ("load", "TK") else 2 * STALL_S,
    )  # fmt: skip
    return None if stop is None else stopped(stop, say, rows, 2)


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    """The rows in a child; a tiling that hangs is killed and the rows rerun without it. The table comes last."""
    import torch

    from bench.tuning.tune_train2 import finish

    if not torch.cuda.is_available():
        print("no GPU: nothing to time (build runs here: `build --out DIR`)")
        return
    start, say, rows = time.perf_counter(), Log(), {}

    deadline = start + total_s
    with_reruns("rows", deadline, say, lambda skip: _run_child(artifacts, skip, deadline, say, rows))
    table = [(name, shape, us, tk_us, us / tk_us, same) for name, shape, us, tk_us, same in rows.values()]
    finish(say, table, start, out / "tune_engram4.log", say.lines, (12, 28, 9))


def main(argv=None) -> None:
    import argparse
    import functools
    import sys

    from bench.tuning.tune_train2 import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        parser = argparse.ArgumentParser()
        parser.add_argument("part")
        parser.add_argument("--artifacts", type=Path, required=True)
        parser.add_argument("--skip", default="")
        args = parser.parse_args(argv[1:])
        _child(args.artifacts, tuple(s for s in args.skip.split(",") if s))
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
