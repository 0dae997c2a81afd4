"""Round 2: time the Engram gate backward's and forward's candidates beside the kernels shipped before them and
TileKernels, at the bench shapes of bench/cases/engram.py (timed rows: bytes against TileKernels'), then check the
shipped defaults' bytes against their controls where TileKernels is not run (image tokens, other widths, few tokens).

Backward ("k<keep>d<depth>c", kernels_src/engram/gate_bwd.py): the control is main's k28d12c, built from its source
at CONTROL_COMMIT (TileLang's inserted barriers: two a kept group); k28d14c, the default, places its own barriers.
Forward ("c<ctas>s<stages>x<slice>[w]"): c1584s2x28 is the default (the kernel shipped before, the same CUDA
source); "w" reads an item's weights an item ahead, timed at 1, 128 and 8192 tokens. grad_w_reduce
("t<threads>r<rows>", default t224r132) and the Sinkhorn momentum ("t<threads>v<vec>x<reps>", default t128v4x2)
are checked byte for byte against the kernels shipped before them (t128r66, t128v8x1: the same CUDA sources).

Round 1 on the H200 (2026-12-02, µs, TileKernels beside): backward k28d12c 848.7, k28d14c 751.0, k28d14s 755.0,
k28d8s 764.1 (TK 665.9); grad_w_reduce t128r66 8.00, t224r132 7.74, t256r132 7.73, t128r132 7.80 (TK 6.90);
forward at 8192 tokens c1584s2x28 421.4, c1584s2x28w 417.2 (TK 399.0); at 1 / 128 tokens c1584s2x28 7.79 / 11.74,
a whole row in flight c1584s14x28w 8.98 / 14.35, c1584s14x28 8.50 / 14.14, c1584s8x28w 7.85 / 14.89 (TK 5.25 /
10.00: TileKernels runs the same grid there, one token a CTA, so the gap is a token's latency, not the grid);
momentum 512000512 t128v8x1 1503.5, t128v4x2 1459.1, t256v4x2 1496.0, t32v4x2 2409.4 (TK 1452.7). The losers and
the "s" form (one stream across passes and tokens) are deleted. The tuning harness is tune_engram2's.

    python -m bench.tuning.tune_engram3 build --out tune-artifacts/engram3
    TKAOT_PATH=$PWD/tune-artifacts/engram3 python -m bench.tuning.tune_engram3 --out tune-results/engram3
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from bench.tuning import tune_engram2 as harness
from bench.tuning.tune_engram2 import CLAMP, EPS, HC, HIDDEN, TOKENS

CONTROL_COMMIT = "a3a2081"  # main before these candidates: backward 845.5 µs, grad_w_reduce 7.93, forward 421.9 / 7.90
BWD_CONTROL = "k28d12c"
CONTROL_MODULE = "bench.tuning._engram3_control"
BWD = ("k28d14c",)  # the default: 13 groups in flight, the kernel's own barriers
FWD = ("c1584s2x28", "c1584s2x28w")  # the default (shipped before), weights an item ahead
FWD_TOKENS = (TOKENS, 1, 128)
REDUCE = ("t128r66", "t224r132")  # shipped before (224 CTAs of 128), the default (128 CTAs of 224, one round trip)
MOMENTUM = ("t128v8x1", "t128v4x2")  # shipped before (8 consecutive elements a lane), the default (two runs of 4)
NAN = float("nan")


def build(out: str) -> None:
    """The backward's control from CONTROL_COMMIT, then every candidate from the kernel sources, into `out`."""
    import kernels_src.engram.gate_bwd as bwd_source
    import kernels_src.engram.gate_fwd as fwd_source
    import kernels_src.engram.grad_w_reduce as reduce_source
    import kernels_src.engram.sinkhorn_momentum as momentum_source
    from build_tools import ops
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from tkaot._engram.kernels import GATE_BWD, GATE_FWD, GRAD_W_REDUCE, SINKHORN_MOMENTUM

    start = time.perf_counter()
    built = harness.build_control(CONTROL_COMMIT, "kernels_src/engram/gate_bwd.py", CONTROL_MODULE, BWD_CONTROL, GATE_BWD, out)
    variants = []
    for source, decl, tilings in (
        (fwd_source, GATE_FWD, FWD),
        (bwd_source, GATE_BWD, BWD),
        (reduce_source, GRAD_W_REDUCE, REDUCE),
        (momentum_source, SINKHORN_MOMENTUM, MOMENTUM),
    ):
        harness.declare(source, {f"candidate{i}": t for i, t in enumerate(tilings)}, source.__name__, decl)
        fixed = {"grad_dtype": "float32", "momentum_dtype": "bfloat16"}  # the momentum's, as benched
        for tiling in tilings:
            static = tuple((a.name, tiling if a.name == "tiling" else fixed.get(a.name, a.choices[0])) for a in decl.axes)
            variants.append(ops.Variant(decl.name, static))
    report = build_variants(variants, Path(out), "sm90", 1, BuildCache())
    print(f"built {built + report.built}, from cache {report.cached} -> {out} in {time.perf_counter() - start:.0f} s")


def _against_control(log, control: str, tilings: tuple, use, cases) -> list[tuple]:
    """Rows of each tiling's outputs against the control's, case by case: use(tiling) makes the op launch that
    tiling, a case is (shape label, a call returning the outputs)."""
    rows = []
    for shape, call in cases:
        want = None
        for tiling in (control, *tilings):
            use(tiling)
            try:
                got = tuple(g if g is None else g.clone() for g in call())
            except Exception as exc:  # not built, or a launch error: the row says which
                rows.append((tiling, shape, NAN, NAN, type(exc).__name__))
                continue
            if tiling == control:
                want, same = got, "control"
            else:
                same = "yes" if want is not None and harness._same(got, want) else "NO"
            log.write(json.dumps({"candidate": tiling, "shape": shape, "against": control, "identical": same}) + "\n")
            rows.append((tiling, shape + " (ctl)", NAN, NAN, same))
    return rows


def _randn(gen, *shape, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device="cuda") * scale).bfloat16()


def _gate_inputs(gen, tokens: int, hidden: int, masked: float) -> dict:
    w = _randn(gen, HC, hidden).float() * _randn(gen, HC, hidden).float()
    mask = torch.rand(tokens, generator=gen, device="cuda") < masked if masked else None
    return {"x": _randn(gen, tokens, HC, hidden), "kv": _randn(gen, tokens, HC + 1, hidden), "w": w, "mask": mask}


def _checks(log, gen) -> list[tuple]:
    """Candidates against their controls where no TileKernels kernel runs: image tokens (30 %), hidden below the
    backward's kept groups (4096) and above them (8192), 1 and 2 tokens a backward CTA, every width of the forward's
    tiles, more partials than a thread holds in flight."""
    import tkaot
    from tkaot._engram import kernels

    shipped = (dict(kernels.GATE_FWD_TILINGS), dict(kernels.GATE_BWD_TILINGS), dict(kernels.GRAD_W_REDUCE_TILINGS))
    shipped_momentum = dict(kernels.SINKHORN_MOMENTUM_TILINGS)

    def bwd_case(tokens, hidden, masked):
        a = _gate_inputs(gen, tokens, hidden, masked)
        go = _randn(gen, tokens, HC, hidden)
        saved = tkaot.reference.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, True, None)[1:]
        call = lambda: tkaot.engram.engram_gate_bwd(go, a["x"], a["kv"], a["w"], *saved, CLAMP, a["mask"])  # noqa: E731
        return f"bwd {tokens}x{hidden}{' masked' if masked else ''}", call

    def fwd_case(tokens, hidden, masked):
        a = _gate_inputs(gen, tokens, hidden, masked)
        call = lambda: tkaot.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], EPS, CLAMP, True, a["mask"])  # noqa: E731
        return f"fwd {tokens}x{hidden}{' masked' if masked else ''}", call

    def reduce_case(partials, hidden):
        p = torch.randn(partials, HC, hidden, generator=gen, device="cuda")
        wh, we = _randn(gen, HC, hidden), _randn(gen, HC, hidden)
        gh, ge = (torch.randn(HC, hidden, generator=gen, device="cuda") for _ in range(2))

        def call():
            outs = gh.clone(), ge.clone()
            tkaot.engram.grad_w_reduce(p, wh, we, *outs)
            return outs

        return f"reduce {partials}x{HC}x{hidden}", call

    def momentum_case(numel, nesterov):
        g = torch.randn(numel, generator=gen, device="cuda")
        m = _randn(gen, numel)

        def call():
            buffer = m.clone()
            return tkaot.engram.engram_sinkhorn_momentum_update(g, buffer, 0.9, nesterov), buffer

        return f"momentum {numel}{' nesterov' if nesterov else ''}", call

    def use_momentum(tiling):
        kernels.SINKHORN_MOMENTUM_TILINGS = {"default": tiling}

    def use_fwd(tiling):
        kernels.GATE_FWD_TILINGS = {"default": tiling}

    def use_bwd(tiling):
        kernels.GATE_BWD_TILINGS = {"default": tiling}

    def use_reduce(tiling):
        kernels.GRAD_W_REDUCE_TILINGS = {"default": tiling}

    bwd = [bwd_case(t, h, m) for t, h, m in ((1000, HIDDEN, 0.3), (300, 4096, 0.3), (300, 8192, 0.3), (264, HIDDEN, 0.5), (1, HIDDEN, 0))]
    rows = _against_control(log, BWD_CONTROL, BWD, use_bwd, bwd)
    fwd_shapes = ((100, HIDDEN, 0.3), (100, 4096, 0), (3, 256, 0), (5, 16384, 0.3), (1000, 1792, 0.3), (1, HIDDEN, 0))
    fwd = [fwd_case(t, h, m) for t, h, m in fwd_shapes]
    rows += _against_control(log, FWD[0], FWD[1:], use_fwd, fwd)
    reduce = [reduce_case(p, h) for p, h in ((132, 256), (7, 4096), (200, HIDDEN), (1, 512))]
    rows += _against_control(log, REDUCE[0], REDUCE[1:], use_reduce, reduce)
    momentum = [momentum_case(n, nesterov) for n, nesterov in ((8, True), (1000, False), (4104, True), (1 << 20, True))]
    rows += _against_control(log, MOMENTUM[0], MOMENTUM[1:], use_momentum, momentum)
    kernels.GATE_FWD_TILINGS, kernels.GATE_BWD_TILINGS, kernels.GRAD_W_REDUCE_TILINGS = shipped
    kernels.SINKHORN_MOMENTUM_TILINGS = shipped_momentum
    return rows


def _rows(tk, log, gen) -> list[tuple]:
    rows = harness._bwd_rows(tk, log, gen, (BWD_CONTROL, *BWD))
    rows += harness._fwd_rows(tk, log, gen, [(tokens, False, FWD) for tokens in FWD_TOKENS])
    rows += harness._masked_rows(gen, log, FWD) + harness._masked_rows(gen, log, FWD, tokens=100)
    return rows + _checks(log, gen)


if __name__ == "__main__":
    harness.cli(__doc__, build, _rows, "tune_engram3.jsonl")
