"""Time the tiling candidates of the fused kernels (swiglu + cast, RMSNorm + cast) side by side.

Each candidate is one value of the kernel's `tiling` axis, built into an artifact set
on TKAOT_PATH (the op's own tiling comes from the default set); bench/tuning/tune_fused.toml
lists the candidates below (SWIGLU_TILINGS, NORM_CAST_TILINGS) at the bench shapes:

    tkaot-build build --shapeset bench/tuning/tune_fused.toml --out tune-artifacts/fused
    TKAOT_PATH=tune-artifacts/fused python -m bench.tuning.tune_fused

Every candidate's output is first checked bit for bit against the pure-torch reference (swiglu
also on gates that send the lean division to its IEEE fallback, with weights and clamping), then
timed by CUDA-graph replay over rotating input sets (each larger than L2) on the bench shapes.
Anchors in the same run: plain norm_forward at the norm shape and the copy ceiling.
"""

from __future__ import annotations

import time

import torch

import tkaot
from bench.timing import copy_ceiling_tbps, device_us
from tkaot import reference
from tkaot._quant import fused as _fused
from tkaot.errors import VariantNotBuilt

INPUT_SETS = 3
# Runs 4-7 (bench/results/tuning at f014b86, with Nsight Compute instruction counts): swiglu's gate check per
# vector on the bf16 bit patterns ("bits", 1 or 2 vectors a thread) against the per-gate check ("lean").
# Runs 12-17 (2026-12-01): bf16 widened from words and the lean fp32 sf ("ws"), adjacent vectors with one
# amax/sf/store a group ("wsc"), one gate check and weight a chunk ("wscc"), one row a block ("b1");
# norm_cast with words and the lean sf. The last shipped tilings stay as controls.
# Run 18: swiglu at 1280 threads an SM or 3 rows a block; norm_cast with the weight read after the row
# reduction ("nl", no preload: fewer registers) at 6-8 blocks an SM.
# Run 19: norm_cast rows over 7 warps (4 vectors a thread) at 5-6 blocks an SM; run 20: 9-10 blocks. Candidates
# of the next run go here; the shipped tilings and their predecessors as controls:
# Run 21: the persistent norm_cast tilings (p, pf, s) 60.4-79.0 µs against lean8nlbwd 49.5. Run 22: with the
# PDL wait at entry ("g", launched with programmatic dependent launch) at 7-9 blocks an SM, persistent too:
# g 47.7-48.1, 7 blocks 48.6-49.0, 9 blocks 48.2-48.4, persistent 59.8-60.5 (lean8nlbwd 49.5-49.8; a weight
# shared by every call). Run 23: a weight per input set; "w", the weight's lines prefetched into L2 at entry.
SWIGLU_TILINGS = ("wscc2v9b1", "wscc2v9b1g")
NORM_CAST_TILINGS = ("lean8nlbwd", "lean8nlbwdg", "lean8nlbwdgw", "lean9nlbwdg", "lean9nlbwdgw")
# Gates outside the lean division's exact range (zeros, tiny, below -64, huge) and ones whose
# 1 + exp(-g) may have an all-ones mantissa (2**-23, 2**-21, about -ln 3)
EDGE_GATES = (0.0, -0.0, 2.0**-23, 2.0**-21, -1.0986, 1e-30, -1e-30, -70.0, -100.0, 1e30, 3.0, -3.0)
TOKENS, SWIGLU_HIDDEN, NORM_HIDDEN = 8192, 2048, 7168


def _swiglu_rows() -> list[tuple[str, float | None, str]]:
    inputs = [{"x": torch.randn(TOKENS, 2 * SWIGLU_HIDDEN, dtype=torch.bfloat16, device="cuda")} for _ in range(INPUT_SETS)]
    nbytes = TOKENS * SWIGLU_HIDDEN * (2 * 2 + 1) + TOKENS * (SWIGLU_HIDDEN // 128) * 4
    want_q, want_sf = reference.fused.swiglu_forward_and_per_token_cast(inputs[0]["x"], "e4m3", 128)
    edge = _edge_input()
    rows = []
    for tiling in SWIGLU_TILINGS:
        _fused.SWIGLU_TILING = tiling

        def call(a):
            return tkaot.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128)

        def check(got):
            verdicts = {_same(got, (want_q, want_sf)), _edge_verdict(edge)}
            return "exact" if verdicts == {"exact"} else "MISMATCH"

        rows.append(_measure(f"swiglu+cast {tiling}", call, inputs, nbytes, check))
    _fused.SWIGLU_TILING = "base"
    return rows


def _edge_input() -> dict:
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(256, 2 * SWIGLU_HIDDEN, generator=g, device="cuda") * 4
    gates = torch.tensor(EDGE_GATES, device="cuda")
    pick = torch.randint(0, 4 * len(EDGE_GATES), x[:, :SWIGLU_HIDDEN].shape, generator=g, device="cuda")
    x[:, :SWIGLU_HIDDEN] = torch.where(pick < len(EDGE_GATES), gates[pick.clamp(max=len(EDGE_GATES) - 1)], x[:, :SWIGLU_HIDDEN])
    weights = torch.rand(256, generator=g, device="cuda")
    return dict(x=x.bfloat16(), topk_weights=weights, routed_scaling_factor=2.5, clamp_value=6.0)


def _edge_verdict(edge: dict) -> str:
    """Bit-exactness on the edge gates, plain and with weights and clamping (counts compared too)."""
    plain = tkaot.quant.swiglu_forward_and_per_token_cast(edge["x"], "e4m3", 128)
    verdicts = {_same(plain, reference.fused.swiglu_forward_and_per_token_cast(edge["x"], "e4m3", 128))}
    counts = [torch.zeros(4, dtype=torch.int64, device="cuda") for _ in range(2)]
    got = tkaot.quant.swiglu_forward_and_per_token_cast(**edge, fmt="e4m3", num_per_channels=128, clamped_count=counts[0])
    want = reference.fused.swiglu_forward_and_per_token_cast(**edge, fmt="e4m3", num_per_channels=128, clamped_count=counts[1])
    verdicts.add(_same(got, want) if torch.equal(counts[0], counts[1]) else "MISMATCH")
    return "exact" if verdicts == {"exact"} else "MISMATCH"


def _norm_cast_rows() -> list[tuple[str, float | None, str]]:
    # Each input set has its own weight, as bench/cases/fused.py's (and a model's layers) do: a weight shared by
    # every call stays in L2, which hides the weight's first read (runs before 23 shared one, 1.5 µs faster)
    def norm_set():
        return {
            "x": torch.randn(TOKENS, NORM_HIDDEN, dtype=torch.bfloat16, device="cuda") * 3,
            "w": torch.randn(NORM_HIDDEN, dtype=torch.bfloat16, device="cuda"),
        }

    inputs = [norm_set() for _ in range(INPUT_SETS)]
    weight = inputs[0]["w"]
    nbytes = TOKENS * NORM_HIDDEN * (2 + 1) + TOKENS * (NORM_HIDDEN // 32) * 4 + NORM_HIDDEN * 2
    rows = []
    for tiling in NORM_CAST_TILINGS:
        _fused.NORM_CAST_TILING = tiling

        def call(a):
            return tkaot.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32)

        def check(_):
            # The kernel's own rstd goes into the reference, so the cast is compared bit for bit; out_scale 1
            # and another value (the "unit" tilings run a separate loop for each)
            verdicts = set()
            for out_scale in (1.0, 0.75):
                x = inputs[0]["x"]
                (q, sf), y, rstd, _ = tkaot.quant.norm_forward_and_per_token_cast(
                    x, weight, 1e-6, "e4m3", 32, out_scale=out_scale, with_rstd=True, with_out_bf16=True
                )
                (want_q, want_sf), want_y, _, _ = reference.fused.norm_forward_and_per_token_cast(
                    x, weight, 1e-6, None, out_scale, rstd=rstd
                )
                verdicts.add(_same((q, sf), (want_q, want_sf)))
                verdicts.add("exact" if torch.equal(y, want_y.bfloat16()) else "MISMATCH")  # the extra bf16 output
            return "exact" if verdicts == {"exact"} else "MISMATCH"

        rows.append(_measure(f"norm+cast {tiling}", call, inputs, nbytes, check))
    _fused.NORM_CAST_TILING = "base"

    def plain(a):
        return tkaot.quant.norm_forward(a["x"], a["w"], 1e-6)

    rows.append(_measure("norm_forward (anchor)", plain, inputs, 2 * TOKENS * NORM_HIDDEN * 2 + NORM_HIDDEN * 2, lambda _: "-"))
    return rows


def _peer_rows() -> list[tuple[str, float | None, str]]:
    """TileKernels on the same shapes, when it is importable (its first call compiles)."""
    try:
        import tile_kernels as tk
    except ImportError:
        return []
    swiglu_inputs = [{"x": torch.randn(TOKENS, 2 * SWIGLU_HIDDEN, dtype=torch.bfloat16, device="cuda")} for _ in range(INPUT_SETS)]
    norm_inputs = [
        {"x": torch.randn(TOKENS, NORM_HIDDEN, device="cuda").bfloat16() * 3, "w": torch.randn(NORM_HIDDEN, device="cuda").bfloat16()}
        for _ in range(INPUT_SETS)
    ]
    swiglu_bytes = TOKENS * SWIGLU_HIDDEN * (2 * 2 + 1) + TOKENS * (SWIGLU_HIDDEN // 128) * 4
    norm_bytes = TOKENS * NORM_HIDDEN * (2 + 1) + TOKENS * (NORM_HIDDEN // 32) * 4 + NORM_HIDDEN * 2

    def swiglu(a):
        return tk.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128)

    def norm_cast(a):
        return tk.quant.norm_forward_and_per_token_cast(a["x"], a["w"], 1e-6, "e4m3", 32)

    return [
        _measure("TileKernels swiglu+cast", swiglu, swiglu_inputs, swiglu_bytes, lambda _: "-"),
        _measure("TileKernels norm+cast", norm_cast, norm_inputs, norm_bytes, lambda _: "-"),
    ]


def _same(got, want) -> str:
    (q, sf), (want_q, want_sf) = got, want
    exact = torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(sf, want_sf)
    return "exact" if exact else "MISMATCH"


def _measure(name, call, inputs, nbytes, check) -> tuple[str, float | None, str]:
    try:
        verdict = check(call(inputs[0]))
        us, mode = device_us(call, inputs)
    except VariantNotBuilt as exc:
        return name, None, f"not built: {str(exc).splitlines()[0][:60]}"
    return name, us, f"{nbytes / us / 1e6:5.2f} TB/s  {verdict}{'' if mode == 'graph' else ' (events)'}"


def main() -> None:
    t0 = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name()}, {INPUT_SETS} rotating input sets, {TOKENS} tokens")
    rows = _swiglu_rows() + _norm_cast_rows() + _peer_rows()
    ceiling = copy_ceiling_tbps(1 << 30)
    print(f"{'candidate':24s} {'µs':>8s}  TB/s  check")
    for name, us, note in rows:
        print(f"{name:24s} {us:8.2f}  {note}" if us is not None else f"{name:24s} {'-':>8s}  {note}")
    print(f"copy ceiling {ceiling:.2f} TB/s; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
