"""Launch the fused kernels a few times each, for a profiler run of tkaot beside TileKernels.

    ncu --clock-control none -k regex:'swiglu|norm' --section ... \
        python -m bench.tuning.profile_fused [swiglu:<tiling> | norm_cast:<tiling> ...]

Runs the shipped tilings, then each candidate named on the command line (built on
TKAOT_PATH, as for bench/tuning/tune_fused.py), then TileKernels' kernels on the same inputs when
tile_kernels is importable. Each is launched LAUNCHES times; prints the launch order.
"""

from __future__ import annotations

import sys

import torch

import tkaot
from tkaot._quant import fused as _fused

LAUNCHES = 2
TOKENS, SWIGLU_HIDDEN, NORM_HIDDEN = 8192, 2048, 7168


def main() -> None:
    x = torch.randn(TOKENS, 2 * SWIGLU_HIDDEN, dtype=torch.bfloat16, device="cuda")
    xn = torch.randn(TOKENS, NORM_HIDDEN, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(NORM_HIDDEN, dtype=torch.bfloat16, device="cuda")
    runs = [("tkaot swiglu (shipped)", lambda: tkaot.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128))]
    runs.append(("tkaot norm_cast (shipped)", lambda: tkaot.quant.norm_forward_and_per_token_cast(xn, w, 1e-6, "e4m3", 32)))
    for arg in sys.argv[1:]:
        family, tiling = arg.split(":")
        attr = {"swiglu": "SWIGLU_TILING", "norm_cast": "NORM_CAST_TILING"}[family]

        def run(attr=attr, tiling=tiling, family=family):
            saved = getattr(_fused, attr)
            setattr(_fused, attr, tiling)
            try:
                if family == "swiglu":
                    tkaot.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128)
                else:
                    tkaot.quant.norm_forward_and_per_token_cast(xn, w, 1e-6, "e4m3", 32)
            finally:
                setattr(_fused, attr, saved)

        runs.append((f"tkaot {family} {tiling}", run))
    try:
        import tile_kernels as tk
    except ImportError:
        tk = None
    if tk is not None:
        runs.append(("TileKernels swiglu", lambda: tk.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128)))
        runs.append(("TileKernels norm_cast", lambda: tk.quant.norm_forward_and_per_token_cast(xn, w, 1e-6, "e4m3", 32)))
    for name, run in runs:
        for _ in range(LAUNCHES):
            run()
        torch.cuda.synchronize()
        print(name, flush=True)


if __name__ == "__main__":
    main()
