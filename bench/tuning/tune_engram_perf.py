"""Time the Engram gate's tiling candidates (forward, backward) and grad_w_reduce beside TileKernels, at the bench
shapes of bench/cases/engram.py.

The candidates are values of the kernels' `tiling` axes ("w<warps>x<slice>b<depth>", kernels_src/engram/gate_fwd.py;
"k<keep>d<depth>", kernels_src/engram/gate_bwd.py); the declarations ship only the defaults, so `build` declares
them all for the length of one build (in this process, -j 1) and writes them into an artifact set:

    python -m bench.tuning.tune_engram_perf build --out tune-artifacts/engram
    TKAOT_PATH=$PWD/tune-artifacts/engram python -m bench.tuning.tune_engram_perf --out tune-results/engram

Each candidate's outputs (forward: out, and with save_for_backward dot / gate_score / rstd_x / rstd_k; backward:
grad_hidden_states, grad_kv, grad_w_partial; grad_w_reduce: both gradients) are first compared bit for bit with
TileKernels' on the same inputs, then timed by CUDA-graph replay over rotating input sets larger
than L2 (bench.timing.device_us). The table comes last; the log (one JSON line a row) goes to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

# Forward candidates (kernels_src/engram/gate_fwd.py): the shipped w4x28b6 (register rings, 4 warps a CTA) and the
# one shipped before it, w4x32b8, as the control. Measured losers (8192x4x7168, TileKernels 402 µs): w4x32b4 801,
# w2x32b8 772, w4x32b12 898 µs; the cp.async form (one warp a CTA and a row a CTA, x/k/v/weight by cp.async into shared
# memory, nothing in flight in registers; session 10, H200): a28d4 774, a28d8 931, a0d8 621 µs, and 23 µs at 1 token
# (w4x28b6: 602 / 14.5) — deleted from the kernel source.
CANDIDATES = ("w4x28b6", "w4x32b8")
# Backward (one CTA an SM): 28 groups kept and 12 in flight (shipped, 255 registers, 32 bytes spilled); 32 kept, 8 in
# flight (shipped before). Measured losers (TileKernels 667 µs): k32d4 1759, k28d8 1458 µs.
BWD_CANDIDATES = ("k28d12", "k32d8")
TOKENS, HC, HIDDEN = 8192, 4, 7168
EPS, CLAMP = 1e-20, 1e-6
SHAPES = ((TOKENS, False), (TOKENS, True), (1, False))  # (tokens, save_for_backward)


def build(out: str) -> None:
    """Build every candidate and grad_w_reduce into `out`: the gate kernels declared with the candidates as their
    tilings, in this process only."""
    import kernels_src.engram.gate_bwd as bwd_source
    import kernels_src.engram.gate_fwd as fwd_source
    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from tkaot._decl import KernelDecl, tiling_axis
    from tkaot._engram.kernels import GATE_BWD, GATE_FWD

    variants = []
    for shipped, source, candidates in ((GATE_FWD, fwd_source, CANDIDATES), (GATE_BWD, bwd_source, BWD_CANDIDATES)):
        tilings = {f"candidate{i}": t for i, t in enumerate(candidates)}
        fields = {name: getattr(shipped, name) for name in KernelDecl._fields}
        decl = KernelDecl(**{**fields, "axes": (tiling_axis(tilings),), "tilings": tilings})
        ops.DECLARATIONS[decl.name] = source.DECL = decl
        variants += [ops.Variant(decl.name, (("tiling", t),)) for t in candidates]
    variants.append(ops.Variant("engram_grad_w_reduce", (("dtype", "bfloat16"),)))
    start = time.perf_counter()
    report = build_variants(variants, Path(out), "sm90", 1, BuildCache())
    print(f"built {report.built}, from cache {report.cached} -> {out} in {time.perf_counter() - start:.0f} s")


def _inputs(tokens: int, sets: int, gen: torch.Generator) -> list[dict]:
    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device="cuda").to(dtype)

    w = randn(HC, HIDDEN).float() * randn(HC, HIDDEN).float()
    return [{"x": randn(tokens, HC, HIDDEN), "kv": randn(tokens, HC + 1, HIDDEN), "w": w} for _ in range(sets)]


def _same(got, want) -> bool:
    pairs = [(g, w) for g, w in zip(got, want) if w is not None]
    return all(g is not None and g.shape == w.shape and torch.equal(g.view(torch.int8), w.view(torch.int8)) for g, w in pairs)


def _rows(tk, log) -> list[tuple]:
    import tkaot
    from bench.timing import device_us
    from tkaot._engram import gate

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for tokens, save in SHAPES:
        per_set = tokens * (2 * HC + HC + 1) * HIDDEN * 2 + HC * HIDDEN * 4
        inputs = _inputs(tokens, min(64, max(2, -(-3 * l2 // per_set))), gen)
        shape = f"{tokens}x{HC}x{HIDDEN}{' save' if save else ''}"

        def run(lib, save=save):
            return lambda a: lib.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, save)

        want = run(tk)(inputs[0]) if tk else None
        tk_us = device_us(run(tk), inputs)[0] if tk else float("nan")
        for tiling in CANDIDATES:
            gate.GATE_FWD_TILINGS = {"default": tiling}  # the op reads its tiling from here at every call
            try:
                got = run(tkaot)(inputs[0])
            except Exception as exc:  # not built, or a launch error: the row says which
                rows.append((tiling, shape, float("nan"), tk_us, f"{type(exc).__name__}"))
                continue
            same = "n/a" if want is None else "yes" if _same(got, want) else "NO"
            us = device_us(run(tkaot), inputs)[0]
            rows.append((tiling, shape, us, tk_us, same))
            log.write(json.dumps({"tiling": tiling, "shape": shape, "us": us, "tk_us": tk_us, "identical": same, "bytes": per_set}) + "\n")
        del inputs
        torch.cuda.empty_cache()
    gate.GATE_FWD_TILINGS = {"default": CANDIDATES[0]}
    return rows + _bwd_rows(tk, log, gen) + _reduce_rows(tk, log, gen)


def _bwd_rows(tk, log, gen) -> list[tuple]:
    import tkaot
    from bench.timing import device_us
    from tkaot._engram import gate

    inputs = _inputs(TOKENS, 2, gen)  # 2.6 GB a set: two sets are past the L2 many times over
    for a in inputs:
        a["go"] = torch.randn(TOKENS, HC, HIDDEN, generator=gen, device="cuda").bfloat16()
        a["saved"] = tkaot.reference.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, True, None)[1:]
    shape = f"{TOKENS}x{HC}x{HIDDEN} bwd"

    def run(lib):
        return lambda a: lib.engram.engram_gate_bwd(a["go"], a["x"], a["kv"], a["w"], *a["saved"], CLAMP)

    want = run(tk)(inputs[0]) if tk else None
    tk_us = device_us(run(tk), inputs)[0] if tk else float("nan")
    rows = []
    for tiling in BWD_CANDIDATES:
        gate.GATE_BWD_TILINGS = {"default": tiling}
        try:
            got = run(tkaot)(inputs[0])
        except Exception as exc:  # not built, or a launch error: the row says which
            rows.append((tiling, shape, float("nan"), tk_us, f"{type(exc).__name__}"))
            continue
        same = "n/a" if want is None else "yes" if _same(got, want) else "NO"
        us = device_us(run(tkaot), inputs)[0]
        rows.append((tiling, shape, us, tk_us, same))
        log.write(json.dumps({"tiling": tiling, "shape": shape, "us": us, "tk_us": tk_us, "identical": same}) + "\n")
    gate.GATE_BWD_TILINGS = {"default": BWD_CANDIDATES[0]}
    del inputs
    torch.cuda.empty_cache()
    return rows


def _reduce_rows(tk, log, gen) -> list[tuple]:
    import tkaot
    from bench.timing import device_us

    partials = torch.cuda.get_device_properties(0).multi_processor_count
    sets = -(-3 * torch.cuda.get_device_properties(0).L2_cache_size // (partials * HC * HIDDEN * 4))

    def make():
        wh, we = (torch.randn(HC, HIDDEN, generator=gen, device="cuda").bfloat16() for _ in range(2))
        p = torch.randn(partials, HC, HIDDEN, generator=gen, device="cuda")
        gh, ge = (torch.randn(HC, HIDDEN, generator=gen, device="cuda") for _ in range(2))
        return {"p": p, "wh": wh, "we": we, "gh": gh, "ge": ge}

    inputs = [make() for _ in range(min(64, sets))]

    def run(lib):
        return lambda a: lib.engram.grad_w_reduce(a["p"], a["wh"], a["we"], a["gh"], a["ge"])

    a = inputs[0]
    got = {k: v.clone() for k, v in a.items()}
    run(tkaot)(got)
    same = "n/a"
    if tk:
        want = {k: v.clone() for k, v in a.items()}
        run(tk)(want)
        same = "yes" if _same((got["gh"], got["ge"]), (want["gh"], want["ge"])) else "NO"
    tk_us = device_us(run(tk), inputs)[0] if tk else float("nan")
    us = device_us(run(tkaot), inputs)[0]
    shape = f"{partials}x{HC}x{HIDDEN} fp32"
    log.write(json.dumps({"tiling": "shipped", "shape": shape, "us": us, "tk_us": tk_us, "identical": same}) + "\n")
    return [("reduce", shape, us, tk_us, same)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("run", "build"), default="run")
    parser.add_argument("--out", required=True, help="run: the log's folder; build: the artifact set's")
    args = parser.parse_args()
    if args.command == "build":
        build(args.out)
        return
    try:
        import tile_kernels as tk
    except Exception as exc:  # not installed, or no TileLang: the TileKernels columns stay empty
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc})")
        tk = None
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tune_engram_perf.jsonl", "w") as log:
        rows = _rows(tk, log)
    print(f"{torch.cuda.get_device_name()}, {time.perf_counter() - start:.0f} s")
    print(f"{'candidate':10s} {'shape':22s} {'µs':>9s} {'TK µs':>9s} {'ratio':>6s}  identical")
    for tiling, shape, us, tk_us, same in rows:
        print(f"{tiling:10s} {shape:22s} {us:9.2f} {tk_us:9.2f} {us / tk_us:6.3f}  {same}")


if __name__ == "__main__":
    main()
