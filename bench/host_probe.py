"""Repeat the launch-path host measurements of bench/run.py (launch_floor) in a fresh process.

    python -m bench.host_probe [tk]

Host µs on a shared machine drift by several µs between phases of one run; this prints three
rounds of the floor, the compiled and ABI launchers and torch's rms_norm, optionally after
importing tile_kernels (more live Python objects), to show the spread.
"""

import gc
import json
import sys

from bench.run import launch_floor

KEYS = (
    "floor_host_us", "compiled_floor_host_us", "tkaot_norm_host_us", "tkaot_norm_abi_host_us",
    "torch_rms_norm_host_us", "empty_like_host_us", "bare_launch_host_us",
)  # fmt: skip


def main() -> None:
    if sys.argv[1:] == ["tk"]:
        import tile_kernels  # noqa: F401
    for _ in range(3):
        result = launch_floor()
        row = {k.replace("_host_us", ""): result.get(k) for k in KEYS}
        print(json.dumps({"tile_kernels_imported": sys.argv[1:] == ["tk"], "gc_objects": len(gc.get_objects()), **row}), flush=True)


if __name__ == "__main__":
    main()
