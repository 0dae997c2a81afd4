"""Time the tiling candidates of the row-wise casts (kernel `cast_tune`) at 8192 x 7168 on one GPU.

Needs an artifact set holding the candidates and the variants the public ops launch
for these cases (so "op (installed)" times the kernels the ops ship now), built with

    tkaot-build build --op cast_tune --set "case=ptc_e4m3_128|ptc_e4m3_128_ue8m0_col|ptc_e2m1_32|cast_back_e4m3_128|per_channel_128" \
        --set "tiling=c0|c1|c2|c3" --out tune-artifacts/quant
    tkaot-build build --op per_token_cast --set hidden=7168 --set in_dtype=bfloat16 --set in_block=none --set in_sf=none \
        --set fmt=e4m3 --set group=128 --set "sf=fp32|ue8m0" --set "sf_layout=row|col" --set mode=cast --set stochastic=false \
        --out tune-artifacts/quant
    tkaot-build build --op per_token_cast --set hidden=7168 --set in_dtype=bfloat16 --set in_block=none --set in_sf=none \
        --set fmt=e2m1 --set group=32 --set sf=fp32 --set sf_layout=row --set mode=cast --set stochastic=false \
        --out tune-artifacts/quant
    tkaot-build build --op cast_back --set hidden=7168 --set in_dtype=e4m3 --set in_block=1x128 --set in_sf=fp32 \
        --set out_dtype=bfloat16 --out tune-artifacts/quant
    tkaot-build build --op per_channel_cast --set hidden=7168 --set in_dtype=bfloat16 --set in_block=none --set in_sf=none \
        --set block_m=128 --set sf=fp32 --out tune-artifacts/quant

and run from the repository root as

    TKAOT_PATH=tune-artifacts/quant python -m bench.tune_quant

Each candidate's output is first checked bit-exact against the torch reference,
then timed by CUDA-graph replay over rotating input sets (each larger than L2).
The public op is timed beside them: TKAOT_PATH comes first, so it runs the
variants built above (c0's tiling), else whatever the installed artifact sets hold.
Tiling names (kernels_src/quant/tiling.py): t<threads>r<rows>c<cols>, v8 = 8-byte
input vectors, h = CTAs walk along the rows, s = one lane forms each group's scale.
"""

from __future__ import annotations

import sys
import time

import torch

import tkaot
from bench.timing import device_us
from kernels_src.quant.cast_tune import CASES
from tkaot import _casts
from tkaot._op import current_stream
from tkaot.errors import VariantNotBuilt
from tkaot.reference import quant as ref

TOKENS, HIDDEN, SETS = 8192, 7168, 4
# TileKernels 2.1.0 on the same H200 (earlier run, µs): the bar each case must clear
TILE_KERNELS_US = {
    "ptc_e4m3_128": 44.4,
    "ptc_e4m3_128_ue8m0_col": 44.7,
    "ptc_e2m1_32": 187.7,
    "cast_back_e4m3_128": 45.9,
    "per_channel_128": 43.8,
}
ARGS = {
    "per_token_cast": _casts._PER_TOKEN_ARGS,
    "cast_back": ("x", "x_sf", "out", "num_tokens", "x_stride", "sf_stride"),
    "per_channel_cast": _casts._PER_CHANNEL.args,
}


def _kernel_of(case: str) -> str:
    return CASES[case][0].KERNEL


def make_sets(case: str, device) -> list[dict]:
    """SETS input/output sets: "args" the kernel's device arguments, "want" the reference outputs (first set only)."""
    params = CASES[case][1]
    sets = []
    for n in range(SETS):
        x = torch.randn(TOKENS, HIDDEN, device=device) * torch.exp2(torch.randint(-8, 8, (TOKENS, 1), device=device).float())
        x = x.to(torch.bfloat16)
        kernel = _kernel_of(case)
        if kernel == "per_token_cast":
            fmt, group, kind, layout = params["fmt"], params["group"], params["sf"], params["sf_layout"]
            flags = dict(round_sf=kind == "ue8m0", use_packed_ue8m0=kind == "ue8m0", use_tma_aligned_col_major_sf=layout == "col")
            out = torch.empty(TOKENS, HIDDEN // 2 if fmt == "e2m1" else HIDDEN, dtype=_casts._FMT_DTYPE[fmt], device=device)
            out_sf = _casts._alloc_sf(TOKENS, HIDDEN // group, kind, layout, device)
            args = (x, None, out, out_sf, TOKENS, x.stride(0), 0, _casts._sf_kernel_stride(out_sf, kind, layout))
            outs = (out, out_sf)
            want = lambda x=x, fmt=fmt, group=group, flags=flags: ref.per_token_cast(x, fmt, group, **flags)
            op = lambda x=x, fmt=fmt, group=group, flags=flags: tkaot.quant.per_token_cast(x, fmt, group, **flags)
            moved = x.nbytes + out.nbytes + out_sf.nbytes
        elif kernel == "cast_back":
            data, sf = ref.per_token_cast(x, "e4m3", 128)
            out = torch.empty(TOKENS, HIDDEN, dtype=torch.bfloat16, device=device)
            args = (data, sf, out, TOKENS, data.stride(0), sf.stride(0))
            outs = (out,)
            want = lambda data=data, sf=sf: (ref.cast_back((data, sf), "bf16", (1, 128)),)
            op = lambda data=data, sf=sf: tkaot.quant.per_token_cast_back((data, sf), "bf16", 128)
            moved = data.nbytes + sf.nbytes + out.nbytes
        else:
            out = torch.empty(TOKENS, HIDDEN, dtype=torch.float8_e4m3fn, device=device)
            out_sf = torch.empty(TOKENS // 128, HIDDEN, dtype=torch.float32, device=device)
            args = (x, None, out, out_sf, TOKENS, 0)
            outs = (out, out_sf)
            want = lambda x=x: ref.per_channel_cast(x, "e4m3", 128)
            op = lambda x=x: tkaot.quant.per_channel_cast(x, "e4m3", 128)
            moved = x.nbytes + out.nbytes + out_sf.nbytes
        ptrs = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else (0 if a is None else a) for a in args)
        sets.append(dict(ptrs=ptrs, outs=outs, want=want if n == 0 else None, op=op, moved=moved))
    return sets


def differing_bytes(outs, want) -> int:
    bad = 0
    for got, ref_t in zip(outs, want):
        g = torch.empty(got.shape, dtype=got.dtype, device=got.device).copy_(got)
        w = torch.empty(ref_t.shape, dtype=ref_t.dtype, device=ref_t.device).copy_(ref_t)
        bad += int((g.view(torch.uint8) != w.view(torch.uint8)).sum())
    return bad


def candidate(device: int, case: str, tiling: str):
    """The bound launcher of one candidate, or None when no artifact set has it."""
    from tkaot.registry import REGISTRY

    key = f"case={case},tiling={tiling}"
    try:
        return REGISTRY.kernel("bench.tune_quant", "cast_tune", key, device).bind(ARGS[CASES[case][0].KERNEL])
    except VariantNotBuilt:
        return None


def report(case: str, label: str, us: float, moved: int, note: str = "") -> None:
    print(f"{case:24s} {label:18s} {us:7.1f} {moved / us / 1e6:6.2f}  {TILE_KERNELS_US[case] / us:5.2f}x  {note}")


def main() -> int:
    device = torch.cuda.current_device()
    start = time.perf_counter()
    print(f"{'case':24s} {'candidate':18s} {'µs':>7s} {'TB/s':>6s}  {'vs TK':>6s}  check")
    failures = 0
    for case, (_, _, tilings) in CASES.items():
        sets = make_sets(case, "cuda")
        want = sets[0]["want"]()
        moved = sets[0]["moved"]
        for name, tiling in tilings.items():
            label = f"{name} {tiling if isinstance(tiling, str) else 't{}k{}'.format(*tiling)}"
            launcher = candidate(device, case, name)
            if launcher is None:
                print(f"{case:24s} {label:18s} not built")
                continue
            for t in sets[0]["outs"]:
                (t if t.stride(-1) == 1 else t.mT).view(torch.uint8).fill_(0xFF)  # column-major sf: poison through its transpose
            launcher(device, current_stream(device), *sets[0]["ptrs"])
            torch.cuda.synchronize()
            bad = differing_bytes(sets[0]["outs"], want)
            failures += bad != 0

            def launch(s, launcher=launcher):
                launcher(device, current_stream(device), *s["ptrs"])

            us, mode = device_us(launch, sets, reps=20)
            note = ("ok" if bad == 0 else f"{bad} bytes differ") + ("" if mode == "graph" else f" ({mode})")
            report(case, label, us, moved, note)
        try:
            us, _ = device_us(lambda s: s["op"](), sets, reps=20)
            report(case, "op (installed)", us, moved)
        except VariantNotBuilt as exc:
            print(f"{case:24s} {'op (installed)':18s} not built ({str(exc).splitlines()[0]})")
        del sets, want
        torch.cuda.empty_cache()
    print(f"({time.perf_counter() - start:.0f} s; vs TK = TileKernels' µs from an earlier run / this µs: above 1 is faster)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
