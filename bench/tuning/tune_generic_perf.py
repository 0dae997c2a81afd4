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
specialised kernels) 98.22, 142.08, 164.03 and 235.90 µs for the four cases in order; after round 1 59.71, 121.00,
74.08 and 106.62 (CONTROL_US). Then the generic top-k gates (topk_gate, moe_topk_gate_forward with a bias and one
shared slot, 8192x256 top-8), specialised then generic, every output compared with TileKernels' and the specialised
variant's.
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
from tkaot._moe import ops as _moe_ops
from tkaot._quant import casts as _casts
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
# The generic kernels before this branch (round 1's H200 run): norm_cast e4m3/32 then 74.08 (its x loads went out
# a few at a time), the residual tiling 106.62; topk_gate 12.47 (specialised 9.41) and moe_topk_gate 18.75 (14.80)
# before the runtime slot bounds left the selection rounds
CONTROL_US = {"norm_forward": 59.71, "norm_forward residual rstd": 121.00, "norm_cast e4m3/32": 74.08,
              "norm_cast e4m3/32 ue8m0 residual": 106.62, "topk_gate 8192x256 top-8": 12.47,
              "moe_topk_gate_forward 8192x256 top-8+1": 18.75}  # fmt: skip


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


def routing_rows(tk, log: list[str]) -> list[dict]:
    """topk_gate and moe_topk_gate_forward (a bias, one shared slot) at 8192x256 top-8, specialised then generic,
    beside TileKernels; every output compared with TileKernels' and the specialised variant's."""
    tokens, experts, topk = 8192, 256, 8
    bias = torch.randn(experts, device="cuda") * 0.1
    inputs = [{"s": torch.randn(tokens, experts, device="cuda")} for _ in range(16)]
    cases = [
        (f"topk_gate {tokens}x{experts} top-{topk}", _moe_ops._TOPK, "topk_gate", lambda m, a: m.moe.topk_gate(a["s"], topk)),
        (f"moe_topk_gate_forward {tokens}x{experts} top-{topk}+1", _moe_ops._GATE, "moe_topk_gate",
         lambda m, a: m.moe.moe_topk_gate_forward(a["s"], topk, True, 1, 2.5, 0, bias=bias)),
    ]  # fmt: skip
    rows = []
    for name, kernels, specialised, call in cases:
        rows += specialised_then_generic(tk, log, name, kernels, specialised, inputs, call)
    return rows


def specialised_then_generic(tk, log: list[str], name: str, kernels, specialised: str, inputs: list[dict], call) -> list[dict]:
    """One case's rows: call(module, inputs) on the specialised kernel `specialised`, then on its generic one (the
    op's OpKernels `kernels`, or None where clearing bench.generic's plans suffices), beside TileKernels (`tk`, or
    None); each output compared with TileKernels' and the specialised variant's. Each row is also logged."""
    tk_us = want = None
    if tk is not None:
        try:
            want = outputs(call(tk, inputs[0]), {}, False)
            tk_us, _ = device_us(lambda a: call(tk, a), inputs)
        except Exception as error:  # noqa: BLE001 (a TileKernels signature of its own: time ours anyway)
            log.append(json.dumps({"case": name, "tile_kernels_error": repr(error)}))
    ours = lambda a: call(tkaot, a)  # noqa: E731
    forget(kernels)
    special_out = outputs(ours(inputs[0]), {}, False)
    special_us, _ = device_us(ours, inputs)
    with on_generic(specialised):
        got = outputs(ours(inputs[0]), {}, False)
        generic_us, _ = device_us(ours, inputs)
    forget(kernels)
    rows = []
    for label, us, out in (("specialised (shipped)", special_us, special_out), ("generic (new default)", generic_us, got)):
        row = {"case": name, "candidate": label, "us": round(us, 2), "tile_kernels_us": None if tk_us is None else round(tk_us, 2),
               "ratio_vs_tk": None if tk_us is None else round(us / tk_us, 3), "ratio_vs_specialised": round(us / special_us, 3),
               "identical_tk": "—" if want is None else ("yes" if same_bytes(out, want) else "NO"),
               "identical_specialised": "yes" if same_bytes(out, special_out) else "NO"}  # fmt: skip
        rows.append(row)
        log.append(json.dumps(row))
    return rows


def forget(kernels) -> None:
    """The op's bound launchers (and the casts' plans), so its next call looks its kernel up again."""
    _casts._PLANS.clear()
    if kernels is not None:
        kernels.cache.clear()


def start(argv) -> tuple[Path, object]:
    """(the --out directory, made; tile_kernels, or None where it does not import)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        import tile_kernels as tk
    except ImportError:
        tk = None
    return out_dir, tk


def print_table(rows: list[dict], control_us: dict) -> None:
    """The rows as a table, each generic candidate beside its case's previous generic µs (control_us)."""
    print("| case | candidate | µs | TileKernels µs | ratio | /specialised | identical (TK / specialised) | previous generic µs |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in rows:
        tk_text = "—" if r["tile_kernels_us"] is None else f"{r['tile_kernels_us']:.2f}"
        ratio = "—" if r["ratio_vs_tk"] is None else f"{r['ratio_vs_tk']:.2f}"
        control = f"{control_us[r['case']]:.2f}" if r["candidate"].startswith("generic") else ""
        print(f"| {r['case']} | {r['candidate']} | {r['us']:.2f} | {tk_text} | {ratio} | {r['ratio_vs_specialised']:.2f} | "
              f"{r['identical_tk']} / {r['identical_specialised']} | {control} |")  # fmt: skip


def main(argv=None) -> None:
    out_dir, tk = start(argv)
    torch.manual_seed(0)
    weight = torch.randn(HIDDEN, device="cuda").to(torch.bfloat16)

    def rows_bf16():
        return torch.randn(TOKENS, HIDDEN, device="cuda").to(torch.bfloat16)

    inputs = [{"x": rows_bf16(), "r": rows_bf16()} for _ in range(SETS)]
    rows, log, begun = [], [], time.time()
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
    rows += routing_rows(tk, log)
    (out_dir / "tune_generic_perf.jsonl").write_text("\n".join(log) + "\n")
    print(f"{torch.cuda.get_device_name(0)}, {TOKENS}x{HIDDEN} bf16, {time.time() - begun:.0f} s")
    print_table(rows, CONTROL_US)


if __name__ == "__main__":
    main()
