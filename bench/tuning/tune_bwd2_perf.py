"""Time the tilings of moe_topk_gate_backward (kernels_src/moe/moe_topk_gate_backward.py) beside TileKernels.

    python -m build_tools.cli build --shapeset bench/tuning/tune_bwd2_perf.toml --arch sm90 --out tune-artifacts/bwd2
    TKAOT_PATH=$PWD/tune-artifacts/bwd2 python -m bench.tuning.tune_bwd2_perf --out DIR

(the default artifact set holds these tilings too: without TKAOT_PATH it times those). The candidates are the
kernel's tilings (tokens a block; route gradients gathered through a shared-memory row a warp): scatter4, the one
shipped (scatter1, scatter2, scatter8 measured within noise of it on the H200 and were dropped). Each is launched
straight from its artifact entry at bench/cases/backward.py's
shapes (8192 x 256, top-8, without and with the aux term). Before timing, each
candidate's output is compared: its bytes against the default tiling's (all tilings must write the same bytes),
and against TileKernels within the parity suite's tolerance (tests/parity_backward_cases.py: rtol 1e-5, sums in
another order; TileKernels builds with fast math). A last check-only input repeats experts within a token and
leaves slots empty (-1), against the torch reference.
The kernel before the shared-memory gather is not buildable any more; its times in the same bench run are the
control (11.84 / 13.78 µs, TileKernels 7.18 / 8.34).
Prints a table last (candidate, shape, µs, TileKernels µs, ratio, identical?) and writes DIR/tune_bwd2_perf.log.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench.timing import device_us
from tkaot._moe import backward as gate_backward
from tkaot._op import current_stream
from tkaot.errors import VariantNotBuilt
from tkaot.reference import backward as ref

TOKENS, EXPERTS, TOPK, SCALE, SEQS = 8192, 256, 8, 2.5, 4
TILINGS = ("scatter4",)  # scatter1/2/8 lost or tied (tkaot/_moe/kernels.py); a new candidate needs a declared tiling
SETS = 4  # rotating input sets: 4 x (8 MiB in + 8 MiB out), past the 50 MiB L2
RTOL, ATOL = 1e-5, 1e-7


def _inputs(gen: torch.Generator, aux: bool, tokens: int = TOKENS, repeats: bool = False) -> dict:
    scores = torch.nn.functional.softplus(torch.randn(tokens, EXPERTS, device="cuda", generator=gen)).sqrt()
    idx = torch.argsort(torch.rand(tokens, EXPERTS, device="cuda", generator=gen), dim=1)[:, :TOPK].contiguous()
    if repeats:  # fixed routing may repeat an expert; masked slots carry -1
        idx[::3, 1] = idx[::3, 0]
        idx[::5, 7] = idx[::5, 0]
        idx[::7, 4] = -1
    return {
        "scores": scores, "idx": idx,
        "w": torch.rand(tokens, TOPK, device="cuda", generator=gen),
        "dw": torch.randn(tokens, TOPK, device="cuda", generator=gen),
        "mask": (torch.rand(tokens, device="cuda", generator=gen) > 0.1) if aux else None,
        "h": torch.randn(SEQS, EXPERTS, device="cuda", generator=gen) if aux else None,
        "out": torch.empty(tokens, EXPERTS, device="cuda"),
    }  # fmt: skip


def _call(launch, device: int):
    def call(a: dict) -> None:
        tokens = a["scores"].shape[0]
        launch(
            device, current_stream(device),
            a["scores"].data_ptr(), a["idx"].data_ptr(), a["w"].data_ptr(), a["dw"].data_ptr(),
            0 if a["mask"] is None else a["mask"].data_ptr(), 0 if a["h"] is None else a["h"].data_ptr(),
            a["out"].data_ptr(), SCALE, 0 if a["h"] is None else 1, tokens // SEQS, tokens, EXPERTS, TOPK,
        )  # fmt: skip

    return call


def _theirs(tk):
    def call(a: dict) -> None:
        tk.moe.moe_topk_gate_backward(
            a["scores"], a["idx"], a["w"], a["dw"], SCALE, mask=a["mask"], grad_scores_sum=a["h"], out=a["out"]
        )

    return call


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs() / want.abs().clamp_min(1e-30)).max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import tile_kernels as tk

    start = time.perf_counter()
    device = torch.cuda.current_device()
    gen = torch.Generator(device="cuda").manual_seed(0)
    log: list[str] = []
    rows: list[tuple] = []

    def say(line: str) -> None:
        print(line)
        log.append(line)

    launchers = {}
    for tiling in TILINGS:
        try:
            launchers[tiling] = gate_backward._KERNEL.get(device, tiling)
        except VariantNotBuilt:
            say(f"{tiling}: not built (is the artifact set of this script on TKAOT_PATH?)")

    for aux in (False, True):
        shape = f"{TOKENS}x{EXPERTS}, top-{TOPK}" + (", aux" if aux else "")
        sets = [_inputs(gen, aux) for _ in range(SETS)]
        theirs = _theirs(tk)
        theirs(sets[0])
        torch.cuda.synchronize()
        want = sets[0]["out"].clone()
        tk_us, _ = device_us(theirs, sets, reps=30)
        first = None
        for tiling, launch in launchers.items():
            call = _call(launch, device)
            sets[0]["out"].fill_(float("nan"))
            call(sets[0])
            torch.cuda.synchronize()
            got = sets[0]["out"].clone()
            first = got if first is None else first
            same = torch.equal(got.view(torch.int32), first.view(torch.int32))
            close = torch.allclose(got, want, rtol=RTOL, atol=ATOL)
            verdict = ("same bytes as scatter4" if same else "BYTES DIFFER from scatter4") + (
                ", close to TK" if close else ", FAR from TK"
            )
            us, mode = device_us(call, sets, reps=30)
            say(f"{tiling:9s} {shape:26s} {us:7.2f} µs ({mode})  TK {tk_us:6.2f}  max rel vs TK {_rel(got, want):.2e}  {verdict}")
            rows.append((tiling, shape, us, tk_us, us / tk_us, verdict))
        del sets

    # repeated experts and empty slots: every tiling against the torch reference (and the same bytes)
    for aux in (False, True):
        a = _inputs(gen, aux, tokens=1000, repeats=True)
        want = ref.moe_topk_gate_backward(a["scores"], a["idx"], a["w"], a["dw"], SCALE, a["mask"], a["h"])
        first = None
        for tiling, launch in launchers.items():
            a["out"].fill_(float("nan"))
            _call(launch, device)(a)
            torch.cuda.synchronize()
            got = a["out"].clone()
            first = got if first is None else first
            same = torch.equal(got.view(torch.int32), first.view(torch.int32))
            close = torch.allclose(got, want, rtol=1e-4, atol=1e-6)
            say(f"repeats{' + aux' if aux else ''}: {tiling}: {'same bytes' if same else 'BYTES DIFFER'}, "
                f"{'close to' if close else 'FAR from'} the reference (max rel {_rel(got, want):.2e})")  # fmt: skip

    say(f"\n{'candidate':9s} {'shape':26s} {'µs':>7s} {'TK µs':>7s} {'ratio':>6s}  identical?")
    for tiling, shape, us, tk_us, ratio, verdict in rows:
        say(f"{tiling:9s} {shape:26s} {us:7.2f} {tk_us:7.2f} {ratio:6.2f}  {verdict}")
    say(f"control (kernel before, same bench run): 11.84 / 13.78 µs; {time.perf_counter() - start:.1f} s")
    (args.out / "tune_bwd2_perf.log").write_text("\n".join(log) + "\n")


if __name__ == "__main__":
    main()
