"""Time norm_backward's staged pass 1 (kernels_src/norm/rmsnorm_backward.py) beside TileKernels, on both tiers.

    python -m bench.tuning.tune_train_perf --out DIR

Runs on the default artifact set (no artifact set of its own: the candidates are the specialised and the generic
variant of one kernel body). At bench/cases/backward.py's shapes (8192 tokens): bf16 7168 with a weight, with a
weight and a residual gradient, and without a weight, each on the specialised variant and on the generic one; the
generic tier's own rows (fp32 7168, bf16 3168). Before timing, each call's outputs are compared: the generic
variant's bytes against the specialised variant's (they must be identical), and both against TileKernels within
the parity suite's tolerances (tests/parity_backward_cases.py: both libraries sum rows in their own order).
The kernel before the staging is not buildable any more; its times in the same bench run are the control
(bench/RESULTS.md: 112.6 / 163.0 / 322.2 / 130.2 µs for the rows here, TileKernels 97.3 / 118.1 / 181.6 / 53.7).
Prints a table last (candidate, shape, µs, TileKernels µs, ratio, identical?) and writes DIR/tune_train_perf.log.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import tkaot
from bench.generic import on_generic
from bench.timing import copy_ceiling_tbps, device_us

TOKENS = 8192
SETS = 3  # rotating input sets, each larger than L2 at these shapes
BF16_SUM, F32_SUM = (2**-7, 2**-7), (1e-4, 1e-5)  # tests/parity_backward_cases.py
WEIGHT_GRAD = {torch.bfloat16: (2**-7, 1e-3), torch.float32: (1e-4, 1e-3)}
# (name, dtype, hidden, weight, residual gradient, tiers)
ROWS = [
    ("bf16, weight", torch.bfloat16, 7168, True, False, ("specialised", "generic")),
    ("bf16, weight + residual grad", torch.bfloat16, 7168, True, True, ("specialised", "generic")),
    ("bf16, no weight", torch.bfloat16, 7168, False, False, ("specialised", "generic")),
    ("fp32, weight", torch.float32, 7168, True, False, ("generic",)),
    ("bf16, weight", torch.bfloat16, 3168, True, False, ("generic",)),
]


def _inputs(dtype, hidden: int, weight: bool, residual: bool) -> dict:
    x = torch.randn(TOKENS, hidden, dtype=dtype, device="cuda")
    return {
        "dy": torch.randn_like(x), "x": x, "w": (torch.rand(hidden, dtype=dtype, device="cuda") + 0.5) if weight else None,
        "rstd": torch.rsqrt(x.float().square().mean(-1) + 1e-6), "dr": torch.randn_like(x) if residual else None,
    }  # fmt: skip


def _ours(a):
    return tkaot.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"], a["dr"])


def _theirs(tk):
    return lambda a: tk.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"], a["dr"])


def _same(a, b) -> bool:
    return all(
        (p is None and q is None) or (p is not None and q is not None and torch.equal(p.view(torch.uint8), q.view(torch.uint8)))
        for p, q in zip(a, b)
    )


def _close(got, want, dtype) -> str:
    tol = BF16_SUM if dtype is torch.bfloat16 else F32_SUM
    if not torch.allclose(got[0].float(), want[0].float(), rtol=tol[0], atol=tol[1]):
        return "x_grad FAR"
    if got[1] is not None and not torch.allclose(got[1].float(), want[1].float(), *WEIGHT_GRAD[dtype]):
        return "weight_grad FAR"
    return "close"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import tile_kernels as tk

    log, table, start = [], [], time.time()
    ceiling = copy_ceiling_tbps()
    log.append(f"copy ceiling {ceiling:.2f} TB/s")
    for name, dtype, hidden, weight, residual, tiers in ROWS:
        inputs = [_inputs(dtype, hidden, weight, residual) for _ in range(SETS)]
        nbytes = TOKENS * hidden * dtype.itemsize * (4 if residual else 3)
        want = _theirs(tk)(inputs[0])
        tk_us, _ = device_us(_theirs(tk), inputs)
        spec = _ours(inputs[0]) if "specialised" in tiers else None
        for tier in tiers:
            if tier == "generic":
                with on_generic("rmsnorm_backward"):
                    got = _ours(inputs[0])
                    us, mode = device_us(_ours, inputs)
                identical = "=spec" if spec is None or _same(got, spec) else "DIFFERS from spec"
            else:
                got, (us, mode) = spec, device_us(_ours, inputs)
                identical = "-"
            torch.cuda.synchronize()
            verdict = f"{identical}, TK {_close(got, want, dtype)}"
            shape = f"{TOKENS}x{hidden} {name}"
            table.append((tier, shape, us, tk_us, us / tk_us, verdict))
            log.append(f"{tier:11} {shape:38} {us:8.2f} µs ({nbytes / us / 1e6:5.2f} TB/s, {mode}) TK {tk_us:8.2f} {verdict}")
    log.append(f"{time.time() - start:.1f} s")
    print("\n".join(log))
    lines = [f"{'candidate':11} {'shape':38} {'µs':>8} {'TK µs':>8} {'ratio':>6}  identical?"]
    lines += [f"{c:11} {s:38} {us:8.2f} {tk_us:8.2f} {r:6.2f}  {v}" for c, s, us, tk_us, r, v in table]
    print("\n".join(lines))
    (args.out / "tune_train_perf.log").write_text("\n".join(log + lines) + "\n")


if __name__ == "__main__":
    main()
