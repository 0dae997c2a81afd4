"""Time the tiling candidates of the row-wise casts (kernel `cast_tune`) at 8192 x 7168 on one GPU.

Needs an artifact set holding the candidates and the variants the public ops launch
for these cases (so "op (installed)" times the kernels the ops ship now), built with (cast_tune is no
declared kernel now: its lines need the catalogue of commit 46d55b4)

    tkaot-build build --op cast_tune --set "case=ptc_e4m3_128|ptc_e4m3_128_ue8m0_col|cast_back_e4m3_128|per_channel_128" \
        --set "tiling=c0|c1|c2|c3" --out tune-artifacts/quant
    tkaot-build build --op cast_tune --set case=ptc_e2m1_32 --set "tiling=c0|c1" --out tune-artifacts/quant
    tkaot-build build --op cast_tune --set case=ptc_e2m1_32_ue8m0 --set "tiling=c0|c1" --out tune-artifacts/quant
    tkaot-build build --op per_token_cast --set hidden=7168 --set in_dtype=bfloat16 --set in_block=none --set in_sf=none \
        --set fmt=e4m3 --set group=128 --set "sf=fp32|ue8m0" --set "sf_layout=row|col" --set mode=cast --set stochastic=false \
        --out tune-artifacts/quant
    tkaot-build build --op per_token_cast --set hidden=7168 --set in_dtype=bfloat16 --set in_block=none --set in_sf=none \
        --set fmt=e2m1 --set group=32 --set "sf=fp32|ue8m0" --set sf_layout=row --set mode=cast --set stochastic=false \
        --out tune-artifacts/quant
    tkaot-build build --op cast_back --set hidden=7168 --set in_dtype=e4m3 --set in_block=1x128 --set in_sf=fp32 \
        --set out_dtype=bfloat16 --out tune-artifacts/quant
    tkaot-build build --op per_channel_cast --set hidden=7168 --set in_dtype=bfloat16 --set in_block=none --set in_sf=none \
        --set block_m=128 --set sf=fp32 --out tune-artifacts/quant

and run from the repository root as

    TKAOT_PATH=tune-artifacts/quant python -m bench.tuning.tune_quant [CASE ...]

(naming cases runs only those, e.g. ptc_e2m1_32 ptc_e2m1_32_ue8m0). Each candidate's
output is first checked bit-exact against the torch reference, then timed by
CUDA-graph replay over rotating input sets (each larger than L2). Per-token casts
are also checked on edge inputs (61 tokens, so the last CTA is partly empty):
zeros and -0, bf16 subnormals, values whose products land on E2M1 / E4M3 rounding
ties and one unit either side, the largest bf16 values, random magnitudes across
the whole exponent range, all bit-exact against the reference; and on rows with
inf and NaN, where the reference's NaN handling is not the kernels' (its amax
propagates NaN), bit-exact against c0 (in the FP4 cases, the tiling the op ships).
The public op is timed beside them: TKAOT_PATH comes first, so it runs the
variants built above (the tilings the op ships), else whatever the installed artifact sets hold.
Tiling names (kernels_src/quant/tiling.py): t<threads>r<rows>c<cols>, v8 = 8-byte
input vectors, h = CTAs walk along the rows, s = one lane forms each group's scale,
f = bf16 to FP4 by the word helpers of kernels_src/quant/fp4_words.py, with no
token checks in CTAs whose tokens are all in range.
"""

from __future__ import annotations

import sys
import time

import torch

import tkaot
from bench.timing import device_us
from bench.tuning.cast_tune import CASES
from tkaot._op import current_stream
from tkaot._quant import casts as _casts
from tkaot.errors import VariantNotBuilt
from tkaot.reference import quant as ref

TOKENS, HIDDEN, SETS = 8192, 7168, 4
EDGE_TOKENS = 61
# TileKernels 2.1.0 on the same H200 (earlier run, µs): the bar each case must clear (none measured for MXFP4)
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
            args, outs, want, op, moved = per_token_io(x, params)
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
        sets.append(dict(ptrs=pointers(args), outs=outs, want=want if n == 0 else None, op=op, moved=moved))
    return sets


def pointers(args) -> tuple:
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else (0 if a is None else a) for a in args)


def per_token_io(x: torch.Tensor, params: dict):
    """(kernel args, outputs, reference, public op, bytes moved) of a per_token_cast case on input x."""
    tokens, hidden = x.shape
    fmt, group, kind, layout = params["fmt"], params["group"], params["sf"], params["sf_layout"]
    flags = dict(round_sf=kind == "ue8m0", use_packed_ue8m0=kind == "ue8m0", use_tma_aligned_col_major_sf=layout == "col")
    out = torch.empty(tokens, hidden // 2 if fmt == "e2m1" else hidden, dtype=_casts._FMT_DTYPE[fmt], device=x.device)
    out_sf = _casts._alloc_sf(tokens, hidden // group, kind, layout, x.device)
    args = (x, None, out, out_sf, tokens, x.stride(0), 0, _casts._sf_kernel_stride(out_sf, kind, layout))
    want = lambda: ref.per_token_cast(x, fmt, group, **flags)
    op = lambda: tkaot.quant.per_token_cast(x, fmt, group, **flags)
    return args, (out, out_sf), want, op, x.nbytes + out.nbytes + out_sf.nbytes


def _bf16(bits: list[int]) -> torch.Tensor:
    """fp32 values of bf16 bit patterns."""
    return (torch.tensor(bits, dtype=torch.int32) << 16).view(torch.float32)


def edge_inputs(params: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(finite, non-finite) bf16 inputs of EDGE_TOKENS x HIDDEN for a per-token case (see the module docstring)."""
    gen = torch.Generator().manual_seed(7)
    group, fmax = params["group"], ref.FORMAT_MAX[params["fmt"]]
    groups = HIDDEN // group

    def rows(n: int, make_row) -> torch.Tensor:
        return torch.stack([make_row() for _ in range(n)])

    def pick(pool: torch.Tensor, n: int) -> torch.Tensor:
        return pool[torch.randint(len(pool), (n,), generator=gen)]

    def signs(n: int) -> torch.Tensor:
        return torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)

    # Rounding ties: a group whose amax is fmax * 2**k has the factor 2**-k, so the grid's midpoints (and the bf16
    # values one unit either side) times 2**k give products on, just under and just over every tie; amax = fmax * 7/6
    # makes the factor inexact, and products near the ties round either way in fp32
    if params["fmt"] == "e2m1":
        grid = torch.tensor(ref.E2M1_GRID)
    else:
        grid = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = ((grid[1:] + grid[:-1]) / 2).to(torch.bfloat16).view(torch.int16)
    near = torch.cat([mids - 1, mids, mids + 1]).view(torch.bfloat16).float()

    def tie_row(scale: float):
        def make_group():
            g = pick(near, group) * signs(group)
            g[torch.randint(group, (1,), generator=gen)] = fmax
            return g * scale

        return lambda: torch.cat([make_group() for _ in range(groups)])

    subnormal = _bf16([*range(1, 128), *(0x8000 | b for b in range(1, 128)), 0x0080, 0x8080])  # and the smallest normals
    largest = _bf16([0x7F7F, 0x7F7E, 0x7F40, 0x7F00, 0x7E80])  # 3.39e38 down
    first = torch.arange(HIDDEN) % group == 0
    finite = [
        torch.zeros(1, HIDDEN),
        torch.full((1, HIDDEN), -0.0),
        rows(2, lambda: pick(subnormal, HIDDEN)),
        rows(1, lambda: torch.where(first, 1.0, pick(subnormal, HIDDEN))),  # tiny values beside a large amax
        *(rows(2, tie_row(scale)) for scale in (1.0, 2.0, 0.5, 2.0**20, 2.0**-100, 7 / 6)),
        rows(4, lambda: pick(largest, HIDDEN) * signs(HIDDEN)),
        rows(2, lambda: torch.where(torch.rand(HIDDEN, generator=gen) < 0.1, pick(largest, HIDDEN), torch.randn(HIDDEN, generator=gen))),
    ]
    n = EDGE_TOKENS - sum(len(r) for r in finite)
    exps = torch.randint(-133, 126, (n, groups, 1), generator=gen).float()  # every binade, no overflow to inf
    finite.append((torch.randn(n, groups, group, generator=gen) * torch.exp2(exps)).view(n, HIDDEN))
    x = torch.cat(finite).to(torch.bfloat16)

    y = torch.randn(EDGE_TOKENS, groups, group, generator=gen)
    where = torch.rand(EDGE_TOKENS, groups, group, generator=gen) < 0.05
    y[where] = pick(torch.tensor([float("inf"), float("-inf"), float("nan")]), int(where.sum()))
    y[0] = float("nan")  # all-NaN groups
    y[1] = float("-inf")
    y[2, :, ::2] = float("nan")
    y = y.view(EDGE_TOKENS, HIDDEN).to(torch.bfloat16)
    y.view(torch.int16)[3, ::3] = -0x3F  # 0xFFC1: a NaN with the sign bit set and a payload
    return x.to(device), y.to(device)


def edge_check(device: int, case: str, launcher, control: dict | None) -> str:
    """Bit-exactness of one per-token candidate on the edge inputs: the finite rows against the reference, the
    inf / NaN rows against c0's outputs (`control`, filled when c0 runs: pass {} then, the filled dict after)."""
    params = CASES[case][1]
    notes = []
    for name, x in zip(("edge", "inf/nan"), edge_inputs(params, "cuda")):
        args, outs, want, _, _ = per_token_io(x, params)
        for t in outs:
            (t if t.stride(-1) == 1 else t.mT).view(torch.uint8).fill_(0xFF)
        launcher(device, current_stream(device), *pointers(args))
        torch.cuda.synchronize()
        if name == "edge":
            bad = differing_bytes(outs, want())
        elif control is None:
            notes.append("inf/nan: no c0 to compare")
            continue
        elif "outs" not in control:
            control["outs"] = [t.clone() for t in outs]
            bad = 0
        else:
            bad = differing_bytes(outs, control["outs"])
        if bad:
            notes.append(f"{name}: {bad} bytes differ")
    return ", ".join(notes)


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
        return REGISTRY.kernel("bench.tuning.tune_quant", "cast_tune", key, device).bind(ARGS[CASES[case][0].DECL.name])
    except VariantNotBuilt:
        return None


def report(case: str, label: str, us: float, moved: int, note: str = "") -> None:
    vs_tk = f"{TILE_KERNELS_US[case] / us:5.2f}x" if case in TILE_KERNELS_US else "    -"
    print(f"{case:24s} {label:18s} {us:7.1f} {moved / us / 1e6:6.2f}  {vs_tk}  {note}")


def main(argv: list[str]) -> int:
    unknown = [c for c in argv if c not in CASES]
    if unknown:
        print(f"unknown cases {unknown}; cases are {list(CASES)}", file=sys.stderr)
        return 2
    device = torch.cuda.current_device()
    start = time.perf_counter()
    print(f"{'case':24s} {'candidate':18s} {'µs':>7s} {'TB/s':>6s}  {'vs TK':>6s}  check")
    failures = 0
    for case, (_, _, tilings) in CASES.items():
        if argv and case not in argv:
            continue
        sets = make_sets(case, "cuda")
        want = sets[0]["want"]()
        moved = sets[0]["moved"]
        control = {}  # c0's outputs on the non-finite edge rows
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
            edge = ""
            if _kernel_of(case) == "per_token_cast":
                edge = edge_check(device, case, launcher, control if name == "c0" or "outs" in control else None)
            failures += bad != 0 or "differ" in edge

            def launch(s, launcher=launcher):
                launcher(device, current_stream(device), *s["ptrs"])

            us, mode = device_us(launch, sets, reps=20)
            note = ("ok" if bad == 0 else f"{bad} bytes differ") + (f", {edge}" if edge else "") + ("" if mode == "graph" else f" ({mode})")
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
    sys.exit(main(sys.argv[1:]))
