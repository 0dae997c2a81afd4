"""Near the copy ceiling, round 1: candidates of mhc_pre_apply_mix_bwd (8192 x 4 x 7168 bf16) and
engram_sinkhorn_momentum_update (512000512 fp32 grad, bf16 momentum, nesterov), timed beside the shipped kernels
and TileKernels, with the same run's copy ceiling.

Why (H200, bench.run): mhc_pre_apply_mix_bwd 358.11 µs against TileKernels' 355.15 (1.008x, copy ceiling 4.22 TB/s
that run); engram_sinkhorn_momentum_update 1449.50 against 1444.70 (1.003x).

Launch shapes and SASS (sm_90; ours: prebuilt/sm90's cubins and this build's; TileKernels': its kernels lowered by
TileLang for sm_90 at the bench's arguments (PDL on) and compiled with the build's nvcc flags, so its JIT's own
flags may differ a little). Resident CTAs an SM from registers (rounded up to 8 a lane), 2048 lanes, 32 CTAs and
228 KB of shared memory an SM; bytes in flight an SM: the loads a lane can have outstanding times its lanes.

mhc_pre_apply_mix_bwd, 8192 tokens x 4 x 7168 (one 128-lane CTA a token in both; 896 16-byte vectors a row, 7 a
lane). Ours: 75 registers, 440 instructions; per vector 9 LDG.128 (o_grad, 4 x through the read-only path, 4
x_grad) then 4 STG.128 of x_grad, one vector in flight a lane (144 B); 6 CTAs an SM (register-bound), 792
resident, 10.3 waves; at most 111 KB in flight an SM; mix_grad by one barrier and 4 scalar stores. TileKernels:
88 registers (__launch_bounds__(128, 1)), hidden static so the 7 h_blk-1024 stages fully unrolled (880
instructions): 27 LDGSTS.128 (cp.async, L1 bypass) into 2 stages of 18 KB each (36 KB shared a CTA), refilled
right after each stage is read (27 LDS.128), 32 BAR.SYNC, 13 STG.128 (x_grad from registers); 5 CTAs an SM
(register-bound), 660 resident, 12.4 waves; up to 2 stages in flight a CTA, 184 KB an SM. Both update x_grad in
place the same way (a vector read once, written once from registers after its sums; no other CTA touches it), both
store whole 16-byte vectors of whole rows (no partial sectors). So TileKernels has more bytes in flight an SM and
fewer, longer-lived CTAs; the tail (the last partial wave) is a tenth of a CTA's life in both.

engram_sinkhorn_momentum_update, 512000512 fp32 grad, bf16 momentum. Ours (t128v4x2): 31 registers, 144
instructions, 500001 CTAs of 128 lanes, a lane 2 runs of 4: 2 LDG.128 (grad) + 2 LDG.64 (momentum), 2 STG.64 +
2 STG.128 executed (8 in the code: nesterov is a runtime flag, both branches carry the stores); 16 CTAs an SM
(2048 lanes), 96 KB in flight an SM. TileKernels: nesterov and beta1 compile-time, 28 registers, 88 instructions,
2000002 CTAs of 32 lanes, a lane the same 2 runs of 4, 128 elements apart (our t32v4x2's layout): 2 LDG.128 +
2 LDG.64, 2 STG.64 + 2 STG.128; 32 CTAs an SM (the CTA limit: 1024 lanes), 48 KB in flight an SM. Every access
of a warp in both is one contiguous 512 B (fp32) or 256 B (bf16) span: whole sectors.

Candidates' static numbers (registers / shared bytes / resident CTAs an SM / bytes in flight an SM, the build's
printout): mhc u1t1 88 / 64 B / 5 / 92 KB; u2t1 117 / 64 B / 4 / 147 KB; u3t1 151 / 64 B / 3 / 166 KB; u1t2 92 /
128 B / 2 (4 tokens) / 74 KB; u2t2 118 / 128 B / 2 (4 tokens) / 147 KB; r2 71 / 36864 B / 6 / 221 KB; r3 72 /
55296 B / 4 / 221 KB; r4 72 / 73728 B / 3 / 221 KB (r: LDGSTS.128 into the ring, LDS.128 out, 1 BAR in all).
engram t32v4x2 31 registers, 136 instructions, 32 CTAs an SM (1024 lanes); t32v8x1 31, 104 instructions (a
lane 8 consecutive: 2 LDG.128 of grad, 1 LDG.128 of momentum); t64v4x2 31, 144; t128v4x4 51, 264 (4 runs a
lane; 9 CTAs an SM at 56 registers a lane: 1152 lanes, 110 KB in flight); t256v4x1 and t512v4x1 22, 72 (one run a
lane, 2048 lanes an SM, 48 KB in flight).

Candidates:
- mhc (bench/tuning/tune_ceiling1_mhc.py): "u<U>t<T>": U vectors' loads a lane issued before the first is computed
  (1 = the shipped walk), T tokens a block of 128 * T lanes. "ctl" is the shipped source rebuilt (its cubin checked
  against prebuilt/sm90's); "u1t1" the candidates' builder with nothing changed (same bytes, its own code).
- engram: other tilings of kernels_src/engram/sinkhorn_momentum.py ("t<threads>v<vec>x<reps>"); "t128v4x2" is the
  shipped one (its cubin checked against prebuilt/sm90's); t32v4x2 is TileKernels' launch shape and layout (32
  lanes a CTA, 256 elements a CTA, a lane 4 at i * 4 and 4 at 128 + i * 4: read from its generated source), which
  bench/tuning/tune_engram3.py's round timed at 2409.4 µs against TileKernels' 1452.7 (one run; timed again here,
  beside TileKernels, to see whether that gap is real); t32v8x1 the same CTA with 8 consecutive elements a lane.

The run (GPU, tile_kernels importable, prebuilt/ holding main's sm90 set) in a watched child (bench/tuning/watch.py):
the same-run copy ceiling (bench.timing.copy_ceiling_tbps) first; every candidate's outputs byte for byte against the
shipped kernel's on fresh inputs (mhc: 1, 3, 127, 4097 tokens, hidden 7168, and 5 tokens of hidden 1032; engram: 8,
1000, 4104, 2**20 + 8 elements, nesterov and not) and at the timed shape (its first input set), the shipped kernel's
against TileKernels' where TileKernels takes the size; then PASSES passes at the timed shape (CUDA-graph replay over
rotating inputs, bench.timing.device_us, the bench's rotating-set rule), the order reversed every other pass,
TileKernels in the same passes, the median of the passes. One table last, with TB/s and the fraction of the ceiling.

    python -m bench.tuning.tune_ceiling1 build --out tune-artifacts/ceiling1              (CPU: TileLang and nvcc)
    python -m bench.tuning.tune_ceiling1 --artifacts tune-artifacts/ceiling1 --out DIR     (GPU, 140 s budget)

tune-artifacts/ is not tracked: carry the built folder to the GPU machine (0.2 MB), or run the build there first
(about 50 s). `--budget S` changes the run's 140 s. The log: DIR/tune_ceiling1.log.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from bench.tuning.watch import ROW, Log, budget, child_start, run_child, started, stopped, with_reruns

ARTIFACTS = "tune-artifacts/ceiling1"
MHC_KERNEL, MHC_KEY = "mhc_pre_apply_mix_bwd", "mhc_mult=4"
MHC = {"u1t1": (1, 1), "u2t1": (2, 1), "u3t1": (3, 1), "u1t2": (1, 2), "u2t2": (2, 2), "r2": (2,), "r3": (3,), "r4": (4,)}
MOMENTUM_SHIPPED = "t128v4x2"  # tkaot/_engram/kernels.py's SINKHORN_MOMENTUM_TILINGS["default"] (the build checks it)
MOMENTUM = ("t32v4x2", "t32v8x1", "t64v4x2", "t128v4x4", "t256v4x1", "t512v4x1")
MOMENTUM_STATIC = {"grad_dtype": "float32", "momentum_dtype": "bfloat16"}
HC, HIDDEN, TOKENS = 4, 7168, 8192
NUMEL, BETA1 = 512000512, 0.9
PASSES = 6
TOTAL_S = 140  # the whole run, so that it ends within 150 s with its imports
STALL_S = 40  # a candidate silent this long is taken as hung (TileKernels' first calls compile: 90 s for them)


# ---- build (CPU)


def _entry(set_dir: Path, kernel: str, match) -> dict:
    entries = json.loads((set_dir / "manifest.json").read_text())["variants"]
    return next(e for e in entries if e["kernel"] == kernel and match(e["key"]))


def _registers(cubin: bytes) -> int | str:
    """EIATTR_REGCOUNT (0x2f) of the cubin's kernel, read from its ELF .nv.info sections."""
    import struct

    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    for s in sections:
        if not cubin[names + s[0] : cubin.index(b"\0", names + s[0])].startswith(b".nv.info"):
            continue
        at, end = s[4], s[4] + s[5]
        while at < end:
            fmt, attr = cubin[at], cubin[at + 1]
            if fmt == 4:  # EIFMT_SVAL: a 2-byte size, then the value
                size = struct.unpack_from("<H", cubin, at + 2)[0]
                if attr == 0x2F:
                    return struct.unpack_from("<II", cubin, at + 4)[1]
                at += 4 + size
            else:
                at += {3: 4, 2: 3}.get(fmt, 2)
    return "?"


def _sass_counts(cubin: Path) -> str:
    """Instruction counts of the cubin's SASS (cuobjdump on PATH, else nothing)."""
    import shutil
    import subprocess

    tool = shutil.which("cuobjdump")
    if tool is None:
        return "(no cuobjdump on PATH)"
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True).stdout
    ops = [line.split("*/", 1)[1].strip() for line in sass.splitlines() if line.strip().startswith("/*") and "*/" in line]
    ops = [o.split(" ", 1)[1] if o.startswith("@") else o for o in ops if o]
    count = lambda prefix: sum(1 for o in ops if o.startswith(prefix))  # noqa: E731
    return (
        f"{len(ops)} instr, LDG {count('LDG')} (128-bit {sum(1 for o in ops if o.startswith('LDG') and '.128' in o)}), "
        f"STG {count('STG')} (128-bit {sum(1 for o in ops if o.startswith('STG') and '.128' in o)}), BAR {count('BAR')}, "
        f"LDGSTS {count('LDGSTS')}, LDS {count('LDS')}, FFMA {count('FFMA')}"
    )


def _describe(set_dir: Path, kernel: str, match, label: str, prebuilt: str | None = None) -> None:
    e = _entry(set_dir, kernel, match)
    cubin = set_dir / "cubins" / f"{e['cubin']}.cubin"
    regs = _registers(cubin.read_bytes())
    note = "" if prebuilt is None else ", = prebuilt/sm90" if e["cubin"] == prebuilt else ", DIFFERS from prebuilt/sm90"
    launch = e["launch"]
    print(f"{label:10s} {e['cubin'][:12]} {regs} registers, {launch['smem']} B shared, {launch['block']}, grid {launch['grid']}{note}")
    print(f"{'':10s} {_sass_counts(cubin)}")


def build(out: Path) -> None:
    import kernels_src.engram.sinkhorn_momentum as momentum_source
    import kernels_src.mhc.pre_apply_mix_bwd as mhc_source
    from bench.tuning.tune_ceiling1_mhc import make_build, make_ring_build
    from bench.tuning.tune_engram2 import declare
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant
    from tkaot._engram.kernels import SINKHORN_MOMENTUM, SINKHORN_MOMENTUM_TILINGS

    if SINKHORN_MOMENTUM_TILINGS["default"] != MOMENTUM_SHIPPED:
        raise SystemExit(f"the shipped momentum tiling is {SINKHORN_MOMENTUM_TILINGS['default']}, this round measured {MOMENTUM_SHIPPED}")
    t0 = time.perf_counter()
    prebuilt = Path("prebuilt/sm90")
    with tempfile.TemporaryDirectory(prefix="tune-ceiling1-cache-") as cache:  # a patched builder keeps the source hash
        tilings = (MOMENTUM_SHIPPED, *MOMENTUM)
        declare(momentum_source, {f"t{i}": t for i, t in enumerate(tilings)}, momentum_source.__name__, SINKHORN_MOMENTUM)
        variants = [Variant.make(SINKHORN_MOMENTUM.name, {**MOMENTUM_STATIC, "tiling": t}) for t in tilings]
        build_variants(variants, out / "engram", "sm90", jobs=1, cache=BuildCache(Path(cache) / "engram"))
        shipped = mhc_source.build
        for name, opts in {"ctl": None, **MHC}.items():
            mhc_source.build = shipped if opts is None else make_build(*opts) if len(opts) == 2 else make_ring_build(*opts)
            if opts is not None and len(opts) == 1:  # the ring's lanes read only their own slots: no barriers
                mhc_source.PASS_CONFIGS = {"tl.disable_thread_storage_sync": True, "tl.disable_buffer_init_check": True}
            try:
                variant = Variant.make(MHC_KERNEL, {"mhc_mult": HC})
                build_variants([variant], out / f"mhc-{name}", "sm90", jobs=1, cache=BuildCache(Path(cache) / name))
            finally:
                mhc_source.build = shipped
                if hasattr(mhc_source, "PASS_CONFIGS"):
                    del mhc_source.PASS_CONFIGS
    for t in tilings:
        ctl = _entry(prebuilt, SINKHORN_MOMENTUM.name, lambda k, t=t: _momentum_key(k, t))["cubin"] if t == MOMENTUM_SHIPPED else None
        _describe(out / "engram", SINKHORN_MOMENTUM.name, lambda k, t=t: _momentum_key(k, t), t, ctl)
    for name in ("ctl", *MHC):
        ctl = _entry(prebuilt, MHC_KERNEL, lambda k: k == MHC_KEY)["cubin"] if name == "ctl" else None
        _describe(out / f"mhc-{name}", MHC_KERNEL, lambda k: k == MHC_KEY, name, ctl)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


def _momentum_key(key: str, tiling: str) -> bool:
    parts = dict(p.split("=", 1) for p in key.split(","))
    return parts.get("tiling") == tiling and all(parts.get(k) == v for k, v in MOMENTUM_STATIC.items())


# ---- the rows (GPU, in the child)


def _kernels(set_dir: Path) -> dict:
    from tkaot._kernel import Kernel

    entries = json.loads((set_dir / "manifest.json").read_text())["variants"]
    cubins = set_dir / "cubins"
    return {
        (e["kernel"], e["key"]): Kernel(e["kernel"], e["key"], e["launch"], cubins / f"{e['cubin']}.cubin", e["cubin"], set_dir.name)
        for e in entries
    }


def _find(kernels: dict, kernel: str, match):
    return next(k for (name, key), k in kernels.items() if name == kernel and match(key))


def _mhc_calls(artifacts: Path) -> dict:
    """name -> call(a) -> (x_grad, mix_grad): the shipped kernel (prebuilt/sm90) and each candidate."""
    import torch

    from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD
    from tkaot._op import current_stream

    sets = {"shipped": Path("prebuilt/sm90"), **{name: artifacts / f"mhc-{name}" for name in MHC}}

    def make(set_dir):
        launch = _find(_kernels(set_dir), MHC_KERNEL, lambda k: k == MHC_KEY).bind(PRE_APPLY_MIX_BWD.args)

        def call(a):
            og, x, mix, xg = a["o_grad"], a["x"], a["mix"], a["x_grad"]
            device = x.device.index
            mix_grad = torch.empty(mix.shape, dtype=torch.float32, device=x.device)
            launch(device, current_stream(device), og.data_ptr(), x.data_ptr(), mix.data_ptr(), xg.data_ptr(), mix_grad.data_ptr(),
                   x.shape[0], x.shape[2])  # fmt: skip
            return xg, mix_grad

        return call

    return {name: make(d) for name, d in sets.items()}


def _momentum_calls(artifacts: Path) -> dict:
    """name -> call(a, nesterov) -> (momentum, sinkhorn_input)."""
    import torch

    from tkaot._engram.kernels import SINKHORN_MOMENTUM
    from tkaot._op import current_stream

    built = _kernels(artifacts / "engram")
    kernels = {"shipped": _find(_kernels(Path("prebuilt/sm90")), SINKHORN_MOMENTUM.name, lambda k: _momentum_key(k, MOMENTUM_SHIPPED))}
    kernels.update({t: _find(built, SINKHORN_MOMENTUM.name, lambda k, t=t: _momentum_key(k, t)) for t in MOMENTUM})

    def make(kernel):
        launch = kernel.bind(SINKHORN_MOMENTUM.args)

        def call(a, nesterov=True):
            g, m = a["grad"], a["momentum"]
            device = g.device.index
            out = torch.empty(g.shape, dtype=torch.float32, device=g.device)
            launch(device, current_stream(device), g.data_ptr(), m.data_ptr(), out.data_ptr(), BETA1, 1.0 - BETA1, int(nesterov), g.numel())
            return m, out

        return call

    return {name: make(k) for name, k in kernels.items()}


def _tk_call(tk, op: str):
    if op == "mhc":
        return lambda a: (a["x_grad"], tk.mhc.mhc_pre_apply_mix_bwd(a["o_grad"], a["x"], a["mix"], a["x_grad"]))
    return lambda a, nesterov=True: (a["momentum"], tk.engram.engram_sinkhorn_momentum_update(a["grad"], a["momentum"], BETA1, nesterov))


def _mhc_inputs(tokens: int, hidden: int, sets: int, gen) -> list[dict]:
    import torch

    def bf16(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").bfloat16()

    return [
        {"o_grad": bf16(tokens, hidden), "x": bf16(tokens, HC, hidden), "mix": torch.randn(tokens, HC, generator=gen, device="cuda"),
         "x_grad": bf16(tokens, HC, hidden)}
        for _ in range(sets)
    ]  # fmt: skip


def _momentum_inputs(numel: int, sets: int, gen) -> list[dict]:
    import torch

    return [
        {"grad": torch.randn(numel, generator=gen, device="cuda"), "momentum": torch.randn(numel, generator=gen, device="cuda").bfloat16()}
        for _ in range(sets)
    ]  # fmt: skip


def _outputs(call, a: dict, **kw) -> tuple:
    """The call's outputs, cloned; the tensors it updates in place are copies, so `a` is left as it was."""
    import torch

    a = {k: v.clone() if k in ("x_grad", "momentum") else v for k, v in a.items()}
    got = call(a, **kw)
    torch.cuda.synchronize()
    return tuple(g.clone() for g in got)


def _same(got, want) -> bool:
    import torch

    return len(got) == len(want) and all(
        g.shape == w.shape and torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want)
    )


def _checks(tk, calls: dict, cases: list, op: str) -> dict:
    """name -> "yes" / "NO: where": each candidate's outputs against the shipped kernel's; "shipped" against TK's."""
    verdict = {name: [] for name in calls}
    for label, a, kw, tk_ok in cases:
        runs = {}
        for name, call in calls.items():
            started(f"{op}:{name}", f"check {label}")
            runs[name] = _outputs(call, a, **kw)
        for name, got in runs.items():
            if name != "shipped" and not _same(got, runs["shipped"]):
                verdict[name].append(label)
        if tk is not None and tk_ok:
            started("TK", f"check {label}")
            if not _same(_outputs(_tk_call(tk, op), a, **kw), runs["shipped"]):
                verdict["shipped"].append(f"{label} vs TK")
    return {name: "yes" if not bad else "NO: " + ", ".join(bad) for name, bad in verdict.items()}


def _timed(calls: dict, inputs: list[dict], shape: str, op: str) -> dict:
    from bench.timing import device_us

    times = {name: [] for name in calls}
    order = list(calls)
    for p in range(PASSES):
        for name in order if p % 2 == 0 else order[::-1]:
            started(f"{op}:{name}" if name != "TK" else name, shape)
            times[name].append(device_us(calls[name], inputs)[0])
    return {name: statistics.median(ts) for name, ts in times.items()}


def _sets(per_set: int) -> int:
    import torch

    return min(64, max(2, -(-3 * torch.cuda.get_device_properties(0).L2_cache_size // per_set)))


def _child(artifacts: Path, skip: tuple[str, ...]) -> None:
    import torch

    from bench.timing import copy_ceiling_tbps

    started("ceiling", "")
    print(f"copy ceiling {copy_ceiling_tbps():.3f} TB/s", flush=True)
    torch.cuda.empty_cache()
    started("TK", "import")
    try:
        import tile_kernels as tk
    except Exception as exc:  # not importable: the TileKernels columns stay empty
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})", flush=True)
        tk = None
    gen = torch.Generator(device="cuda").manual_seed(0)
    ops = (
        ("mhc", _mhc_calls(artifacts), f"{TOKENS}x{HC}x{HIDDEN} bf16", TOKENS * HIDDEN * 2 * (1 + 3 * HC) + TOKENS * HC * 8,
         lambda sets: _mhc_inputs(TOKENS, HIDDEN, sets, gen), TOKENS * HIDDEN * 2 * (1 + 2 * HC)),
        ("engram", _momentum_calls(artifacts), f"{NUMEL} fp32/bf16 nesterov", NUMEL * (4 + 2 + 2 + 4),
         lambda sets: _momentum_inputs(NUMEL, sets, gen), NUMEL * 6),
    )  # fmt: skip
    for op, calls, shape, moved, make_inputs, per_set in ops:
        calls = {n: c for n, c in calls.items() if f"{op}:{n}" not in skip}
        if op == "mhc":
            cases = [(f"{t} tokens", _mhc_inputs(t, HIDDEN, 1, gen)[0], {}, True) for t in (1, 3, 127, 4097)]
            cases.append(("5 tokens, hidden 1032", _mhc_inputs(5, 1032, 1, gen)[0], {}, False))
        else:
            cases = [
                (f"{n}{' nesterov' if nest else ''}", _momentum_inputs(n, 1, gen)[0], {"nesterov": nest}, n % 256 == 0)
                for n, nest in ((8, True), (1000, False), (4104, True), ((1 << 20) + 8, True), (1 << 20, False))
            ]
        if tk is not None:  # TileKernels' first call compiles: before the watched rows
            started("TK", f"{op} compile")
            first = next(c for c in cases if c[3])  # a size TileKernels takes (the momentum: a multiple of 256)
            _outputs(_tk_call(tk, op), first[1], **first[2])
        same = _checks(tk, calls, cases, op)
        del cases
        inputs = make_inputs(_sets(per_set))
        want = _outputs(calls["shipped"], inputs[0])
        for name, call in calls.items():
            started(f"{op}:{name}", f"check {shape}")
            if not _same(_outputs(call, inputs[0]), want):
                same[name] += f"; NO at {shape}"
        timed = dict(calls)
        if tk is not None:
            timed["TK"] = _tk_call(tk, op)
            started("TK", f"check {shape}")
            if not _same(_outputs(timed["TK"], inputs[0]), want):
                same["shipped"] += f"; NO vs TK at {shape}"
        us = _timed(timed, inputs, f"{op} {shape}", op)
        for name in calls:
            row = (f"{op}:{name}", shape, us[name], us.get("TK", math.nan), moved / us[name] / 1e6, same[name])
            print(ROW + json.dumps(row), flush=True)
        del inputs
        torch.cuda.empty_cache()


# ---- the run (GPU): the child, watched


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    import re

    import torch

    from bench.tuning.tune_train2 import finish

    if not torch.cuda.is_available():
        print("no GPU: nothing to time (build runs here: `build --out DIR`)")
        return
    start, say, rows = time.perf_counter(), Log(), {}
    deadline = start + total_s

    def on_row(row: tuple) -> None:
        rows.setdefault(tuple(row[:2]), row)
        say(f"{row[0]:16s} {row[1]:28s} {row[2]:9.2f} µs  TK {row[3]:9.2f}  {row[4]:.3f} TB/s  identical: {row[5]}")

    def run(skip: list[str]) -> str | None:
        stop = run_child(
            "bench.tuning.tune_ceiling1", "all", artifacts, skip, deadline, say, on_row,
            stall_s=lambda name: 90 if name in ("TK", "load", "ceiling") or name.endswith(":shipped") else STALL_S,
        )  # fmt: skip
        return None if stop is None else stopped(stop, say, rows, 3)

    with_reruns("rows", deadline, say, run)
    ceiling = next((float(m.group(1)) for line in say.lines if (m := re.match(r"copy ceiling ([\d.]+) TB/s", line))), math.nan)
    table = []
    for name, shape, us, tk_us, tbps, same in rows.values():
        verdict = f"{tbps:.3f} TB/s = {tbps / ceiling:.3f} of ceiling; {same}"
        table.append((name, shape, us, tk_us, us / tk_us if tk_us == tk_us else math.nan, verdict))
    say(f"same-run copy ceiling {ceiling:.3f} TB/s")
    finish(say, table, start, out / "tune_ceiling1.log", say.lines, (16, 28, 9))


def main(argv=None) -> None:
    import sys

    from bench.tuning.tune_train2 import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        _, artifacts, skip = child_start(argv[1:])
        _child(artifacts, skip)
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
