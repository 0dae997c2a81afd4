"""Time folded candidates of rmsnorm_backward_plain (norm_backward without a weight or a residual gradient) at bf16
hidden 8192 and 4096 (round 10) beside the shipped kernel and TileKernels' norm_backward.

Why (H200, 8192 tokens, bf16, bench/results/2026-12-03-H200-s17-bench-backward-at-dba1764.log): the op takes 102.4 µs
at 8192 (TileKernels 95.1) and 51.4 at 4096 (49.4), where at 7168 it matches (92.2 against 91.8). The tiling
(tkaot/_quant/kernels.py: norm_backward_tiling, at most NORM_BACKWARD_MAX_VECTORS = 7 vectors a thread, for the
weighted body's registers) gives 8192 256 threads a row of 4 vectors, one row a block, and 4096 128 threads of 4
vectors, 2 rows a block; 7168 (the width that matches) takes 128 threads of 7 vectors, 2 rows a block. The plain body
holds no weight registers, so a thread could hold 8 vectors.

The candidates keep the shipped bytes ("fold"). A row of `fold` times fewer threads, each holding `fold` times the
vectors: the folded thread of lane t owns vector v * (R / fold) + t (R the shipped threads a row), which is vector
v // fold of the shipped layout's thread (v % fold) * (R / fold) + t. It keeps one dot-product accumulator for each of
those shipped threads (acc[v % fold]), adds each one's vectors in the shipped thread's order with the same fused
multiply-adds from the same 0.0, and reduces each with the shipped shuffle tree (the xor tree over the 32 lanes of a
warp: a folded warp's lanes are the shipped warp's, lane for lane, so each accumulator ends as that shipped warp's sum,
alike in every lane). Accumulator f of folded warp w is the shipped warp f * (R / fold / 32) + w: the warp sums are
written there and added from 0.0 in the shipped warps' order, divided by hidden as before; x_grad's elements are the
shipped expressions of the same row's rstd and mean. So x_grad is the shipped kernel's, byte for byte (the run checks
it). The folded row needs at least a warp (R / fold >= 32). A folded block holds `fold` times the rows, so its stage
(x and out_grad, STAGES rows ahead of each row slot) is `fold` times the shipped one's shared memory; the op's grid is
the shipped formula with the folded rows a block (min(ceil(tokens / rows), 132)).

Candidates (each an artifact set ARTIFACTS/<candidate>/ of rmsnorm_backward_plain at bf16 8192, 4096 and 7168;
7168 folds nowhere, a control: its cubin is checked at build against ctl's, as is every width a candidate leaves
unfolded, so the harness's body is shown to be the shipped code where it does not fold):
- "ctl": the shipped kernel, built from the tree (`build` checks its cubins against prebuilt/sm90's manifest);
- "fold": 8192 at 128 threads a row x 8 vectors (2 rows a block), 4096 at 64 x 8 (4 rows a block), 2 stages (8192:
  128 KiB of stage where the shipped kernel takes 64);
- "fold.s1": fold with one row staged ahead of each slot: the shipped kernel's shared memory (64 KiB at both widths);
- "fold.s3": fold with 3 rows staged ahead (192 KiB);
- "fold4.s1": 8192 at 64 threads x 16 vectors (4 rows a block, one stage: 128 KiB), 4096 as fold.s1;
- "f1": the harness's body folding nowhere: ctl's cubins at every width (checked at build), timed as the run's noise.
A candidate's stage depth is its folded widths'; a width it leaves unfolded is the shipped body (2 stages).
(Folding 8192 alone is fold's 8192 row beside ctl's 4096 row: the rows are timed apart, so it is no candidate of its
own.)

On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_normbwd10 build --out tune-artifacts/normbwd10

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_normbwd10 --artifacts tune-artifacts/normbwd10 --out DIR [--budget S]

The run, in a child process watched by this one (bench/tuning/watch.py; a candidate silent for STALL_S seconds is killed
and the run goes on without it; the whole run stops at --budget seconds, 170 by default):
1. checks (1, 3, 127, 4097 and 8192 tokens; widths 8192, 4096, 7168; out_scale 1 and 0.75): each candidate's x_grad
   bytes against ctl's, ctl's against the torch reference (tests/parity_backward_cases.py's tolerances); outputs are
   poisoned with NaN first, so an unwritten element shows;
2. times (8192 tokens, CUDA-graph replay over rotating inputs larger than L2, bench.timing.device_us) each width's
   kernels twice, the second pass in the reverse order, then TileKernels on the width (checked within the parity
   tolerance against ctl).
Prints each row as it is timed, one table last (candidate, shape, µs (the passes' mean), both passes, ratio to ctl,
TileKernels µs, verdict) and writes DIR/tune_normbwd10.log.
"""

from __future__ import annotations

import functools
import json
import math
import tempfile
import time
from pathlib import Path

from bench.tuning.tune_normbwd import _inputs, _launchers, _near_reference, _result, _same
from bench.tuning.tune_train2 import cli
from bench.tuning.watch import ROW, START, Log, budget, run_child

ARTIFACTS = "tune-artifacts/normbwd10"
KERNEL = "rmsnorm_backward_plain"
MODULE = "kernels_src.norm.rmsnorm_backward_plain"
CONTROL = "ctl"
# name -> {"fold": {hidden: fold}, "stages": rows staged ahead}; a width not named is not folded
CANDIDATES = {
    "fold": {"fold": {8192: 2, 4096: 2}, "stages": 2},
    "fold.s1": {"fold": {8192: 2, 4096: 2}, "stages": 1},
    "fold.s3": {"fold": {8192: 2, 4096: 2}, "stages": 3},
    "fold4.s1": {"fold": {8192: 4, 4096: 2}, "stages": 1},
    "f1": {"fold": {}, "stages": 2},  # folds nowhere: ctl's cubins (checked at build), timed as the run's noise
}
NAMES = (CONTROL, *CANDIDATES)
DTYPE = "bfloat16"
WIDTHS = (8192, 4096, 7168)
TOKENS = 8192
SETS = 3  # rotating input sets, each larger than L2 (8192 x 4096 bf16: 3 tensors of 64 MiB a set)
CHECK_TOKENS = (1, 3, 127, 4097, TOKENS)
CHECK_SCALES = (1.0, 0.75)


def fold_of(name: str, hidden: int) -> int:
    return 1 if name == CONTROL else CANDIDATES[name]["fold"].get(hidden, 1)


# ---- the candidate body


def fold_tiling(hidden: int, dtype: str, fold: int):
    """The shipped StaticTiling with each row in `fold` times fewer threads, each holding `fold` times the vectors;
    base_warps: the shipped row's warps (the warp sums a row)."""
    from kernels_src.norm.rmsnorm_backward import NUM_THREADS, StaticTiling

    class FoldTiling(StaticTiling):
        def __init__(self):
            super().__init__(hidden, dtype)
            self.fold, self.base_warps = fold, self.row_warps
            if fold > 1 and (self.row_threads % (32 * fold) or self.lanes != 32):
                raise ValueError(f"hidden {hidden}: {self.row_threads} threads a row do not fold {fold} times into whole warps")
            self.row_threads //= fold
            self.vectors *= fold
            self.slots = NUM_THREADS // self.row_threads
            self.stage_elems = self.slots * hidden
            self.lanes = min(self.row_threads, 32)
            self.row_warps = self.row_threads // self.lanes
            self.warps_shape, self.slots_shape = (2, self.slots, self.base_warps), (self.slots, hidden)
            self.exact = hidden % (self.vec * self.row_threads) == 0

    return FoldTiling()


def fold_body(staged_rows: int):
    """rmsnorm_backward_kernel's static_body over a fold_tiling: the shipped plain form (tiling_body(form="plain")),
    statement for statement, with an accumulator for each shipped thread a folded thread stands for."""
    import tilelang.language as T

    from kernels_src.norm.rmsnorm_backward import STAGES, _fma, _mul

    def make(tiling, dtype: str, num_tokens, num_blocks):
        stages = staged_rows if tiling.fold > 1 else STAGES  # an unfolded width: the shipped body
        hidden, vec, vecs_per_thread = tiling.hidden, tiling.vec, tiling.vectors
        row_threads, slots, region, fold = tiling.row_threads, tiling.slots, tiling.stage_elems, tiling.fold
        staged_tensors = 2
        if not tiling.exact:
            raise ValueError(f"hidden {hidden}: fold_body takes widths whose every thread's vectors are in the row")

        def token_of(it, block, sub):
            return (it * num_blocks + block) * slots + sub

        def staged(stage, tensor, sub, col):
            return (stage * staged_tensors + tensor) * region + sub * hidden + col

        @T.macro
        def row_dot(acc, warp_sums, half, sub, lane):
            """acc[f], the shares of the shipped threads the thread stands for; acc[0] becomes the row's dot product:
            each reduced over its warp's lanes, then the shipped warps' sums in their order."""
            for i in T.unroll(tiling.lanes.bit_length() - 1):
                for f in T.unroll(fold):
                    acc[f] += T.shfl_xor(acc[f], tiling.lanes >> (i + 1))
            if tiling.base_warps > 1:
                if lane % 32 == 0:
                    for f in T.unroll(fold):
                        warp_sums[tiling.warp_at(half, sub, f * tiling.row_warps + lane // 32)] = acc[f]
                if slots > 1:
                    T.sync_threads(sub + 1, row_threads)  # each slot's warp sums are its own
                else:
                    T.sync_threads()
                acc[0] = 0.0
                for w in T.unroll(tiling.base_warps):
                    acc[0] += warp_sums[tiling.warp_at(half, sub, w)]

        @T.macro
        def stage_row(src, stage_buf, tensor, stage, sub, token, lane):
            for v in T.unroll(vecs_per_thread):
                col = (v * row_threads + lane) * vec
                if tiling.in_row(v, col):
                    T.ptx_cp_async(
                        T.access_ptr(stage_buf[staged(stage, tensor, sub, col)], "w", vec),
                        T.access_ptr(src[T.min(token, num_tokens - 1), col], "r", vec),
                        vec,
                        token < num_tokens,
                    )

        @T.macro
        def body(out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, has_weight, has_residual, block):
            tid = T.get_thread_binding()
            lane, sub = tiling.lane_and_slot(tid)
            x_in = T.alloc_local((vecs_per_thread, vec), dtype)
            g_in = T.alloc_local((vecs_per_thread, vec), dtype)
            res = T.alloc_local((vec,), dtype)
            acc = T.alloc_local((fold,), T.float32)
            stage_buf = T.alloc_shared((stages * staged_tensors * region,), dtype)
            warp_sums = T.alloc_shared(tiling.warps_shape, T.float32)
            r = T.alloc_var(T.float32)
            r_next = T.alloc_var(T.float32)
            xh = T.alloc_var(T.float32)
            g = T.alloc_var(T.float32)
            t = T.alloc_var(T.float32)

            for s in T.unroll(stages):
                stage_row(x, stage_buf, 0, s, sub, token_of(s, block, sub), lane)
                stage_row(out_grad, stage_buf, 1, s, sub, token_of(s, block, sub), lane)
                T.ptx_commit_group()
            r_next = 0.0
            if token_of(0, block, sub) < num_tokens:
                r_next = rstd[token_of(0, block, sub)]

            for it in T.serial(T.ceildiv(num_tokens, num_blocks * slots)):
                token = token_of(it, block, sub)
                ahead = token_of(it + stages, block, sub)
                stage = it % stages
                r = r_next
                r_next = 0.0
                if token_of(it + 1, block, sub) < num_tokens:
                    r_next = rstd[token_of(it + 1, block, sub)]
                T.ptx_wait_group(stages - 1)
                for f in T.unroll(fold):
                    acc[f] = 0.0
                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if token < num_tokens and tiling.in_row(v, col):
                        for j in T.vectorized(vec):
                            x_in[v, j] = stage_buf[staged(stage, 0, sub, col) + j]
                        for j in T.vectorized(vec):
                            g_in[v, j] = stage_buf[staged(stage, 1, sub, col) + j]
                    else:
                        for j in T.unroll(vec):
                            x_in[v, j] = T.cast(0, dtype)
                            g_in[v, j] = T.cast(0, dtype)
                stage_row(x, stage_buf, 0, stage, sub, ahead, lane)
                stage_row(out_grad, stage_buf, 1, stage, sub, ahead, lane)
                for v in T.unroll(vecs_per_thread):
                    for j in T.unroll(vec):
                        xh = T.cast(x_in[v, j], T.float32) * r
                        g = T.cast(g_in[v, j], T.float32) * out_scale
                        acc[v % fold] = _fma(xh, g, acc[v % fold])

                row_dot(acc, warp_sums, it % 2, sub, lane)
                mean = tiling.mean(acc[0])

                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if token < num_tokens and tiling.in_row(v, col):
                        for j in T.unroll(vec):
                            xh = T.cast(x_in[v, j], T.float32) * r
                            g = T.cast(g_in[v, j], T.float32) * out_scale
                            t = _fma(-xh, mean, g)
                            res[j] = T.cast(_mul(t, r), dtype)
                        for j in T.vectorized(vec):
                            x_grad[token, col + j] = res[j]
                T.ptx_commit_group()
            T.ptx_wait_group(0)

        return body

    return make


# ---- build (CPU)


def _manifest(path: Path) -> dict:
    """{(kernel, key): (cubin sha256, shared memory bytes)} of a manifest."""
    return {(e["kernel"], e["key"]): (e["cubin"], e["launch"]["smem"]) for e in json.loads(path.read_text())["variants"]}


def build(out: Path) -> None:
    import importlib

    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    variants = [Variant.make(KERNEL, {"hidden": h, "dtype": DTYPE}) for h in WIDTHS]
    module = importlib.import_module(MODULE)
    shipped = module.build
    # A cache of its own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-normbwd10-cache-") as cache:
        for name in NAMES:
            t = time.perf_counter()
            if name != CONTROL:
                make = fold_body(CANDIDATES[name]["stages"])

                def patched(hidden, dtype, name=name, make=make):
                    tiling = fold_tiling(hidden, dtype, fold_of(name, hidden))
                    return module.rmsnorm_backward_kernel(tiling, dtype, static_body=make)

                module.build = patched
            try:
                build_variants(variants, out / name, "sm90", jobs=1, cache=BuildCache(Path(cache) / name))
            finally:
                module.build = shipped
            print(f"{name:10s} built in {time.perf_counter() - t:5.1f} s", flush=True)
    prebuilt = _manifest(Path("prebuilt/sm90/manifest.json"))
    control = _manifest(out / CONTROL / "manifest.json")
    for (kernel, key), (sha, smem) in control.items():
        same = "not in" if (kernel, key) not in prebuilt else "identical to" if prebuilt[(kernel, key)][0] == sha else "DIFFERS from"
        print(f"{CONTROL} {key}: {smem} B shared, {same} prebuilt/sm90")
    for name in CANDIDATES:
        for (kernel, key), (sha, smem) in _manifest(out / name / "manifest.json").items():
            hidden = int(key.split(",")[0].removeprefix("hidden="))
            fold = fold_of(name, hidden)
            same = "= ctl" if control.get((kernel, key), ("",))[0] == sha else "differs from ctl"
            flag = "" if (fold > 1) == (same != "= ctl") else "  <- UNEXPECTED (an unfolded width must be ctl's cubin)"
            print(f"{name} {key}: fold {fold}, {smem} B shared, cubin {same}{flag}")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- the calls (GPU)


class Sets:
    """The sets' launchers, each set's only if it loads and is not skipped."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.sets = {}
        for name in NAMES:
            if name in skip:
                continue
            try:
                self.sets[name] = _launchers(artifacts / name)
            except Exception as exc:  # a set that fails to load is reported, not fatal
                say(f"{name}: not loaded ({type(exc).__name__}: {exc})")

    def calls(self, hidden: int, device: int) -> dict:
        return {name: _op(kernels, name, hidden, device) for name, kernels in self.sets.items()}


def _op(kernels: dict, name: str, hidden: int, device: int):
    """norm_backward without a weight or a residual gradient on the set's rmsnorm_backward_plain (the op's grid,
    tkaot/_quant/norm_backward.py, with the candidate's rows a block) as a call on tune_normbwd._inputs."""
    from tkaot._op import current_stream
    from tkaot._quant.kernels import NORM_BACKWARD_MAX_BLOCKS, NORM_BACKWARD_THREADS, RMSNORM_BACKWARD_PLAIN, norm_backward_tiling

    pass1 = kernels[(KERNEL, f"hidden={hidden},dtype={DTYPE}")].bind(RMSNORM_BACKWARD_PLAIN.args)
    rows = NORM_BACKWARD_THREADS // (norm_backward_tiling(hidden, DTYPE)[1] // fold_of(name, hidden))

    def call(a: dict):
        tokens = a["x"].shape[0]
        blocks = min(-(-tokens // rows), NORM_BACKWARD_MAX_BLOCKS)
        pass1(
            device, current_stream(device), a["dy"].data_ptr(), a["x"].data_ptr(), 0, a["rstd"].data_ptr(), 0,
            a["x_grad"].data_ptr(), a["partials"].data_ptr(), a["out_scale"], 0, 0, tokens, blocks, a["dy"].stride(0),
            a["x"].stride(0), 0,
        )  # fmt: skip
        return a["x_grad"], None

    return call


def _verdict(outs: dict, label: str) -> str:
    if label == CONTROL or CONTROL not in outs:
        return "-"
    return f"={CONTROL}" if _same(outs[label], outs[CONTROL]) else f"DIFFERS from {CONTROL}"


def check(sets: Sets, say, started) -> int:
    """Phase 1: each candidate's x_grad bytes against ctl's, ctl's against the reference."""
    import torch

    device, bad, done = torch.cuda.current_device(), 0, 0
    for hidden in WIDTHS:
        started("check", f"{hidden}")
        calls = sets.calls(hidden, device)
        for tokens in CHECK_TOKENS:
            for n, out_scale in enumerate(CHECK_SCALES):
                a = _inputs(torch.bfloat16, hidden, tokens, False, False, seed=hidden * 31 + tokens * 7 + n)
                a["out_scale"] = out_scale
                outs = {label: _result(call, a) for label, call in calls.items()}
                for label in outs:
                    verdict = _verdict(outs, label)
                    if label == CONTROL:
                        verdict += f", reference {_near_reference(outs[label], a, torch.bfloat16)}"
                    if "DIFFERS" in verdict or "FAR" in verdict:
                        bad += 1
                        say(f"check {label} {tokens}x{hidden} out_scale={out_scale}: {verdict}")
                    done += 1
                del a, outs
    say(f"checks: {done} calls, {bad} mismatches")
    return bad


def measure(sets: Sets, say, started, emit) -> None:
    """Phase 2: each width's kernels twice (the second pass reversed), then TileKernels on the width, checked within the
    parity tolerance against ctl; emit(row) for each (candidate, shape, µs, passes, ratio, TK µs, verdict)."""
    import torch

    from bench.timing import device_us
    from bench.tuning.tune_train_perf import _close

    try:
        import tile_kernels as tk
    except ImportError as exc:
        tk = None
        say(f"TileKernels not timed: {exc}")
    device = torch.cuda.current_device()
    for r, hidden in enumerate(WIDTHS):
        shape = f"{TOKENS}x{hidden} bf16"
        inputs = [_inputs(torch.bfloat16, hidden, TOKENS, False, False, seed=1000 * r + s) for s in range(SETS)]
        calls = sets.calls(hidden, device)
        outs = {}
        for label, call in calls.items():
            started(label, shape)
            outs[label] = _result(call, inputs[0])
        times: dict = {label: [] for label in calls}
        for order in (list(calls), list(reversed(calls))):
            for label in order:
                started(label, shape)
                times[label].append(device_us(calls[label], inputs)[0])
        base = sum(times[CONTROL]) / 2 if CONTROL in times else math.nan
        for label, (a, b) in times.items():
            us = (a + b) / 2
            emit((label, shape, us, f"{a:.2f}/{b:.2f}", us / base, math.nan, _verdict(outs, label)))
        if tk is not None:

            def theirs(a):
                return tk.quant.norm_backward(a["dy"], a["x"], None, a["rstd"], None)

            started("TK", shape)
            want = theirs(inputs[0])
            torch.cuda.synchronize()
            verdict = f"{CONTROL} " + _close(outs[CONTROL], want, torch.bfloat16) if CONTROL in outs else "-"
            us, _ = device_us(theirs, inputs)
            emit(("TK", shape, us, "-", us / base, us, verdict))
        del inputs, outs


# ---- the run: the phases in a child process, watched (a candidate that hangs is killed and skipped)

TOTAL_S = 170  # the whole run's budget (--budget S)
STALL_S = 20  # a candidate silent this long is taken as hung (twice that while loading or in TileKernels' first calls)


def _child(argv) -> None:
    """Child: the phases, each step announced (START name|what) before it runs, each row as ROW json."""
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


def _line(row) -> str:
    name, shape, us, passes, ratio, tk_us, verdict = row
    return f"{name:10s} {shape:16s} {us:8.2f} {passes:>13s} {ratio:6.3f} {tk_us:8.2f}  {verdict}"


def _run_child(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run the child until it ends, stalls or passes the deadline; the candidate (or "check") it hung in, if any."""

    def on_row(row) -> None:
        if tuple(row[:2]) not in rows:  # a rerun's repeat of a row keeps the first
            rows[tuple(row[:2])] = row
            say(_line(row))

    stop = run_child(
        "bench.tuning.tune_normbwd10", "all", artifacts, skip, deadline, say,
        on_row=on_row,
        stall_s=lambda name: STALL_S if name not in ("load", "TK") else 2 * STALL_S,
        on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True),
    )  # fmt: skip
    if stop is None:
        return None
    name, what, stopped = stop
    say(f"{stopped} in {name} at {what or '-'}")
    return name if name in NAMES or name == "check" else None


def table(rows: list, say) -> None:
    """The rows (candidate, shape, µs, passes, ratio, TK µs, verdict), each shape's together, TileKernels' last."""
    order = {shape: n for n, (_, shape, *_) in reversed(list(enumerate(rows)))}
    say(f"\n{'candidate':10s} {'shape':16s} {'µs':>8s} {'passes':>13s} {'ratio':>6s} {'TK µs':>8s}  verdict (ratio: to {CONTROL})")
    for row in sorted(rows, key=lambda r: (order[r[1]], r[0] == "TK")):
        say(_line(row))


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
    (out / "tune_normbwd10.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        _child(argv[2:])
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
