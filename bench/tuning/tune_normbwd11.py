"""Time candidates of rmsnorm_backward_plain (norm_backward without a weight or a residual gradient) that move it
toward TileKernels' norm_backward at bf16 hidden 8192 and 4096 (round 11), beside the shipped kernel and TileKernels.

Why (H200, 8192 tokens, bf16, round 10's run of bench/tuning/tune_normbwd10.py): the shipped kernel takes 102.08 µs at
8192 (TileKernels 95.19) and 50.71 at 4096 (49.13); at 7168 it matches (91.42 against 92.69). Round 10's folded rows
(fewer threads a row, more vectors a thread) were slower at both widths.

What TileKernels does at these widths (its CUDA norm_backward, no weight, no residual gradient, lowered here for sm_90
and compiled with the build's nvcc flags): the same launch shape as ours. 8192: 256 threads, one row a block of 4
16-byte vectors a thread; 4096: 256 threads, two rows a block of 128 threads x 4 vectors; 7168: two rows of 128
threads x 7 vectors. Its grid is one block an SM (132), each block striding over the rows; x and out_grad are staged by
cp.async, 2 rows ahead (64 KiB of shared memory at 8192 and 4096, as ours); the row's dot product is reduced with warp
shuffles, then the warp sums through shared memory (double-buffered, one named barrier of the row's threads a row); it
stores x_grad alone. Where its code differs from ours:
- its loop runs each block's own row count, ceil((tokens - block) / step) (ours: every block the grid's most, the last
  an empty row in most blocks), so with one row a block its loads and stores need no row check (ours check each);
- it converts x and out_grad to fp32 as it reads them from the stage and holds x * rstd and out_grad * out_scale in
  fp32 registers from the dot product to the stores (ours, in its source, holds the bf16 vectors and recomputes both
  after the sum: nvcc compiles both alike, below);
- it refills each vector's stage slot right after reading it (ours reads the row's vectors, then refills them all;
  round 8 timed that alone at 7168, 4096 and 2048: no faster, so it is tried here only inside tk);
- it is launched without programmatic dependent launch (ours with it);
- out_scale is a compile-time constant there (1.0 in the timed calls: its product folds away); ours is a runtime value.
Its row loop is shorter (SASS instructions a row in each warp, ours / TileKernels': 8192 410 / 341, 4096 434 / 353,
7168 713 / 647; the rest mostly our address arithmetic: a runtime grid, rows clamped to the last), and it uses fewer
registers (8192 106 / 96, 4096 104 / 93, 7168 150 / 143). The candidates' loops: tk 397 / 414 / 713, tk1 367 / 401 /
652, exact 392 / 434 / 713, scale1 380 / 398 / 663 (8192 / 4096 / 7168).

The candidates keep the shipped arithmetic (the same products, fused multiply-adds and sums in the same order, each
row in the same threads): x_grad is ctl's, byte for byte (the run checks it). Each is an artifact set
ARTIFACTS/<candidate>/ of rmsnorm_backward_plain at bf16 8192, 4096 and 7168 (a candidate's change at every width:
7168 shows what it costs where we match), or ctl's set launched differently:
- "ctl": the shipped kernel, built from the tree (`build` checks its cubins against prebuilt/sm90's manifest);
- "tk": the shipped body with TileKernels' code differences above: the block's own row count (no row checks where
  a block holds one row), fp32 x * rstd and out_grad * out_scale held across the reduction, each vector's slot
  refilled as it is read (the fp32 registers held alone compile to ctl's cubin, byte for byte, at all three widths:
  nvcc keeps the values across the reduction either way, so they are no candidate of their own);
- "tk1": tk with out_scale taken as 1, as TileKernels' call compiles it (out_grad's product by it left out: the same
  value where the call's out_scale is 1, as in the timed calls; a call of another out_scale launches ctl's kernel, as
  an op dispatching on it would, so the checks at 0.75 show ctl's bytes, not this kernel's);
- "exact": the block's own row count alone;
- "scale1": out_scale taken as 1 alone (its calls of another out_scale: ctl's, as tk1's);
- "grid2": ctl's cubins on a grid of 2 blocks an SM at 8192 and 4096 (264; two fit: 106 and 104 registers x 256
  threads and 64 KiB of stage a block): twice the rows in flight on each SM; 7168 (150 registers, 112 KiB: one
  fits) keeps 132 blocks, ctl's launch;
- "nopdl": ctl's cubins launched without programmatic dependent launch (round 8: no faster at 7168, 4096, 2048);
- "same": the harness's body with none of the changes: ctl's cubins (checked at build), timed as the run's noise.

On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_normbwd11 build --out tune-artifacts/normbwd11

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_normbwd11 --artifacts tune-artifacts/normbwd11 --out DIR [--budget S]

The run is round 10's (bench/tuning/tune_normbwd10.py: its check and measure phases, in a child process watched by
bench/tuning/watch.py; the whole run stops at --budget seconds, 170 by default): each candidate's x_grad bytes against
ctl's at 1, 3, 127, 4097 and 8192 tokens (out_scale 1 and 0.75), ctl's against the torch reference; then each width's
kernels timed twice at 8192 tokens (the second pass reversed) and TileKernels on the width. One table last; writes
DIR/tune_normbwd11.log.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from pathlib import Path

from bench.tuning import tune_normbwd10 as r10
from bench.tuning.tune_normbwd import _launchers
from bench.tuning.tune_train2 import cli
from bench.tuning.watch import ROW, START, Log, budget, run_child

ARTIFACTS = "tune-artifacts/normbwd11"
KERNEL, MODULE, DTYPE, WIDTHS = r10.KERNEL, r10.MODULE, r10.DTYPE, r10.WIDTHS
CONTROL = r10.CONTROL
# name -> {"body": the body's changes (a set of its own), or "set": the set whose cubins it launches; "per_sm": blocks an
# SM of the grid at a width (the op's: 1); "pdl": False to launch without programmatic dependent launch;
# "unit_scale": its cubins take out_scale as 1, so a call of another out_scale launches ctl's (as an op would)}
CANDIDATES = {
    "tk": {"body": {"exact": True, "held": True, "inter": True}},
    "tk1": {"body": {"exact": True, "held": True, "inter": True, "unit_scale": True}, "unit_scale": True},
    "exact": {"body": {"exact": True}},
    "scale1": {"body": {"unit_scale": True}, "unit_scale": True},
    "grid2": {"set": CONTROL, "per_sm": {8192: 2, 4096: 2}},
    "nopdl": {"set": CONTROL, "pdl": False},
    "same": {"body": {}},  # none of the changes: ctl's cubins (checked at build), timed as the run's noise
}
NAMES = (CONTROL, *CANDIDATES)
BUILT = tuple(name for name, c in CANDIDATES.items() if "body" in c)


def set_of(name: str) -> str:
    """The artifact set whose cubins the candidate launches."""
    return name if name == CONTROL or "body" in CANDIDATES[name] else CANDIDATES[name]["set"]


# ---- the candidate body


def candidate_body(exact: bool = False, held: bool = False, inter: bool = False, unit_scale: bool = False):
    """rmsnorm_backward_kernel's static_body: the shipped plain form (tiling_body(form="plain") over a StaticTiling),
    statement for statement, with TileKernels' code differences where asked:
    - exact: the block's own row count, ceil((tokens - block * slots) / (blocks * slots)), and (one row slot a block)
      no row checks on the staged reads and the stores;
    - held: x * rstd and out_grad * out_scale held in fp32 registers from the dot product to the stores;
    - inter: each vector's stage slots (x's, out_grad's) refilled right after the thread reads them;
    - unit_scale: out_scale taken as 1 (out_grad's product by it left out: the same value where the call's is 1)."""
    import tilelang.language as T

    from kernels_src.norm.rmsnorm_backward import STAGES, _fma, _mul

    def make(tiling, dtype: str, num_tokens, num_blocks):
        hidden, vec, vecs_per_thread = tiling.hidden, tiling.vec, tiling.vectors
        row_threads, slots, region, stages = tiling.row_threads, tiling.slots, tiling.stage_elems, STAGES
        staged_tensors = 2
        if not tiling.exact:
            raise ValueError(f"hidden {hidden}: candidate_body takes widths whose every thread's vectors are in the row")
        check_rows = not (exact and slots == 1)  # each iteration's row is in range where the count is the block's own

        def token_of(it, block, sub):
            return (it * num_blocks + block) * slots + sub

        def staged(stage, tensor, sub, col):
            return (stage * staged_tensors + tensor) * region + sub * hidden + col

        def scaled(g, out_scale):
            return g if unit_scale else g * out_scale

        def iterations(block):
            if exact:
                return T.ceildiv(num_tokens - block * slots, num_blocks * slots)
            return T.ceildiv(num_tokens, num_blocks * slots)

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
        def stage_row(src, stage_buf, tensor, stage, sub, token, lane):
            for v in T.unroll(vecs_per_thread):
                col = (v * row_threads + lane) * vec
                T.ptx_cp_async(
                    T.access_ptr(stage_buf[staged(stage, tensor, sub, col)], "w", vec),
                    T.access_ptr(src[T.min(token, num_tokens - 1), col], "r", vec),
                    vec,
                    token < num_tokens,
                )

        @T.macro
        def stage_vector(src, stage_buf, tensor, stage, sub, token, lane, v):
            col = (v * row_threads + lane) * vec
            T.ptx_cp_async(
                T.access_ptr(stage_buf[staged(stage, tensor, sub, col)], "w", vec),
                T.access_ptr(src[T.min(token, num_tokens - 1), col], "r", vec),
                vec,
                token < num_tokens,
            )

        @T.macro
        def read_vector(x_in, g_in, stage_buf, stage, sub, col, v):
            for j in T.vectorized(vec):
                x_in[v, j] = stage_buf[staged(stage, 0, sub, col) + j]
            for j in T.vectorized(vec):
                g_in[v, j] = stage_buf[staged(stage, 1, sub, col) + j]

        @T.macro
        def body(out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, has_weight, has_residual, block):
            tid = T.get_thread_binding()
            lane, sub = tiling.lane_and_slot(tid)
            x_in = T.alloc_local((vecs_per_thread, vec), dtype)
            g_in = T.alloc_local((vecs_per_thread, vec), dtype)
            if held:
                xh_held = T.alloc_local((vecs_per_thread, vec), T.float32)
                g_held = T.alloc_local((vecs_per_thread, vec), T.float32)
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

            for it in T.serial(iterations(block)):
                token = token_of(it, block, sub)
                ahead = token_of(it + stages, block, sub)
                stage = it % stages
                if not check_rows:
                    T.assume(token < num_tokens)  # the block's own count: so the stores are seen in bounds
                r = r_next
                r_next = 0.0
                if token_of(it + 1, block, sub) < num_tokens:
                    r_next = rstd[token_of(it + 1, block, sub)]
                T.ptx_wait_group(stages - 1)
                acc[0] = 0.0
                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if check_rows:
                        if token < num_tokens:
                            read_vector(x_in, g_in, stage_buf, stage, sub, col, v)
                        else:
                            for j in T.unroll(vec):
                                x_in[v, j] = T.cast(0, dtype)
                                g_in[v, j] = T.cast(0, dtype)
                    else:
                        read_vector(x_in, g_in, stage_buf, stage, sub, col, v)
                    if inter:
                        stage_vector(x, stage_buf, 0, stage, sub, ahead, lane, v)
                        stage_vector(out_grad, stage_buf, 1, stage, sub, ahead, lane, v)
                if not inter:
                    stage_row(x, stage_buf, 0, stage, sub, ahead, lane)
                    stage_row(out_grad, stage_buf, 1, stage, sub, ahead, lane)
                for v in T.unroll(vecs_per_thread):
                    for j in T.unroll(vec):
                        xh = T.cast(x_in[v, j], T.float32) * r
                        g = scaled(T.cast(g_in[v, j], T.float32), out_scale)
                        acc[0] = _fma(xh, g, acc[0])
                        if held:
                            xh_held[v, j] = xh
                            g_held[v, j] = g

                row_dot(acc, warp_sums, it % 2, sub, lane)
                mean = tiling.mean(acc[0])

                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if check_rows:
                        if token < num_tokens:
                            for j in T.unroll(vec):
                                if held:
                                    t = _fma(-xh_held[v, j], mean, g_held[v, j])
                                else:
                                    xh = T.cast(x_in[v, j], T.float32) * r
                                    g = scaled(T.cast(g_in[v, j], T.float32), out_scale)
                                    t = _fma(-xh, mean, g)
                                res[j] = T.cast(_mul(t, r), dtype)
                            for j in T.vectorized(vec):
                                x_grad[token, col + j] = res[j]
                    else:
                        for j in T.unroll(vec):
                            if held:
                                t = _fma(-xh_held[v, j], mean, g_held[v, j])
                            else:
                                xh = T.cast(x_in[v, j], T.float32) * r
                                g = scaled(T.cast(g_in[v, j], T.float32), out_scale)
                                t = _fma(-xh, mean, g)
                            res[j] = T.cast(_mul(t, r), dtype)
                        for j in T.vectorized(vec):
                            x_grad[token, col + j] = res[j]
                T.ptx_commit_group()
            T.ptx_wait_group(0)

        return body

    return make


# ---- build (CPU)


def build(out: Path) -> None:
    import importlib

    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant
    from kernels_src.norm.rmsnorm_backward import StaticTiling

    t0 = time.perf_counter()
    variants = [Variant.make(KERNEL, {"hidden": h, "dtype": DTYPE}) for h in WIDTHS]
    module = importlib.import_module(MODULE)
    shipped = module.build
    # A cache of its own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-normbwd11-cache-") as cache:
        for name in (CONTROL, *BUILT):
            t = time.perf_counter()
            if name != CONTROL:
                make = candidate_body(**CANDIDATES[name]["body"])

                def patched(hidden, dtype, make=make):
                    return module.rmsnorm_backward_kernel(StaticTiling(hidden, dtype), dtype, static_body=make)

                module.build = patched
            try:
                build_variants(variants, out / name, "sm90", jobs=1, cache=BuildCache(Path(cache) / name))
            finally:
                module.build = shipped
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


def regs_of(set_dir: Path, sha: str) -> int | str:
    """The registers a thread of the set's cubin `sha` (its EIATTR_REGCOUNT), or "?" where the cubin is not found."""
    paths = [p for p in set_dir.rglob("*") if p.is_file() and sha in p.name]
    return cubin_registers(paths[0].read_bytes()) if paths else "?"


def cubin_registers(data: bytes) -> int | str:
    """EIATTR_REGCOUNT (0x2f) of the first kernel in an ELF cubin's .nv.info sections."""
    import struct

    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    for s in sections:
        name = data[names + s[0] : data.index(b"\0", names + s[0])]
        if not name.startswith(b".nv.info"):  # the count is in the common .nv.info
            continue
        at, end = s[4], s[4] + s[5]
        while at < end:
            fmt, attr = data[at], data[at + 1]
            if fmt == 4:  # EIFMT_SVAL: a 2-byte size, then the value
                size = struct.unpack_from("<H", data, at + 2)[0]
                if attr == 0x2F:
                    return struct.unpack_from("<II", data, at + 4)[1]
                at += 4 + size
            else:
                at += {3: 4, 2: 3}.get(fmt, 2)
    return "?"


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
    tkaot/_quant/norm_backward.py, times the candidate's blocks an SM; launched with PDL unless the candidate says not)
    as a call on tune_normbwd._inputs. A unit_scale candidate's call of another out_scale launches `general`'s kernel
    (ctl's set), as an op dispatching on out_scale would."""
    from tkaot._op import current_stream
    from tkaot._quant.kernels import NORM_BACKWARD_MAX_BLOCKS, NORM_BACKWARD_THREADS, RMSNORM_BACKWARD_PLAIN, norm_backward_tiling

    spec = CANDIDATES.get(name, {})
    key = (KERNEL, f"hidden={hidden},dtype={DTYPE}")
    pass1 = kernels[key].bind(RMSNORM_BACKWARD_PLAIN.args, pdl=spec.get("pdl"))
    other = general[key].bind(RMSNORM_BACKWARD_PLAIN.args) if spec.get("unit_scale") and general is not None else pass1
    rows = NORM_BACKWARD_THREADS // norm_backward_tiling(hidden, DTYPE)[1]
    most = NORM_BACKWARD_MAX_BLOCKS * spec.get("per_sm", {}).get(hidden, 1)

    def call(a: dict):
        tokens = a["x"].shape[0]
        blocks = min(-(-tokens // rows), most)
        (pass1 if a["out_scale"] == 1.0 else other)(
            device, current_stream(device), a["dy"].data_ptr(), a["x"].data_ptr(), 0, a["rstd"].data_ptr(), 0,
            a["x_grad"].data_ptr(), a["partials"].data_ptr(), a["out_scale"], 0, 0, tokens, blocks, a["dy"].stride(0),
            a["x"].stride(0), 0,
        )  # fmt: skip
        return a["x_grad"], None

    return call


# ---- the run: round 10's phases in a child process, watched (a candidate that hangs is killed and skipped)


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
        r10.check(sets, say, started)
    r10.measure(sets, say, started, emit)


def _run_child(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run the child until it ends, stalls or passes the deadline; the candidate (or "check") it hung in, if any."""

    def on_row(row) -> None:
        if tuple(row[:2]) not in rows:  # a rerun's repeat of a row keeps the first
            rows[tuple(row[:2])] = row
            say(r10._line(row))

    stop = run_child(
        "bench.tuning.tune_normbwd11", "all", artifacts, skip, deadline, say,
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
    (out / "tune_normbwd11.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        _child(argv[2:])
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, r10.TOTAL_S)))


if __name__ == "__main__":
    main()
