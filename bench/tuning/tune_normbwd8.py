"""Time candidate bodies of the specialised rmsnorm_backward for the calls WITHOUT a weight or a residual gradient
(round 8) beside the shipped kernel and TileKernels' norm_backward.

Why (H200, 8192 x 7168 bf16, bench/results/2026-12-02-H200-s15-tune_normbwd6.log): with a weight the op takes 95.67 µs
(TileKernels 96.66), pass 2 included; without one 97.87 (TileKernels 91.57), though it reads no weight and has no
weight gradient to reduce. The call is served by rmsnorm_backward's specialised variant (hidden=7168,dtype=bfloat16,
prebuilt/sm90), the same cubin as the weighted call, weight and residual gradient taken as runtime flags; no
partials buffer, no pass 2, the same grid (132 blocks of 2 rows). Its lowering (the cubin disassembled, sm_90a):
- 255 registers, one block an SM: the registers of the weight (w_held) and its gradient (dw) are held in every call
  (a candidate: 150);
- a stage of 3 tensors (x, out_grad, residual_out_grad: 172,096 bytes of shared memory) though only two are staged:
  the shared-memory carveout leaves the SM ~60 KB of L1 where two tensors (114,752 bytes) would leave ~124 KB;
- the loop holds every flag's body (3,764 SASS lines; a candidate's ~1,070): the dot-product loop unswitched on
  has_weight, the store loop branched at each of the row's 7 vectors (a weight, the residual gradient's load and add
  predicated; no weight with a residual gradient; neither), the stage reads and stores each under a token < num_tokens
  branch (BSSY/BSYNC); the x_grad store of vector 0, where the bodies meet, is split into four 32-bit STG.E (the other
  six are STG.E.128);
- the row's warp sums cross a block barrier (bar.sync 0, both row slots) where TileKernels' takes one named barrier
  each row (bar.sync 1 + row, 128), and TileKernels stages only two tensors without a residual gradient, holds
  x * rstd and the scaled gradient in fp32 registers to the store, refills each vector's stage slot just after
  reading it;
- launched with PDL (griddepcontrol.wait, then launch_dependents at entry), as TileKernels' is not: back to back
  without a weight, each call's grid queues behind the one before it on the SMs it holds (172 KB of shared memory
  leaves no room for a second block), where a weighted call has pass 2 between. "ctl.nopdl" and "nw.nopdl" time
  the control and nw launched without it (a diagnosis: the op launches with PDL).
Which of these costs the 6 µs the GPU run says. Each candidate is a body (plain_body, below) that takes the weight and
residual gradient as absent (so as a variant of its own would, served only to those calls); it writes the shipped
kernel's bytes (the same vectors a thread, the same products and sums in the same order, the same fused
multiply-adds), which the run checks:
- "static": the shipped body's own source with both flags given as 0 (the compiler drops their branches; the stage of
  3 tensors stays): against ctl, what folding the flags costs;
- "nw": the shipped body with both flags static: 2 staged tensors, no weight registers, one body;
- "nw.pad": nw with the shipped stage size (3 tensors' shared memory): nw against nw.pad is the L1 carveout. Its cubins
  are static's byte for byte at every built width (so plain_body is the shipped body's code, flags dropped): the two
  rows time one cubin twice, the run's noise;
- "named": the warp-sum barrier one of each row slot (bar.sync 1 + slot, row_threads), not the block's;
- "vec": each vector's stage slot refilled right after its read (TileKernels' order);
- "flat": the staged reads unconditional (a row past the last token was staged as zeros), only the stores predicated;
- "s3": 3 rows staged ahead (2 tensors of 3 stages: the shipped kernel's shared memory).
(Holding x * rstd and the scaled gradient in fp32 registers to the stores, as rmsnorm_backward_residual does, built
nw's cubin byte for byte, and with the named barrier named's: without a weight nvcc keeps them in registers already.
Every candidate's bf16 7168 cubin stores each vector with one STG.E.128.)

Candidates, each its own artifact set ARTIFACTS/<candidate>/ (the specialised variant at bf16 7168, 4096, 2048 and
fp32 7168), pass 2 (weight_grad_reduce, unchanged) in ARTIFACTS/common/. On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_normbwd8 build --out tune-artifacts/normbwd8

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_normbwd8 --artifacts tune-artifacts/normbwd8 --out DIR [--budget S]

(the tree on PYTHONPATH; 13 calls a row without a weight, a row about 10 s, TileKernels compiling each of its 5 rows' kernels)

"ctl" is the shipped kernel, built from the tree (`build` checks its cubins against prebuilt/sm90's manifest: the
bf16 ones identical; fp32 7168 is not in the default set, where the op serves fp32 7168 from rmsnorm_backward_generic,
so that row's control is the specialised variant the tree would build).

The run, in a child process watched by this one (bench/tuning/watch.py: a candidate silent for STALL_S seconds, a hung
kernel, is killed and the run goes on without it; the whole run stops at --budget seconds, 200 by default):
1. checks (bf16 and fp32; 1, 3, 127, 4097 and 8192 tokens; widths 7168, 4096, 2048 (fp32: 7168); with and without a
   weight, with and without a residual gradient): each candidate's bytes against the control's on the calls without a
   weight or a residual gradient (a candidate serves no other), the control against the torch reference on every call
   (tests/parity_backward_cases.py's tolerances); outputs are poisoned with NaN first, so an unwritten element shows.
2. times (8192 tokens, CUDA-graph replay over rotating inputs larger than L2, bench.timing) each row's kernels twice,
   the second pass in the reverse order, each row's bytes checked again, then TileKernels on the row (checked within
   the parity tolerance against the control): bf16 7168 without a weight, with a weight (the control alone: the
   weighted call must keep its 95.7 µs), bf16 4096 and 2048 and fp32 7168 without a weight.
Prints each row as it is timed, one table last (candidate, shape, µs (the passes' mean), both passes, ratio to the
control, TileKernels µs, verdict) and writes DIR/tune_normbwd8.log.
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

ARTIFACTS = "tune-artifacts/normbwd8"
SPEC, PASS2 = "rmsnorm_backward", "weight_grad_reduce"
MODULE = "kernels_src.norm.rmsnorm_backward"
CONTROL = "ctl"
# name -> plain_body's options
CANDIDATES = {
    "static": {"shipped": True},
    "nw": {},
    "nw.pad": {"staged": 3},
    "named": {"named": True},
    "vec": {"refill": "vec"},
    "named.vec": {"named": True, "refill": "vec"},
    "flat": {"flat": True},
    "named.flat": {"named": True, "flat": True},
    "s3": {"stages": 3},
    "named.s3": {"named": True, "stages": 3},
}
NAMES = (CONTROL, *CANDIDATES)
# Sets also timed launched without programmatic dependent launch ("<name>.nopdl"): back to back, each call's grid (one
# block an SM, 172 KB of shared memory in the control) waits for the one before it; with a weight, pass 2 sits between
NOPDL = (CONTROL, "nw")
VARIANTS = (("bfloat16", 7168), ("bfloat16", 4096), ("bfloat16", 2048), ("float32", 7168))
TOKENS = 8192
SETS = 3  # rotating input sets, each larger than L2 at the timed shapes
# (name, dtype, hidden, weight): the timed rows (none with a residual gradient)
ROWS = (
    ("bf16, no weight", "bfloat16", 7168, False),
    ("bf16, weight", "bfloat16", 7168, True),
    ("bf16, no weight", "bfloat16", 4096, False),
    ("bf16, no weight", "bfloat16", 2048, False),
    ("fp32, no weight", "float32", 7168, False),
)
CHECK_TOKENS = (1, 3, 127, 4097, TOKENS)
# (weight, residual gradient, out_scale): every flag combination; candidates serve the last
CHECK_CALLS = ((True, False, 1.0), (True, True, 0.5), (False, True, 2.5), (False, False, 1.0), (False, False, 0.75))


# ---- the candidate bodies


def plain_body(opts: dict):
    """rmsnorm_backward_kernel's static_body for the calls without a weight or a residual gradient, with `opts`
    (CANDIDATES' values): the shipped tiling_body's sums in its order, has_weight and has_residual taken as 0."""
    import tilelang.language as T

    from kernels_src.norm.rmsnorm_backward import _fma, _mul

    if opts.get("shipped"):
        return _shipped_static
    named, flat = opts.get("named", False), opts.get("flat", False)
    refill, stages, staged_tensors = opts.get("refill", "row"), opts.get("stages", 2), opts.get("staged", 2)

    def make(tiling, dtype: str, num_tokens, num_blocks):
        vec, vecs_per_thread = tiling.vec, tiling.vectors
        row_threads, slots, region = tiling.row_threads, tiling.slots, tiling.stage_elems
        hidden = tiling.hidden
        if not tiling.exact:
            raise ValueError(f"hidden {hidden}: plain_body takes widths whose every thread's vectors are in the row")

        def token_of(it, block, sub):
            return (it * num_blocks + block) * slots + sub

        def staged(stage, tensor, sub, col):
            return (stage * staged_tensors + tensor) * region + sub * hidden + col

        @T.macro
        def row_dot(acc, warp_sums, half, sub, lane):
            for i in T.unroll(tiling.lanes.bit_length() - 1):
                acc[0] += T.shfl_xor(acc[0], tiling.lanes >> (i + 1))
            if tiling.row_warps > 1:
                if lane % 32 == 0:
                    warp_sums[tiling.warp_at(half, sub, lane // 32)] = acc[0]
                if named and slots > 1:
                    T.sync_threads(sub + 1, row_threads)  # each slot's warp sums are its own
                else:
                    T.sync_threads()
                acc[0] = 0.0
                for w in T.unroll(tiling.row_warps):
                    acc[0] += warp_sums[tiling.warp_at(half, sub, w)]

        @T.macro
        def stage_vec(src, stage_buf, tensor, stage, sub, token, lane, v):
            col = (v * row_threads + lane) * vec
            T.ptx_cp_async(
                T.access_ptr(stage_buf[staged(stage, tensor, sub, col)], "w", vec),
                T.access_ptr(src[T.min(token, num_tokens - 1), col], "r", vec),
                vec,
                token < num_tokens,
            )

        @T.macro
        def stage_row(src, stage_buf, tensor, stage, sub, token, lane):
            for v in T.unroll(vecs_per_thread):
                stage_vec(src, stage_buf, tensor, stage, sub, token, lane, v)

        @T.macro
        def body(out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, has_weight, has_residual, block):
            tid = T.get_thread_binding()
            lane, sub = tiling.lane_and_slot(tid)
            x_in = T.alloc_local((vecs_per_thread, vec), dtype)
            g_in = T.alloc_local((vecs_per_thread, vec), dtype)
            res = T.alloc_local((vec,), dtype)
            acc = T.alloc_local((1,), T.float32)
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
                acc[0] = 0.0
                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if flat:  # a row past the last token was staged as zeros: the else branch's values
                        for j in T.vectorized(vec):
                            x_in[v, j] = stage_buf[staged(stage, 0, sub, col) + j]
                        for j in T.vectorized(vec):
                            g_in[v, j] = stage_buf[staged(stage, 1, sub, col) + j]
                    elif token < num_tokens:
                        for j in T.vectorized(vec):
                            x_in[v, j] = stage_buf[staged(stage, 0, sub, col) + j]
                        for j in T.vectorized(vec):
                            g_in[v, j] = stage_buf[staged(stage, 1, sub, col) + j]
                    else:
                        for j in T.unroll(vec):
                            x_in[v, j] = T.cast(0, dtype)
                            g_in[v, j] = T.cast(0, dtype)
                    if refill == "vec":
                        stage_vec(x, stage_buf, 0, stage, sub, ahead, lane, v)
                        stage_vec(out_grad, stage_buf, 1, stage, sub, ahead, lane, v)
                if refill == "row":
                    stage_row(x, stage_buf, 0, stage, sub, ahead, lane)
                    stage_row(out_grad, stage_buf, 1, stage, sub, ahead, lane)
                for v in T.unroll(vecs_per_thread):
                    for j in T.unroll(vec):
                        xh = T.cast(x_in[v, j], T.float32) * r
                        g = T.cast(g_in[v, j], T.float32) * out_scale
                        acc[0] = _fma(xh, g, acc[0])

                row_dot(acc, warp_sums, it % 2, sub, lane)
                mean = tiling.mean(acc[0])

                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if token < num_tokens:
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


def _shipped_static(tiling, dtype: str, num_tokens, num_blocks):
    """The shipped tiling_body itself with has_weight and has_residual given as 0: its source, every flag's branch
    left to the compiler to drop (3 staged tensors' shared memory still allocated)."""
    import tilelang.language as T

    from kernels_src.norm.rmsnorm_backward import tiling_body

    shipped = tiling_body(tiling, dtype, num_tokens, num_blocks)

    @T.macro
    def body(out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, has_weight, has_residual, block):
        shipped(out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, 0, 0, block)

    return body


# ---- build (CPU)


def _manifest_cubins(path: Path) -> dict:
    """{(kernel, key): cubin sha256} of a manifest."""
    return {(e["kernel"], e["key"]): e["cubin"] for e in json.loads(path.read_text())["variants"]}


def build(out: Path) -> None:
    import importlib

    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    variants = [Variant.make(SPEC, {"hidden": h, "dtype": d}) for d, h in VARIANTS]
    module = importlib.import_module(MODULE)
    shipped = module.build
    # A cache of its own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-normbwd8-cache-") as cache:
        build_variants([Variant.make(PASS2, {"dtype": d}) for d in ("bfloat16", "float32")], out / "common", "sm90", jobs=1,
                       cache=BuildCache(Path(cache) / "common"))  # fmt: skip
        for name in NAMES:
            t = time.perf_counter()
            if name != CONTROL:
                make = plain_body(CANDIDATES[name])
                module.build = lambda hidden, dtype, make=make: module.rmsnorm_backward_kernel(
                    module.StaticTiling(hidden, dtype), dtype, static_body=make
                )
            try:
                build_variants(variants, out / name, "sm90", jobs=1, cache=BuildCache(Path(cache) / name))
            finally:
                module.build = shipped
            print(f"{name:16s} built in {time.perf_counter() - t:5.1f} s", flush=True)
    # The control is the shipped kernel: its cubins are the default set's wherever that set has the key
    prebuilt = _manifest_cubins(Path("prebuilt/sm90/manifest.json"))
    for (kernel, key), sha in _manifest_cubins(out / CONTROL / "manifest.json").items():
        same = "not in" if (kernel, key) not in prebuilt else "identical to" if prebuilt[(kernel, key)] == sha else "DIFFERS from"
        print(f"{CONTROL} {kernel} {key}: {same} prebuilt/sm90")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- the calls (GPU)


class Sets:
    """The sets' launchers, each set's only if it loads and is not skipped."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.pass2 = _launchers(artifacts / "common")
        self.sets = {}
        for name in NAMES:
            if name in skip:
                continue
            try:
                self.sets[name] = _launchers(artifacts / name)
            except Exception as exc:  # a set that fails to load is reported, not fatal
                say(f"{name}: not loaded ({type(exc).__name__}: {exc})")

    def calls(self, dtype: str, hidden: int, plain: bool, device: int) -> dict:
        """{name: call}: the control, then (calls without a weight or a residual gradient only) each candidate, then
        the NOPDL sets launched without programmatic dependent launch (a diagnosis, not a candidate)."""
        calls = {
            name: _op(kernels, self.pass2, SPEC, dtype, hidden, device) for name, kernels in self.sets.items() if name == CONTROL or plain
        }
        for name in NOPDL:
            if name in calls:
                calls[f"{name}.nopdl"] = _op(self.sets[name], self.pass2, SPEC, dtype, hidden, device, pdl=False)
        return calls


def _op(kernels: dict, pass2: dict, kernel: str, dtype: str, hidden: int, device: int, pdl: bool | None = None):
    """norm_backward on the set's specialised `kernel` variant (the op's grid, tkaot/_quant/norm_backward.py) as a call on
    tune_normbwd._inputs; pdl=False launches both passes without programmatic dependent launch (None: as the op does)."""
    from tkaot._op import current_stream
    from tkaot._quant.kernels import (
        NORM_BACKWARD_MAX_BLOCKS,
        NORM_BACKWARD_THREADS,
        RMSNORM_BACKWARD,
        WEIGHT_GRAD_REDUCE,
        norm_backward_tiling,
    )

    pass1 = kernels[(kernel, f"hidden={hidden},dtype={dtype}")].bind(RMSNORM_BACKWARD.args, pdl=pdl)
    reduce = pass2[(PASS2, f"dtype={dtype}")].bind(WEIGHT_GRAD_REDUCE.args, pdl=pdl)
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


def _verdict(outs: dict, label: str) -> str:
    if label == CONTROL or CONTROL not in outs:
        return "-"
    return f"={CONTROL}" if _same(outs[label], outs[CONTROL]) else f"DIFFERS from {CONTROL}"


def check(sets: Sets, say, started) -> int:
    """Phase 1: each candidate's bytes against the control's, the control's against the reference."""
    import torch

    device, bad, done = torch.cuda.current_device(), 0, 0
    for dtype, hidden in VARIANTS:
        torch_dtype = getattr(torch, dtype)
        started("check", f"{dtype} {hidden}")
        for tokens in CHECK_TOKENS:
            for n, (weight, residual, out_scale) in enumerate(CHECK_CALLS):
                calls = sets.calls(dtype, hidden, not weight and not residual, device)
                a = _inputs(torch_dtype, hidden, tokens, weight, residual, seed=hidden * 31 + tokens * 7 + n)
                a["out_scale"] = out_scale
                outs = {label: _result(call, a) for label, call in calls.items()}
                for label in outs:
                    verdict = _verdict(outs, label)
                    if label == CONTROL:
                        verdict += f", reference {_near_reference(outs[label], a, torch_dtype)}"
                    if "DIFFERS" in verdict or "FAR" in verdict:
                        bad += 1
                        say(f"check {label} {dtype} {tokens}x{hidden} weight={weight} residual={residual}: {verdict}")
                    done += 1
                del a, outs
    say(f"checks: {done} calls, {bad} mismatches")
    return bad


def measure(sets: Sets, say, started, emit) -> None:
    """Phase 2: the timed rows, each kernel twice (the second pass reversed), then TileKernels on the row, checked
    within the parity tolerance against the control; emit(row) for each (candidate, shape, µs, passes, ratio, TK µs,
    verdict)."""
    import torch

    from bench.timing import device_us
    from bench.tuning.tune_train_perf import _close

    try:
        import tile_kernels as tk
    except ImportError as exc:
        tk = None
        say(f"TileKernels not timed: {exc}")
    device = torch.cuda.current_device()
    for r, (name, dtype, hidden, weight) in enumerate(ROWS):
        torch_dtype = getattr(torch, dtype)
        shape = f"{TOKENS}x{hidden} {name}"
        inputs = [_inputs(torch_dtype, hidden, TOKENS, weight, False, seed=1000 * r + s) for s in range(SETS)]
        calls = sets.calls(dtype, hidden, not weight, device)
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
                return tk.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"], a["dr"])

            started("TK", shape)
            want = theirs(inputs[0])
            torch.cuda.synchronize()
            verdict = f"{CONTROL} " + _close(outs[CONTROL], want, torch_dtype) if CONTROL in outs else "-"
            us, _ = device_us(theirs, inputs)
            emit(("TK", shape, us, "-", us / base, us, verdict))
        del inputs, outs


# ---- the run: the phases in a child process, watched (a candidate that hangs is killed and skipped)

TOTAL_S = 200  # the whole run's budget (--budget S)
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
    return f"{name:16s} {shape:28s} {us:8.2f} {passes:>13s} {ratio:6.3f} {tk_us:8.2f}  {verdict}"


def _run_child(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run the child until it ends, stalls or passes the deadline; the candidate (or "check") it hung in, if any."""

    def on_row(row) -> None:
        if tuple(row[:2]) not in rows:  # a rerun's repeat of a row keeps the first
            rows[tuple(row[:2])] = row
            print(_line(row), flush=True)

    stop = run_child(
        "bench.tuning.tune_normbwd8", "all", artifacts, skip, deadline, say,
        on_row=on_row,
        stall_s=lambda name: STALL_S if name not in ("load", "TK") else 2 * STALL_S,
        on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True),
    )  # fmt: skip
    if stop is None:
        return None
    name, what, stopped = stop
    say(f"{stopped} in {name} at {what or '-'}")
    name = name.removesuffix(".nopdl")  # a set hung without PDL is skipped whole
    return name if name in NAMES or name == "check" else None


def table(rows: list, say) -> None:
    """The rows (candidate, shape, µs, passes, ratio, TK µs, verdict), each shape's together, TileKernels' last."""
    order = {shape: n for n, (_, shape, *_) in reversed(list(enumerate(rows)))}
    say(f"\n{'candidate':16s} {'shape':28s} {'µs':>8s} {'passes':>13s} {'ratio':>6s} {'TK µs':>8s}  verdict (ratio: to {CONTROL})")
    for row in sorted(rows, key=lambda r: (order[r[1]], r[0] == "TK")):
        say(_line(row))
    say("(the weighted row runs the control alone: a candidate body serves only the calls without a weight or a residual gradient)")


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
    (out / "tune_normbwd8.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        _child(argv[2:])
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
