"""One-token latency, round 1: candidates of engram_gate_fwd and mhc_pre_big_fuse_split (the op's kernel for few
tokens) that shorten the one-token critical path, timed beside the shipped kernels and TileKernels at 1 token.

Why (H200, bench.run's rows at 1 token): engram_gate_fwd 1x4x7168 inference ~1.05x TileKernels (5.53 µs against
5.20 in round 13's run); mhc_pre_big_fuse_fwd 1x4x7168, 16 splits, 20 repeats 4.89 against 4.84 (1.012x).

What the one token's path is (sm_90 SASS: the shipped cubins of prebuilt/sm90; TileKernels' kernels lowered for sm_90
at the bench's arguments and compiled with the build's nvcc flags, so its JIT's own flags may differ a little):

engram_gate_fwd. Both launch one warp a (token, head): 4 working CTAs of 32 threads at 1 token (TileKernels launches
4 x 396 CTAs, all but 4 leave at once; ours 4). Both stage k and x through 2 slots of 1024 elements by cp.async, so
the one warp runs 7 items of pass 1 then 7 of pass 2 one after another: its time is the items' instruction stream.
TileKernels (hidden static): 80 registers, 1137 instructions, first global load at instruction 50, no PDL; pass-1
loop 275 instructions an item (8 LDGSTS, 8 LDG of the weights, 11 LDS, 96 FFMA), pass-2 loop 201 an item. Ours
(c1584s2x28w): 144 registers, 2408 instructions, griddepcontrol.wait at instruction 1, first global load at 94;
the pass-1 loop 909 instructions (the whole-item and tested bodies; 44 LDGSTS, 12 LDG, 61 LDS, 192 FFMA), pass 2 493.
No dependent global round trip separates them (the weights of the next item are read ahead in both); the difference
is the length of one warp's instruction stream and its waits, 14 items in a row.

Candidates "c<ctas>d<slice>w<warps>[o]" (kernels_src/engram/gate_fwd.py's decode form, for few tokens: the op would
take it below a token count): a CTA of `warps` warps a (token, head); all warps stage the token's whole row at once
(x, k and the fp32 weights an item of `warps` chunks a commit group, v's after; warp q stages chunk q of each item),
so every load is in flight from the start and the issue is shared; pass 1's three sums are independent chains, each
run by the lanes of one warp in TileKernels' order (warps 0, 1, 2: x*x, k*k, x*w*k; "o": all three in warp 0), an
item at a time behind a block barrier; the totals through shared memory; pass 2 by every warp over the chunks it
staged itself. Same sums in the same order: the shipped kernel's bytes (checked below). 72-82 KB of shared memory
a CTA. Where there are no more tokens than runs (the grid's y size, read from gridDim), a run is its own token and
the two integer divisions of the run bounds (about 40 instructions before the first load) are skipped. Built for
sm_90: c2048d28w4 92 registers, 1905 instructions, first global load at 120 in the code (the division's 40 not on
the one-token path), the pass-1 item loop 756 instructions for the three warps' whole and tested bodies together
(48 LDS, 192 FFMA; each warp runs its own third), 3 barriers in the code (one an item of pass 1, one for the totals,
one a token); c2048d28w4o 90 registers, 1756 instructions (item loop 622); c2048d32w8 82 registers, 2671
instructions (81936 B shared).

mhc_pre_big_fuse_split. TileKernels: one block of 96 threads a token (warp 0 reduces the mixes and runs post mix and
the Sinkhorn, warps 1-2 apply the pre mix), 55 registers, 1224 instructions, first global load at 15, no PDL. Ours:
4 blocks of 256 threads a token (every block reduces the mixes; block 0's warp 0 runs the Sinkhorn; warps 1-7 of
each block apply), 61 registers, 1530 instructions, first global load at 25. The Sinkhorn loop (20 repeats, one
matrix element a lane): TileKernels 186 instructions, ours 183 (40 FFMA each): both kernels' one-token path is the
Sinkhorn warp's chain (a round trip for the split partials, then 40 normalisations, each 2 dependent xor shuffles
and adds, then an IEEE division), the apply side being far shorter in ours (4 x 224 workers, one vector each).

Candidates (bench/tuning/tune_lat1_mhc.py; the same macros, so the same sums in the same order):
- "gather": each Sinkhorn row or column sum from the line's M values fetched by M independent shuffles, added in the
  butterfly's order (tree_sum): one shuffle latency a sum instead of two dependent ones (4 SHFL.IDX, 3 FADD);
  1693 instructions, the Sinkhorn loop 207 (unrolled by 4, as the shipped one);
- "alone": a fifth block a token runs only the mixes and the Sinkhorn (its other 7 warps leave at once), so the
  Sinkhorn warp shares its SM with no worker; 4 apply blocks as shipped; 1739 instructions;
- "gather_alone": both;
- "arrive": warp 0 of each block only arrives at the workers' barrier (bar.arrive on named barrier 1), so the
  Sinkhorn warp does not wait for its block's workers; 1542 instructions;
- "gather_arrive": both.
"ctl" is the shipped split kernel rebuilt through the candidates' builder with no change (the build checks its cubin
against prebuilt/sm90's).

The run (GPU, tile_kernels importable, prebuilt/ holding main's sm90 set) in a watched child (bench/tuning/watch.py):
every candidate's outputs byte for byte against the shipped kernel's on fresh inputs at 1, 3, 127 and 4097 tokens
(engram: inference and save_for_backward, and 30 % image tokens in place at 127; mhc: 16 splits, 20 repeats) and at
the timed shapes, the shipped kernel's against TileKernels' (where TileKernels is deterministic); then each at 1 token
(CUDA-graph replay over rotating inputs larger than L2, bench.timing.device_us), PASSES passes alternating the
order, the median of the passes; then engram at 16, 128 and 8192 tokens (one pass each: where a decode form would
stop serving) and mhc at 32 tokens (the op's split kernel serves up to 64 tokens; 8192 tokens run the one-block
kernel, which no candidate changes). At 1 token the rotating sets (64, bench.run's rule) fit in L2, as in the bench's
row: the one token's loads are L2 round trips. One table last.

    python -m bench.tuning.tune_lat1 build --out tune-artifacts/lat1                  (CPU: TileLang and nvcc)
    python -m bench.tuning.tune_lat1 --artifacts tune-artifacts/lat1 --out DIR         (GPU, 130 s budget)
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from bench.tuning.watch import ROW, Log, budget, run_child, started, stopped, with_reruns

ARTIFACTS = "tune-artifacts/lat1"
ENGRAM_SET = "engram"
ENGRAM_SHIPPED = "c1584s2x28w"  # tkaot/_engram/kernels.py's GATE_FWD_TILINGS["default"] (the build checks it)
ENGRAM = ("c2048d28w4", "c2048d28w4o", "c2048d32w8")
MHC_KERNEL, MHC_KEY = "mhc_pre_big_fuse_split", "mhc_mult=4"
MHC = {
    "gather": {"gather": True},
    "alone": {"alone": True},
    "gather_alone": {"gather": True, "alone": True},
    "arrive": {"arrive": True},
    "gather_arrive": {"gather": True, "arrive": True},
}
CHECK_TOKENS = (1, 3, 127, 4097)
HC, HIDDEN, SPLITS, REPEATS = 4, 7168, 16, 20
EPS, CLAMP = 1e-20, 1e-6
PASSES = 3  # timed passes at 1 token, the order alternating
TOTAL_S = 130  # the whole run, so that it ends within 150 s with its imports
STALL_S = 30  # a candidate silent this long is taken as hung (TileKernels' first calls compile: 90 s for them)


# ---- build (CPU)


def _sha(set_dir: Path, kernel: str, key: str) -> str | None:
    entries = json.loads((set_dir / "manifest.json").read_text())["variants"]
    return next((e["cubin"] for e in entries if e["kernel"] == kernel and e["key"] == key), None)


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


def _describe(set_dir: Path, kernel: str, key: str, label: str, prebuilt: str | None = None) -> None:
    entries = json.loads((set_dir / "manifest.json").read_text())["variants"]
    e = next(e for e in entries if e["kernel"] == kernel and e["key"] == key)
    regs = _registers((set_dir / "cubins" / f"{e['cubin']}.cubin").read_bytes())
    note = "" if prebuilt is None else ", = prebuilt/sm90" if e["cubin"] == prebuilt else ", DIFFERS from prebuilt/sm90"
    print(f"{label:16s} {e['cubin'][:12]}  {regs} registers, {e['launch']['smem']} B shared, block {e['launch']['block']}{note}")


def build(out: Path) -> None:
    import kernels_src.engram.gate_fwd as fwd_source
    import kernels_src.mhc.pre_big_fuse_split as split_source
    from bench.tuning.tune_engram2 import declare
    from bench.tuning.tune_lat1_mhc import make_build
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant
    from tkaot._engram.kernels import GATE_FWD, GATE_FWD_TILINGS

    if GATE_FWD_TILINGS["default"] != ENGRAM_SHIPPED:
        raise SystemExit(f"the shipped engram tiling is {GATE_FWD_TILINGS['default']}, this round measured {ENGRAM_SHIPPED}")
    t0 = time.perf_counter()
    prebuilt = Path("prebuilt/sm90")
    # a cache of its own: a patched builder does not change a kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-lat1-cache-") as cache:
        tilings = (ENGRAM_SHIPPED, *ENGRAM)
        declare(fwd_source, {f"t{i}": t for i, t in enumerate(tilings)}, fwd_source.__name__, GATE_FWD)
        variants = [Variant(GATE_FWD.name, (("tiling", t),)) for t in tilings]
        build_variants(variants, out / ENGRAM_SET, "sm90", jobs=1, cache=BuildCache(Path(cache) / ENGRAM_SET))
        shipped, configs = split_source.build, getattr(split_source, "PASS_CONFIGS", None)
        for name, opts in {"ctl": {}, **MHC}.items():
            split_source.build = make_build(**opts)
            split_source.PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}  # the candidates' barriers are their own
            try:
                variant = Variant.make(MHC_KERNEL, {"mhc_mult": 4})
                build_variants([variant], out / f"mhc-{name}", "sm90", jobs=1, cache=BuildCache(Path(cache) / name))
            finally:
                split_source.build = shipped
                if configs is None:
                    del split_source.PASS_CONFIGS
                else:
                    split_source.PASS_CONFIGS = configs
    for t in tilings:
        key = f"tiling={t}"
        _describe(out / ENGRAM_SET, GATE_FWD.name, key, t, _sha(prebuilt, GATE_FWD.name, key) if t == ENGRAM_SHIPPED else None)
    for name in ("ctl", *MHC):
        ctl = _sha(prebuilt, MHC_KERNEL, MHC_KEY) if name == "ctl" else None
        _describe(out / f"mhc-{name}", MHC_KERNEL, MHC_KEY, f"mhc {name}", ctl)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- the rows (GPU, in the child)


def _kernels(set_dir: Path) -> dict:
    """{(kernel, key): Kernel} of an artifact set."""
    from tkaot._kernel import Kernel

    entries = json.loads((set_dir / "manifest.json").read_text())["variants"]
    cubins = set_dir / "cubins"
    return {
        (e["kernel"], e["key"]): Kernel(e["kernel"], e["key"], e["launch"], cubins / f"{e['cubin']}.cubin", e["cubin"], set_dir.name)
        for e in entries
    }


def _engram_calls(artifacts: Path) -> dict:
    """name -> call(a, save, mask, inplace) of engram_gate_fwd: the shipped kernel (prebuilt/sm90) and each
    candidate, packed as tkaot/_engram/gate.py packs the op's launch."""
    import torch

    from tkaot._engram.kernels import GATE_FWD
    from tkaot._op import current_stream

    shipped = _kernels(Path("prebuilt/sm90"))[(GATE_FWD.name, f"tiling={ENGRAM_SHIPPED}")]
    built = _kernels(artifacts / ENGRAM_SET)
    kernels = {"shipped": shipped, **{t: built[(GATE_FWD.name, f"tiling={t}")] for t in ENGRAM}}

    def make(kernel):
        launch = kernel.bind(GATE_FWD.args)

        def call(a, save=False, mask=None, inplace=False):
            x, kv, w = a["x"], a["kv"], a["w"]
            tokens, hc, hidden = x.shape
            out = x if inplace else torch.empty_like(x)
            saved = [torch.empty(tokens, hc, device=x.device) for _ in range(4)] if save else []
            flags = (1 if save else 0) | (2 if mask is not None else 0) | (4 if inplace else 0)
            launch(
                x.device.index, current_stream(x.device.index), x.data_ptr(), kv.data_ptr(), w.data_ptr(),
                0 if mask is None else mask.data_ptr(), out.data_ptr(), *[s.data_ptr() for s in saved] or [0] * 4,
                EPS, CLAMP, hidden**-0.5, flags, tokens, hc, hidden,
            )  # fmt: skip
            return (out, *saved)

        return call

    return {name: make(k) for name, k in kernels.items()}


def _mhc_calls(artifacts: Path) -> dict:
    """name -> call(a) of the split kernel: the shipped one (prebuilt/sm90) and each candidate set's."""
    from tkaot._mhc.kernels import PRE_BIG_FUSE_SPLIT
    from tkaot._op import current_stream

    sets = {"shipped": Path("prebuilt/sm90"), **{name: artifacts / f"mhc-{name}" for name in MHC}}

    def make(set_dir):
        launch = _kernels(set_dir)[(MHC_KERNEL, MHC_KEY)].bind(PRE_BIG_FUSE_SPLIT.args)

        def call(a):
            device = a["residual"].device.index
            pointers = (a[k].data_ptr() for k in ("mul", "sq", "scale", "base", "residual", "post", "comb", "input"))
            launch(device, current_stream(device), *pointers, 1e-6, 1e-6, 1e-6, 2.0, REPEATS, SPLITS, a["residual"].shape[0], HIDDEN)
            return a["post"], a["comb"], a["input"]

        return call

    return {name: make(d) for name, d in sets.items()}


def _engram_inputs(tokens: int, sets: int, gen) -> list[dict]:
    import torch

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda").bfloat16()

    return [
        {"x": randn(tokens, HC, HIDDEN), "kv": randn(tokens, HC + 1, HIDDEN), "w": randn(HC, HIDDEN).float() * randn(HC, HIDDEN).float()}
        for _ in range(sets)
    ]  # fmt: skip


def _mhc_inputs(tokens: int, sets: int, gen) -> list[dict]:
    import torch

    def f32(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    m3 = HC * (HC + 2)
    return [
        {
            "mul": f32(SPLITS, tokens, m3), "sq": f32(SPLITS, tokens).abs() * 100, "scale": f32(3).abs(), "base": f32(m3),
            "residual": f32(tokens, HC, HIDDEN).bfloat16(), "post": f32(tokens, HC), "comb": f32(tokens, HC * HC),
            "input": f32(tokens, HIDDEN).bfloat16(),
        }
        for _ in range(sets)
    ]  # fmt: skip


def _sets(per_set: int) -> int:
    import torch

    return min(64, max(2, -(-3 * torch.cuda.get_device_properties(0).L2_cache_size // per_set)))


def _outputs(call, *args, **kw) -> tuple:
    """The call's outputs, cloned (output buffers the call writes into are poisoned with NaN first)."""
    import torch

    a = args[0]
    for k in ("post", "comb", "input"):
        if k in a:
            a[k].fill_(math.nan)
    got = call(*args, **kw)
    torch.cuda.synchronize()
    return tuple(g.clone() for g in got)


def _same(got, want) -> bool:
    import torch

    return len(got) == len(want) and all(
        g.shape == w.shape and torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want)
    )


def _checks(tk, calls: dict, engram: bool, gen, op: str) -> dict:
    """name -> "yes" / "NO (where)": each candidate's outputs against the shipped kernel's on fresh inputs, and the
    shipped kernel's against TileKernels' under "shipped"."""
    verdict = {name: [] for name in calls}
    cases = []
    for tokens in CHECK_TOKENS:
        if engram:
            a = _engram_inputs(tokens, 1, gen)[0]
            cases += [(f"{tokens}", (a,), {}), (f"{tokens} save", (a,), {"save": True})]
            if tokens == 127:
                import torch

                mask = torch.rand(tokens, generator=gen, device="cuda") < 0.3
                cases.append((f"{tokens} masked in place", (a,), {"mask": mask, "inplace": True}))
        else:
            cases.append((f"{tokens}", (_mhc_inputs(tokens, 1, gen)[0],), {}))
    for label, args, kw in cases:
        runs = {}
        for name, call in calls.items():
            started(f"{op}:{name}", f"check {label}")
            if kw.get("inplace"):  # each call on its own copy of x
                runs[name] = _outputs(call, {**args[0], "x": args[0]["x"].clone()}, **kw)
            else:
                runs[name] = _outputs(call, *args, **kw)
        want = runs["shipped"]
        for name, got in runs.items():
            if name != "shipped" and not _same(got, want):
                verdict[name].append(label)
        if tk is not None and "mask" not in kw:
            started("TK", f"check {label}")
            t = _tk_call(tk, engram)
            if not _same(_outputs(t, *args, **kw), want):
                verdict["shipped"].append(f"{label} vs TK")
    return {name: "yes" if not bad else "NO: " + ", ".join(bad) for name, bad in verdict.items()}


def _tk_call(tk, engram: bool):
    if engram:
        return lambda a, save=False, **_: tuple(
            o for o in tk.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, save) if o is not None
        )

    def call(a):
        tk.mhc.mhc_pre_big_fuse_fwd(
            a["mul"], a["sq"], a["scale"], a["base"], a["residual"], a["post"], a["comb"], a["input"],
            1e-6, 1e-6, 1e-6, 2.0, REPEATS, SPLITS,
        )  # fmt: skip
        return a["post"], a["comb"], a["input"]

    return call


def _timed(calls: dict, inputs: list[dict], shape: str, passes: int, op: str = "") -> dict:
    """name -> median over `passes` passes (the order reversed every other pass) of its device µs a call."""
    from bench.timing import device_us

    times = {name: [] for name in calls}
    order = list(calls)
    for p in range(passes):
        for name in order if p % 2 == 0 else order[::-1]:
            started(f"{op}:{name}" if op and name != "TK" else name, shape)
            times[name].append(device_us(calls[name], inputs)[0])
    return {name: statistics.median(ts) for name, ts in times.items()}


def _child(artifacts: Path, skip: tuple[str, ...]) -> None:
    import torch

    started("TK", "import")
    try:
        import tile_kernels as tk
    except Exception as exc:  # not importable: the TileKernels columns stay empty
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})", flush=True)
        tk = None
    gen = torch.Generator(device="cuda").manual_seed(0)

    def emit(name, shape, us, tk_us, same):
        print(ROW + json.dumps((name, shape, us, tk_us, same)), flush=True)

    for engram, calls in ((True, _engram_calls(artifacts)), (False, _mhc_calls(artifacts))):
        op = "engram" if engram else "mhc"
        calls = {n: c for n, c in calls.items() if f"{op}:{n}" not in skip}
        if tk is not None:  # TileKernels' first call compiles: before the watched rows
            started("TK", f"{op} compile")
            a = (_engram_inputs if engram else _mhc_inputs)(1, 1, gen)[0]
            _tk_call(tk, engram)(a)
            torch.cuda.synchronize()
        same = _checks(tk, calls, engram, gen, op)
        rows = ((1, PASSES), (16, 1), (128, 1), (8192, 1)) if engram else ((1, PASSES), (32, 1))
        for tokens, passes in rows:
            per_set = (
                tokens * (3 * HC + 1) * HIDDEN * 2 + HC * HIDDEN * 4 if engram else tokens * (HC + 1) * HIDDEN * 2 + tokens * SPLITS * 100
            )
            inputs = (_engram_inputs if engram else _mhc_inputs)(tokens, _sets(per_set), gen)
            shape = f"{op} {tokens}x{HC}x{HIDDEN}"
            # the timed shape's bytes too, on the first input set
            want = _outputs(calls["shipped"], inputs[0])
            timed_same = {n: "" if _same(_outputs(c, inputs[0]), want) else f"; NO at {tokens}" for n, c in calls.items()}
            timed = dict(calls)
            if tk is not None:
                started("TK", shape)
                timed["TK"] = _tk_call(tk, engram)
                if not _same(_outputs(timed["TK"], inputs[0]), want):
                    timed_same["shipped"] += f"; NO vs TK at {tokens}"
            us = _timed(timed, inputs, shape, passes, op)  # TileKernels in the same alternating passes
            tk_us = us.get("TK", math.nan)
            for name in calls:
                emit(f"{op}:{name}", shape, us[name], tk_us, same[name] + timed_same[name])
            del inputs
            torch.cuda.empty_cache()


# ---- the run (GPU): the child, watched


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    import torch

    from bench.tuning.tune_train2 import finish

    if not torch.cuda.is_available():
        print("no GPU: nothing to time (build runs here: `build --out DIR`)")
        return
    start, say, rows = time.perf_counter(), Log(), {}
    deadline = start + total_s

    def on_row(row: tuple) -> None:
        rows.setdefault(tuple(row[:2]), row)
        say(f"{row[0]:22s} {row[1]:24s} {row[2]:9.2f} µs  TK {row[3]:9.2f}  identical: {row[4]}")

    def run(skip: list[str]) -> str | None:
        stop = run_child(
            "bench.tuning.tune_lat1", "all", artifacts, skip, deadline, say, on_row,
            stall_s=lambda name: 90 if name in ("TK", "load", "check") else STALL_S,
        )  # fmt: skip
        return None if stop is None else stopped(stop, say, rows, 2)

    with_reruns("rows", deadline, say, run)
    table = [(name, shape, us, tk_us, us / tk_us if tk_us == tk_us else math.nan, same) for name, shape, us, tk_us, same in rows.values()]
    finish(say, table, start, out / "tune_lat1.log", say.lines, (22, 24, 9))


def main(argv=None) -> None:
    import argparse
    import sys

    from bench.tuning.tune_train2 import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        parser = argparse.ArgumentParser()
        parser.add_argument("part")
        parser.add_argument("--artifacts", type=Path, required=True)
        parser.add_argument("--skip", default="")
        args = parser.parse_args(argv[1:])
        started("load", "")
        _child(args.artifacts, tuple(s for s in args.skip.split(",") if s))
        return
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
