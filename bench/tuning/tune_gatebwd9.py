"""Time launch-shape and tiling candidates for engram_gate_bwd beside the shipped kernel and TileKernels (issue 17, round 9).

The bench row `engram_gate_bwd 8192 x 4 x 7168 bf16` took 709.25 µs on the H200 (tiling k28d11v16) against TileKernels'
665.87 (bench/results/2026-12-02-H200-s15-tune_engram6.log). The launch shape, ours against TileKernels'
(tile_kernels/engram/engram_gate_bwd_cuda.py as its wrapper calls it on the H200):
- grid: one CTA a weight-gradient partial, the SM count (132) in both: 8192 tokens are ceil(8192 / 132) = 63 a CTA, so
  130 CTAs take 63 tokens, one takes 2 and one none, in both kernels (the partials' token ranges are part of the
  output: grad_w_partial's bytes fix the grid, so num_partials is no candidate here);
- 256 threads (8 warps, two a head) in both;
- shared memory: ours 231,488 bytes (go and w of 28 kept groups, v's kept groups once a token, a ring of 11 slots of
  x and k), theirs 186,400 (a whole row of go and of v, x, k and w in two stages of 1,792 elements): one CTA an SM
  either way (two would need twice that), so one wave of 132 CTAs, one CTA an SM;
- registers (sm_90a, nvcc 13.0, the build's flags; theirs lowered from their source at hidden 7168, 132 partials, no
  mask, no PDL): ours 219, theirs 255 with an 8-byte stack frame; both keep a thread's grad_w in registers (112
  floats: their whole row, our 28 kept groups), and one 256-thread CTA an SM allows 255, so no limit binds;
- PDL: ours waits at entry and lets the next call launch at entry; TileKernels' is launched without it (get_pdl() is
  False by default). Back to back, the next call's CTAs cannot take an SM this one holds (one CTA an SM), but they
  can start their prologue on an SM that finished (the empty CTA's and the 2-token CTA's SMs at once).
So the cheap levers are PDL and the tiling: how far ahead each pass keeps loads in flight.
Candidates (tilings "k<keep>d<depth>v<ahead>", kernels_src/engram/gate_bwd.py; 6.5 KB a kept group + 4 KB a ring slot,
at most 226 KB; every one adds in the shipped order, so its outputs are ctl's bytes, which the run checks):
  ctl          k28d11v16, the shipped kernel (its cubin must be prebuilt/sm90's: checked at build and run)
  nopdl        ctl's cubin launched without PDL (as TileKernels launches its own)
  k28d11v14    2 fewer go groups in flight in the dL/dg pass
  k28d11v18    2 more
  k28d11v20    4 more
  k28d10v16    one ring slot fewer in the grad_x pass (9 x / k groups ahead, 4 KB less shared memory)
  waitonly     ctl without griddepcontrol.launch_dependents at its entry (still launched with PDL): the next call's
               CTAs launch as this one ends, not onto the SMs this one leaves idle early
  k27d12v16    one more ring slot, the last of 28 groups through the plain loop (go read again, grad_w in the partial)

On a CPU with TileLang and nvcc (a few seconds a candidate):

    python -m bench.tuning.tune_gatebwd9 build --out tune-artifacts/gatebwd9 [--only k28d11v14,nopdl]

then on the GPU, from the tree's root with PYTHONPATH set to it (tile_kernels importable):

    python -m bench.tuning.tune_gatebwd9 --artifacts tune-artifacts/gatebwd9 --out DIR [--budget S]

The run, in a child process watched by this one (bench/tuning/watch.py: a candidate silent for STALL_S seconds, a hung
kernel, is killed and the run goes on without it; everything stops at --budget seconds, 140 by default):
1. checks each candidate through the op (tkaot.engram.engram_gate_bwd, the candidate's launcher put in the op's kernel
   table, the op's outputs allocated NaN-filled) at 1, 3, 127, 4097 and 8192 tokens of 4 x 7168, 1000 tokens with
   30% image tokens and 300 tokens of 4 x 7424 (past the kept groups): every byte of grad_hidden_states, grad_kv and
   grad_w_partial against ctl's (and no NaN left), ctl's against TileKernels' (every case but 7424, while the run
   is under TK_CHECK_S seconds);
2. times (8192 x 4 x 7168, CUDA-graph replay over 2 rotating input sets of 190 MB each, beyond the 50 MB L2,
   bench.timing) each candidate and TileKernels twice, the second pass in the reverse order, the outputs' bytes
   checked again.
Prints each row as it is timed and a table last (candidate, µs (the passes' mean), both passes, ratio to TileKernels,
ratio to ctl, verdict); writes DIR/tune_gatebwd9.log.
"""

import argparse
import contextlib
import functools
import hashlib
import json
import math
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

from bench.tuning.watch import ROW, Log, child_start, run_child, started, with_reruns

ARTIFACTS = "tune-artifacts/gatebwd9"
KERNEL = "engram_gate_bwd"
CONTROL = "ctl"
SHIPPED = "k28d11v16"
HC, HIDDEN = 4, 7168
EPS, CLAMP = 1e-20, 1e-6


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    tiling: str
    artifacts: str = ""  # a launch-only candidate: another candidate's artifact set
    pdl: bool | None = None  # None: as the manifest says (the op's launch)
    trigger: bool = True  # griddepcontrol.launch_dependents at entry (False: none, so the next call launches at exit)
    note: str = ""


CANDIDATES = (
    Candidate(CONTROL, SHIPPED, note="the shipped kernel (cubin = prebuilt/sm90's)"),
    Candidate("nopdl", SHIPPED, artifacts=CONTROL, pdl=False, note="ctl's cubin launched without PDL"),
    Candidate("k28d11v14", "k28d11v14", note="2 fewer go groups ahead in the dL/dg pass"),
    Candidate("k28d11v18", "k28d11v18", note="2 more go groups ahead"),
    Candidate("k28d11v20", "k28d11v20", note="4 more go groups ahead"),
    Candidate("k28d10v16", "k28d10v16", note="a ring slot fewer in the grad_x pass"),
    Candidate("waitonly", SHIPPED, trigger=False, note="ctl without launch_dependents at entry: the next call launches as this one ends"),
    Candidate("k27d12v16", "k27d12v16", note="a ring slot more, the 28th group through the plain loop"),
)  # fmt: skip
NAMES = tuple(c.name for c in CANDIDATES)


# ---- build (CPU)


def _wait_only():
    """kernels_src.pdl.kernel_entry without griddepcontrol.launch_dependents."""
    import tilelang.language as T

    from kernels_src.pdl import PDL_SOURCE

    @T.macro
    def entry(extra_source: str = ""):
        T.import_source(PDL_SOURCE + extra_source)
        T.call_extern("int32", "tkaot_pdl_wait")

    return entry


@contextlib.contextmanager
def _declared(tiling: str, trigger: bool = True):
    """The kernel declared with `tiling` as its only (default) tiling for the length of a build; trigger False: its
    entry without launch_dependents."""
    import kernels_src.engram.gate_bwd as source
    from build_tools import ops
    from tkaot._decl import KernelDecl, tiling_axis

    base = ops.DECLARATIONS[KERNEL]
    fields = {name: getattr(base, name) for name in KernelDecl._fields}
    tilings = {"default": tiling}
    axes = tuple(tiling_axis(tilings) if a.name == "tiling" else a for a in base.axes)
    decl = KernelDecl(**{**fields, "axes": axes, "tilings": tilings})
    saved = source.DECL, source.kernel_entry
    ops.DECLARATIONS[KERNEL] = source.DECL = decl
    if not trigger:
        source.kernel_entry = _wait_only()
    try:
        yield
    finally:
        ops.DECLARATIONS[KERNEL] = base
        source.DECL, source.kernel_entry = saved


def _variant(artifacts: Path, name: str, tiling: str) -> dict:
    return next(e for e in json.loads((artifacts / name / "manifest.json").read_text())["variants"] if e["key"] == f"tiling={tiling}")


def _ctl_identical(artifacts: Path, root: Path) -> str:
    """Whether ctl's cubin is prebuilt/sm90's (the manifest's hash and the file's bytes)."""
    key = f"tiling={SHIPPED}"
    variants = json.loads((root / "prebuilt/sm90/manifest.json").read_text())["variants"]
    shipped = {e["key"]: e["cubin"] for e in variants if e["kernel"] == KERNEL}
    digest = shipped.get(key)
    mine = _variant(artifacts, CONTROL, SHIPPED)["cubin"]
    path = artifacts / CONTROL / "cubins" / f"{mine}.cubin"
    data = path.read_bytes() if path.is_file() else b""
    prebuilt = root / "prebuilt/sm90/cubins" / f"{digest}.cubin"
    same = mine == digest and hashlib.sha256(data).hexdigest() == digest and (not prebuilt.is_file() or prebuilt.read_bytes() == data)
    return f"ctl cubin ({key}) {'identical to' if same else 'DIFFERS from'} prebuilt/sm90's ({digest[:12] if digest else 'not in it'})"


def build(out: Path, only: tuple[str, ...] = ()) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tune-gatebwd9-cache-") as cache:
        for c in CANDIDATES:
            if c.artifacts or (only and c.name not in only):
                continue
            t = time.perf_counter()
            try:
                with _declared(c.tiling, c.trigger):
                    variant = Variant.make(KERNEL, {"tiling": c.tiling})
                    build_variants([variant], out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name))
            except Exception as exc:  # a candidate that fails to build is reported, not fatal
                print(f"{c.name:10s} NOT BUILT: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
                continue
            entry = _variant(out, c.name, c.tiling)
            print(f"{c.name:10s} built in {time.perf_counter() - t:5.1f} s: block {entry['launch']['block'][0]}, "
                  f"{entry['launch']['smem']} B shared  ({c.note})", flush=True)  # fmt: skip
    if (out / CONTROL / "manifest.json").is_file():
        print(_ctl_identical(out, Path.cwd()), flush=True)
    print(f"{out}: {time.perf_counter() - t0:.0f} s", flush=True)


# ---- check and time (GPU), in the child

# (tokens, hidden, image-token fraction, compared with TileKernels)
CHECKS = ((8192, HIDDEN, 0, True), (1, HIDDEN, 0, True), (3, HIDDEN, 0, True), (127, HIDDEN, 0, True), (4097, HIDDEN, 0, True),
          (1000, HIDDEN, 0.3, True), (300, 7424, 0, False))  # fmt: skip
TK_CHECK_S = 60  # TileKernels compiles a kernel a (hidden, mask): its masked check only within this many seconds
REPS = 60  # graph replays of 8 calls a timing (~0.35 s)
TOKENS, SETS = 8192, 2  # a set is 190 MB of inputs: two are past the 50 MB L2 many times over


def _launchers(artifacts: Path, say) -> dict:
    """{name: launcher for the op} for every candidate whose set loads."""
    from tkaot._engram import gate as op
    from tkaot._kernel import Kernel

    launchers = {}
    for c in CANDIDATES:
        set_dir = artifacts / (c.artifacts or c.name)
        try:
            e = _variant(artifacts, set_dir.name, c.tiling)
            kernel = Kernel(e["kernel"], e["key"], e["launch"], set_dir / "cubins" / f"{e['cubin']}.cubin", e["cubin"], set_dir.name)
            launchers[c.name] = kernel.bind(op._BWD.args, pdl=c.pdl)
        except Exception as exc:
            say(f"{c.name}: not loaded ({type(exc).__name__}: {exc})")
    return launchers


class _NanTorch(types.ModuleType):
    """torch for the op's module, its empty and empty_like filled with NaN (an output element left unwritten shows)."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        import torch

        return torch.empty(*args, **kwargs).fill_(math.nan)

    @staticmethod
    def empty_like(t, **kwargs):
        import torch

        return torch.empty_like(t, **kwargs).fill_(math.nan)


@contextlib.contextmanager
def _serving(launcher, poison: bool = False):
    """The op's launcher table with `launcher` in it (under the shipped tiling) for the current device; with poison
    the op's outputs are allocated NaN-filled."""
    import torch

    from tkaot._engram import gate as op
    from tkaot._engram import kernels

    table = op._BWD
    key = (torch.cuda.current_device(), kernels.GATE_BWD_TILINGS["default"])
    saved = table.cache.get(key)
    table.cache[key] = launcher
    saved_torch = op.torch
    if poison:
        op.torch = _NanTorch()
    try:
        yield
    finally:
        op.torch = saved_torch
        if saved is None:
            table.cache.pop(key, None)
        else:
            table.cache[key] = saved


def _inputs(tokens: int, hidden: int, masked: float, seed: int) -> dict:
    import torch

    import tkaot

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").bfloat16()

    x, kv, go = randn(tokens, HC, hidden), randn(tokens, HC + 1, hidden), randn(tokens, HC, hidden)
    w = randn(HC, hidden).float() * randn(HC, hidden).float()
    mask = torch.rand(tokens, generator=gen, device="cuda") < masked if masked else None
    saved = [s.clone() for s in tkaot.engram.engram_gate_fwd(x, kv, w, EPS, CLAMP, True, mask)[1:]]
    return {"go": go, "x": x, "kv": kv, "w": w, "saved": saved, "mask": mask}


def _same(got, want) -> bool:
    import torch

    def raw(t):
        return t.contiguous().view(torch.uint8)

    return all(g.shape == w.shape and torch.equal(raw(g), raw(w)) for g, w in zip(got, want))


def _nan_left(got) -> bool:
    return any(bool(g.float().isnan().any()) for g in got)


class Run:
    """The child's state: the candidates' launchers and TileKernels (if it imports)."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.say = say
        self.kernels = {name: k for name, k in _launchers(artifacts, say).items() if name not in skip}
        self.start = time.perf_counter()
        tk = None
        if "TK" in skip:
            say("TileKernels skipped (it hung before): no TK columns")
        else:
            try:
                import tile_kernels as tk
            except ImportError as exc:
                say(f"TileKernels not importable ({exc}): no TK columns")
        self.tk = tk

    def ours(self, name: str, a: dict, poison: bool = True):
        import torch

        import tkaot

        with _serving(self.kernels[name], poison):
            got = tkaot.engram.engram_gate_bwd(a["go"], a["x"], a["kv"], a["w"], *a["saved"], CLAMP, a["mask"])
        torch.cuda.synchronize()
        return got

    def theirs(self, a: dict):
        import torch

        got = self.tk.engram.engram_gate_bwd(a["go"], a["x"], a["kv"], a["w"], *a["saved"], CLAMP, a["mask"])
        torch.cuda.synchronize()
        return got


def check(run: Run) -> None:
    """Phase 1: every candidate's bytes against ctl's, ctl's against TileKernels'."""
    import torch

    say, bad, done = run.say, 0, 0
    failed = dict.fromkeys(run.kernels, 0)
    for i, (tokens, hidden, masked, with_tk) in enumerate(CHECKS):
        case = f"{tokens}x{HC}x{hidden}{f' {masked:.0%} image' if masked else ''}"
        a = _inputs(tokens, hidden, masked, seed=100 + i)
        outs = {}
        for name in run.kernels:  # each announced: a candidate that hangs or faults is named, and rerun without
            started(name, f"check {case}")
            outs[name] = run.ours(name, a)
        want = outs.get(CONTROL)
        for name, got in outs.items():
            done += 1
            if want is None:
                break
            if name != CONTROL and not _same(got, want):
                bad += 1
                failed[name] += 1
                diff = [int((g.view(torch.uint8) != w.view(torch.uint8)).sum()) for g, w in zip(got, want)]
                say(f"check {name} {case}: DIFFERS from ctl (bytes differing in grad_x, grad_kv, grad_w_partial: {diff})")
            if _nan_left(got):
                bad += 1
                failed[name] += 1
                say(f"check {name} {case}: NaN left (an element not written)")
        tk_time = not masked or time.perf_counter() - run.start < TK_CHECK_S
        if run.tk is not None and want is not None and with_tk and tk_time:
            started("TK", f"check {case}")
            theirs = run.theirs(a)
            done += 1
            if not _same(want, theirs):
                bad += 1
                say(f"check ctl {case}: DIFFERS from TileKernels")
        del a, outs
        torch.cuda.empty_cache()
    for name, n in failed.items():
        say(f"check {name:10s} {'every output = ctl' if not n else f'{n} of {len(CHECKS)} cases WRONG'} ({len(CHECKS)} cases)")
    say(f"checks: {done} outputs, {bad} mismatches (candidates against ctl, ctl against TileKernels)")


def measure(run: Run, emit) -> None:
    """Phase 2: each candidate and TileKernels timed twice at 8192 x 4 x 7168, the second pass reversed; emit a row
    (name, shape, µs, passes, verdict) for each."""
    import torch

    from bench.timing import device_us

    shape = f"{TOKENS}x{HC}x{HIDDEN}"
    inputs = [_inputs(TOKENS, HIDDEN, 0, seed=1000 + s) for s in range(SETS)]
    calls = {}
    for name, launcher in run.kernels.items():

        def call(a, launcher=launcher):
            import tkaot

            with _serving(launcher):
                return tkaot.engram.engram_gate_bwd(a["go"], a["x"], a["kv"], a["w"], *a["saved"], CLAMP)

        calls[name] = call
    if run.tk is not None:
        calls["TK"] = lambda a: run.tk.engram.engram_gate_bwd(a["go"], a["x"], a["kv"], a["w"], *a["saved"], CLAMP)
    outs = {}
    for label, call in calls.items():
        started(label, shape)
        outs[label] = call(inputs[0])
        torch.cuda.synchronize()
    times: dict = {label: [] for label in calls}
    for order in (list(calls), list(reversed(calls))):
        for label in order:
            started(label, shape)
            times[label].append(device_us(calls[label], inputs, reps=REPS)[0])
    for label, (a, b) in times.items():
        verdicts = []
        if CONTROL in outs and label != CONTROL:
            verdicts.append("=ctl" if _same(outs[label], outs[CONTROL]) else "DIFFERS from ctl")
        if "TK" in outs and label != "TK":
            verdicts.append("=TK" if _same(outs[label], outs["TK"]) else "DIFFERS from TK")
        emit((label, shape, (a + b) / 2, f"{a:.2f}/{b:.2f}", " ".join(verdicts) or "-"))


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
    return f"{name:10s} {shape:14s} {us:8.2f} {passes:>15s} {to_tk} {to_ctl}  {verdict}"


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    import torch

    start = time.perf_counter()
    deadline = start + total_s
    out.mkdir(parents=True, exist_ok=True)
    say = Log()
    rows: dict = {}
    say(f"tune_gatebwd9: {torch.cuda.get_device_name()}, artifacts {artifacts}, budget {total_s:.0f} s; candidates: "
        + ", ".join(f"{c.name} ({c.note})" for c in CANDIDATES))  # fmt: skip

    def one(skip: list[str]) -> str | None:
        def on_row(row) -> None:
            rows.setdefault(row[0], row)  # a rerun's repeat of a row keeps the first
            say(f"{row[0]:10s} {row[1]:14s} {row[2]:8.2f} {row[3]:>15s}  {row[4]}")

        stop = run_child("bench.tuning.tune_gatebwd9", "all", artifacts, skip, deadline, say, on_row,
                         stall_s=lambda name: TK_STALL_S if name in ("load", "TK") else STALL_S,
                         on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True))  # fmt: skip
        if stop is None:
            return None
        name, what, how = stop
        say(f"{how} in {name} at {what or '-'}")
        return name if name in NAMES or name in ("check", "TK") else None  # rerun without it

    with_reruns("tune_gatebwd9", deadline, say, one)  # a rerun checks and times what is left
    base = {name: row[2] for name, row in rows.items()}
    say(f"\n{'candidate':10s} {'shape':14s} {'µs':>8s} {'passes':>15s} {'/TK':>6s} {'/ctl':>6s}  outputs ({TOKENS} tokens)")
    for row in rows.values():
        say(_line(row, base))
    say(f"{time.perf_counter() - start:.0f} s")
    (out / "tune_gatebwd9.log").write_text("\n".join(say.lines) + "\n")


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
        print("tune_gatebwd9: no GPU here; nothing timed (the build runs on a CPU: `build --out DIR`)")
        return
    time_candidates(args.artifacts, args.out, args.budget)


if __name__ == "__main__":
    main()
