"""Time norm_forward_and_per_token_cast's generic kernel (e4m3/32, no residual) against the one shipped before it,
its specialised variant and TileKernels, checking every output byte.

norm_cast_generic's default tiling now has a body for each width class (kernels_src/fused/norm_cast_generic.py,
RuntimeSplit.width_classes in kernels_src/norm/row_sum.py): rows over all 128 threads of a block (hidden > 2048) on
a split whose shift is a constant, so each vector is an offset from the row pointer as in the specialised kernel,
and the narrower rows on the runtime split, its loops to the 4 vectors those widths give a thread. Before it, one
body over the runtime split: 68.3 µs at 8192x7168 against 48.4 for the specialised kernel (H200, session 11: 1.41x).

Each candidate is norm_cast_generic (bf16, fp32 sf, the default tiling) built into its own artifact set,
ARTIFACTS/<candidate>/, with tune_mhc_perf's machinery (patches set while it builds): "control", the module's build
as it was at BEFORE (one body over the runtime split: the kernel shipped before); "new", this tree's (the shipped
default); "new.7blocks", the same at 7 blocks an SM (a 72-register cap: fewer addresses computed again). Build on
a CPU with TileLang and nvcc, then time on the GPU where tile_kernels imports (widths past --budget s skipped):

    python -m bench.tuning.tune_generic3 build --out tune-artifacts/generic3
    python -m bench.tuning.tune_generic3 --artifacts tune-artifacts/generic3 --out DIR

For each width and candidate the specialised variant (prebuilt set) runs, then the candidate's generic kernel, each
beside TileKernels; every output (values and scale factors) is compared bit for bit with TileKernels' and with the
specialised variant's (the specialised rows repeat per candidate: the run's noise). Widths: 7168 (the issue's
row), 4096 (wide), 1536 (narrow: 64 threads a row, a thread's last vector out of some rows), 2080 (wide, the last
vector in half the lanes; no specialised variant is built there, so only TileKernels' bytes count).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

from bench.tuning.tune_mhc_perf import Candidate, Source, _set, build

ARTIFACTS = "tune-artifacts/generic3"
BEFORE = "a3a2081"  # main before the width classes
TOKENS = 8192
WIDTHS = (7168, 4096, 1536, 2080)
SETS = 4  # rotating inputs of 8192 rows: past L2 (bf16)
_NC, _NCG = "kernels_src.fused.norm_cast", "kernels_src.fused.norm_cast_generic"


class _Tiling(NamedTuple):  # kernels_src/fused/norm_cast.py's Tiling, for a patched TILINGS
    blocks: int
    preload: bool
    residual: bool


_VALUES = {"dtype": "bfloat16", "sf": "fp32", "tiling": "lean8nlbwdgw"}
_OP = dict(kernel="norm_cast_generic", op="norm_forward_and_per_token_cast", values=_VALUES)
_SEVEN = {"lean8nlbwdgw": _Tiling(7, False, False), "lean6plbwdgwRL": _Tiling(6, True, True)}
CANDIDATES = (
    Candidate("control", patches=((_NCG, "build", Source(BEFORE)),), note="one body, runtime split (shipped before)", **_OP),
    Candidate("new", note="a body a width class (shipped)", **_OP),
    Candidate("new.7blocks", patches=_set(_NC, TILINGS=_SEVEN), note="the same, 7 blocks an SM", **_OP),
)  # fmt: skip
CONTROL_US = {f"norm_cast {TOKENS}x7168 e4m3/32": 68.34}  # the shipped generic kernel, session 11 (H200)


def main(argv=None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["build"]:
        parser = argparse.ArgumentParser(prog="tune_generic3 build")
        parser.add_argument("--out", default=ARTIFACTS)
        build(Path(parser.parse_args(argv[1:]).out), candidates=CANDIDATES)
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--artifacts", default=ARTIFACTS)
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget", type=float, default=70.0, help="seconds, after which the remaining widths are skipped")
    args = parser.parse_args(argv)
    time_candidates(Path(args.artifacts), Path(args.out), args.budget)


def time_candidates(artifacts: Path, out_dir: Path, budget: float) -> None:
    import torch

    from bench.tuning.tune_generic_perf import print_table, specialised_then_generic
    from tkaot import _op
    from tkaot._quant import norm_cast as _norm_cast

    try:
        import tile_kernels as tk
    except ImportError:
        tk = None
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rows, log, begun = [], [], time.time()
    for hidden in WIDTHS:
        if time.time() - begun > budget:
            log.append(f'{{"skipped": {hidden}, "why": "past the budget"}}')
            continue
        name = f"norm_cast {TOKENS}x{hidden} e4m3/32"
        inputs = [{"x": torch.randn(TOKENS, hidden, device="cuda").to(torch.bfloat16)} for _ in range(SETS)]
        weight = torch.randn(hidden, device="cuda").to(torch.bfloat16)

        def call(module, a, weight=weight):
            return module.quant.norm_forward_and_per_token_cast(a["x"], weight, 1e-6, "e4m3", 32)

        for c in CANDIDATES:
            os.environ["TKAOT_PATH"] = str(artifacts / c.name)  # the candidate first, the prebuilt set after it
            _op.REGISTRY.reset()
            special, generic = specialised_then_generic(tk, log, name, _norm_cast._NORM_CAST, "norm_cast", inputs, call)
            generic["candidate"] = f"generic {c.name} ({c.note})"
            special["candidate"] = f"specialised (with {c.name})"
            rows += [special, generic]
        del inputs
        torch.cuda.empty_cache()
    os.environ.pop("TKAOT_PATH", None)
    _op.REGISTRY.reset()
    (out_dir / "tune_generic3.jsonl").write_text("\n".join(log) + "\n")
    print(f"{torch.cuda.get_device_name(0)}, {time.time() - begun:.0f} s")
    print_table(rows, {**{r["case"]: float("nan") for r in rows}, **CONTROL_US})


if __name__ == "__main__":
    main()
