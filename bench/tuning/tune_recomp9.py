"""Time launch-shape candidates for mhc_multilayer_recompute (mhc 4) beside the shipped kernel and TileKernels (issue 16,
round 9).

The bench row `mhc_multilayer_recompute 8192x4x7168 bf16, 4 layers` took 892.8 µs on the H200 against TileKernels'
821.4 (session 12). The launch shapes at that row:
- ours: a 128-thread block per 1,024 hidden elements of one token (8 bf16 a thread), grid (7, 8192) = 57,344
  blocks; MIN_BLOCKS 6 caps the registers at 80 a thread, no shared memory, so 6 blocks (24 warps) an SM: 792 blocks
  a wave on 132 SMs, 72.4 waves (the tail, 0.4 of a wave, is under 1 % of the time); launched with PDL,
  griddepcontrol.launch_dependents at entry;
- TileKernels (tile_kernels/mhc/multilayer_recompute_cuda.py as its wrapper calls it): 64-thread blocks per 512
  hidden elements of one token (h_blk = gcd(512, hidden), 8 elements a thread), n * 14 = 114,688 blocks at the row,
  token-major like ours; hidden and both layer counts compiled in; the next layer's output and mixes loaded ahead by
  cp.async into 2.2 KB of double-buffered shared memory; 93 registers (lowered for sm_90a with its pass configs and
  compiled with the build's nvcc flags, with or without its ptxas register usage level 10), so 10 blocks (20 warps)
  an SM, 1,320 a wave, 86.9 waves: fewer warps than ours; no PDL (its get_pdl() is False by default).
The `build` step prints each candidate's registers (from the cubin), so the blocks an SM follow from them.
Candidates (the mhc_mult=4 variant each; the shipped body with its constants patched: the same products and sums in
the same order, so the outputs must be ctl's bytes, which the run checks):
  ctl        the shipped kernel (its cubin must be prebuilt/sm90's: checked at build and run)
  nopdl      ctl's cubin launched without PDL (a diagnosis, as TileKernels launches)
  waitonly   ctl without launch_dependents at entry (still launched with PDL: the next call launches at this one's exit)
  mb5/mb7/mb8  MIN_BLOCKS 5, 7, 8: registers capped at 96, 72, 64 a thread (fewer or more warps an SM)
  t64        THREADS 64, MIN_BLOCKS 12 (80 registers as ctl): TileKernels' block, 114,688 blocks
  t256       THREADS 256, MIN_BLOCKS 3 (80 registers): 28,672 blocks
  ahead5     OUTPUT_AHEAD at MIN_BLOCKS 5 (907.2 µs against 892.8 once, session 12)
  t64ahead   OUTPUT_AHEAD in 64-thread blocks at MIN_BLOCKS 10: the nearest to TileKernels' kernel (its 93 registers
             and 64 threads are 10 blocks, 20 warps an SM; the next layer's output in flight during this one's stores)

On a CPU with TileLang and nvcc (a few seconds a candidate):

    python -m bench.tuning.tune_recomp9 build --out tune-artifacts/recomp9 [--only mb7,t64]

then on the GPU, from the tree's root with PYTHONPATH set to it (tile_kernels importable):

    python -m bench.tuning.tune_recomp9 --artifacts tune-artifacts/recomp9 --out DIR [--budget S]

The run, in a child process watched by this one (bench/tuning/watch.py: a candidate silent for STALL_S seconds is
killed and the run goes on without it; everything stops at --budget seconds, 140 by default):
1. checks each candidate through the op (tkaot.mhc.mhc_multilayer_recompute, the candidate's launcher put in the op's
   kernel table) at 1, 3, 127 and 4097 tokens, hidden 1536 (a half-empty block of 1,024 a token), 4 layers with 4 and
   with 3 post layers, then at those tokens and 8192 at the bench row's hidden 7168 and 4 post layers; outputs
   poisoned with NaN first: every byte against ctl's (and no NaN left), and ctl's against TileKernels' at hidden 7168
   (TileKernels compiles hidden and the layer counts in: one compile, the one the timing uses);
2. times (the bench shape: CUDA-graph replay over 2 rotating input sets of 3.3 GB each, bench.timing) each candidate
   and TileKernels twice, the second pass in the reverse order, the outputs' bytes checked again.
Prints each row as it is timed and a table last (candidate, µs (the passes' mean), both passes, ratio to TileKernels,
ratio to ctl, verdict); writes DIR/tune_recomp9.log.
"""

import argparse
import contextlib
import functools
import hashlib
import json
import math
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.tuning.watch import ROW, Log, child_start, run_child, started, with_reruns

ARTIFACTS = "tune-artifacts/recomp9"
KERNEL = "mhc_multilayer_recompute"
MODULE = "kernels_src.mhc.multilayer_recompute"
KEY = "mhc_mult=4"
MHC = 4
CONTROL = "ctl"


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    threads: int = 128
    min_blocks: int = 6
    output_ahead: bool = False
    trigger: bool = True  # griddepcontrol.launch_dependents at entry (False: none, so at exit)
    artifacts: str = ""  # a launch-only candidate: another candidate's artifact set
    pdl: bool | None = None  # None: as the manifest says (the op's launch)
    note: str = ""


CANDIDATES = (
    Candidate(CONTROL, note="the shipped kernel (cubin = prebuilt/sm90's)"),
    Candidate("nopdl", artifacts=CONTROL, pdl=False, note="ctl's cubin launched without PDL"),
    Candidate("waitonly", trigger=False, note="ctl without launch_dependents at entry"),
    Candidate("mb5", min_blocks=5, note="MIN_BLOCKS 5 (96 registers at most)"),
    Candidate("mb7", min_blocks=7, note="MIN_BLOCKS 7 (72 registers at most)"),
    Candidate("mb8", min_blocks=8, note="MIN_BLOCKS 8 (64 registers at most)"),
    Candidate("t64", threads=64, min_blocks=12, note="64-thread blocks (TileKernels'), 80 registers at most"),
    Candidate("t256", threads=256, min_blocks=3, note="256-thread blocks, 80 registers at most"),
    Candidate("ahead5", min_blocks=5, output_ahead=True, note="next layer's output loaded ahead, MIN_BLOCKS 5"),
    Candidate("t64ahead", threads=64, min_blocks=10, output_ahead=True, note="TileKernels' shape: 64 threads, 10 blocks, output ahead"),
)  # fmt: skip
NAMES = tuple(c.name for c in CANDIDATES)


# ---- build (CPU)


def _wait_only():
    """kernels_src.pdl.pdl_entry without griddepcontrol.launch_dependents: the kernel behind launches at this one's exit."""
    import tilelang.language as T

    @T.macro
    def entry():
        T.call_extern("int32", "tkaot_pdl_wait")

    return entry


@contextlib.contextmanager
def _patched(c: Candidate):
    """kernels_src.mhc.multilayer_recompute building candidate c."""
    import importlib

    module = importlib.import_module(MODULE)
    saved = {"build": module.build, "THREADS": module.THREADS, "pdl_entry": module.pdl_entry}
    shipped = module.build
    try:
        module.THREADS = c.threads
        module.build = lambda mhc_mult, **kw: shipped(mhc_mult, min_blocks=c.min_blocks, output_ahead=c.output_ahead)
        if not c.trigger:
            module.pdl_entry = _wait_only()
        yield
    finally:
        for a, v in saved.items():
            setattr(module, a, v)


def registers(cubin: bytes) -> list[int]:
    """The registers a thread of each kernel in a cubin: the EIATTR_REGCOUNT (0x2f) records of its .nv.info section
    (ELF64; a record is format, attribute, u16 size and a payload of symbol index and count)."""
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx][4]
    out = []
    for name_off, _, _, _, offset, size, _, _, _, _ in sections:
        if cubin[strtab + name_off : cubin.index(b"\0", strtab + name_off)] != b".nv.info":
            continue
        at = offset
        while at < offset + size:
            fmt, attr = cubin[at], cubin[at + 1]
            length = struct.unpack_from("<H", cubin, at + 2)[0] if fmt == 4 else 0
            if attr == 0x2F and fmt == 4:
                out.append(struct.unpack_from("<I", cubin, at + 8)[0])
            at += 4 + length
    return out


def _ctl_identical(artifacts: Path, root: Path) -> str:
    """Whether ctl's cubin is prebuilt/sm90's (the manifest's hash and the file's bytes)."""
    shipped = {
        e["key"]: e["cubin"] for e in json.loads((root / "prebuilt/sm90/manifest.json").read_text())["variants"] if e["kernel"] == KERNEL
    }
    mine = {e["key"]: e["cubin"] for e in json.loads((artifacts / CONTROL / "manifest.json").read_text())["variants"]}
    digest = shipped.get(KEY)
    path = artifacts / CONTROL / "cubins" / f"{mine.get(KEY)}.cubin"
    data = path.read_bytes() if path.is_file() else b""
    prebuilt = root / "prebuilt/sm90/cubins" / f"{digest}.cubin"
    same = (
        mine.get(KEY) == digest and hashlib.sha256(data).hexdigest() == digest and (not prebuilt.is_file() or prebuilt.read_bytes() == data)
    )
    return f"ctl cubin ({KEY}) {'identical to' if same else 'DIFFERS from'} prebuilt/sm90's ({digest[:12] if digest else 'not in it'})"


def _shape(c: Candidate, entry: dict, cubin: bytes, tokens: int = 8192, hidden: int = 7168, sms: int = 132) -> str:
    """Registers, blocks an SM (registers and threads only: no shared memory), grid and waves at the bench shape."""
    regs = max(registers(cubin), default=0)
    threads = entry["launch"]["block"][0]
    warps = threads // 32
    per_warp = -(-regs * 32 // 256) * 256  # allocated in 256-register units a warp
    per_sm = min(32, 64 // warps, 65536 // (per_warp * warps)) if regs else 0
    blocks = -(-hidden // (8 * threads)) * tokens
    waves = blocks / (per_sm * sms) if per_sm else math.nan
    return f"{regs} registers, {per_sm} blocks ({per_sm * warps} warps) an SM, {blocks} blocks, {waves:.2f} waves"


def build(out: Path, only: tuple[str, ...] = ()) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    # A cache of each candidate's own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-recomp9-cache-") as cache:
        for c in CANDIDATES:
            if c.artifacts or (only and c.name not in only):
                continue
            t = time.perf_counter()
            try:
                with _patched(c):
                    build_variants(
                        [Variant.make(KERNEL, {"mhc_mult": MHC})], out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name)
                    )
            except Exception as exc:  # a candidate that fails to build is reported, not fatal
                print(f"{c.name:8s} NOT BUILT: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
                continue
            entry = next(e for e in json.loads((out / c.name / "manifest.json").read_text())["variants"] if e["key"] == KEY)
            cubin = (out / c.name / "cubins" / f"{entry['cubin']}.cubin").read_bytes()
            print(f"{c.name:8s} built in {time.perf_counter() - t:5.1f} s: block {entry['launch']['block'][0]}, "
                  f"grid {entry['launch']['grid']}, {_shape(c, entry, cubin)}  ({c.note})", flush=True)  # fmt: skip
    if (out / CONTROL / "manifest.json").is_file():
        print(_ctl_identical(out, Path.cwd()), flush=True)
    print(f"{out}: {time.perf_counter() - t0:.0f} s", flush=True)


# ---- check and time (GPU), in the child

CHECK_TOKENS = (1, 3, 127, 4097)
CHECK_HIDDEN = 1536
LAYERS = 4
TOKENS, HIDDEN = 8192, 7168  # the bench row
SETS = 2  # 3.3 GB a set: far beyond the 50 MB L2


def _launchers(artifacts: Path, say) -> dict:
    """{name: Kernel} for every candidate whose set loads."""
    from tkaot._kernel import Kernel

    kernels = {}
    for c in CANDIDATES:
        set_dir = artifacts / (c.artifacts or c.name)
        try:
            e = next(e for e in json.loads((set_dir / "manifest.json").read_text())["variants"] if e["key"] == KEY)
            kernels[c.name] = Kernel(
                e["kernel"], e["key"], e["launch"], set_dir / "cubins" / f"{e['cubin']}.cubin", e["cubin"], set_dir.name
            )
        except Exception as exc:
            say(f"{c.name}: not loaded ({type(exc).__name__}: {exc})")
    return kernels


@contextlib.contextmanager
def _serving(launcher):
    """The op's launcher table with `launcher` in it for mhc 4 on the current device."""
    import torch

    from tkaot._mhc import recompute as op

    table = op._RECOMPUTE
    key = (torch.cuda.current_device(), MHC)
    saved = table.cache.get(key)
    table.cache[key] = launcher
    try:
        yield
    finally:
        if saved is None:
            table.cache.pop(key, None)
        else:
            table.cache[key] = saved


def _inputs(tokens: int, hidden: int, num_post: int, seed: int) -> dict:
    """The bench case's inputs (bench/cases/mhc_fused.py), outputs NaN."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def f32(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    def bf16(*shape):
        return f32(*shape).bfloat16()

    def nan(*shape):
        return torch.full(shape, math.nan, dtype=torch.bfloat16, device="cuda")

    return {
        "res": bf16(tokens, MHC, hidden), "pre": [f32(tokens, MHC, 1).sigmoid() for _ in range(LAYERS)],
        "out": [bf16(tokens, hidden) for _ in range(num_post)], "post": [f32(tokens, MHC, 1).sigmoid() for _ in range(num_post)],
        "comb": [f32(tokens, MHC, MHC).softmax(-1) for _ in range(num_post)], "input": [nan(tokens, hidden) for _ in range(LAYERS)],
        "residual": [nan(tokens, MHC, hidden) for _ in range(num_post)],
    }  # fmt: skip


def _call(lib, a) -> None:
    lib.mhc.mhc_multilayer_recompute(a["res"], a["pre"], a["out"], a["post"], a["comb"], a["input"], a["residual"])


def _outputs(a) -> list:
    return [t.clone() for t in a["input"] + a["residual"]]


def _poison(a) -> None:
    for t in a["input"] + a["residual"]:
        t.fill_(math.nan)


def _same(xs, ys) -> bool:
    import torch

    return len(xs) == len(ys) and all(
        x.shape == y.shape and torch.equal(x.contiguous().view(torch.int16), y.contiguous().view(torch.int16)) for x, y in zip(xs, ys)
    )


class Run:
    """The child's state: the candidates' launchers and TileKernels (if it imports)."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.say = say
        pdl = {c.name: c.pdl for c in CANDIDATES}
        from tkaot._mhc import recompute as op

        self.kernels = {
            name: k.bind(op._RECOMPUTE.args, pdl=pdl[name]) for name, k in _launchers(artifacts, say).items() if name not in skip
        }
        tk = None
        if "TK" in skip:
            say("TileKernels skipped (it hung before): no TK columns")
        else:
            try:
                import tile_kernels as tk
            except ImportError as exc:
                say(f"TileKernels not importable ({exc}): no TK columns")
        self.tk = tk

    def ours(self, name: str, a: dict) -> list:
        import torch

        import tkaot

        _poison(a)
        with _serving(self.kernels[name]):
            _call(tkaot, a)
        out = _outputs(a)
        torch.cuda.synchronize()
        return out

    def theirs(self, a: dict) -> list:
        import torch

        _poison(a)
        _call(self.tk, a)
        out = _outputs(a)
        torch.cuda.synchronize()
        return out


def check(run: Run) -> None:
    """Phase 1: every candidate's bytes against ctl's, ctl's against TileKernels' (at hidden 7168)."""
    say, bad, done = run.say, 0, 0
    # hidden 1536 against ctl only; against TileKernels at the bench row's hidden and layers (its one compile)
    cases = [(t, CHECK_HIDDEN, p) for p in (LAYERS, LAYERS - 1) for t in CHECK_TOKENS]
    cases += [(t, HIDDEN, LAYERS) for t in CHECK_TOKENS] + [(TOKENS, HIDDEN, LAYERS)]
    failed = dict.fromkeys(run.kernels, 0)
    for tokens, hidden, num_post in cases:
        what = f"{tokens}x{MHC}x{hidden}, {num_post} post"
        a = _inputs(tokens, hidden, num_post, seed=tokens * 31 + num_post)
        outs = {}
        for name in run.kernels:  # each announced: a candidate that hangs or faults is named, and rerun without
            started(name, f"check: {what}")
            outs[name] = run.ours(name, a)
        want = outs.get(CONTROL)
        for name, got in outs.items():
            done += 1
            if want is None:
                break
            if name != CONTROL and not _same(got, want):
                bad += 1
                failed[name] += 1
                say(f"check {name} {what}: DIFFERS from ctl")
            if any(t.isnan().any() for t in got):
                bad += 1
                failed[name] += 1
                say(f"check {name} {what}: NaN left (an element not written)")
        if run.tk is not None and want is not None and hidden == HIDDEN:
            started("TK", what)
            theirs = run.theirs(a)
            done += 1
            if not _same(want, theirs):
                bad += 1
                say(f"check ctl {what}: DIFFERS from TileKernels")
        del a, outs
    for name, n in failed.items():
        say(f"check {name:10s} {'every output = ctl' if not n else f'{n} of {len(cases)} cases WRONG'} ({len(cases)} cases)")
    say(f"checks: {done} outputs, {bad} mismatches (candidates against ctl, ctl against TileKernels)")


def measure(run: Run, emit) -> None:
    """Phase 2: each candidate and TileKernels timed twice at the bench shape, the second pass reversed; emit a row
    (name, shape, µs, passes, verdict) for each."""
    import torch

    import tkaot
    from bench.timing import device_us

    shape = f"{TOKENS}x{MHC}x{HIDDEN}, {LAYERS} layers"
    inputs = [_inputs(TOKENS, HIDDEN, LAYERS, seed=1000 + s) for s in range(SETS)]
    calls = {}
    for name, launcher in run.kernels.items():

        def call(a, launcher=launcher):
            with _serving(launcher):
                _call(tkaot, a)

        calls[name] = call
    if run.tk is not None:
        calls["TK"] = lambda a: _call(run.tk, a)
    outs = {}
    for label, call in calls.items():
        started(label, shape)
        _poison(inputs[0])
        call(inputs[0])
        outs[label] = _outputs(inputs[0])
        torch.cuda.synchronize()
    times: dict = {label: [] for label in calls}
    for order in (list(calls), list(reversed(calls))):
        for label in order:
            started(label, shape)
            times[label].append(device_us(calls[label], inputs)[0])
    for label, (a, b) in times.items():
        verdicts = []
        if CONTROL in outs and label != CONTROL:
            verdicts.append("=ctl" if _same(outs[label], outs[CONTROL]) else "DIFFERS from ctl")
        if "TK" in outs and label != "TK":
            verdicts.append("=TK" if _same(outs[label], outs["TK"]) else "DIFFERS from TK")
        emit((label, shape, (a + b) / 2, f"{a:.1f}/{b:.1f}", " ".join(verdicts) or "-"))


def _part(argv) -> None:
    """Child: the checks, then the timed rows, each call announced (START name|what) first, each row as ROW json."""
    _, artifacts, skip = child_start(argv)
    say = functools.partial(print, flush=True)
    run = Run(artifacts, skip, say)
    if CONTROL in run.kernels:
        say(_ctl_identical(artifacts, Path.cwd()))
    if "check" not in skip:
        check(run)
    measure(run, lambda row: print(ROW + json.dumps(row), flush=True))


# ---- the run (GPU): the phases in a watched child

TOTAL_S = 140  # the whole run's budget (--budget S)
STALL_S = 20  # a candidate silent this long is taken as hung (TileKernels' first calls compile: TK_STALL_S)
TK_STALL_S = 90


def _line(row, base: dict) -> str:
    name, shape, us, passes, verdict = row
    tk, ctl = base.get("TK"), base.get(CONTROL)
    to_tk = f"{us / tk:6.3f}" if tk and not math.isnan(us) else f"{'-':>6s}"
    to_ctl = f"{us / ctl:6.3f}" if ctl and not math.isnan(us) else f"{'-':>6s}"
    return f"{name:10s} {shape:24s} {us:8.1f} {passes:>13s} {to_tk} {to_ctl}  {verdict}"


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    start = time.perf_counter()
    deadline = start + total_s
    out.mkdir(parents=True, exist_ok=True)
    say = Log()
    rows: dict = {}
    say(
        f"tune_recomp9: artifacts {artifacts}, budget {total_s:.0f} s; candidates: " + ", ".join(f"{c.name} ({c.note})" for c in CANDIDATES)
    )

    def one(skip: list[str]) -> str | None:
        def on_row(row) -> None:
            rows.setdefault(row[0], row)  # a rerun's repeat of a row keeps the first
            say(f"{row[0]:10s} {row[1]:24s} {row[2]:8.1f} {row[3]:>13s}  {row[4]}")

        stop = run_child("bench.tuning.tune_recomp9", "all", artifacts, skip, deadline, say, on_row,
                         stall_s=lambda name: TK_STALL_S if name in ("load", "TK") else STALL_S,
                         on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True))  # fmt: skip
        if stop is None:
            return None
        name, what, how = stop
        say(f"{how} in {name} at {what or '-'}")
        return name if name in NAMES or name in ("check", "TK") else None  # rerun without it

    with_reruns("tune_recomp9", deadline, say, one)  # a rerun checks and times what is left
    base = {name: row[2] for name, row in rows.items()}
    say(f"\n{'candidate':10s} {'shape':24s} {'µs':>8s} {'passes':>13s} {'/TK':>6s} {'/ctl':>6s}  outputs (bench shape)")
    for row in rows.values():
        say(_line(row, base))
    say(f"{time.perf_counter() - start:.0f} s")
    (out / "tune_recomp9.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:
        _part(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("time", "build"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(ARTIFACTS), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the sets go; time: the log's directory")
    parser.add_argument("--only", default="", help="build: these candidates (comma-separated) only")
    parser.add_argument("--budget", type=float, default=TOTAL_S, help="time: the whole run's seconds")
    args = parser.parse_args(argv)
    if args.command == "build":
        args.out.mkdir(parents=True, exist_ok=True)
        build(args.out, tuple(n for n in args.only.split(",") if n))
        return
    import torch

    if not torch.cuda.is_available():
        print("tune_recomp9: no GPU here; nothing timed (the build runs on a CPU: `build --out DIR`)")
        return
    time_candidates(args.artifacts, args.out, args.budget)


if __name__ == "__main__":
    main()
