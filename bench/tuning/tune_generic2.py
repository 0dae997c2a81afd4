"""Time the generic tier's slow rows against their specialised variants and TileKernels, checking every output byte:
per_token_cast_generic with the group and the sf layout runtime values and cast_back_generic with the input block a
runtime value (one cubin serving the variants that differ only in those: RUNTIME_AXES in
kernels_src/quant/{per_token_cast,cast_back}_generic.py), and the rows still over 1.25x
(norm_forward_and_per_token_cast e4m3/32, normalize_weight 8192x9, swiglu bf16 with weights and a clamp).

The per-token cast and cast back generic variants of bench/tuning/tune_generic2.toml hold this source tree's kernel; the specialised
ones, and the other generic kernels, come from the default set on TKAOT_PATH after them:

    tkaot-build build --shapeset bench/tuning/tune_generic2.toml --arch sm90 --out tune-artifacts/generic2
    TKAOT_PATH=$PWD/tune-artifacts/generic2 python -m bench.tuning.tune_generic2 --out DIR

Each case runs on the specialised variant, then on the generic one (the specialised hidden from the registry), beside
TileKernels; each output (values, scale factors, denominators) is compared bit for bit with TileKernels' and with the
specialised variant's. CONTROL_US: the generic variants before this change (bench/generic.py, H200, session 10), the
per-token ones then one cubin per group and layout, the cast back one per block.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import tkaot
from bench.generic import CASES, CAST_BACK_CASES, on_generic
from bench.timing import device_us
from bench.tuning.tune_generic_perf import outputs, same_bytes
from tkaot._moe import ops as _moe_ops
from tkaot._quant import casts as _casts
from tkaot._quant import norm_cast as _norm_cast
from tkaot._quant import swiglu as _swiglu

TOKENS, HIDDEN = 8192, 7168
SETS = 4  # rotating inputs of 8192x7168 bf16: past L2
CONTROL_US = {"cast_back e4m3 1x128 fp32 -> bf16": 49.15, "cast_back e4m3 1x128 ue8m0 col -> bf16": 44.80,
              "per_token_cast e4m3/128": 43.97, "per_token_cast e4m3/128 ue8m0 col": 44.24, "per_token_cast e4m3/128 pow2": 43.63,
              "per_token_cast e2m1/32": 43.00, "per_token_cast e2m1/32 ue8m0": 42.82, "per_token_cast e2m1/16 e4m3 sf": 47.28,
              "norm_cast e4m3/32": 68.34, "normalize_weight 8192x9": 2.50, "swiglu 8192x4096 bf16 weights clamp": 64.30}  # fmt: skip


def cases() -> list[tuple]:
    """(name, the op's OpKernels, the specialised kernel, inputs, call(module, inputs)): every row timed."""
    torch.manual_seed(0)
    rows = [{"x": torch.randn(TOKENS, HIDDEN, device="cuda").to(torch.bfloat16)} for _ in range(SETS)]
    found = []
    for name, args, kwargs, _ in CASES:
        found.append((f"per_token_cast {name}", None, "per_token_cast", rows,
                      lambda m, a, args=args, kwargs=kwargs: m.quant.per_token_cast(a["x"], *args, **kwargs)))  # fmt: skip
    for name, flags, fmt in CAST_BACK_CASES:
        casts = [{"x": tkaot.quant.per_token_cast(a["x"], "e4m3", 128, **flags)} for a in rows]
        found.append((f"cast_back {name}", _casts._CAST_BACK["tkaot.quant.per_token_cast_back"], "cast_back", casts,
                      lambda m, a, fmt=fmt: m.quant.per_token_cast_back(a["x"], fmt, 128)))  # fmt: skip
    weight = torch.randn(HIDDEN, device="cuda").to(torch.bfloat16)
    found.append(("norm_cast e4m3/32", _norm_cast._NORM_CAST, "norm_cast", rows,
                  lambda m, a: m.quant.norm_forward_and_per_token_cast(a["x"], weight, 1e-6, "e4m3", 32)))  # fmt: skip
    weights = [{"w": torch.rand(TOKENS, 9, device="cuda")} for _ in range(16)]
    found.append(("normalize_weight 8192x9", _moe_ops._NORMALIZE, "normalize_weight", weights, lambda m, a: m.moe.normalize_weight(a["w"])))
    pairs = [{"x": torch.randn(TOKENS, 2 * 4096, device="cuda").to(torch.bfloat16)} for _ in range(SETS)]
    clamped = {"topk_weights": torch.rand(TOKENS, device="cuda"), "clamp_value": 6.0}
    found.append(("swiglu 8192x4096 bf16 weights clamp", _swiglu._SWIGLU, "swiglu", pairs,
                  lambda m, a: m.quant.swiglu_forward_and_per_token_cast(a["x"], "bf16", None, **clamped)))  # fmt: skip
    return found


def forget(kernels) -> None:
    """The op's bound launchers, so its next call looks its kernel up again."""
    _casts._PLANS.clear()
    if kernels is not None:
        kernels.cache.clear()


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
    table, log, start = [], [], time.time()
    for name, kernels, specialised, inputs, call in cases():
        tk_us = want = None
        if tk is not None:
            try:
                want = outputs(call(tk, inputs[0]), {}, False)
                tk_us, _ = device_us(lambda a, call=call: call(tk, a), inputs)
            except Exception as error:  # noqa: BLE001 (a TileKernels signature of its own: time ours anyway)
                log.append(json.dumps({"case": name, "tile_kernels_error": repr(error)}))
        ours = lambda a, call=call: call(tkaot, a)  # noqa: E731
        forget(kernels)
        special_out = outputs(ours(inputs[0]), {}, False)
        special_us, _ = device_us(ours, inputs)
        with on_generic(specialised):
            got = outputs(ours(inputs[0]), {}, False)
            generic_us, _ = device_us(ours, inputs)
        forget(kernels)
        for label, us, out in (("specialised (shipped)", special_us, special_out), ("generic (new default)", generic_us, got)):
            row = {"case": name, "candidate": label, "us": round(us, 2), "tile_kernels_us": None if tk_us is None else round(tk_us, 2),
                   "ratio_vs_tk": None if tk_us is None else round(us / tk_us, 3), "ratio_vs_specialised": round(us / special_us, 3),
                   "identical_tk": "—" if want is None else ("yes" if same_bytes(out, want) else "NO"),
                   "identical_specialised": "yes" if same_bytes(out, special_out) else "NO",
                   "control_generic_us": CONTROL_US[name] if label.startswith("generic") else None}  # fmt: skip
            table.append(row)
            log.append(json.dumps(row))
    (out_dir / "tune_generic2.jsonl").write_text("\n".join(log) + "\n")
    print(f"{torch.cuda.get_device_name(0)}, {time.time() - start:.0f} s")
    print("| case | candidate | µs | TileKernels µs | ratio | /specialised | identical (TK / specialised) | previous generic µs |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in table:
        tk_text = "—" if r["tile_kernels_us"] is None else f"{r['tile_kernels_us']:.2f}"
        ratio = "—" if r["ratio_vs_tk"] is None else f"{r['ratio_vs_tk']:.2f}"
        control = "" if r["control_generic_us"] is None else f"{r['control_generic_us']:.2f}"
        print(f"| {r['case']} | {r['candidate']} | {r['us']:.2f} | {tk_text} | {ratio} | {r['ratio_vs_specialised']:.2f} | "
              f"{r['identical_tk']} / {r['identical_specialised']} | {control} |")  # fmt: skip


if __name__ == "__main__":
    main()
