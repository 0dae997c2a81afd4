"""Round reduce24: tilings of engram_sinkhorn_step_reduce (kernels_src/engram/sinkhorn_step_reduce.py,
"t<threads>r<rows><s|d>") timed beside TileKernels at the bench case (bench/cases/engram.py: PARTIALS_PER_SM x the
SM count partials of 5120 fp32 columns, 396 on an H200).

Round 1 (every batch's copies unrolled, tune_engram_reduce24-round1 log): 10.0-12.2 µs for twelve tilings against
TileKernels' 6.58, whatever the batch and buffers; the unrolled copies ran to 130-440 KB of code. Round 2: the copies
in a loop (column_sums.stage_rows): t16r100d 6.29, t8r396s 6.52, t32r396s 6.66, t32r100d 6.74, t64r100d 6.96, batches of
50 rows 7.9-8.6, of 25 10.9-11.3, against TileKernels' 6.58 (round2 log). Round 3: batches of 66-200 rows, 8-24
threads.

Why: the twenty-fourth session's first bench run of this case (2026-12-03, H200) read 18.455 µs for the kernel
shipped then (one thread a column, four partials' loads in registers at a time) against TileKernels' 6.573: the sum
runs through 396 rows, and four loads in flight a thread leave it waiting on memory. Issue 17 wants every row no
slower than TileKernels.

On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_engram_reduce24 build --out tune-artifacts/reduce24

on the GPU (tilelang and tile_kernels importable):

    TKAOT_PATH=$PWD/tune-artifacts/reduce24 python -m bench.tuning.tune_engram_reduce24 --out DIR

The run: every tiling's output, into a NaN-poisoned buffer, against the partials added in row order one row at a time
by torch (bit for bit) at CHECK shapes, misaligned views among them, and against TileKernels' at the timed shape; then
ROUNDS rounds of bench.timing.device_us (a CUDA graph over rotating input sets, past the L2), the order rotated a
round. One table last; DIR/tune_engram_reduce24.jsonl holds every check and round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

CANDIDATES = {
    "t16r100d": "16 threads (64 columns) a CTA, two buffers of 100 rows (round 2's best)",
    "t8r100d": "8 threads, two buffers of 100 rows",
    "t24r100d": "24 threads, two buffers of 100 rows",
    "t16r66d": "16 threads, two buffers of 66 rows",
    "t16r132d": "16 threads, two buffers of 132 rows",
    "t8r132d": "8 threads, two buffers of 132 rows",
    "t16r150d": "16 threads, two buffers of 150 rows",
    "t16r200d": "16 threads, two buffers of 200 rows",
    "t8r200d": "8 threads, two buffers of 200 rows",
    "t24r200d": "24 threads, two buffers of 200 rows",
    "t16r396s": "16 threads, 396 rows in one trip",
    "t8r396s": "8 threads, 396 rows in one trip (round 2)",
}
HEAD_DIM = 5120
# (partials, head_dim, offset in elements of the views' first element: 1 misaligns them)
CHECK = ((1, 5120, 0), (3, 256, 0), (127, 5120, 0), (396, 5120, 0), (444, 5120, 0), (4097, 256, 0), (396, 5120, 1),
         (3, 5121, 0), (127, 3, 0), (396, 8192, 0), (201, 260, 1))  # fmt: skip
ROUNDS = 5
TK = "TileKernels"


def build(out: str) -> None:
    """Every candidate for sm90 into `out`."""
    import kernels_src.engram.sinkhorn_step_reduce as source
    from bench.tuning import tune_engram2 as harness
    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from tkaot._engram.kernels import SINKHORN_STEP_REDUCE

    start = time.perf_counter()
    harness.declare(source, {f"candidate{i}": t for i, t in enumerate(CANDIDATES)}, source.__name__, SINKHORN_STEP_REDUCE)
    variants = [ops.Variant(SINKHORN_STEP_REDUCE.name, (("dtype", "float32"), ("tiling", t))) for t in CANDIDATES]
    report = build_variants(variants, Path(out), "sm90", 2, BuildCache())
    print(f"built {report.built}, from cache {report.cached} -> {out} in {time.perf_counter() - start:.0f} s")


def _ours(tiling):
    import tkaot
    from tkaot._engram import kernels

    def call(a):
        kernels.SINKHORN_STEP_REDUCE_TILINGS = {"default": tiling}  # the op reads its tiling at every call
        tkaot.engram.engram_sinkhorn_step_reduce(a["p"], a["s"])
        return a["s"]

    return call


def _inputs(partials: int, head_dim: int, offset: int, gen):
    import torch

    flat = torch.rand(partials * head_dim + offset, generator=gen, device="cuda")
    out = torch.empty(head_dim + offset, device="cuda")
    return {"p": flat[offset:].view(partials, head_dim), "s": out[offset:]}


def _in_order(partial):
    import torch

    acc = torch.zeros(partial.shape[1], device=partial.device)
    for row in partial:
        acc += row
    return acc


def run(out: str) -> None:
    os.environ.setdefault("TKAOT_STRICT", "1")  # a candidate not built is an error, never a generic stand-in
    import torch

    from bench.timing import device_us
    from tkaot._engram import device as _device
    from tkaot._engram.sinkhorn import PARTIALS_PER_SM

    try:
        import tile_kernels as tk
    except Exception as exc:  # not installed, or no TileLang: the TileKernels row stays empty
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})")
        tk = None
    start = time.perf_counter()
    Path(out).mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    calls = {t: _ours(t) for t in CANDIDATES}
    if tk is not None:
        calls[TK] = lambda a: (tk.engram.engram_sinkhorn_step_reduce(a["p"], a["s"]), a["s"])[1]
    partials = PARTIALS_PER_SM * _device.sm_count(0)
    bad: dict[str, list[str]] = {name: [] for name in calls}
    with open(Path(out) / "tune_engram_reduce24.jsonl", "w") as log:
        for rows, head_dim, offset in (*CHECK, (partials, HEAD_DIM, 0)):
            a = _inputs(rows, head_dim, offset, gen)
            want = _in_order(a["p"])
            for name, call in calls.items():
                if name == TK and (offset or (rows, head_dim) != (partials, HEAD_DIM)):
                    continue  # TileKernels' kernel: its shape only
                try:
                    a["s"].fill_(float("nan"))
                    got = call(a)
                    verdict = "yes" if torch.equal(got.view(torch.int32), want.view(torch.int32)) else "NO"
                except Exception as exc:
                    verdict = type(exc).__name__
                if verdict != "yes":
                    bad[name].append(f"{verdict} at {rows}x{head_dim}+{offset}")
                log.write(json.dumps({"check": name, "shape": [rows, head_dim, offset], "in_order_bytes": verdict}) + "\n")
        print(f"checks done in {time.perf_counter() - start:.0f} s")
        sets = [_inputs(partials, HEAD_DIM, 0, gen) for _ in range(32)]  # 32 x 8.1 MB: past the L2
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
    print(f"{torch.cuda.get_device_name()}, {time.perf_counter() - start:.0f} s, {ROUNDS} rounds, {partials}x{HEAD_DIM} fp32")
    print(f"{'tiling':10s} {'µs median':>10s} {'min':>8s} {'max':>8s} {'ratio TK':>8s}  bytes ok  what")
    for name in calls:
        ok = "; ".join(bad[name][:2]) + (f" (+{len(bad[name]) - 2})" if len(bad[name]) > 2 else "") or "yes"
        what = CANDIDATES.get(name, "its default call")
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
