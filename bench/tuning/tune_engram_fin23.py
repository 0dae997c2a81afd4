"""Round fin23: candidates of engram_sinkhorn_finalize (kernels_src/engram/sinkhorn_finalize.py, tiling
"r<rows>[c][p|s]") timed beside the shipped one-row-a-CTA form (r1) and TileKernels at the bench case
(bench/cases/engram.py: 100001 x 5120 fp32, eps 1e-20, alpha sqrt(5120)), with the same run's copy ceiling.

Why: issue 17 asks memory-bound rows for at least 90 % of the same-run copy ceiling; finalize read 82 % and 81 % in
the tenth session's two runs (1182.90 µs against TileKernels 1184.44; results/2026-12-02-NVIDIA-H200-s10-*families.json)
while engram_sinkhorn_step, which reads the same rows in a loop with col_scale held in registers, read 105 %. r1 is a
CTA a row: 96 registers, 5 CTAs an SM; a CTA loads its 20 KB row, reduces it over the block, then stores it, with no
load in flight while it reduces and stores, and it reads col_scale (20 KB, from L2) again with every row.

Candidates (sm_90a registers; every one has the same 120 multiplies and 40 fused multiply-adds in its PTX as r1, and
r1's order of the per-thread sum and its 128-thread AllReduce):
  r4c / r16c   115  R rows a CTA in turn, col_scale in registers
  r4p / r16p   120  the next row's loads issued before this row's reduction (registers), col_scale from L2
  r4cp / r16cp 153  both
  r4s / r16s   100  the next row staged in shared memory by cp.async (16 bytes a copy; 20 KB), col_scale from L2
  r4cs / r16cs 121  cp.async staging and col_scale in registers
  r1w           96  r1 with its stores through shared memory: x * factor written in the row layout, then 16
                    contiguous bytes a thread, so each warp store covers whole 32-byte sectors (r1, like
                    TileKernels, stores a thread's 32 bytes as two 16-byte halves, each warp store half of 32 sectors;
                    the step kernel's loads, in that layout too, read at 105 %, so the stores are the suspect)
  r4cw 121, r4csw / r16csw 123: those stores with r4c, r4cs, r16cs

On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_engram_fin23 build --out tune-artifacts/fin23

on the GPU (tilelang and tile_kernels importable):

    TKAOT_PATH=$PWD/tune-artifacts/fin23 python -m bench.tuning.tune_engram_fin23 --out DIR

The run: the copy ceiling (bench.timing.copy_ceiling_tbps); every kernel's output against r1's bytes on fresh random
inputs at CHECK_ROWS rows and the timed size (TileKernels' too); then ROUNDS rounds, each timing every kernel (its
order rotated a round) over REPS calls between CUDA events, the calls alternating between two input sets (8 GB, far
past the L2); the median of the rounds. One table last; DIR/tune_engram_fin23.jsonl holds every check and round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

SHIPPED = "r1"
CANDIDATES = {
    "r4c": "4 rows a CTA, col_scale in registers",
    "r16c": "16 rows a CTA, col_scale in registers",
    "r4p": "4 rows, next row's loads before the reduction",
    "r16p": "16 rows, next row's loads before the reduction",
    "r4cp": "4 rows, both",
    "r16cp": "16 rows, both",
    "r4s": "4 rows, next row staged by cp.async",
    "r16s": "16 rows, next row staged by cp.async",
    "r4cs": "4 rows, cp.async staging, col_scale in registers",
    "r16cs": "16 rows, cp.async staging, col_scale in registers",
    "r1w": "r1, stores through shared memory, whole sectors",
    "r4cw": "r4c, stores through shared memory",
    "r4csw": "r4cs, stores through shared memory",
    "r16csw": "r16cs, stores through shared memory",
}
HEAD_DIM = 5120
TIMED = 100001
CHECK_ROWS = (1, 3, 4, 5, 15, 16, 17, 127, 4097)  # around the candidates' row groups, and the issue's sizes
EPS, ALPHA = 1e-20, HEAD_DIM**0.5  # the bench case's
ROUNDS, REPS = 9, 8
BUDGET_S = 150  # no timing round starts later (a round: ~13 kernels x 9 calls of ~1.2 ms)
TK = "TileKernels"
AGAIN = "shipped again"  # the shipped kernel timed twice a round: the run's noise
BYTES = 2 * TIMED * HEAD_DIM * 4 + TIMED * 4  # the bench case's count: the matrix read, out written, row_scale


def build(out: str) -> None:
    """r1 and every candidate for sm90 into `out`; r1's cubin checked against prebuilt/sm90's (key head_dim=5120)."""
    import kernels_src.engram.sinkhorn_finalize as source
    from bench.tuning import tune_engram2 as harness
    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from tkaot._engram.kernels import SINKHORN_FINALIZE

    start = time.perf_counter()
    tilings = (SHIPPED, *CANDIDATES)
    harness.declare(source, {f"candidate{i}": t for i, t in enumerate(tilings)}, source.__name__, SINKHORN_FINALIZE)
    variants = [ops.Variant(SINKHORN_FINALIZE.name, (("head_dim", HEAD_DIM), ("tiling", t))) for t in tilings]
    report = build_variants(variants, Path(out), "sm90", 1, BuildCache())
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    built = next(v["cubin"] for v in manifest["variants"] if v["key"] == f"head_dim={HEAD_DIM},tiling={SHIPPED}")
    prebuilt = Path(__file__).resolve().parents[2] / "prebuilt" / "sm90" / "manifest.json"
    shipped = next(v["cubin"] for v in json.loads(prebuilt.read_text())["variants"]
                   if v["kernel"] == SINKHORN_FINALIZE.name and v["key"] == f"head_dim={HEAD_DIM}")  # fmt: skip
    print(f"r1: {built[:16]} {'identical to' if built == shipped else 'DIFFERS from'} prebuilt/sm90's ({shipped[:16]})")
    print(f"built {report.built}, from cache {report.cached} -> {out} in {time.perf_counter() - start:.0f} s")


def _inputs(rows: int, gen):
    import torch

    return {
        "m": torch.randn(rows, HEAD_DIM, generator=gen, device="cuda"),
        "r": torch.rand(rows, generator=gen, device="cuda"),
        "c": torch.rand(HEAD_DIM, generator=gen, device="cuda"),
        "out": torch.empty(rows, HEAD_DIM, device="cuda"),
    }


def _callers(tk) -> dict:
    """name -> call(inputs) -> out."""
    import tkaot
    from tkaot._engram import kernels

    def ours(tiling):
        def call(a):
            kernels.SINKHORN_FINALIZE_TILINGS = {"default": tiling}  # the op reads its tiling at every call
            return tkaot.engram.engram_sinkhorn_finalize(a["m"], a["r"], a["c"], EPS, ALPHA, a["out"])

        return call

    calls = {SHIPPED: ours(SHIPPED), **{t: ours(t) for t in CANDIDATES}}
    if tk is not None:
        calls[TK] = lambda a: tk.engram.engram_sinkhorn_finalize(a["m"], a["r"], a["c"], EPS, ALPHA, a["out"])
    return calls


def _check(calls: dict, rows: int, gen, log) -> dict:
    """name -> "yes" / "NO" / an exception's name: its output (into a NaN-poisoned buffer) against r1's bytes."""
    import torch

    a = _inputs(rows, gen)
    a["out"].fill_(float("nan"))
    want = calls[SHIPPED](a).clone()
    verdicts = {}
    for name, call in calls.items():
        if name == SHIPPED:
            continue
        try:
            a["out"].fill_(float("nan"))
            got = call(a)
            verdicts[name] = "yes" if torch.equal(got.view(torch.int32), want.view(torch.int32)) else "NO"
        except Exception as exc:  # not built, or a launch error: the row says which
            verdicts[name] = type(exc).__name__
        log.write(json.dumps({"check": name, "rows": rows, "same_as_shipped": verdicts[name]}) + "\n")
    del a, want
    torch.cuda.empty_cache()
    return verdicts


def _rounds(calls: dict, gen, log, start: float) -> dict:
    """name -> per-round µs a call: ROUNDS rounds, each kernel REPS calls between events (two input sets in turn);
    no round starts past BUDGET_S seconds from `start`."""
    import torch

    sets = [_inputs(TIMED, gen) for _ in range(2)]
    names = [n for n in calls if n != SHIPPED]
    order = [SHIPPED, *names[: len(names) // 2], AGAIN, *names[len(names) // 2 :]]
    runnable = {}
    for name in order:
        call = calls[SHIPPED if name == AGAIN else name]
        try:
            for s in sets:
                call(s)
            torch.cuda.synchronize()
            runnable[name] = call
        except Exception as exc:
            print(f"{name}: not timed ({type(exc).__name__}: {exc})")
    times: dict[str, list[float]] = {name: [] for name in runnable}
    for r in range(ROUNDS):
        if time.perf_counter() - start > BUDGET_S:
            print(f"stopped after {r} rounds: {BUDGET_S} s spent")
            break
        names_r = list(runnable)
        names_r = names_r[r % len(names_r) :] + names_r[: r % len(names_r)]
        for name in names_r:
            call = runnable[name]
            call(sets[1])  # the switch from the kernel before, untimed
            first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            first.record()
            for i in range(REPS):
                call(sets[i % 2])
            last.record()
            last.synchronize()
            times[name].append(first.elapsed_time(last) * 1000.0 / REPS)
        log.write(json.dumps({"round": r, "us": {n: t[-1] for n, t in times.items()}}) + "\n")
    del sets
    torch.cuda.empty_cache()
    return times


def run(out: str) -> None:
    os.environ.setdefault("TKAOT_STRICT", "1")  # a candidate not built is an error, never a generic stand-in
    import torch

    from bench.timing import copy_ceiling_tbps

    try:
        import tile_kernels as tk
    except Exception as exc:  # not installed, or no TileLang: the TileKernels row stays empty
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})")
        tk = None
    start = time.perf_counter()
    Path(out).mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    calls = _callers(tk)
    ceiling = copy_ceiling_tbps()
    not_same: dict[str, list[str]] = {name: [] for name in calls if name != SHIPPED}
    with open(Path(out) / "tune_engram_fin23.jsonl", "w") as log:
        log.write(json.dumps({"copy_ceiling_tbps": ceiling}) + "\n")
        for rows in (*CHECK_ROWS, TIMED):
            for name, verdict in _check(calls, rows, gen, log).items():
                if verdict != "yes":
                    not_same[name].append(f"{verdict} at {rows}")
        print(f"checks done in {time.perf_counter() - start:.0f} s")
        times = _rounds(calls, gen, log, start)
    tk_us = statistics.median(times[TK]) if TK in times else float("nan")
    print(f"{torch.cuda.get_device_name()}, {time.perf_counter() - start:.0f} s, {ROUNDS} rounds of {REPS} calls, "
          f"{TIMED}x{HEAD_DIM} fp32, copy ceiling {ceiling:.3f} TB/s")  # fmt: skip
    print(f"{'candidate':13s} {'µs median':>10s} {'min':>8s} {'max':>8s} {'ratio TK':>8s} {'ceiling':>7s}  bytes ok  what")
    for name in (SHIPPED, AGAIN, *CANDIDATES, TK):
        bad = not_same.get(name, ["not run"])
        ok = "control" if name in (SHIPPED, AGAIN) else "; ".join(bad[:2]) + (f" (+{len(bad) - 2})" if len(bad) > 2 else "") or "yes"
        what = CANDIDATES.get(name, "shipped" if name in (SHIPPED, AGAIN) else "its default calls")
        rounds = times.get(name)
        if not rounds:
            print(f"{name:13s} {'-':>10s} {'-':>8s} {'-':>8s} {'-':>8s} {'-':>7s}  {ok:8s}  {what} (not timed)")
            continue
        med = statistics.median(rounds)
        share = BYTES / (med * 1e-6) / 1e12 / ceiling
        print(f"{name:13s} {med:10.1f} {min(rounds):8.1f} {max(rounds):8.1f} {med / tk_us:8.3f} {share:7.3f}  {ok:8s}  {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("run", "build"), default="run")
    parser.add_argument("--out", required=True, help="run: the log's folder; build: the artifact set's")
    args = parser.parse_args()
    build(args.out) if args.command == "build" else run(args.out)


if __name__ == "__main__":
    main()
