"""Time round 6's candidates for the mHC rows still slower than TileKernels (issue 16) beside TileKernels and the
shipped kernels (the controls), at the bench shapes (bench/cases/mhc*.py).

The rows (H200, ratio to TileKernels in one run) and the candidates (bench/tuning/mhc6_candidates.py, where
each is described; every one keeps the shipped kernel's signature and, if right, its output bytes):
- mhc_sinkhorn_bwd, 8192 x 4 x 4 fp32, 20 repeats (1.09x): one thread a matrix row, not one element a lane:
  a row's sums in registers, a column's over the token's 4 threads by shuffles (half the shuffles a token),
  and a row's quotients on one denominator. rowsN: N threads a block (N / 4 tokens); .fdiv: the lines that
  share a denominator share its refined reciprocal (the fast path of IEEE division, one range check a line, IEEE
  division outside the range), not a full division each.
- mhc_fn_normw_merge_bwd, 24 x 28672 (1.07x; round 4 best 5.49 µs against TileKernels' 5.29): gGrR[bB], G groups
  of threads on the same columns, each loading R rows at once (G * R = 24: the whole column in flight, one wait
  for memory, not three), the first group adding the products in row order; 2^B columns a block (32 without b,
  a warp a group), blocks of G * 2^B threads.
- mhc_pre_big_fuse_fwd at 1 token (1.11x): tNbB, B blocks a token of N threads (each reduces the mixes; block
  0's warp 0 runs the Sinkhorn), a worker a vector of the hidden dimension (896 of 7168 / 8: 4 x 224 or
  2 x 480 workers), its residual loads issued before the mixes are reduced: a decode token waits for memory
  about once (the splits and the residual together) where the shipped kernel waits six times (the splits, then
  five rounds of 192 vectors). Its 8192-token row is timed too (the op could choose by token count).
- mhc_multilayer_recompute, 8192 x 4 x 7168 bf16, 4 layers (1.09x, last: it runs on what is left of the budget):
  t64bB, 64-thread blocks (twice as many blocks a token) capped at B blocks an SM: 12 keeps the shipped 768
  threads and 80 registers an SM's worth, 8 allows 128 registers.

The machinery is bench/tuning/tune_mhc_perf.py's (candidates as patched builders, each built into its own artifact
set ARTIFACTS/<candidate>/, launched through the op's own validation and argument packing) and tune_mhc4.py's (the
watched children, bytes from a copy of the inputs made first: normw_merge_bwd accumulates into its outputs).
Build on a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_mhc6 build --out tune-artifacts/mhc6

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_mhc6 --artifacts tune-artifacts/mhc6 --out DIR [--budget S]

Each op's rows run in a child process that announces every call before it makes it; a child silent for STALL_S
seconds (three times that for TileKernels' first calls, which compile) or past its deadline (the run's budget,
--budget or TOTAL_S, less FLOOR_S for each op after it) is killed, its row says so, and the op's rows run again
without that candidate. Per candidate and row: its output bytes against TileKernels' ("TK yes", or how many
tensors differ and by how much) and against the control's ("=ctl"), then its device µs (CUDA-graph replay over
rotating inputs larger than L2, median) beside TileKernels' and the control's in the same child. Prints one table
last and writes DIR/tune_mhc6.log.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
import time
from pathlib import Path

from bench.tuning.tune_mhc4 import CONTROL, _against_tk, _outputs, _row_text, _same, _stopped, _tensors_of
from bench.tuning.tune_mhc_perf import Candidate, _set, options
from bench.tuning.watch import ROW, Log, child_start, run_child, started, with_reruns

ARTIFACTS = "tune-artifacts/mhc6"

_SINK = "kernels_src.mhc.sinkhorn_bwd"
_SINK_OP = dict(kernel="mhc_sinkhorn_bwd", op="mhc_sinkhorn_bwd")
_MERGE = "kernels_src.mhc.normw_merge_bwd"
_MERGE_OP = dict(kernel="mhc_normw_merge_bwd", op="mhc_fn_normw_merge_bwd", values={"dtype": "float32"})
_FUSE = "kernels_src.mhc.pre_big_fuse"
_FUSE_OP = dict(kernel="mhc_pre_big_fuse", op="mhc_pre_big_fuse_fwd")
_RC = "kernels_src.mhc.multilayer_recompute"
_RC_OP = dict(kernel="mhc_multilayer_recompute", op="mhc_multilayer_recompute")


def _built_by(module: str, name: str, *args) -> tuple[tuple[str, str, object], ...]:
    """The patch that builds `module`'s kernel with mhc6_candidates.<name>(*args) (imported when it is built:
    TileLang is needed only there)."""
    return ((module, "build", _Deferred(name, args)),)


class _Deferred:
    """A builder named in mhc6_candidates, made when first called (the build imports TileLang; the GPU run need not)."""

    def __init__(self, name: str, args: tuple):
        self.name, self.args = name, args

    def __call__(self, *a, **k):
        from bench.tuning import mhc6_candidates

        return getattr(mhc6_candidates, self.name)(*self.args)(*a, **k)

    def __repr__(self) -> str:
        return f"{self.name}{self.args}"


def _sink(threads: int, fdiv: bool) -> Candidate:
    name = f"sinkhorn_bwd.rows{threads}" + (".fdiv" if fdiv else "")
    note = f"a thread a row, {threads} threads" + (", shared reciprocals" if fdiv else "")
    return Candidate(name, patches=_built_by(_SINK, "sinkhorn_rows_build", threads, fdiv), note=note, **_SINK_OP)


def _merge(groups: int, rows: int, log_cols: int | None = None) -> Candidate:
    cols = 1 << (log_cols if log_cols is not None else 5)
    name = f"normw_merge_bwd.g{groups}r{rows}" + (f"b{log_cols}" if log_cols is not None else "")
    note = f"{groups} groups x {rows} rows, {cols} columns a block ({groups * cols} threads)"
    return Candidate(name, patches=_built_by(_MERGE, "merge_groups_build", groups, rows, cols), note=note, **_MERGE_OP)


def _fuse(threads: int, blocks: int) -> Candidate:
    name = f"big_fuse.t{threads}b{blocks}"
    note = f"{blocks} blocks a token of {threads} threads, residual loads before the mixes"
    return Candidate(name, patches=_built_by(_FUSE, "big_fuse_split_build", threads, blocks), note=note, **_FUSE_OP)


CANDIDATES = (
    Candidate("sinkhorn_bwd.ctl", note="shipped: an element a lane, 128 threads", **_SINK_OP),
    _sink(32, False), _sink(64, False), _sink(128, False),
    _sink(32, True), _sink(64, True), _sink(128, True),
    Candidate("normw_merge_bwd.ctl", note="shipped: a thread a column, 8 rows a chunk", **_MERGE_OP),
    _merge(3, 8), _merge(4, 6, 7), _merge(6, 4, 7), _merge(2, 12, 7),
    Candidate("big_fuse.ctl", note="shipped: a block a token, 128 threads", **_FUSE_OP),
    _fuse(256, 4), _fuse(512, 2),
    Candidate("recompute.ctl", note="shipped: 128 threads, 6 blocks an SM (80 registers)", **_RC_OP),
    Candidate("recompute.t64b12", patches=_set(_RC, THREADS=64) + options(_RC, min_blocks=12),
              note="64 threads, 12 blocks an SM (80 registers)", **_RC_OP),
    Candidate("recompute.t64b8", patches=_set(_RC, THREADS=64) + options(_RC, min_blocks=8),
              note="64 threads, 8 blocks an SM (128 registers)", **_RC_OP),
)  # fmt: skip

TOTAL_S = 145  # the whole run's budget (--budget S)
STALL_S = 20  # a candidate silent this long is taken as hung (and the loading: tkaot and torch import)
TK_STALL_S = 60  # TileKernels' first calls compile its kernels
FLOOR_S = 30  # the least time an op's child is left: loading, its candidates, TileKernels' compile


# ---- build (CPU)


def build(out: Path, only: str | None = None) -> None:
    from bench.tuning import tune_mhc_perf

    tune_mhc_perf.build(out, only, CANDIDATES)


# ---- one op's rows (GPU, in a child)


def measure_op(op: str, artifacts: Path, skip: tuple, started, say) -> None:
    """Say a ROW (candidate, shape, µs, TK µs, control µs, verdict) for each of op's candidates not in `skip`; the
    candidates run first (the control first of them), then TileKernels (its first call compiles), after which each
    row is said again with TileKernels' µs and bytes ("TK" in skip: never)."""
    import torch

    from bench import timing
    from bench.run import _tile_kernels, rotating_inputs
    from bench.tuning.tune_mhc_perf import _cases, _launching

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    chosen = [c for c in CANDIDATES if c.op == op and c.name not in skip]
    control = next((c for c in chosen if c.name.endswith(CONTROL)), None)
    if control is not None:
        chosen.remove(control)
        chosen.insert(0, control)
    for case in _cases()[op]:
        torch.manual_seed(0)
        inputs = rotating_inputs(case, l2)
        first = copy.deepcopy(inputs[0])  # every output is taken from a copy of this (the op may accumulate)
        want = control_us = None
        rows, outputs = [], {}
        for c in chosen:
            started(c.name, case.shape)
            try:
                with _launching(c, artifacts):
                    got = outputs[c.name] = _outputs(case, first)
                    verdict = []
                    if c is control:
                        want = got
                    elif want is not None:
                        verdict.append("=ctl" if _same(got, want) else "DIFFERS from ctl")
                    us, mode = timing.device_us(case.tkaot, inputs)
                    if mode != "graph":
                        verdict.append(f"({mode})")
            except Exception as exc:  # a candidate that fails to load or launch is reported, not fatal
                us, verdict = None, [f"error: {type(exc).__name__}: {exc}"[:120]]
            control_us = us if c is control else control_us
            rows.append([c.name, case.shape, us, None, control_us, ", ".join(verdict)])
            say(ROW + json.dumps(rows[-1]))
        tk = None if "TK" in skip else _tile_kernels()
        if tk is not None and case.tile_kernels is not None:
            started("TK", case.shape)
            theirs = copy.deepcopy(first)
            tk_got = _tensors_of(case.tile_kernels(tk, theirs)) + _tensors_of(theirs)
            torch.cuda.synchronize()
            tk_us, _ = timing.device_us(lambda a, case=case, tk=tk: case.tile_kernels(tk, a), inputs)
            for row in rows:
                row[3] = tk_us
                if row[0] in outputs:
                    row[5] = _against_tk(outputs[row[0]], tk_got) + (", " + row[5] if row[5] else "")
                say(ROW + json.dumps(row))
        del inputs, first, outputs
        torch.cuda.empty_cache()


def _part(argv) -> None:
    """Child: one op's rows, each call announced (START name|shape) before it is made, each row as ROW json."""
    op, artifacts, skip = child_start(argv)
    measure_op(op, artifacts, skip, started, functools.partial(print, flush=True))


# ---- the run (GPU): each op's rows in a watched child


def _run_op(op: str, artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run one op's rows in a child until it ends, stalls or passes the deadline; the candidate it hung in, if any."""

    def on_row(row: tuple) -> None:
        rows[tuple(row[:2])] = row  # a row said again (with TileKernels' figures, or by a rerun) replaces it
        say(_row_text(row))

    stop = run_child("bench.tuning.tune_mhc6", op, artifacts, skip, deadline, say, on_row,
                     stall_s=lambda name: STALL_S if name != "TK" else TK_STALL_S)  # fmt: skip
    return None if stop is None else _stopped(op, *stop, say, rows)


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    """Each op in its own child, in CANDIDATES' order; one that hangs in a candidate is rerun without it."""
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    say = Log()
    rows: dict = {}

    say(f"tune_mhc6: artifacts {artifacts}, budget {total_s:.0f} s")
    ops = list(dict.fromkeys(c.op for c in CANDIDATES))
    for i, op in enumerate(ops):
        # each op may use what is left but FLOOR_S for each op after it (TileKernels' first calls compile, and an op
        # stopped before them has no ratios), so one slow op cannot starve the rest and a fast one leaves its time
        deadline = start + total_s - FLOOR_S * (len(ops) - 1 - i)
        with_reruns(op, deadline, say, lambda skip, op=op, deadline=deadline: _run_op(op, artifacts, skip, deadline, say, rows))
    say(f"\n{'candidate':24s} {'shape':34s} {'µs':>8s} {'TK µs':>8s} {'ratio':>6s} {'ctl µs':>8s} {'/ctl':>6s}  identical?")
    for row in rows.values():
        say(_row_text(row))
    say(f"{time.perf_counter() - start:.1f} s")
    (out / "tune_mhc6.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:
        _part(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("build", "time"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(ARTIFACTS), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the artifact sets go; time: the log's directory")
    parser.add_argument("--only", help="build: only the candidates whose name contains this")
    parser.add_argument("--budget", type=float, default=TOTAL_S, help="time: the whole run's seconds")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.out, args.only)
        return
    try:
        import torch

        if not torch.cuda.is_available():
            print("tune_mhc6: no GPU here (torch.cuda.is_available() is False); nothing timed")
            return
    except ImportError:
        print("tune_mhc6: torch not importable; nothing timed")
        return
    time_candidates(args.artifacts, args.out, args.budget)


if __name__ == "__main__":
    main()
