"""Device time of swiglu + cast tilings at several row counts (the tail of the grid-stride loop).

TKAOT_PATH=<candidates> python -m bench.tuning.rows_probe <tiling> ...
"""

from __future__ import annotations

import sys

import torch

import tkaot
from bench.timing import device_us
from tkaot._quant import fused as _fused

HIDDEN = 2048
ROWS = (1320 * 5, 7920, 8192, 1320 * 7, 1320 * 8)


def main() -> None:
    for tiling in sys.argv[1:]:
        _fused.SWIGLU_TILING = tiling
        for rows in ROWS:
            sets = max(2, (160 << 20) // (rows * 4 * HIDDEN) + 1)
            inputs = [{"x": torch.randn(rows, 2 * HIDDEN, dtype=torch.bfloat16, device="cuda")} for _ in range(sets)]
            us, _ = device_us(lambda a: tkaot.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128), inputs)
            print(f"{tiling:10s} rows {rows:6d}  {us:7.2f} us  {us / rows * 1000:6.3f} us/1k rows", flush=True)


if __name__ == "__main__":
    main()
