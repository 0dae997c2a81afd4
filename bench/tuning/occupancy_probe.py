"""Resident blocks an SM for every variant of an artifact set, as the driver computes them.

    python -m bench.tuning.occupancy_probe <artifact dir> [kernel]

cuOccupancyMaxActiveBlocksPerMultiprocessor with each variant's block size and dynamic shared memory:
what a persistent grid sized NUM_SMS x the tiling's blocks an SM must not exceed.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import torch

from tkaot import _cuda
from tkaot._kernel import Kernel
from tkaot._spec import LaunchSpec


def main() -> None:
    root = Path(sys.argv[1])
    only = sys.argv[2] if len(sys.argv) > 2 else None
    torch.zeros(1, device="cuda")  # torch's context, which Kernel.load uses
    cuda = ctypes.CDLL("libcuda.so.1")
    for entry in json.loads((root / "manifest.json").read_text())["variants"]:
        if only and entry["kernel"] != only:
            continue
        spec = LaunchSpec.from_json(entry["launch"])
        kernel = Kernel(entry["kernel"], entry["key"], spec, root / "cubins" / f"{entry['cubin']}.cubin", entry["cubin"], "probe")
        fn = int(_cuda.ffi.cast("uintptr_t", kernel.load(0)))
        blocks = ctypes.c_int()
        threads = spec.block[0] * spec.block[1] * spec.block[2]
        occupancy = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor
        rc = occupancy(ctypes.byref(blocks), ctypes.c_void_p(fn), threads, ctypes.c_size_t(spec.smem))
        print(f"{entry['kernel']:10s} {entry['key']:60s} threads {threads:5d} smem {spec.smem:6d}  blocks/SM {blocks.value} (rc {rc})")


if __name__ == "__main__":
    main()
