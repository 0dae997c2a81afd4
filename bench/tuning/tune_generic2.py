"""Time the generic tier's slow rows against their specialised variants and TileKernels, checking every output byte:
per_token_cast_generic with the group and the sf layout runtime values and cast_back_generic with the input block a
runtime value (one cubin serving the variants that differ only in those: RUNTIME_AXES in
kernels_src/quant/{per_token_cast,cast_back}_generic.py), and the rows still over 1.25x
(norm_forward_and_per_token_cast e4m3/32, normalize_weight 8192x9, swiglu bf16 with weights and a clamp).

The per-token cast, cast back and weight normalisation generic variants of bench/tuning/tune_generic2.toml hold
this source tree's kernels (normalize_weight_generic: the body of the fewest slots holding the call's weights); the specialised
ones, and the other generic kernels, come from the default set on TKAOT_PATH after them:

    tkaot-build build --shapeset bench/tuning/tune_generic2.toml --arch sm90 --out tune-artifacts/generic2
    TKAOT_PATH=$PWD/tune-artifacts/generic2 python -m bench.tuning.tune_generic2 --out DIR

Each case runs on the specialised variant, then on the generic one (the specialised hidden from the registry), beside
TileKernels; each output (values, scale factors, denominators) is compared bit for bit with TileKernels' and with the
specialised variant's. CONTROL_US: the generic variants before this change (bench/generic.py, H200, session 10), the
per-token ones then one cubin per group and layout, the cast back one per block.
"""

from __future__ import annotations

import time

import torch

import tkaot
from bench.generic import CASES, CAST_BACK_CASES
from bench.tuning.tune_generic_perf import print_table, specialised_then_generic, start
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


def main(argv=None) -> None:
    out_dir, tk = start(argv)
    rows, log, begun = [], [], time.time()
    for name, kernels, specialised, inputs, call in cases():
        rows += specialised_then_generic(tk, log, name, kernels, specialised, inputs, call)
    (out_dir / "tune_generic2.jsonl").write_text("\n".join(log) + "\n")
    print(f"{torch.cuda.get_device_name(0)}, {time.time() - begun:.0f} s")
    print_table(rows, CONTROL_US)


if __name__ == "__main__":
    main()
