"""Benchmark cases: one op at one shape, with tkaot and its peers side by side.

Each family module in this package defines `cases() -> list[Case]`. The
harness (bench/run.py) times every callable it is given on rotating inputs,
and calls `tile_kernels` ones only when that package imports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Case:
    op: str  # the tkaot op, e.g. "norm_forward"
    shape: str  # for the table, e.g. "8192x7168 bf16"
    bytes: int  # the fewest bytes the op must move (each input read once, each output written once)
    make: Callable[[], dict]  # fresh random CUDA inputs for one call
    tkaot: Callable[[dict], object]
    torch: Callable[[dict], object] | None = None  # torch's nearest equivalent
    tile_kernels: Callable[[object, dict], object] | None = None  # (tile_kernels module, inputs)
    host_timing: bool = False  # also measure host µs per call (1-token shapes)


FAMILIES = ("norm", "moe", "quant", "fused", "mhc", "mhc_fused", "engram", "backward")  # modules in this package; each adds its cases
