"""Time fused-kernel tilings on the option rows of bench/cases/fused.py, beside TileKernels.

SwiGLU + cast with routing weights and a clamp (no counts asked), and plain; RMSNorm + cast with a
residual, and without. Each candidate's output is first compared bit for bit with the pure-torch
reference (swiglu: also with clamped_count, counts compared). Candidates are built from
bench/tuning/tune_options.toml:

    tkaot-build build --shapeset bench/tuning/tune_options.toml --out tune-artifacts/opt
    TKAOT_PATH=$PWD/tune-artifacts/opt python -m bench.tuning.tune_options
"""

from __future__ import annotations

import torch

import tkaot
from bench.timing import copy_ceiling_tbps, device_us
from tkaot import reference
from tkaot._quant import fused as _fused

# Run 24 (2026-12-01, bench/results/tuning at f014b86): wscc2v9b1gk won the weights + clamp row. Runs 25-29 (session 5; the
# logs name candidates since removed from TILINGS, see the notes there): swiglu wscc2v9b1gkm (the clamp by min / max)
# 25.3-25.8 µs with weights and a clamp (wscc2v9b1gk 27.9-28.4, TileKernels 30.4-31.0), shipped for calls with a
# clamp; norm_cast lean6plbwdgwRL 102.4-103.3 with a residual (lean6plbwdgwR 102.9-103.9, lean8nlbwdgw 106.1-107.6,
# TileKernels 102.9-104.0), shipped for calls with a residual ("R" tilings are timed with a residual only).
SWIGLU_TILINGS = ("wscc2v9b1g", "wscc2v9b1gk", "wscc2v9b1gkm")
NORM_CAST_TILINGS = ("lean8nlbwdgw", "lean6plbwdgwR", "lean6plbwdgwRL")
TOKENS, WIDTH, HIDDEN = 8192, 4096, 7168
SETS = 3


def _same(a, b) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _time(call, sets, nbytes) -> str:
    us, mode = device_us(call, sets)
    return f"{us:8.2f} µs {nbytes / us / 1e6:5.2f} TB/s{'' if mode == 'graph' else ' (events)'}"


def swiglu_rows(tk) -> list[str]:
    moe = lambda: dict(topk_weights=torch.rand(TOKENS, device="cuda"), routed_scaling_factor=2.5, clamp_value=7.0)  # noqa: E731
    sets = [{"x": torch.randn(TOKENS, WIDTH, device="cuda").bfloat16(), "moe": moe()} for _ in range(SETS)]
    half = WIDTH // 2
    moe_bytes = TOKENS * WIDTH * 2 + TOKENS * 4 + TOKENS * half + TOKENS * (half // 128) * 4
    plain_bytes = TOKENS * WIDTH * 2 + TOKENS * half + TOKENS * (half // 128) * 4
    rows = []
    for tiling in SWIGLU_TILINGS:
        _fused.SWIGLU_TILING = _fused.SWIGLU_CLAMP_TILING = tiling  # the MoE row has a clamp
        a = sets[0]
        got = tkaot.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128, **a["moe"])
        want = reference.fused.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128, **a["moe"])
        counts = [torch.zeros(4, dtype=torch.int64, device="cuda") for _ in range(2)]
        got_c = tkaot.quant.swiglu_forward_and_per_token_cast(a["x"] * 4, "e4m3", 128, **a["moe"], clamped_count=counts[0])
        want_c = reference.fused.swiglu_forward_and_per_token_cast(a["x"] * 4, "e4m3", 128, **a["moe"], clamped_count=counts[1])
        exact = _same(got[0], want[0]) and torch.equal(got[1], want[1]) and _same(got_c[0], want_c[0])
        exact = exact and torch.equal(got_c[1], want_c[1]) and torch.equal(counts[0], counts[1]) and int(counts[0][0]) > 0
        got_b = tkaot.quant.swiglu_forward(a["x"], "bf16", **a["moe"])
        exact = exact and _same(got_b, reference.fused.swiglu_forward(a["x"], "bf16", **a["moe"]))
        verdict = "exact" if exact else "MISMATCH"
        rows += _swiglu_timings(tiling, tkaot, sets, moe_bytes, plain_bytes, verdict)
    if tk is not None:
        rows += _swiglu_timings("TileKernels", tk, sets, moe_bytes, plain_bytes, "")
    return rows


def _swiglu_timings(name, module, sets, moe_bytes, plain_bytes, verdict) -> list[str]:
    cast, bf16 = module.quant.swiglu_forward_and_per_token_cast, module.quant.swiglu_forward
    half = WIDTH // 2
    bf16_bytes = TOKENS * WIDTH * 2 + TOKENS * half * 2
    return [
        f"swiglu+cast moe   {name:14s} {_time(lambda a: cast(a['x'], 'e4m3', 128, **a['moe']), sets, moe_bytes)}  {verdict}",
        f"swiglu+cast plain {name:14s} {_time(lambda a: cast(a['x'], 'e4m3', 128), sets, plain_bytes)}",
        f"swiglu bf16 moe   {name:14s} {_time(lambda a: bf16(a['x'], 'bf16', **a['moe']), sets, bf16_bytes + TOKENS * 4)}",
        f"swiglu bf16 plain {name:14s} {_time(lambda a: bf16(a['x'], 'bf16'), sets, bf16_bytes)}",
    ]


def norm_rows(tk) -> list[str]:
    def make():
        r = lambda *s: torch.randn(*s, device="cuda").bfloat16()  # noqa: E731
        return {"x": r(TOKENS, HIDDEN), "r": r(TOKENS, HIDDEN), "w": r(HIDDEN)}

    sets = [make() for _ in range(SETS)]
    base = TOKENS * HIDDEN + TOKENS * (HIDDEN // 32) * 4 + HIDDEN * 2
    res_bytes, plain_bytes = TOKENS * HIDDEN * 6 + base, TOKENS * HIDDEN * 2 + base
    rows = []
    for tiling in NORM_CAST_TILINGS:
        _fused.NORM_CAST_RESIDUAL_TILING = tiling
        residual_only = "R" in tiling  # the residual-specialised tilings serve residual calls only
        if not residual_only:
            _fused.NORM_CAST_TILING = tiling
        a = sets[0]
        (q, sf), _, rstd, s = tkaot.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32, residual=a["r"], with_rstd=True)
        (wq, wsf), _, _, ws = reference.fused.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, a["r"], rstd=rstd)
        verdict = "exact" if _same(q, wq) and torch.equal(sf, wsf) and torch.equal(s, ws) else "MISMATCH"
        res = lambda a: tkaot.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32, residual=a["r"])  # noqa: E731
        plain = lambda a: tkaot.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32)  # noqa: E731
        rows.append(f"norm+cast residual {tiling:14s} {_time(res, sets, res_bytes)}  {verdict}")
        if not residual_only:
            rows.append(f"norm+cast plain    {tiling:14s} {_time(plain, sets, plain_bytes)}")
    if tk is not None:
        res = lambda a: tk.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32, residual=a["r"])  # noqa: E731
        plain = lambda a: tk.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32)  # noqa: E731
        rows.append(f"norm+cast residual {'TileKernels':14s} {_time(res, sets, res_bytes)}")
        rows.append(f"norm+cast plain    {'TileKernels':14s} {_time(plain, sets, plain_bytes)}")
    return rows


def main() -> None:
    try:
        import tile_kernels as tk
    except ImportError:
        tk = None
    print(f"device: {torch.cuda.get_device_name()}, {SETS} rotating input sets")
    rows = swiglu_rows(tk) + norm_rows(tk)
    print("\n".join(rows))
    print(f"copy ceiling {copy_ceiling_tbps(1 << 30):.2f} TB/s")


if __name__ == "__main__":
    main()
