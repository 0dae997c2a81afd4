"""Time candidates of rmsnorm_backward_plain (norm_backward without a weight or a residual gradient) that shorten its
row loop toward TileKernels' norm_backward at bf16 hidden 4096 and 5120 (round 12), beside the shipped kernel and
TileKernels; 7168 is the control width.

Why (H200, 8192 tokens, bf16, the shipped "tk" plain body of round 11): 4096 51.76 µs against TileKernels' 49.45
(1.047), 5120 64.43 against 61.88 (1.041); 7168 and 8192 match.

What differs at these widths (TileKernels' norm_backward, no weight, no residual gradient, lowered for sm_90 with
out_scale 1 as its timed calls compile it, and compiled with the build's nvcc flags; ours: prebuilt/sm90's cubins):
- the launch shape is the same at both: 256 threads, two rows a block of 128 threads, 4 vectors a thread at 4096 and
  5 at 5120 (its vector size gcd(8, hidden / 32) = 8, 128 threads a row, two row groups of 128), a grid of 132, x and
  out_grad staged by cp.async 2 rows ahead (64 KiB and 80 KiB of shared memory, as ours);
- registers: 4096 93 (ours 96), 5120 114 (ours 118);
- the row loop (SASS instructions a row in each warp): 4096 353 (ours 414), 5120 435 (ours 511); 7168: ours 713,
  TileKernels' 647 (round 11). By opcode (TileKernels' / ours, 4096 then 5120): FMUL 65 / 97, 80 / 120 (out_grad's
  product by out_scale, one a value: a compile-time 1 there, a runtime value here); CS2R 0 / 16, 0 / 20 (the zeros
  our reads put in a row past the last: with two row slots a block the own row count of the block still leaves the
  second slot's last row past the end in some blocks, so the reads and stores keep their row checks); IMAD 20 / 38,
  33 / 47, LEA 5 / 11, 5 / 11, MOV 5 / 4, 6 / 13 (addressing: our rows of a block are adjacent, (it * blocks +
  block) * 2 + slot, the cp.async source clamped to the last row; its slot s visits block + (it * 2 + s) * 132,
  the source unclamped, the copy off past the last row); ISETP 4 / 7 both.
- its row count is each row group's own, with no row checks on the stage's reads (cp.async wrote zeros there past
  the last row), the stores checked.

The candidates keep the shipped arithmetic (the same products, fused multiply-adds and sums in the same order, each
row in the same threads): x_grad is ctl's, byte for byte (the run checks it). Each is an artifact set
ARTIFACTS/<candidate>/ of rmsnorm_backward_plain at bf16 4096, 5120 and 7168, or one whose cubins another set's are:
- "ctl": the shipped kernel, built from the tree (`build` checks its cubins against prebuilt/sm90's manifest);
- "scale1": out_scale taken as 1 (out_grad's product by it left out: the same value where the call's out_scale is 1,
  as in the timed calls; a call of another out_scale launches ctl's kernel, as an op dispatching on it would, so the
  checks at 0.75 show ctl's bytes, not this kernel's);
- "own": each row slot its own row count, so no row visited is past the last: no row checks on the reads or stores
  (the slots' warp-sum barriers are their own already, so the two slots may run different counts);
- "tkrows": own with TileKernels' rows: slot s of block b visits b + (it * slots + s) * blocks, and the cp.async
  source is not clamped (the copy is off, reading nothing, past the last row);
- "tk": tkrows with out_scale taken as 1 (TileKernels' code at these widths; its calls of another out_scale: ctl's);
- "one": own's body with one row slot a block of 128 threads, 2 blocks an SM (264; 93-150 registers x 128 threads
  and 32, 40 or 56 KiB of stage a block fit twice): the same rows in flight on each SM, no row checks;
- "stage3": ctl's body with 3 rows staged ahead of each slot (96, 120 and 168 KiB of stage a block);
- "same": the harness's body with none of the changes: ctl's cubins (checked at build), timed as the run's noise.

Built for sm_90 (registers, then the row loop's SASS instructions a row in each warp; 4096 / 5120 / 7168):
ctl 96 / 118 / 148, 414 / 511 / 713; scale1 96 / 118 / 149, 401 / 477 / 652; own 96 / 114 / 142, 393 / 488 / 676;
tkrows 102 / 116 / 141, 386 / 470 / 673; tk 104 / 115 / 142, 361 / 444 / 622; one 96 / 118 / 151, 383 / 480 / 638
(32, 40 and 56 KiB of shared memory a block); stage3 96 / 118 / 148, 413 / 513 / 723; TileKernels 93 / 114 / 143,
353 / 435 / 647. tk's loop against TileKernels' still holds more IMAD (37 / 20 at 4096, 45 / 33 at 5120) and MOV
(18 / 5, 21 / 6): x_grad's 64-bit row addresses. A slot's own count makes the shuffles' convergence unknown to the
compiler (own, tkrows, tk: a divergent fallback out of the loop, one branch in it).

On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_normbwd12 build --out tune-artifacts/normbwd12

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_normbwd12 --artifacts tune-artifacts/normbwd12 --out DIR [--budget S]

The run is round 10's (bench/tuning/tune_normbwd10.py: its check and measure phases on this round's widths, in a child
process watched by bench/tuning/watch.py; the whole run stops at --budget seconds, 170 by default): each candidate's
x_grad bytes against ctl's at 1, 3, 127, 4097 and 8192 tokens (out_scale 1 and 0.75), ctl's against the torch
reference; then each width's kernels timed twice at 8192 tokens (the second pass reversed) and TileKernels on the
width. One table last; writes DIR/tune_normbwd12.log.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from pathlib import Path

from bench.tuning import tune_normbwd10 as r10
from bench.tuning.tune_normbwd import _launchers
from bench.tuning.tune_normbwd11 import regs_of
from bench.tuning.tune_train2 import cli
from bench.tuning.watch import ROW, START, Log, budget, run_child

ARTIFACTS = "tune-artifacts/normbwd12"
KERNEL, MODULE, DTYPE = r10.KERNEL, r10.MODULE, r10.DTYPE
WIDTHS = (4096, 5120, 7168)
CONTROL = r10.CONTROL
# name -> {"body": the body's changes (a set of its own), or "set": the set whose cubins it launches; "threads": the
# block's threads (the op's: 256); "per_sm": blocks an SM of the grid (the op's: 1); "unit_scale": its cubins take
# out_scale as 1, so a call of another out_scale launches ctl's (as an op would)}
CANDIDATES = {
    "scale1": {"body": {"unit_scale": True}, "unit_scale": True},
    "own": {"body": {"own": True}},
    "tkrows": {"body": {"own": True, "tk_rows": True}},
    "tk": {"body": {"own": True, "tk_rows": True, "unit_scale": True}, "unit_scale": True},
    "one": {"body": {"own": True}, "threads": 128, "per_sm": 2},
    "stage3": {"body": {"stages": 3}},
    "same": {"body": {}},  # none of the changes: ctl's cubins (checked at build), timed as the run's noise
}
NAMES = (CONTROL, *CANDIDATES)
BUILT = tuple(name for name, c in CANDIDATES.items() if "body" in c)


def set_of(name: str) -> str:
    """The artifact set whose cubins the candidate launches."""
    return name if name == CONTROL or "body" in CANDIDATES[name] else CANDIDATES[name]["set"]


# ---- the candidate body


def candidate_body(own: bool = False, tk_rows: bool = False, unit_scale: bool = False, stages: int = 2):
    """rmsnorm_backward_kernel's static_body: the shipped plain form (tiling_body(form="plain") over a StaticTiling,
    statement for statement), with the changes asked:
    - own: each row slot's own row count, ceil((tokens - first) / (blocks * slots)) from its first row `first`, and no
      row checks on the staged reads or the stores;
    - tk_rows: slot s of block b visits row b + (it * slots + s) * blocks, the cp.async source unclamped;
    - unit_scale: out_scale taken as 1 (out_grad's product by it left out);
    - stages: rows staged ahead of each slot (the shipped 2)."""
    import tilelang.language as T

    from kernels_src.norm.rmsnorm_backward import _fma, _mul

    def make(tiling, dtype: str, num_tokens, num_blocks):
        hidden, vec, vecs_per_thread = tiling.hidden, tiling.vec, tiling.vectors
        row_threads, slots, region = tiling.row_threads, tiling.slots, tiling.stage_elems
        staged_tensors = 2
        if not tiling.exact:
            raise ValueError(f"hidden {hidden}: candidate_body takes widths whose every thread's vectors are in the row")
        row_checks = not (own or slots == 1)

        def token_of(it, block, sub):
            if tk_rows:
                return (it * slots + sub) * num_blocks + block
            return (it * num_blocks + block) * slots + sub

        def rows_of(block, sub):
            if own:
                return T.ceildiv(num_tokens - token_of(0, block, sub), num_blocks * slots)
            return T.ceildiv(num_tokens - block * slots, num_blocks * slots)

        def staged(stage, tensor, sub, col):
            return (stage * staged_tensors + tensor) * region + sub * hidden + col

        def scaled(g, out_scale):
            return g if unit_scale else g * out_scale

        def in_range(token):
            return token < num_tokens if row_checks else True

        @T.macro
        def row_dot(acc, warp_sums, half, sub, lane):
            for i in T.unroll(tiling.lanes.bit_length() - 1):
                acc[0] += T.shfl_xor(acc[0], tiling.lanes >> (i + 1))
            if tiling.row_warps > 1:
                if lane % 32 == 0:
                    warp_sums[tiling.warp_at(half, sub, lane // 32)] = acc[0]
                if slots > 1:
                    T.sync_threads(sub + 1, row_threads)  # each slot's warp sums are its own
                else:
                    T.sync_threads()
                acc[0] = 0.0
                for w in T.unroll(tiling.row_warps):
                    acc[0] += warp_sums[tiling.warp_at(half, sub, w)]

        @T.macro
        def stage_vector(src, stage_buf, tensor, stage, sub, token, lane, v):
            col = (v * row_threads + lane) * vec
            T.ptx_cp_async(
                T.access_ptr(stage_buf[staged(stage, tensor, sub, col)], "w", vec),
                T.access_ptr(src[token if tk_rows else T.min(token, num_tokens - 1), col], "r", vec),
                vec,
                token < num_tokens,
            )

        @T.macro
        def stage_row(src, stage_buf, tensor, stage, sub, token, lane):
            for v in T.unroll(vecs_per_thread):
                stage_vector(src, stage_buf, tensor, stage, sub, token, lane, v)

        @T.macro
        def body(out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, has_weight, has_residual, block):
            tid = T.get_thread_binding()
            lane, sub = tiling.lane_and_slot(tid)
            x_in = T.alloc_local((vecs_per_thread, vec), dtype)
            g_in = T.alloc_local((vecs_per_thread, vec), dtype)
            xh_held = T.alloc_local((vecs_per_thread, vec), T.float32)
            gw_held = T.alloc_local((vecs_per_thread, vec), T.float32)
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

            for it in T.serial(rows_of(block, sub)):
                token = token_of(it, block, sub)
                ahead = token_of(it + stages, block, sub)
                stage = it % stages
                if not row_checks:
                    T.assume(token < num_tokens)  # the slot's own count: its stores are seen in bounds
                r = r_next
                r_next = 0.0
                if token_of(it + 1, block, sub) < num_tokens:
                    r_next = rstd[token_of(it + 1, block, sub)]
                T.ptx_wait_group(stages - 1)
                acc[0] = 0.0
                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if in_range(token):
                        for j in T.vectorized(vec):
                            x_in[v, j] = stage_buf[staged(stage, 0, sub, col) + j]
                        for j in T.vectorized(vec):
                            g_in[v, j] = stage_buf[staged(stage, 1, sub, col) + j]
                    else:
                        for j in T.unroll(vec):
                            x_in[v, j] = T.cast(0, dtype)
                            g_in[v, j] = T.cast(0, dtype)
                    stage_vector(x, stage_buf, 0, stage, sub, ahead, lane, v)
                    stage_vector(out_grad, stage_buf, 1, stage, sub, ahead, lane, v)
                for v in T.unroll(vecs_per_thread):
                    for j in T.unroll(vec):
                        xh = T.cast(x_in[v, j], T.float32) * r
                        g = scaled(T.cast(g_in[v, j], T.float32), out_scale)
                        acc[0] = _fma(xh, g, acc[0])
                        xh_held[v, j] = xh
                        gw_held[v, j] = g

                row_dot(acc, warp_sums, it % 2, sub, lane)
                mean = tiling.mean(acc[0])

                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if in_range(token):
                        for j in T.unroll(vec):
                            t = _fma(-xh_held[v, j], mean, gw_held[v, j])
                            res[j] = T.cast(_mul(t, r), dtype)
                        for j in T.vectorized(vec):
                            x_grad[token, col + j] = res[j]
                T.ptx_commit_group()
            T.ptx_wait_group(0)

        return body

    return make


class OneSlotTiling:
    """A StaticTiling of one row slot a block (the kernel built with the row's threads alone)."""

    def __new__(cls, hidden: int, dtype: str):
        from kernels_src.norm.rmsnorm_backward import StaticTiling

        tiling = StaticTiling(hidden, dtype)
        tiling.slots, tiling.stage_elems = 1, hidden
        tiling.warps_shape, tiling.slots_shape = (2, 1, tiling.row_warps), (1, hidden)
        return tiling


# ---- build (CPU)


def build(out: Path) -> None:
    import importlib

    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant
    from kernels_src.norm import rmsnorm_backward as shared
    from kernels_src.norm.rmsnorm_backward import StaticTiling

    t0 = time.perf_counter()
    variants = [Variant.make(KERNEL, {"hidden": h, "dtype": DTYPE}) for h in WIDTHS]
    module = importlib.import_module(MODULE)
    shipped, threads = module.build, shared.NUM_THREADS
    # A cache of its own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-normbwd12-cache-") as cache:
        for name in (CONTROL, *BUILT):
            t = time.perf_counter()
            if name != CONTROL:
                spec = CANDIDATES[name]
                make = candidate_body(**spec["body"])
                tiling_of = OneSlotTiling if spec.get("threads", threads) != threads else StaticTiling

                def patched(hidden, dtype, make=make, tiling_of=tiling_of):
                    return module.rmsnorm_backward_kernel(tiling_of(hidden, dtype), dtype, static_body=make)

                module.build = patched
                shared.NUM_THREADS = spec.get("threads", threads)  # the kernel's block, read as it is traced
            try:
                build_variants(variants, out / name, "sm90", jobs=1, cache=BuildCache(Path(cache) / name))
            finally:
                module.build, shared.NUM_THREADS = shipped, threads
            print(f"{name:10s} built in {time.perf_counter() - t:5.1f} s", flush=True)
    prebuilt = r10._manifest(Path("prebuilt/sm90/manifest.json"))
    control = r10._manifest(out / CONTROL / "manifest.json")
    for (kernel, key), (sha, smem) in control.items():
        same = "not in" if (kernel, key) not in prebuilt else "identical to" if prebuilt[(kernel, key)][0] == sha else "DIFFERS from"
        print(f"{CONTROL} {key}: {smem} B shared, {regs_of(out / CONTROL, sha)} registers, {same} prebuilt/sm90")
    for name in BUILT:
        changed = bool(CANDIDATES[name]["body"])
        for (kernel, key), (sha, smem) in r10._manifest(out / name / "manifest.json").items():
            same = "= ctl" if control.get((kernel, key), ("",))[0] == sha else "differs from ctl"
            flag = "" if changed == (same != "= ctl") else "  <- UNEXPECTED (the unchanged body must be ctl's cubin)"
            print(f"{name} {key}: {smem} B shared, {regs_of(out / name, sha)} registers, cubin {same}{flag}")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- the calls (GPU)


class Sets:
    """Each candidate's call, on its set's launchers (each set loaded once) unless it fails to load or is skipped."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.names, loaded = [], {}
        for name in NAMES:
            if name in skip:
                continue
            source = set_of(name)
            if source not in loaded:
                try:
                    loaded[source] = _launchers(artifacts / source)
                except Exception as exc:  # a set that fails to load is reported, not fatal
                    loaded[source] = None
                    say(f"{source}: not loaded ({type(exc).__name__}: {exc})")
            if loaded[source] is not None:
                self.names.append(name)
        self.loaded = loaded

    def calls(self, hidden: int, device: int) -> dict:
        general = self.loaded.get(CONTROL)
        return {name: _op(self.loaded[set_of(name)], name, hidden, device, general) for name in self.names}


def _op(kernels: dict, name: str, hidden: int, device: int, general: dict | None = None):
    """norm_backward without a weight or a residual gradient on rmsnorm_backward_plain (the op's grid,
    tkaot/_quant/norm_backward.py, at the candidate's rows a block and blocks an SM) as a call on
    tune_normbwd._inputs. A unit_scale candidate's call of another out_scale launches `general`'s kernel (ctl's set)."""
    from tkaot._op import current_stream
    from tkaot._quant.kernels import NORM_BACKWARD_MAX_BLOCKS, NORM_BACKWARD_THREADS, RMSNORM_BACKWARD_PLAIN, norm_backward_tiling

    spec = CANDIDATES.get(name, {})
    key = (KERNEL, f"hidden={hidden},dtype={DTYPE}")
    pass1 = kernels[key].bind(RMSNORM_BACKWARD_PLAIN.args)
    other = general[key].bind(RMSNORM_BACKWARD_PLAIN.args) if spec.get("unit_scale") and general is not None else pass1
    rows = spec.get("threads", NORM_BACKWARD_THREADS) // norm_backward_tiling(hidden, DTYPE)[1]
    most = NORM_BACKWARD_MAX_BLOCKS * spec.get("per_sm", 1)
    ctl_rows = NORM_BACKWARD_THREADS // norm_backward_tiling(hidden, DTYPE)[1]

    def call(a: dict):
        tokens = a["x"].shape[0]
        launch = pass1 if a["out_scale"] == 1.0 else other
        # ctl's kernel (another out_scale of a unit_scale candidate): the op's grid
        blocks = min(-(-tokens // rows), most) if launch is pass1 else min(-(-tokens // ctl_rows), NORM_BACKWARD_MAX_BLOCKS)
        launch(
            device, current_stream(device), a["dy"].data_ptr(), a["x"].data_ptr(), 0, a["rstd"].data_ptr(), 0,
            a["x_grad"].data_ptr(), a["partials"].data_ptr(), a["out_scale"], 0, 0, tokens, blocks, a["dy"].stride(0),
            a["x"].stride(0), 0,
        )  # fmt: skip
        return a["x_grad"], None

    return call


# ---- the run: round 10's phases on this round's widths in a child process, watched


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

    r10.WIDTHS = WIDTHS  # round 10's phases run over its module's widths
    started("load", "")
    sets = Sets(args.artifacts, skip, say)
    if "check" not in skip:
        r10.check(sets, say, started)
    r10.measure(sets, say, started, emit)


def _run_child(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run the child until it ends, stalls or passes the deadline; the candidate (or "check") it hung in, if any."""

    def on_row(row) -> None:
        if tuple(row[:2]) not in rows:  # a rerun's repeat of a row keeps the first
            rows[tuple(row[:2])] = row
            say(r10._line(row))

    stop = run_child(
        "bench.tuning.tune_normbwd12", "all", artifacts, skip, deadline, say,
        on_row=on_row,
        stall_s=lambda name: r10.STALL_S if name not in ("load", "TK") else 2 * r10.STALL_S,
        on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True),
    )  # fmt: skip
    if stop is None:
        return None
    name, what, stopped = stop
    say(f"{stopped} in {name} at {what or '-'}")
    return name if name in NAMES or name == "check" else None


def time_candidates(artifacts: Path, out: Path, total_s: float = r10.TOTAL_S) -> None:
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
    r10.table(list(rows.values()), say)
    say(f"{time.perf_counter() - start:.1f} s")
    (out / "tune_normbwd12.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        _child(argv[2:])
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, r10.TOTAL_S)))


if __name__ == "__main__":
    main()
