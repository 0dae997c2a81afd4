"""Time the Engram gate forward's candidates beside the one shipped before them and TileKernels, with the backward
(shipped and BWD_CANDIDATES) and grad_w_reduce as shipped, at the bench shapes of bench/cases/engram.py.

Forward candidates are values of engram_gate_fwd's `tiling` axis ("c<ctas>s<stages>x<slice>",
kernels_src/engram/gate_fwd.py: one warp a CTA over consecutive tokens of one head, cp.async ring of `stages`
slots of 1024 elements). The control is the kernel shipped before them, built from its source at commit
CONTROL_COMMIT (read with git at build time, into a module that lives for the build only).
`build` declares them all for the length of one build (in this process, -j 1) and writes one artifact set:

    python -m bench.tuning.tune_engram2 build --out tune-artifacts/engram2
    TKAOT_PATH=$PWD/tune-artifacts/engram2 python -m bench.tuning.tune_engram2 --out tune-results/engram2

Each forward candidate's outputs (out, and with save_for_backward dot / gate_score / rstd_x / rstd_k) are first
compared bit for bit with TileKernels' on the same inputs, then timed by CUDA-graph replay over rotating input
sets larger than L2 (bench.timing.device_us). A masked row checks the image-token path against the same
candidate unmasked (masked rows: out = x and zeros saved; the others: the unmasked bytes). The table comes last;
the log (one JSON line a row) goes to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

# Session 11's first default, its weights read a chunk at a time behind a guard: 563 µs, 9.94 at 1 token. Named
# c1585: a key of its own beside the candidates, the same grid (1585 // 4 = 1584 // 4 runs) at hc_mult 4
CONTROL = "c1585s2x28"
CONTROL_COMMIT = "73960df"
# default (an item's weights read before its wait); 3 and 4 slots (10 and 9 CTAs an SM fit their shared memory),
# with the chunk-at-a-time weights 597 / 10.34 and 624 / 9.98 µs. Dropped: c1584s14x28 (878 / 10.68 µs)
CANDIDATES = ("c1584s2x28", "c1320s3x28", "c1188s4x28")
# Measured before (8192x4x7168, TileKernels 402 µs, H200): register rings w4x28b6 591-603 (14.5 µs at 1 token),
# w4x32b8 620, w4x32b4 801, w2x32b8 772, w4x32b12 898 µs;
# cp.async a row a CTA: a28d4 774, a28d8 931, a0d8 621 µs (23 µs at 1 token). Backward: k32d8 1472, k28d8 1458,
# k32d4 1759 µs against k28d12 1225 (TileKernels 667).
# Backward candidates (kernels_src/engram/gate_bwd.py "k<keep>d<depth>c"): the kept groups' loads by cp.async into
# shared memory in place of the spilling register rings (k28d12: 255 registers, 32 bytes spilled; k28d12c: 219, none,
# but TileLang's inserted barriers: two a group), unmeasured in session 11
BWD_CANDIDATES = ("k28d12c", "k28d8c")
TOKENS, HC, HIDDEN = 8192, 4, 7168
EPS, CLAMP = 1e-20, 1e-6
SHAPES = ((TOKENS, False), (TOKENS, True), (1, False))  # (tokens, save_for_backward)
CONTROL_MODULE = "bench.tuning._engram2_control"


def declare(source, tilings: dict, module_name: str, base) -> None:
    """Declare `base`'s kernel for the length of this process's build, with these tilings, built from `module_name`."""
    from build_tools import ops
    from tkaot._decl import KernelDecl, tiling_axis

    fields = {name: getattr(base, name) for name in KernelDecl._fields}
    axes = tuple(tiling_axis(tilings) if a.name == "tiling" else a for a in base.axes)
    decl = KernelDecl(**{**fields, "source": module_name, "axes": axes, "tilings": tilings})
    ops.DECLARATIONS[decl.name] = source.DECL = decl


def build_control(commit: str, path: str, module_name: str, tiling: str, base, out: str) -> int:
    """Build the kernel `base` declares from its source at `commit` (read with git into a module that lives for the
    build only) as tiling `tiling` into `out`; the number of variants built (not from the cache)."""
    import importlib

    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants

    control_file = Path(__file__).with_name(module_name.rsplit(".", 1)[1] + ".py")
    old = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=True)
    try:
        control_file.write_text(old.stdout)
        control = importlib.import_module(module_name)
        declare(control, {"default": tiling}, module_name, base)
        static = tuple((a.name, tiling if a.name == "tiling" else a.choices[0]) for a in base.axes)
        return build_variants([ops.Variant(base.name, static)], Path(out), "sm90", 1, BuildCache()).built
    finally:
        control_file.unlink(missing_ok=True)


def build(out: str) -> None:
    """Build the candidates, the control, the shipped backward and grad_w_reduce into `out`."""
    import kernels_src.engram.gate_bwd as bwd_source
    import kernels_src.engram.gate_fwd as fwd_source
    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from tkaot._engram.kernels import GATE_BWD, GATE_BWD_TILINGS, GATE_FWD, GRAD_W_REDUCE_TILINGS

    start = time.perf_counter()
    built = build_control(CONTROL_COMMIT, "kernels_src/engram/gate_fwd.py", CONTROL_MODULE, CONTROL, GATE_FWD, out)
    declare(fwd_source, {f"candidate{i}": t for i, t in enumerate(CANDIDATES)}, fwd_source.__name__, GATE_FWD)
    variants = [ops.Variant("engram_gate_fwd", (("tiling", t),)) for t in CANDIDATES]
    bwd = (GATE_BWD_TILINGS["default"], *BWD_CANDIDATES)
    declare(bwd_source, {f"candidate{i}": t for i, t in enumerate(bwd)}, bwd_source.__name__, GATE_BWD)
    variants += [ops.Variant("engram_gate_bwd", (("tiling", t),)) for t in bwd]
    variants += [ops.Variant("engram_grad_w_reduce", (("dtype", "bfloat16"), ("tiling", GRAD_W_REDUCE_TILINGS["default"])))]
    report = build_variants(variants, Path(out), "sm90", 1, BuildCache())
    print(f"built {built + report.built}, from cache {report.cached} -> {out} in {time.perf_counter() - start:.0f} s")


def _inputs(tokens: int, sets: int, gen: torch.Generator) -> list[dict]:
    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    w = randn(HC, HIDDEN).float() * randn(HC, HIDDEN).float()
    return [{"x": randn(tokens, HC, HIDDEN), "kv": randn(tokens, HC + 1, HIDDEN), "w": w} for _ in range(sets)]


def _same(got, want) -> bool:
    pairs = [(g, w) for g, w in zip(got, want) if w is not None]
    return all(g is not None and g.shape == w.shape and torch.equal(g.view(torch.int8), w.view(torch.int8)) for g, w in pairs)


def _timed(name: str, shape: str, run, inputs: list[dict], want, tk_us: float, log) -> tuple:
    """One row (candidate, shape, µs, TileKernels µs, identical): run's outputs against `want`, then its time."""
    from bench.timing import device_us

    try:
        got = run(inputs[0])
    except Exception as exc:  # not built, or a launch error: the row says which
        return (name, shape, float("nan"), tk_us, type(exc).__name__)
    same = "n/a" if want is None else "yes" if _same(got, want) else "NO"
    us = device_us(run, inputs)[0]
    log.write(json.dumps({"candidate": name, "shape": shape, "us": us, "tk_us": tk_us, "identical": same}) + "\n")
    return (name, shape, us, tk_us, same)


def _beside(tk, run, inputs: list[dict]) -> tuple:
    """TileKernels' outputs on inputs[0] and its time (None and nan without it)."""
    from bench.timing import device_us

    if tk is None:
        return None, float("nan")
    want = tuple(w if w is None else w.clone() for w in run(tk)(inputs[0]))  # cloned: an in-place op's timing updates them
    return want, device_us(run(tk), inputs)[0]


def _fwd_rows(tk, log, gen, shapes=None) -> list[tuple]:
    """Each (tokens, save_for_backward, tilings) of `shapes` (SHAPES with the control and CANDIDATES by default):
    TileKernels, then each tiling, then the op as shipped, on the same inputs."""
    import tkaot
    from tkaot._engram import kernels

    shipped = dict(kernels.GATE_FWD_TILINGS)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for tokens, save, tilings in shapes or [(tokens, save, (CONTROL, *CANDIDATES)) for tokens, save in SHAPES]:
        per_set = tokens * (2 * HC + HC + 1) * HIDDEN * 2 + HC * HIDDEN * 4
        inputs = _inputs(tokens, min(64, max(2, -(-3 * l2 // per_set))), gen)
        shape = f"{tokens}x{HC}x{HIDDEN}{' save' if save else ''}"

        def run(lib, save=save):
            return lambda a: lib.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, save)

        want, tk_us = _beside(tk, run, inputs)
        for tiling in tilings:
            kernels.GATE_FWD_TILINGS = {"default": tiling}  # the op reads its tiling here at every call
            rows.append(_timed(tiling, shape, run(tkaot), inputs, want, tk_us, log))
        kernels.GATE_FWD_TILINGS = shipped
        rows.append(_timed("shipped", shape, run(tkaot), inputs, want, tk_us, log))
        del inputs
        torch.cuda.empty_cache()
    if shapes is None:
        rows += _masked_rows(gen, log, (CONTROL, *CANDIDATES))
    kernels.GATE_FWD_TILINGS = shipped
    return rows


def _masked_rows(gen, log, tilings: tuple, tokens: int = 1000) -> list[tuple]:
    """The image-token path (saved, and in place) of each candidate against the same candidate unmasked: masked
    rows pass x and save zeros, the others keep the unmasked bytes (TileKernels' mask variant is not compiled
    here: its JIT would cost the time budget; the parity suite compares it)."""
    import tkaot
    from tkaot._engram import kernels

    a = _inputs(tokens, 1, gen)[0]
    mask = torch.rand(tokens, generator=gen, device="cuda") < 0.3
    shipped = dict(kernels.GATE_FWD_TILINGS)
    rows = []
    for tiling in tilings:
        kernels.GATE_FWD_TILINGS = {"default": tiling}
        try:
            plain = tkaot.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, True)
            masked = tkaot.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, True, mask)
            in_place = a["x"].clone()
            tkaot.engram.engram_gate_fwd(in_place, a["kv"], a["w"], EPS, CLAMP, False, mask, True)
        except Exception as exc:  # not built, or a launch error
            rows.append((tiling, f"{tokens} masked (self)", float("nan"), float("nan"), type(exc).__name__))
            continue
        want = torch.where(mask[:, None, None], a["x"], plain[0])
        saved = [torch.where(mask[:, None], torch.zeros_like(s), s) for s in plain[1:]]
        same = "yes" if _same(masked, (want, *saved)) and _same((in_place,), (want,)) else "NO"
        log.write(json.dumps({"candidate": tiling, "shape": f"{tokens} masked", "identical": same}) + "\n")
        rows.append((tiling, f"{tokens} masked (self)", float("nan"), float("nan"), same))
    kernels.GATE_FWD_TILINGS = shipped
    return rows


def _bwd_rows(tk, log, gen, tilings: tuple) -> list[tuple]:
    import tkaot
    from tkaot._engram import kernels

    inputs = _inputs(TOKENS, 2, gen)  # 2.6 GB a set: two sets are past the L2 many times over
    for a in inputs:
        a["go"] = torch.randn(TOKENS, HC, HIDDEN, generator=gen, device="cuda").bfloat16()
        a["saved"] = tkaot.reference.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, True, None)[1:]

    def run(lib):
        return lambda a: lib.engram.engram_gate_bwd(a["go"], a["x"], a["kv"], a["w"], *a["saved"], CLAMP)

    want, tk_us = _beside(tk, run, inputs)
    shipped = dict(kernels.GATE_BWD_TILINGS)
    rows = []
    for tiling in tilings:
        kernels.GATE_BWD_TILINGS = {"default": tiling}  # the op reads its tiling here at every call
        rows.append(_timed(tiling, f"{TOKENS}x{HC}x{HIDDEN} bwd", run(tkaot), inputs, want, tk_us, log))
    kernels.GATE_BWD_TILINGS = shipped
    del inputs
    torch.cuda.empty_cache()
    return rows


def _reduce_rows(tk, log, gen, tilings: tuple) -> list[tuple]:
    """grad_w_reduce updates its gradients in place: each call runs on clones, compared on the two gradients."""
    import tkaot
    from tkaot._engram import kernels

    partials = torch.cuda.get_device_properties(0).multi_processor_count
    sets = -(-3 * torch.cuda.get_device_properties(0).L2_cache_size // (partials * HC * HIDDEN * 4))

    def make():
        wh, we = (torch.randn(HC, HIDDEN, generator=gen, device="cuda").bfloat16() for _ in range(2))
        p = torch.randn(partials, HC, HIDDEN, generator=gen, device="cuda")
        gh, ge = (torch.randn(HC, HIDDEN, generator=gen, device="cuda") for _ in range(2))
        return {"p": p, "wh": wh, "we": we, "gh": gh, "ge": ge}

    inputs = [make() for _ in range(min(64, sets))]

    def run(lib):
        def call(a):
            lib.engram.grad_w_reduce(a["p"], a["wh"], a["we"], a["gh"], a["ge"])
            return a["gh"], a["ge"]

        return call

    pristine = {k: v.clone() for k, v in inputs[0].items()}
    want, tk_us = _beside(tk, run, inputs)  # TileKernels' timing updates inputs[0]
    shipped = dict(kernels.GRAD_W_REDUCE_TILINGS)
    rows = []
    for tiling in tilings:
        inputs[0] = {k: v.clone() for k, v in pristine.items()}  # each first call starts from TileKernels' first values
        kernels.GRAD_W_REDUCE_TILINGS = {"default": tiling}  # the op reads its tiling here at every call
        rows.append(_timed(tiling, f"{partials}x{HC}x{HIDDEN} fp32", run(tkaot), inputs, want, tk_us, log))
    kernels.GRAD_W_REDUCE_TILINGS = shipped
    return rows


def _rows(tk, log, gen) -> list[tuple]:
    from tkaot._engram import kernels

    bwd = (kernels.GATE_BWD_TILINGS["default"], *BWD_CANDIDATES)
    return _fwd_rows(tk, log, gen) + _bwd_rows(tk, log, gen, bwd) + _reduce_rows(tk, log, gen, (kernels.GRAD_W_REDUCE_TILINGS["default"],))


def cli(doc: str, build_fn, rows_fn, log_name: str) -> None:
    """`build --out DIR` runs build_fn(DIR); `[run] --out DIR` times rows_fn(tk, log, gen)'s rows (log_name in DIR)
    and prints their table last."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("run", "build"), default="run")
    parser.add_argument("--out", required=True, help="run: the log's folder; build: the artifact set's")
    args = parser.parse_args()
    if args.command == "build":
        build_fn(args.out)
        return
    try:
        import tile_kernels as tk
    except Exception as exc:  # not installed, or no TileLang: the TileKernels columns stay empty
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})")
        tk = None
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    with open(out / log_name, "w") as log:
        rows = rows_fn(tk, log, gen)
    print(f"{torch.cuda.get_device_name()}, {time.perf_counter() - start:.0f} s")
    print(f"{'candidate':12s} {'shape':22s} {'µs':>9s} {'TK µs':>9s} {'ratio':>6s}  identical")
    for name, shape, us, tk_us, same in rows:
        print(f"{name:12s} {shape:22s} {us:9.2f} {tk_us:9.2f} {us / tk_us:6.3f}  {same}")


if __name__ == "__main__":
    cli(__doc__, build, _rows, "tune_engram2.jsonl")
