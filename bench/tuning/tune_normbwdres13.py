"""Time candidates of rmsnorm_backward_residual (norm_backward with a weight and a residual gradient) that shorten its
row loop toward TileKernels' norm_backward at bf16 8192 x 7168 (round 13), beside the shipped kernel and TileKernels.

Why (H200, 8192 x 7168 bf16, weight and residual gradient given, out_scale 1): the shipped kernel 120.35 µs against
TileKernels' 118.49 (1.016; bench/results/2026-12-03-H200-s19-bench-norm_backward-at-c9036bd.log).

What differs (TileKernels' norm_backward at this call: weight given, residual gradient given, out_scale 1, lowered for
sm_90 as its timed calls compile it, with the build's nvcc flags: get_norm_backward_kernel_cuda's TIR at hidden 7168,
bf16, 132 SMs, lowered with its pass config; ours: prebuilt/sm90's rmsnorm_backward_residual hidden=7168,dtype=bfloat16.
The row loop: the largest backward-branch loop of the SASS holding the shuffles, the cp.async copies and the stores):
- the launch shape is the same for pass 1: 256 threads, two rows a block of 128 threads, 7 vectors of 8 a thread, a
  grid of 132, x, out_grad and the residual gradient staged by cp.async 2 rows ahead (168 KiB of stage, as ours; ours
  172096 B of dynamic shared memory). TileKernels adds the 132 partial rows in the same kernel after a grid sync (a
  cooperative launch); ours launches weight_grad_reduce after it (pass 2);
- registers: TileKernels' 255, ours 254, no spills in either;
- the row loop (its SASS instructions, each once: one row of each warp; ours 1357, TileKernels' 880). By opcode
  (TileKernels' / ours): FFMA 229 / 285 and FMUL 112 / 278: has_weight is a runtime flag in ours, a compile-time one
  in TileKernels', and with the flag's branch inside the unrolled products the compiler keeps both forms of the
  gradient ("weighted" below: 56 FFMA and 110 FMUL fewer); out_scale's product, in both forms, is a compile-time 1
  there ("scale1": 111 FMUL fewer; both changes, "wscale1": TileKernels' 229 and 112); PRMT 84 / 140, SHF 131 / 188
  (bf16 unpacking: TileKernels holds the weight in fp32); MOV 7 / 61, IMAD 83 / 139; CS2R 0 / 28, BSSY/BSYNC 2 / 8,
  BRA 3 / 17 (our row checks: zeros put in a row past the last; its row count is each block's own, ceil((tokens -
  block) / 264), the staged reads unchecked, the stores checked); LDS 64 / 28; STG 10 / 7; LEA 39 / 31. Both: 21
  LDGSTS, 28 F2FP, 5 SHFL, 9-10 FADD.

The candidates keep the shipped arithmetic (the same products, fused multiply-adds and sums in the same order, each row
in the same threads of the same block and slot, the block's slots added in slot order, pass 2 unchanged): x_grad and
the weight gradient are ctl's, byte for byte (the run checks both). Each is an artifact set ARTIFACTS/<candidate>/ of
rmsnorm_backward_residual at bf16 7168 (ctl's set also holds weight_grad_reduce, pass 2, which every call launches):
- "ctl": the shipped kernel, built from the tree (`build` checks its cubin against prebuilt/sm90's manifest);
- "scale1": out_scale taken as 1 (out_grad's product by it left out: the same value where the call's out_scale is 1,
  as in the timed calls; a call of another out_scale launches ctl's kernel, as an op dispatching on it would, so the
  checks at 0.75 show ctl's bytes, not this kernel's);
- "weighted": has_weight taken as 1 (the products' branch on the flag gone; every timed and checked call has a
  weight: an op would launch ctl's kernel, or another variant, for calls without one);
- "wscale1": weighted and scale1;
- "wown": weighted with each row slot its own row count, ceil((tokens - first) / (blocks * slots)) from its first
  row, so no row visited is past the last: no row checks on the staged reads or the stores (the slots' warp-sum
  barriers are their own already; the block's weight-gradient sums meet after the loop, as before);
- "wsown": wown and scale1;
- "direct": wscale1 with the residual gradient not staged (fewer staged tensors: x and out_grad alone, 112 KiB of
  stage rather than 168): each thread reads its residual-gradient vectors from global memory at the row's stores;
- "same": the harness's body with none of the changes: ctl's cubin (checked at build), timed as the run's noise.
Not built: TileKernels' row order (slot s of block b visits b + (it * slots + s) * blocks) gives a block other rows,
so its weight-gradient partials, and the weight gradient's bytes, would differ; one row slot a block at 2 blocks an
SM gives 264 partial rows that pass 2 adds in another order (the same bytes would need a pass 2 adding them in pairs).

Built for sm_90 (registers / stack bytes, the row loop's SASS instructions; by opcode FFMA, FMUL, IMAD, MOV, PRMT):
ctl 254 / 0, 1357 (285, 278, 139, 61, 140); scale1 252 / 0, 1238 (285, 167, 174, 32, 140); weighted 255 / 0, 1047
(229, 168, 121, 27, 112); wscale1 255 / 0, 989 (229, 112, 146, 22, 112); wown 236 / 0, 1014 (229, 168, 127, 56, 112;
no CS2R, 3 BRA); wsown 255 / 16, 987 (229, 112, 162, 62, 112; 5 LDL in the loop, 11 LDL/STL in the kernel); direct
255 / 0, 957 (229, 112, 132, 20, 112; 8 LDG in the loop, 7 of them the residual gradient's, 14 LDGSTS; 114752 B of
shared memory, the others 172096); TileKernels 255 / 0, 880 (229, 112, 83, 7, 84). With their own row counts (wown,
wsown) the compiler also leaves a divergent copy of the loop's tail outside it (492 and 542 instructions), as round
12 saw. Also built, not kept: out_scale 1 and own without the weight constant (255 / 0, 1134); the weight in fp32
alone (255 / 0, 1394; with wscale1: wscale1's counts); the per-vector order (TileKernels') alone (255 / 0, 1347),
with wscale1 (255 / 0, 999), with wsown and the fp32 weight (255 / 40 bytes of stack, 1083, 19 LDL/STL in the loop);
wsown with the residual gradient not staged (255 / 8, 977).

On a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_normbwdres13 build --out tune-artifacts/normbwdres13

(about 40 s; the sets are not tracked by git: copy them beside the tree on the GPU machine, or build them there), then
on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_normbwdres13 --artifacts tune-artifacts/normbwdres13 --out DIR [--budget S]

The run (in a child process watched by bench/tuning/watch.py; the whole run stops at --budget seconds, 150 by
default): each candidate's x_grad and weight-gradient bytes against ctl's at 1, 3, 127, 4097 and 8192 tokens
(out_scale 1 and 0.75), ctl's against the torch reference; then the kernels timed twice at 8192 x 7168 (the second
pass reversed, each call pass 1 and pass 2) and TileKernels' norm_backward on the same inputs. One table last; writes
DIR/tune_normbwdres13.log.
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

ARTIFACTS = "tune-artifacts/normbwdres13"
KERNEL, MODULE, PASS2 = "rmsnorm_backward_residual", "kernels_src.norm.rmsnorm_backward_residual", "weight_grad_reduce"
DTYPE, HIDDEN, TOKENS = "bfloat16", 7168, 8192
SETS = 3  # rotating input sets, each larger than L2 (8192 x 7168 bf16: 4 tensors of 112 MiB a set)
CHECK_TOKENS = (1, 3, 127, 4097, TOKENS)
CHECK_SCALES = (1.0, 0.75)
CONTROL = "ctl"
# name -> {"body": the body's changes (candidate_body's arguments); "unit_scale": its cubin takes out_scale as 1, so a
# call of another out_scale launches ctl's (as an op would)}
CANDIDATES = {
    "scale1": {"body": {"unit_scale": True}, "unit_scale": True},
    "weighted": {"body": {"weighted": True}},
    "wscale1": {"body": {"weighted": True, "unit_scale": True}, "unit_scale": True},
    "wown": {"body": {"weighted": True, "own": True}},
    "wsown": {"body": {"weighted": True, "own": True, "unit_scale": True}, "unit_scale": True},
    "direct": {"body": {"weighted": True, "unit_scale": True, "direct_residual": True}, "unit_scale": True},
    "same": {"body": {}},  # none of the changes: ctl's cubin (checked at build), timed as the run's noise
}
NAMES = (CONTROL, *CANDIDATES)
TOTAL_S = 150  # the whole run's budget (--budget S)
STALL_S = 20  # a candidate silent this long is taken as hung (twice that while loading or in TileKernels' first calls)


# ---- the candidate body


def candidate_body(
    own: bool = False,
    unit_scale: bool = False,
    direct_residual: bool = False,
    w32: bool = False,
    per_vector: bool = False,
    weighted: bool = False,
):
    """rmsnorm_backward_kernel's static_body: the shipped residual form (tiling_body(form="residual") over a
    StaticTiling, statement for statement), with the changes asked:
    - own: each row slot's own row count from its first row, and no row checks on the staged reads or the stores;
    - unit_scale: out_scale taken as 1 (out_grad's product by it left out);
    - direct_residual: the residual gradient read from global memory at the stores, not staged;
    - w32: the weight held in fp32 registers (converted once, before the rows), not in bf16 converted every row;
    - per_vector: each vector of x and out_grad read from the stage, its stage slots refilled, then its products and
      sums, before the next vector is read (TileKernels' order; the same sums in the same order), rather than every
      vector read, the row's refill, then the products;
    - weighted: has_weight taken as 1 (a weight given: no branch on the flag; calls without one are another kernel's)."""
    import tilelang.language as T

    from kernels_src.norm.rmsnorm_backward import STAGES, _fma, _mul

    def make(tiling, dtype: str, num_tokens, num_blocks):
        hidden, vec, vecs_per_thread = tiling.hidden, tiling.vec, tiling.vectors
        row_threads, slots = tiling.row_threads, tiling.slots
        stages, region = STAGES, tiling.stage_elems
        staged_tensors = 2 if direct_residual else 3
        if not tiling.exact:
            raise ValueError(f"hidden {hidden}: candidate_body takes widths whose every thread's vectors are in the row")
        row_checks = not own

        def token_of(it, block, sub):
            return (it * num_blocks + block) * slots + sub

        def rows_of(block, sub):
            if own:
                return T.ceildiv(num_tokens - token_of(0, block, sub), num_blocks * slots)
            return T.ceildiv(num_tokens, num_blocks * slots)

        def staged(stage, tensor, sub, col):
            return (stage * staged_tensors + tensor) * region + sub * hidden + col

        def scaled(g, out_scale):
            return g if unit_scale else g * out_scale

        def in_range(token):
            return token < num_tokens if row_checks else True

        def with_weight(has_weight):
            return True if weighted else has_weight != 0

        @T.macro
        def row_dot(acc, warp_sums, half, sub, lane):
            for i in T.unroll(tiling.lanes.bit_length() - 1):
                acc[0] += T.shfl_xor(acc[0], tiling.lanes >> (i + 1))
            if tiling.row_warps > 1:
                if lane % 32 == 0:
                    warp_sums[tiling.warp_at(half, sub, lane // 32)] = acc[0]
                if slots > 1:
                    T.sync_threads(sub + 1, row_threads)
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
                T.access_ptr(src[T.min(token, num_tokens - 1), col], "r", vec),
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
            w_in = T.alloc_local((vec,), dtype)
            w_held = T.alloc_local((vecs_per_thread, vec), T.float32 if w32 else dtype)
            dw = T.alloc_local((vecs_per_thread, vec), T.float32)
            r_in = T.alloc_local((vec,), dtype)
            res = T.alloc_local((vec,), dtype)
            acc = T.alloc_local((1,), T.float32)
            stage_buf = T.alloc_shared((stages * staged_tensors * region,), dtype)
            warp_sums = T.alloc_shared(tiling.warps_shape, T.float32)
            slot_sums = T.alloc_shared(tiling.slots_shape, T.float32)
            r = T.alloc_var(T.float32)
            r_next = T.alloc_var(T.float32)
            xh = T.alloc_var(T.float32)
            g = T.alloc_var(T.float32)
            t = T.alloc_var(T.float32)

            for v in T.unroll(vecs_per_thread):
                for j in T.unroll(vec):
                    dw[v, j] = 0.0
            if with_weight(has_weight):
                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    for j in T.vectorized(vec):
                        w_in[j] = weight[col + j]
                    for j in T.unroll(vec):
                        w_held[v, j] = T.cast(w_in[j], T.float32) if w32 else w_in[j]

            for s in T.unroll(stages):
                stage_row(x, stage_buf, 0, s, sub, token_of(s, block, sub), lane)
                stage_row(out_grad, stage_buf, 1, s, sub, token_of(s, block, sub), lane)
                if not direct_residual:
                    stage_row(residual_out_grad, stage_buf, 2, s, sub, token_of(s, block, sub), lane)
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
                    if per_vector:
                        stage_vector(x, stage_buf, 0, stage, sub, ahead, lane, v)
                        stage_vector(out_grad, stage_buf, 1, stage, sub, ahead, lane, v)
                        for j in T.unroll(vec):
                            xh = T.cast(x_in[v, j], T.float32) * r
                            g = scaled(T.cast(g_in[v, j], T.float32), out_scale)
                            if with_weight(has_weight):
                                dw[v, j] = _fma(xh, g, dw[v, j])
                                g = _mul(g, T.cast(w_held[v, j], T.float32))
                            acc[0] = _fma(xh, g, acc[0])
                            xh_held[v, j] = xh
                            gw_held[v, j] = g
                if not per_vector:
                    stage_row(x, stage_buf, 0, stage, sub, ahead, lane)
                    stage_row(out_grad, stage_buf, 1, stage, sub, ahead, lane)
                    for v in T.unroll(vecs_per_thread):
                        for j in T.unroll(vec):
                            xh = T.cast(x_in[v, j], T.float32) * r
                            g = scaled(T.cast(g_in[v, j], T.float32), out_scale)
                            if with_weight(has_weight):
                                dw[v, j] = _fma(xh, g, dw[v, j])
                                g = _mul(g, T.cast(w_held[v, j], T.float32))
                            acc[0] = _fma(xh, g, acc[0])
                            xh_held[v, j] = xh
                            gw_held[v, j] = g

                row_dot(acc, warp_sums, it % 2, sub, lane)
                mean = tiling.mean(acc[0])

                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if in_range(token):
                        if direct_residual:
                            for j in T.vectorized(vec):
                                r_in[j] = residual_out_grad[token, col + j]
                        else:
                            for j in T.vectorized(vec):
                                r_in[j] = stage_buf[staged(stage, 2, sub, col) + j]
                        for j in T.unroll(vec):
                            t = _fma(-xh_held[v, j], mean, gw_held[v, j])
                            res[j] = T.cast(_fma(t, r, T.cast(r_in[j], T.float32)), dtype)
                        for j in T.vectorized(vec):
                            x_grad[token, col + j] = res[j]
                if not direct_residual:
                    stage_row(residual_out_grad, stage_buf, 2, stage, sub, ahead, lane)
                T.ptx_commit_group()
            T.ptx_wait_group(0)

            if with_weight(has_weight):
                if slots == 1:
                    for v in T.unroll(vecs_per_thread):
                        col = (v * row_threads + lane) * vec
                        for j in T.vectorized(vec):
                            partials[block, col + j] = dw[v, j]
                else:
                    T.sync_threads()
                    for v in T.unroll(vecs_per_thread):
                        col = (v * row_threads + lane) * vec
                        for j in T.vectorized(vec):
                            slot_sums[sub, col + j] = dw[v, j]
                    T.sync_threads()
                    for c in T.serial(T.ceildiv(hidden, tiling.threads)):
                        col = c * tiling.threads + tid
                        if col < hidden:
                            r = slot_sums[0, col]
                            for s in T.unroll(1, slots):
                                r += slot_sums[s, col]
                            partials[block, col] = r

        return body

    return make


# ---- build (CPU)


def _manifest(path: Path) -> dict:
    """{(kernel, key): (cubin sha256, shared memory bytes)} of a manifest."""
    return {(e["kernel"], e["key"]): (e["cubin"], e["launch"]["smem"]) for e in json.loads(path.read_text())["variants"]}


def cubin_registers(data: bytes) -> int | str:
    """EIATTR_REGCOUNT (0x2f) of the first kernel in an ELF cubin's .nv.info sections."""
    import struct

    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    for s in sections:
        name = data[names + s[0] : data.index(b"\0", names + s[0])]
        if not name.startswith(b".nv.info"):
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


def regs_of(set_dir: Path, sha: str) -> int | str:
    paths = [p for p in set_dir.rglob("*") if p.is_file() and sha in p.name]
    return cubin_registers(paths[0].read_bytes()) if paths else "?"


def build(out: Path) -> None:
    import importlib

    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    variant = Variant.make(KERNEL, {"hidden": HIDDEN, "dtype": DTYPE})
    module = importlib.import_module(MODULE)
    shipped = module.build
    # A cache of its own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-normbwdres13-cache-") as cache:
        for name in NAMES:
            t = time.perf_counter()
            variants = [variant, Variant.make(PASS2, {"dtype": DTYPE})] if name == CONTROL else [variant]
            if name != CONTROL:
                make = candidate_body(**CANDIDATES[name]["body"])

                def patched(hidden, dtype, make=make):
                    return module.rmsnorm_backward_kernel(module.StaticTiling(hidden, dtype), dtype, static_body=make)

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
        print(f"{CONTROL} {kernel} {key}: {smem} B shared, {regs_of(out / CONTROL, sha)} registers, {same} prebuilt/sm90")
    for name, spec in CANDIDATES.items():
        changed = bool(spec["body"])
        for (kernel, key), (sha, smem) in _manifest(out / name / "manifest.json").items():
            same = "= ctl" if control.get((kernel, key), ("",))[0] == sha else "differs from ctl"
            flag = "" if changed == (same != "= ctl") else "  <- UNEXPECTED (the unchanged body must be ctl's cubin)"
            print(f"{name} {key}: {smem} B shared, {regs_of(out / name, sha)} registers, cubin {same}{flag}")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- the calls (GPU)


class Sets:
    """Each candidate's launchers unless its set fails to load or it is skipped; pass 2 from ctl's set."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.sets = {}
        for name in NAMES:
            if name in skip and name != CONTROL:
                continue
            try:
                self.sets[name] = _launchers(artifacts / name)
            except Exception as exc:  # a set that fails to load is reported, not fatal
                say(f"{name}: not loaded ({type(exc).__name__}: {exc})")
        self.skip = skip

    def calls(self, device: int) -> dict:
        general = self.sets.get(CONTROL)
        if general is None:
            return {}
        return {name: _op(kernels, general, name, device) for name, kernels in self.sets.items() if name not in self.skip}


def _op(kernels: dict, general: dict, name: str, device: int):
    """norm_backward with a weight and a residual gradient (the op's grid and calls, tkaot/_quant/norm_backward.py) on
    the set's rmsnorm_backward_residual and ctl's weight_grad_reduce, as a call on tune_normbwd._inputs. A unit_scale
    candidate's call of another out_scale launches ctl's pass 1."""
    from tkaot._op import current_stream
    from tkaot._quant.kernels import (
        NORM_BACKWARD_MAX_BLOCKS,
        NORM_BACKWARD_THREADS,
        RMSNORM_BACKWARD_RESIDUAL,
        WEIGHT_GRAD_REDUCE,
        norm_backward_tiling,
    )

    key = (KERNEL, f"hidden={HIDDEN},dtype={DTYPE}")
    pass1 = kernels[key].bind(RMSNORM_BACKWARD_RESIDUAL.args)
    other = general[key].bind(RMSNORM_BACKWARD_RESIDUAL.args) if CANDIDATES.get(name, {}).get("unit_scale") else pass1
    reduce = general[(PASS2, f"dtype={DTYPE}")].bind(WEIGHT_GRAD_REDUCE.args)
    rows = NORM_BACKWARD_THREADS // norm_backward_tiling(HIDDEN, DTYPE)[1]

    def call(a: dict):
        tokens = a["x"].shape[0]
        blocks = min(-(-tokens // rows), NORM_BACKWARD_MAX_BLOCKS)
        stream = current_stream(device)
        launch = pass1 if a["out_scale"] == 1.0 else other
        launch(
            device, stream, a["dy"].data_ptr(), a["x"].data_ptr(), a["w"].data_ptr(), a["rstd"].data_ptr(),
            a["dr"].data_ptr(), a["x_grad"].data_ptr(), a["partials"].data_ptr(), a["out_scale"], 1, 1, tokens, blocks,
            a["dy"].stride(0), a["x"].stride(0), a["dr"].stride(0),
        )  # fmt: skip
        reduce(device, stream, a["partials"].data_ptr(), a["weight_grad"].data_ptr(), 0, blocks, HIDDEN)
        return a["x_grad"], a["weight_grad"]

    return call


def _verdict(outs: dict, label: str) -> str:
    if label == CONTROL or CONTROL not in outs:
        return "-"
    (xg, wg), (cx, cw) = outs[label], outs[CONTROL]
    if _same(xg, cx) and _same(wg, cw):
        return f"={CONTROL}"
    return f"DIFFERS from {CONTROL} (x_grad {'same' if _same(xg, cx) else 'differs'}, weight_grad {'same' if _same(wg, cw) else 'differs'})"


def check(sets: Sets, say, started) -> int:
    """Phase 1: each candidate's x_grad and weight-gradient bytes against ctl's, ctl's against the reference."""
    import torch

    device, bad, done = torch.cuda.current_device(), 0, 0
    started("check", f"{HIDDEN}")
    calls = sets.calls(device)
    for tokens in CHECK_TOKENS:
        for n, out_scale in enumerate(CHECK_SCALES):
            a = _inputs(torch.bfloat16, HIDDEN, tokens, True, True, seed=HIDDEN * 31 + tokens * 7 + n)
            a["out_scale"] = out_scale
            outs = {label: _result(call, a) for label, call in calls.items()}
            for label in outs:
                verdict = _verdict(outs, label)
                if label == CONTROL:
                    verdict += f", reference {_near_reference(outs[label], a, torch.bfloat16)}"
                if "DIFFERS" in verdict or "FAR" in verdict:
                    bad += 1
                    say(f"check {label} {tokens}x{HIDDEN} out_scale={out_scale}: {verdict}")
                done += 1
            del a, outs
    say(f"checks: {done} calls, {bad} mismatches")
    return bad


def measure(sets: Sets, say, started, emit) -> None:
    """Phase 2: the kernels twice (the second pass reversed), then TileKernels on the same inputs, checked within the
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
    shape = f"{TOKENS}x{HIDDEN} bf16 w+res"
    inputs = [_inputs(torch.bfloat16, HIDDEN, TOKENS, True, True, seed=1000 + s) for s in range(SETS)]
    calls = sets.calls(device)
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
        verdict = f"{CONTROL} " + _close(outs[CONTROL], want, torch.bfloat16) if CONTROL in outs else "-"
        us, _ = device_us(theirs, inputs)
        emit(("TK", shape, us, "-", us / base, us, verdict))


# ---- the run: the phases in a child process, watched (a candidate that hangs is killed and skipped)


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
    return f"{name:10s} {shape:22s} {us:8.2f} {passes:>13s} {ratio:6.3f} {tk_us:8.2f}  {verdict}"


def _run_child(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run the child until it ends, stalls or passes the deadline; the candidate (or "check") it hung in, if any."""

    def on_row(row) -> None:
        if tuple(row[:2]) not in rows:  # a rerun's repeat of a row keeps the first
            rows[tuple(row[:2])] = row
            say(_line(row))

    stop = run_child(
        "bench.tuning.tune_normbwdres13", "all", artifacts, skip, deadline, say,
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
    """The rows, the candidates in order, TileKernels last."""
    say(f"\n{'candidate':10s} {'shape':22s} {'µs':>8s} {'passes':>13s} {'ratio':>6s} {'TK µs':>8s}  verdict (ratio: to ctl)")
    for row in sorted(rows, key=lambda r: r[0] == "TK"):
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
    (out / "tune_normbwdres13.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        _child(argv[2:])
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
