"""Time the generic norm kernels (rmsnorm_generic, norm_cast_generic) against their specialised variants and
TileKernels at the bench shapes (8192x7168 bf16), checking every output byte.

The generic variants of bench/tuning/tune_generic_perf.toml hold the kernels of this source tree; the
specialised ones come from the default set on TKAOT_PATH after them (the prebuilt set of a checkout):

    tkaot-build build --shapeset bench/tuning/tune_generic_perf.toml --arch sm90 --out tune-artifacts/generic
    TKAOT_PATH=$PWD/tune-artifacts/generic python -m bench.tuning.tune_generic_perf --out DIR

Candidates, each a call on its generic variant: norm_cast's shipped tiling for the call, and for calls with a
residual also the default tiling (which asks has_residual rather than taking the residual as given); norm_forward
has one kernel. Each output (out, scale factors, residual sum, rstd) is compared bit for bit with TileKernels'
(deterministic for these ops; the specialised variants match it, tests/gpu/test_parity_gpu.py) and with the
specialised variant's. The generic variants before this change measured (bench/generic.py, H200, the same
specialised kernels) 98.22, 142.08, 164.03 and 235.90 µs for the four cases in order; CONTROL_US lists them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import tkaot
from bench.generic import on_generic
from bench.timing import device_us
from tkaot._quant import fused as _fused
from tkaot._quant import norm as _norm
from tkaot._quant import norm_cast as _norm_cast

TOKENS, HIDDEN, EPS = 8192, 7168, 1e-6
SETS = 4  # rotating inputs: 4 x (x, residual) of 8192x7168 bf16, past L2
DEFAULT, RESIDUAL = _fused.NORM_CAST_TILING, _fused.NORM_CAST_RESIDUAL_TILING
# (case, op, keywords, with a residual, norm_cast tilings to try on the generic kernel: the shipped one first)
CASES = [
    ("norm_forward", "norm_forward", {}, False, (None,)),
    ("norm_forward residual rstd", "norm_forward", {"with_rstd": True}, True, (None,)),
    ("norm_cast e4m3/32", "norm_forward_and_per_token_cast", {}, False, (DEFAULT,)),
    ("norm_cast e4m3/32 ue8m0 residual", "norm_forward_and_per_token_cast", {"round_sf": True, "use_packed_ue8m0": True}, True,
     (RESIDUAL, DEFAULT)),
]  # fmt: skip
CONTROL_US = {"norm_forward": 98.22, "norm_forward residual rstd": 142.08, "norm_cast e4m3/32": 164.03,
              "norm_cast e4m3/32 ue8m0 residual": 235.90}  # fmt: skip


def outputs(result, a: dict, residual: bool) -> list[torch.Tensor]:
    """Every tensor a call wrote: its results, and the residual sum (written into the residual for norm_cast)."""
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    return [t for t in items if isinstance(t, torch.Tensor)] + ([a["r"]] if residual else [])


def same_bytes(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> bool:
    return len(ours) == len(theirs) and all(
        o.shape == t.shape and o.dtype == t.dtype and torch.equal(o.contiguous().view(torch.uint8), t.contiguous().view(torch.uint8))
        for o, t in zip(ours, theirs)
    )


def run_once(fn, a: dict, residual: bool) -> list[torch.Tensor]:
    """One call on a fresh copy of a's residual (norm_cast adds into it in place), its outputs."""
    b = dict(a, r=a["r"].clone())
    return outputs(fn(b), b, residual)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        import tile_kernels as tk
    except ImportError:
        tk = None
    torch.manual_seed(0)
    weight = torch.randn(HIDDEN, device="cuda").to(torch.bfloat16)

    def rows_bf16():
        return torch.randn(TOKENS, HIDDEN, device="cuda").to(torch.bfloat16)

    inputs = [{"x": rows_bf16(), "r": rows_bf16()} for _ in range(SETS)]
    rows, log, start = [], [], time.time()
    for name, op, kwargs, residual, tilings in CASES:

        def ours(a, op=op, kwargs=kwargs, residual=residual):
            return getattr(tkaot.quant, op)(a["x"], weight, EPS, *(("e4m3", 32) if "cast" in op else ()),
                                            residual=a["r"] if residual else None, **kwargs)  # fmt: skip

        def theirs(a, op=op, kwargs=kwargs, residual=residual):
            return getattr(tk.quant, op)(a["x"], weight, EPS, *(("e4m3", 32) if "cast" in op else ()),
                                         residual=a["r"] if residual else None, **kwargs)  # fmt: skip

        tk_us = want = None
        if tk is not None:
            want = run_once(theirs, inputs[0], residual)
            tk_us, _ = device_us(theirs, inputs)
        kernels = _norm._NORM if op == "norm_forward" else _norm_cast._NORM_CAST
        specialised = "rmsnorm" if op == "norm_forward" else "norm_cast"
        kernels.cache.clear()
        special_out = run_once(ours, inputs[0], residual)
        special_us, _ = device_us(ours, inputs)
        candidates = [("specialised (shipped)", special_us, special_out)]
        for tiling in tilings:
            saved = _fused.NORM_CAST_TILING, _fused.NORM_CAST_RESIDUAL_TILING
            if tiling is not None:
                _fused.NORM_CAST_TILING = _fused.NORM_CAST_RESIDUAL_TILING = tiling
            try:
                with on_generic(specialised):
                    got = run_once(ours, inputs[0], residual)
                    us, _ = device_us(ours, inputs)
            finally:
                _fused.NORM_CAST_TILING, _fused.NORM_CAST_RESIDUAL_TILING = saved
                kernels.cache.clear()
            label = "generic" + ("" if tiling is None else f" {tiling}") + (" (new default)" if tiling in (None, tilings[0]) else "")
            candidates.append((label, us, got))
        for label, us, got in candidates:
            vs_tk = "—" if want is None else ("yes" if same_bytes(got, want) else "NO")
            vs_special = "yes" if same_bytes(got, special_out) else "NO"
            row = {"case": name, "candidate": label, "us": round(us, 2), "tile_kernels_us": None if tk_us is None else round(tk_us, 2),
                   "ratio_vs_tk": None if tk_us is None else round(us / tk_us, 3), "ratio_vs_specialised": round(us / special_us, 3),
                   "identical_tk": vs_tk, "identical_specialised": vs_special}  # fmt: skip
            rows.append(row)
            log.append(json.dumps(row))
        log.append(json.dumps({"case": name, "control_previous_generic_us": CONTROL_US[name]}))
    (out_dir / "tune_generic_perf.jsonl").write_text("\n".join(log) + "\n")
    print(f"{torch.cuda.get_device_name(0)}, {TOKENS}x{HIDDEN} bf16, {time.time() - start:.0f} s")
    print("| case | candidate | µs | TileKernels µs | ratio | /specialised | identical (TK / specialised) | previous generic µs |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in rows:
        tk_text = "—" if r["tile_kernels_us"] is None else f"{r['tile_kernels_us']:.2f}"
        ratio = "—" if r["ratio_vs_tk"] is None else f"{r['ratio_vs_tk']:.2f}"
        control = f"{CONTROL_US[r['case']]:.2f}" if r["candidate"].startswith("generic") else ""
        print(f"| {r['case']} | {r['candidate']} | {r['us']:.2f} | {tk_text} | {ratio} | {r['ratio_vs_specialised']:.2f} | "
              f"{r['identical_tk']} / {r['identical_specialised']} | {control} |")  # fmt: skip


if __name__ == "__main__":
    main()
