"""Round gradw24: tilings of engram grad_w_reduce (kernels_src/engram/grad_w_reduce.py, "t<threads>r<rows><s|l|d>")
beside the shipped t56r148s (every copy of a batch unrolled) and TileKernels, at the bench case (bench/cases/engram.py:
SM-count partials of 4 x 7168 fp32, bf16 weights).

Why: engram_sinkhorn_step_reduce went from 10-12 µs to 5.5 when its cp.async copies moved from unrolled code into a
loop (round reduce24); grad_w_reduce stages its partials the same way, unrolled, and read 6.505 µs against
TileKernels' 6.391 in the twenty-fourth session's bench run at a1dab7b.

    python -m bench.tuning.tune_engram_gradw24 build --out tune-artifacts/gradw24      # CPU, TileLang + nvcc
    TKAOT_PATH=$PWD/tune-artifacts/gradw24 python -m bench.tuning.tune_engram_gradw24 --out DIR   # GPU

Every tiling's two outputs (updated in place from fresh copies) against the shipped tiling's bytes at CHECK shapes, and
TileKernels' at the timed one; then ROUNDS rounds of bench.timing.device_us over rotating input sets past the L2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

SHIPPED = "t56r148s"
CANDIDATES = {
    "t56r148l": "56 threads (224 columns) a CTA, the 148-row batch copied in a loop",
    "t56r66d": "56 threads, two buffers of 66 rows",
    "t32r148l": "32 threads, 148 rows in a loop",
    "t32r66d": "32 threads, two buffers of 66 rows",
    "t24r148l": "24 threads, 148 rows in a loop",
    "t24r66d": "24 threads, two buffers of 66 rows",
    "t16r148l": "16 threads, 148 rows in a loop",
    "t16r66d": "16 threads, two buffers of 66 rows",
    "t64r66d": "64 threads, two buffers of 66 rows",
    "t32r44d": "32 threads, two buffers of 44 rows",
}
HC, HIDDEN = 4, 7168
CHECK = ((1, 4, 7168), (3, 4, 256), (127, 4, 7168), (148, 4, 4096), (132, 2, 2048))
ROUNDS = 5
TK = "TileKernels"


def build(out: str) -> None:
    import kernels_src.engram.grad_w_reduce as source
    from bench.tuning import tune_engram2 as harness
    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from tkaot._engram.kernels import GRAD_W_REDUCE

    start = time.perf_counter()
    tilings = (SHIPPED, *CANDIDATES)
    harness.declare(source, {f"candidate{i}": t for i, t in enumerate(tilings)}, source.__name__, GRAD_W_REDUCE)
    variants = [ops.Variant(GRAD_W_REDUCE.name, (("dtype", "bfloat16"), ("tiling", t))) for t in tilings]
    report = build_variants(variants, Path(out), "sm90", 2, BuildCache())
    print(f"built {report.built}, from cache {report.cached} -> {out} in {time.perf_counter() - start:.0f} s")


def _ours(tiling):
    import tkaot
    from tkaot._engram import kernels

    def call(a):
        kernels.GRAD_W_REDUCE_TILINGS = {"default": tiling}  # the op reads its tiling at every call
        tkaot.engram.grad_w_reduce(a["p"], a["wh"], a["we"], a["gh"], a["ge"])
        return a["gh"], a["ge"]

    return call


def _inputs(partials, hc, hidden, gen):
    import torch

    def f32(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    return {"p": f32(partials, hc, hidden), "wh": f32(hc, hidden).bfloat16(), "we": f32(hc, hidden).bfloat16(),
            "gh": f32(hc, hidden), "ge": f32(hc, hidden)}  # fmt: skip


def run(out: str) -> None:
    os.environ.setdefault("TKAOT_STRICT", "1")  # a candidate not built is an error, never a generic stand-in
    import torch

    from bench.timing import device_us

    try:
        import tile_kernels as tk
    except Exception as exc:
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})")
        tk = None
    start = time.perf_counter()
    Path(out).mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    calls = {t: _ours(t) for t in (SHIPPED, *CANDIDATES)}
    if tk is not None:
        calls[TK] = lambda a: (tk.engram.grad_w_reduce(a["p"], a["wh"], a["we"], a["gh"], a["ge"]), (a["gh"], a["ge"]))[1]
    partials = torch.cuda.get_device_properties(0).multi_processor_count
    bad: dict[str, list[str]] = {name: [] for name in calls}
    bits = lambda t: t.view(torch.int32)  # noqa: E731
    with open(Path(out) / "tune_engram_gradw24.jsonl", "w") as log:
        for shape in (*CHECK, (partials, HC, HIDDEN)):
            base = _inputs(*shape, gen)
            want = calls[SHIPPED]({**base, "gh": base["gh"].clone(), "ge": base["ge"].clone()})
            for name, call in calls.items():
                if name == SHIPPED or (name == TK and shape != (partials, HC, HIDDEN)):
                    continue
                try:
                    got = call({**base, "gh": base["gh"].clone(), "ge": base["ge"].clone()})
                    same = all(torch.equal(bits(g), bits(w)) for g, w in zip(got, want))
                    verdict = "yes" if same else "NO"
                except Exception as exc:
                    verdict = type(exc).__name__
                if verdict != "yes":
                    bad[name].append(f"{verdict} at {shape}")
                log.write(json.dumps({"check": name, "shape": shape, "same_as_shipped": verdict}) + "\n")
        print(f"checks done in {time.perf_counter() - start:.0f} s")
        sets = [_inputs(partials, HC, HIDDEN, gen) for _ in range(16)]  # 16 x 15 MB: past the L2
        times: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for r in range(ROUNDS):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                try:
                    times[name].append(device_us(calls[name], sets)[0])
                except Exception as exc:
                    print(f"{name}: not timed ({type(exc).__name__}: {exc})")
            log.write(json.dumps({"round": r, "us": {n: t[-1] for n, t in times.items() if t}}) + "\n")
    tk_us = statistics.median(times[TK]) if times.get(TK) else float("nan")
    print(f"{torch.cuda.get_device_name()}, {time.perf_counter() - start:.0f} s, {ROUNDS} rounds, {partials}x{HC}x{HIDDEN} fp32")
    print(f"{'tiling':10s} {'µs median':>10s} {'min':>8s} {'max':>8s} {'ratio TK':>8s}  bytes ok  what")
    for name in calls:
        ok = "control" if name == SHIPPED else "; ".join(bad[name][:2]) or "yes"
        what = CANDIDATES.get(name, "shipped" if name == SHIPPED else "its default call")
        if not times[name]:
            print(f"{name:10s} {'-':>10s} {'-':>8s} {'-':>8s} {'-':>8s}  {ok:8s}  {what} (not timed)")
            continue
        med = statistics.median(times[name])
        print(f"{name:10s} {med:10.2f} {min(times[name]):8.2f} {max(times[name]):8.2f} {med / tk_us:8.3f}  {ok:8s}  {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("run", "build"), default="run")
    parser.add_argument("--out", required=True, help="run: the log's folder; build: the artifact set's")
    args = parser.parse_args()
    build(args.out) if args.command == "build" else run(args.out)


if __name__ == "__main__":
    main()
