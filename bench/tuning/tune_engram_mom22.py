"""Round mom22: candidates of engram_sinkhorn_momentum_update (kernels_src/engram/sinkhorn_momentum.py, tiling
"t<threads>v<vec>x<reps>" plus tuning letters) timed beside the shipped t128v4x2 and TileKernels at the bench case
(bench/cases/engram.py: 512000512 elements, fp32 grad, bf16 momentum, nesterov, beta1 0.95).

Why: H200 (one process): shipped t128v4x2 1454-1459 µs, TileKernels 1449-1453 (both ~4.2 TB/s); our t32v4x2 2409
though TileKernels' kernel is a 32-lane CTA of two runs of 4 too. What differs at t32 (SASS, sm_90a, this build's
nvcc flags; TileKernels lowered as its default calls compile it, without PDL):
- ours runs griddepcontrol.wait and launch_dependents at entry (ACQBULK, PREEXIT) and is launched with the PDL
  attribute; TileKernels' timed calls have neither (its use_pdl default is off; with PDL on it places the trigger
  after its stores);
- ours tests each run against numel (every load and the update predicated or branched), TileKernels has no test;
- both read grad by LDG.E.128.CONSTANT (ld.global.nc) as timed; TileKernels' with PDL on reads it by LDG.E.128
  (its pointer is not restrict-qualified and its wait is a barrier to nvcc), which "p" reproduces;
- beta1 a runtime value here (FMUL/FFMA by a uniform register), a constant there: the same instruction count.
At 32 lanes a CTA an SM holds at most 32 CTAs (32 warps, half its warps), so each CTA's lifetime bounds the bytes in
flight; 64 lanes and more fill the SM's warps.

Letters (the module docstring of the kernel): u full CTAs untested, e PDL trigger after the stores, n no PDL,
c grad ld.global.nc.L1::no_allocate and sinkhorn_input st.global.cs, p grad by a plain ld.global.
Every candidate keeps the shipped fused multiply-adds: its bytes equal the shipped kernel's (the run checks).

Built for sm_90a (registers; SASS instructions other than NOP, all paths; those a full CTA runs with nesterov):
t128v4x2 (shipped) 31, 135, 96; u 31, 233; c 32, 102 (LDG.E.NA.128.CONSTANT, STG.E.EF.128); uc 32, 186;
e 31, 136; n 31, 133; t256v4x1 22, 56, ~55; t256v4x1u / uc 22, 109; t32v4x2 31, 126, 93; t32v4x2e 31, 127;
t32v4x2n 31, 124; t32v4x2u 31, 221; t32v4x2un 31, 219, 82 (no test, no ACQBULK / PREEXIT, LDG.E.128.CONSTANT);
t32v4x2uep 32, 221 (LDG.E.128); TileKernels (no PDL) 28, 74, 74 (no test, LDG.E.128.CONSTANT). No local memory,
no shared memory in any. "u" doubles the code (the tested body stays for the last CTA); the full CTA's path is
shorter by its tests.

On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_engram_mom22 build --out tune-artifacts/mom22

on the GPU (tilelang and tile_kernels importable):

    TKAOT_PATH=$PWD/tune-artifacts/mom22 python -m bench.tuning.tune_engram_mom22 --out DIR

The run: every kernel's outputs (the updated momentum and sinkhorn_input) against the shipped kernel's on fresh
random inputs at CHECK_NUMELS (TileKernels too), at OURS_ONLY (not multiples of 256; ours alone; nesterov and not)
and at the timed size; then ROUNDS rounds, each timing every kernel (its order rotated a round) over REPS calls
between CUDA events, the calls alternating between two input sets (6 GB a set pair, far past the L2); the median of
the rounds. One table last; DIR/tune_engram_mom22.jsonl holds every check and round.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

SHIPPED = "t128v4x2"
# name -> what it changes (the module docstring has each one's registers and instruction counts)
CANDIDATES = {  # round 2 (round 1 on the H200: t256v4x1 1446.7, t256v4x1u 1446.4, shipped 1449.4, TileKernels 1445.3)
    "t256v4x1": "256 lanes, one run (round 1 best)",
    "t128v4x1": "128 lanes, one run: 1M CTAs",
    "t192v4x1": "192 lanes, one run",
    "t320v4x1": "320 lanes, one run",
    "t384v4x1": "384 lanes, one run",
    "t256v2x2": "256 lanes, two runs of 2",
    "t512v2x1": "512 lanes, runs of 2",
    "t256v4x1e": "t256v4x1 + PDL trigger after the stores",
    "t32v4x2n": "t32 without PDL (TileKernels' as timed)",
}
FIXED = {"grad_dtype": "float32", "momentum_dtype": "bfloat16"}  # the bench case's
BETA1 = 0.95
TIMED = 512000512
CHECK_NUMELS = (256, 768, 127 * 256, 4096 * 256, 4097 * 256)  # TileKernels' (multiples of 256) too
OURS_ONLY = (1000, 4097 * 256 + 136)  # multiples of 8, not of 256: ours alone, nesterov and not
ROUNDS, REPS = 9, 16
BUDGET_S = 120  # no timing round starts later (a round: ~17 kernels x 17 calls of ~1.5 ms, under a second)
TK = "TileKernels"
AGAIN = "shipped again"  # the shipped kernel timed twice a round: the run's noise


def build(out: str) -> None:
    """The shipped tiling and every candidate (fp32 grad, bf16 momentum) for sm90 into `out`; the shipped cubin
    checked against prebuilt/sm90's manifest."""
    import kernels_src.engram.sinkhorn_momentum as source
    from bench.tuning import tune_engram2 as harness
    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from tkaot._engram.kernels import SINKHORN_MOMENTUM

    start = time.perf_counter()
    tilings = (SHIPPED, *CANDIDATES)
    harness.declare(source, {f"candidate{i}": t for i, t in enumerate(tilings)}, source.__name__, SINKHORN_MOMENTUM)
    decl = ops.DECLARATIONS[SINKHORN_MOMENTUM.name]
    variants = [ops.Variant(decl.name, tuple((a.name, t if a.name == "tiling" else FIXED[a.name]) for a in decl.axes)) for t in tilings]
    report = build_variants(variants, Path(out), "sm90", 1, BuildCache())
    key = ",".join(f"{k}={v}" for k, v in (*FIXED.items(), ("tiling", SHIPPED)))
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    built = next(v["cubin"] for v in manifest["variants"] if v["kernel"] == decl.name and v["key"] == key)
    prebuilt = Path(__file__).resolve().parents[2] / "prebuilt" / "sm90" / "manifest.json"
    shipped = next((v["cubin"] for v in json.loads(prebuilt.read_text())["variants"] if v["key"] == key and v["kernel"] == decl.name), None)
    cubin = hashlib.sha256((Path(out) / "cubins" / f"{built}.cubin").read_bytes()).hexdigest()
    verdict = "identical to prebuilt/sm90" if shipped == built == cubin else f"DIFFERS from prebuilt/sm90 ({shipped})"
    print(f"shipped {SHIPPED}: {built[:16]} {verdict}")
    print(f"built {report.built}, from cache {report.cached} -> {out} in {time.perf_counter() - start:.0f} s")


def _inputs(numel: int, gen):
    import torch

    grad = torch.randn(numel, generator=gen, device="cuda")
    momentum = torch.randn(numel, generator=gen, device="cuda").bfloat16()
    return grad, momentum


def _callers(tk) -> dict:
    """name -> call(grad, momentum, nesterov) -> sinkhorn_input, updating momentum in place."""
    import tkaot
    from tkaot._engram import kernels

    def ours(tiling):
        def call(grad, momentum, nesterov=True):
            kernels.SINKHORN_MOMENTUM_TILINGS = {"default": tiling}  # the op reads its tiling at every call
            return tkaot.engram.engram_sinkhorn_momentum_update(grad, momentum, BETA1, nesterov)

        return call

    calls = {SHIPPED: ours(SHIPPED), **{t: ours(t) for t in CANDIDATES}}
    if tk is not None:
        calls[TK] = lambda grad, momentum, nesterov=True: tk.engram.engram_sinkhorn_momentum_update(grad, momentum, BETA1, nesterov)
    return calls


def _same(a, b) -> bool:
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _check(calls: dict, numel: int, nesterov: bool, gen, log) -> dict:
    """name -> "yes" / "NO" / an exception's name: its momentum and sinkhorn_input against the shipped kernel's on
    fresh inputs."""
    import torch

    grad, momentum = _inputs(numel, gen)
    want_m = momentum.clone()
    want_s = calls[SHIPPED](grad, want_m, nesterov)
    verdicts = {}
    for name, call in calls.items():
        if name == SHIPPED or (name == TK and (numel % 256 or not nesterov)):
            continue
        try:
            m = momentum.clone()
            verdicts[name] = "yes" if _same(call(grad, m, nesterov), want_s) and _same(m, want_m) else "NO"
        except Exception as exc:  # not built, or a launch error: the row says which
            verdicts[name] = type(exc).__name__
        log.write(json.dumps({"check": name, "numel": numel, "nesterov": nesterov, "same_as_shipped": verdicts[name]}) + "\n")
    del grad, momentum, want_m, want_s
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
            for i in range(2):
                call(*sets[i])
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
            call(*sets[1])  # the switch from the kernel before, untimed
            first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            first.record()
            for i in range(REPS):
                call(*sets[i % 2])
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

    try:
        import tile_kernels as tk
    except Exception as exc:  # not installed, or no TileLang: the TileKernels row stays empty
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})")
        tk = None
    start = time.perf_counter()
    Path(out).mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    calls = _callers(tk)
    bytes_ok: dict[str, list[str]] = {name: [] for name in calls if name != SHIPPED}  # the cases not identical
    with open(Path(out) / "tune_engram_mom22.jsonl", "w") as log:
        cases = [(n, True) for n in CHECK_NUMELS] + [(n, nest) for n in OURS_ONLY for nest in (True, False)] + [(TIMED, True)]
        for numel, nesterov in cases:
            for name, verdict in _check(calls, numel, nesterov, gen, log).items():
                if verdict != "yes":
                    bytes_ok[name].append(f"{verdict} at {numel}{'' if nesterov else ' plain'}")
        print(f"checks done in {time.perf_counter() - start:.0f} s")
        times = _rounds(calls, gen, log, start)
    tk_us = statistics.median(times[TK]) if TK in times else float("nan")
    print(f"{torch.cuda.get_device_name()}, {time.perf_counter() - start:.0f} s, {ROUNDS} rounds of {REPS} calls, numel {TIMED}")
    print(f"{'candidate':13s} {'µs median':>10s} {'min':>8s} {'max':>8s} {'ratio TK':>8s}  bytes ok  changes")
    for name in (SHIPPED, AGAIN, *CANDIDATES, TK):
        bad = bytes_ok.get(name, ["not run"])
        ok = "control" if name in (SHIPPED, AGAIN) else "; ".join(bad[:2]) + (f" (+{len(bad) - 2})" if len(bad) > 2 else "") or "yes"
        what = CANDIDATES.get(name, "shipped" if name in (SHIPPED, AGAIN) else "its default calls (no PDL)")
        rounds = times.get(name)
        if not rounds:
            print(f"{name:13s} {'-':>10s} {'-':>8s} {'-':>8s} {'-':>8s}  {ok:8s}  {what} (not timed)")
            continue
        med = statistics.median(rounds)
        print(f"{name:13s} {med:10.1f} {min(rounds):8.1f} {max(rounds):8.1f} {med / tk_us:8.3f}  {ok:8s}  {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("run", "build"), default="run")
    parser.add_argument("--out", required=True, help="run: the log's folder; build: the artifact set's")
    args = parser.parse_args()
    build(args.out) if args.command == "build" else run(args.out)


if __name__ == "__main__":
    main()
