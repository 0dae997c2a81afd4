"""Time norm_backward (kernels_src/norm/rmsnorm_backward.py, weight_grad_reduce.py) beside TileKernels, on both tiers.

    python -m bench.tuning.tune_train_perf --out DIR

Runs on the default artifact set (no artifact set of its own: the candidates are the specialised and the generic
variant of one kernel body). At bench/cases/backward.py's shapes (8192 tokens): bf16 7168 with a weight, with a
weight and a residual gradient, and without a weight, each on the specialised variant and on the generic one; the
generic tier's own rows (fp32 7168, bf16 3168). Before timing, each call's outputs are compared: the generic
variant's bytes against the specialised variant's (they must be identical), and both against TileKernels within
the parity suite's tolerances (tests/parity_backward_cases.py: both libraries sum rows in their own order).
The kernels before are not buildable from this tree; their times on the same rows are the control (CONTROL_US,
the "before" column). Pass 2 alone (weight_grad_reduce over the op's 264 partial rows) is timed too, on the
specialised bf16 7168 call's partials: its share of the weight rows.
Prints a table last (candidate, shape, µs, TileKernels µs, ratio, identical?, before) and writes
DIR/tune_train_perf.log.

Runs so far (H200, µs; TileKernels in brackets):
- before staging (bench/RESULTS.md): weight 112.6 (97.3), + residual grad 163.0 (118.1), no weight 97.9,
  generic fp32 322.2 (181.6), generic 3168 130.2 (53.7).
- round 2, rows staged by cp.async (2 rows ahead bf16, 1 fp32), weight read from L1 twice a row: the CONTROL_US
  below (weight 128.4 (98.1): staging lost 16 µs there while the residual row gained 17 and no weight 6).
- now: a bf16 thread holds its weight vectors in registers from the start (no L1 reads beside the staged shared
  memory reads; 127 registers, no spills); pass 1's own barriers, 2 a row at 7168 rather than TileLang's 6 (a
  thread reads only what its own cp.async wrote; TileKernels also places its own); pass 2 over 224 blocks of 32
  columns rather than 56 of 128 (the same order of sums, so the same bytes). Staging depth as a tiling was not
  tried: the loss was in the weight rows alone, and the residual and no-weight rows (same kernel, runtime flags)
  gained from the staging.
- session 11 (H200): weight 109.5 (1.13x), + residual grad 125.9 (1.07x), generic fp32 7168 229 (1.27x), generic bf16
  3168 80 (1.48x). TileKernels' tiling, read from its source: at bf16 7168 2 rows a block of 256 threads (128 a row,
  7 vectors of 8 a thread), fp32 7168 1 row of 256 threads (7 vectors of 4), bf16 3168 4 rows of 64 threads (25
  vectors of 2: 16-byte vectors do not divide 3168 / 32), always 2 stages and one block an SM (132 blocks).
  At 7168 that is as many rows in flight as ours (264 blocks of 1 row); the candidates it suggests, not yet built:
  fp32 with 2 stages at one block an SM (ours: 1 stage, 2 blocks), and for 3168 (ours: 2 vectors of 8 over 256
  threads, the second vector idle in 116 of them) 128 threads a row. Each changes the op's grid and so the order
  of the weight-gradient partials (within tolerance of TileKernels, not today's bytes); nothing shipped.
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
# Round 2's times of the same rows (the kernels before this change), keyed (tier, shape)
CONTROL_US = {
    ("specialised", "8192x7168 bf16, weight"): 128.37, ("generic", "8192x7168 bf16, weight"): 153.74,
    ("specialised", "8192x7168 bf16, weight + residual grad"): 145.70,
    ("generic", "8192x7168 bf16, weight + residual grad"): 168.55,
    ("specialised", "8192x7168 bf16, no weight"): 91.83, ("generic", "8192x7168 bf16, no weight"): 110.01,
    ("generic", "8192x7168 fp32, weight"): 237.73, ("generic", "8192x3168 bf16, weight"): 96.69,
}  # fmt: skip
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


def _pass2_us(hidden: int) -> float:
    """weight_grad_reduce alone, over the op's partial rows of TOKENS bf16 tokens of `hidden` (graph replay)."""
    from tkaot._op import current_stream
    from tkaot._quant import norm_backward as nb

    rows_per_block = nb.NORM_BACKWARD_THREADS // nb.norm_backward_tiling(hidden, "bfloat16")[1]
    num_blocks = min(-(-TOKENS // rows_per_block), nb.NORM_BACKWARD_MAX_BLOCKS)
    sets = [
        {"p": torch.randn(num_blocks, hidden, device="cuda"), "w": torch.empty(hidden, dtype=torch.bfloat16, device="cuda")}
        for _ in range(10)  # 75 MB of partials at 7168: more than L2
    ]
    device = torch.cuda.current_device()

    def call(a):
        nb._PASS2.get(device, "bfloat16")(device, current_stream(device), a["p"].data_ptr(), a["w"].data_ptr(), 0, num_blocks, hidden)

    return device_us(call, sets)[0]


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
            table.append((tier, shape, us, tk_us, us / tk_us, verdict, CONTROL_US.get((tier, shape))))
            log.append(f"{tier:11} {shape:38} {us:8.2f} µs ({nbytes / us / 1e6:5.2f} TB/s, {mode}) TK {tk_us:8.2f} {verdict}")
    for hidden in (7168, 3168):
        log.append(f"pass 2 alone (weight_grad_reduce, bf16 weight_grad) {TOKENS}x{hidden}: {_pass2_us(hidden):.2f} µs")
    log.append(f"{time.time() - start:.1f} s")
    print("\n".join(log))
    lines = [f"{'candidate':11} {'shape':38} {'µs':>8} {'TK µs':>8} {'ratio':>6}  {'identical?':22} before"]
    lines += [f"{c:11} {s:38} {us:8.2f} {tk_us:8.2f} {r:6.2f}  {v:22} {b or '-'}" for c, s, us, tk_us, r, v, b in table]
    print("\n".join(lines))
    (args.out / "tune_train_perf.log").write_text("\n".join(log + lines) + "\n")


if __name__ == "__main__":
    main()
