"""The benchmark harness: every case side by side (tkaot, torch, TileKernels when importable) in one run.

    python -m bench.run [--families norm,quant] [--out bench/results] [--quick]

Writes bench/results/<date>-<gpu>.json; `python -m bench.report` turns results into RESULTS.md and a PNG.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import traceback
from pathlib import Path

import torch

from bench import timing
from bench.cases import FAMILIES, Case

ROOT = Path(__file__).resolve().parent.parent


def _tile_kernels():
    try:
        import tile_kernels

        return tile_kernels
    except Exception as exc:  # not installed, or no tilelang
        print(f"tile_kernels not importable ({type(exc).__name__}: {exc}); TileKernels columns stay empty")
        return None


def rotating_inputs(case: Case, l2_bytes: int) -> list[dict]:
    """Enough input sets that one pass over them exceeds the L2 several times (at least 2, at most 64)."""
    count = min(64, max(2, -(-3 * l2_bytes // max(case.bytes, 1))))
    return [case.make() for _ in range(count)]


def run_case(case: Case, tk, l2_bytes: int, copy_tbps: float) -> dict:
    inputs = rotating_inputs(case, l2_bytes)
    row = {"op": case.op, "shape": case.shape, "bytes": case.bytes, "rotating_sets": len(inputs)}
    impls = {"tkaot": case.tkaot, "torch": case.torch}
    if tk is not None and case.tile_kernels is not None:
        impls["tile_kernels"] = lambda a, f=case.tile_kernels: f(tk, a)
    for name, fn in impls.items():
        if fn is None:
            continue
        try:
            us, mode = timing.device_us(fn, inputs)
            row[f"{name}_us"] = round(us, 3)
            row[f"{name}_mode"] = mode
            row[f"{name}_tbps"] = round(case.bytes / (us * 1e-6) / 1e12, 3)
            row[f"{name}_of_ceiling"] = round(row[f"{name}_tbps"] / copy_tbps, 3)
            if case.host_timing:
                a = inputs[0]
                row[f"{name}_host_us"] = round(timing.host_us(lambda fn=fn, a=a: fn(a)), 2)
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
    del inputs
    torch.cuda.empty_cache()
    return row


def launch_floor() -> dict:
    """Host µs of the floor: a pre-built cuLaunchKernel of the norm kernel + torch.empty_like, at (1, 7168) bf16.

    Beside it, with the compiled launcher where this process has one: the compiled floor (its launcher
    called with pre-built values + empty_like) and norm_forward forced through each launcher.
    """
    import tkaot
    from bench.prebuilt_launch import prebuilt_norm_launch
    from tkaot import _cuda
    from tkaot._quant.norm import _NORM

    pre = prebuilt_norm_launch()
    x, w, dev, stream = pre.x, pre.weight, pre.x.get_device(), pre.stream
    fn, grid, block, smem, params = pre.fn, pre.grid, pre.block, pre.smem, pre.params
    cu, null = _cuda._lib, _cuda.ffi.NULL

    def floor():
        torch.empty_like(x)
        cu.cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, params, null)

    def bare_launch():
        cu.cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, params, null)

    result = {
        "floor_host_us": round(timing.host_us(floor), 2),
        "bare_launch_host_us": round(timing.host_us(bare_launch), 2),
        "empty_like_host_us": round(timing.host_us(lambda: torch.empty_like(x)), 2),
        "current_stream_host_us": round(timing.host_us(lambda: torch.cuda.current_stream()), 2),
        "raw_stream_host_us": round(timing.host_us(lambda: torch._C._cuda_getCurrentRawStream(dev)), 2),
        "torch_add_host_us": round(timing.host_us(lambda: torch.add(x, x)), 2),
        "tkaot_norm_host_us": round(timing.host_us(lambda: tkaot.quant.norm_forward(x, w, 1e-6)), 2),
        "torch_rms_norm_host_us": round(timing.host_us(lambda: torch.nn.functional.rms_norm(x, (7168,), w, 1e-6)), 2),
        "norm_launcher": tkaot.launcher_kind(),
    }
    # Each launcher side by side: alone with pre-built values, and under norm_forward (the op's cached
    # launcher for this shape swapped in). compiled_floor is empty_like + the compiled launcher alone.
    key = (dev, 7168, torch.bfloat16, True, False, False)
    active = _NORM.cache[key]
    kernel = getattr(active, "__self__", active).kernel  # the compiled one is a bound method
    values = pre.values
    try:
        for kind in ("abi", "compiled") if tkaot.launcher_kind() == "compiled" else ("abi",):
            launcher = _NORM.cache[key] = kernel.bind(_NORM.args, kind)
            result[f"{kind}_launcher_host_us"] = round(timing.host_us(lambda launcher=launcher: launcher(dev, stream, *values)), 2)
            result[f"tkaot_norm_{kind}_host_us"] = round(timing.host_us(lambda: tkaot.quant.norm_forward(x, w, 1e-6)), 2)
        if "compiled_launcher_host_us" in result:

            def compiled_floor():
                torch.empty_like(x)
                launcher(dev, stream, *values)

            result["compiled_floor_host_us"] = round(timing.host_us(compiled_floor), 2)
    finally:
        _NORM.cache[key] = active
    return result


COLD_START = r"""
import subprocess, sys, time
import torch
torch.cuda.init()
x = torch.randn(1, 7168, dtype=torch.bfloat16, device="cuda")
w = torch.randn(7168, dtype=torch.bfloat16, device="cuda")
torch.cuda.synchronize()
spawned = []
real_popen = subprocess.Popen.__init__
def spy(self, *a, **k):
    spawned.append(a[0] if a else k.get("args"))
    real_popen(self, *a, **k)
subprocess.Popen.__init__ = spy
t0 = time.perf_counter()
import tkaot
t1 = time.perf_counter()
out, _, _ = tkaot.quant.norm_forward(x, w, 1e-6)
torch.cuda.synchronize()
t2 = time.perf_counter()
heavy = [m for m in sys.modules if m.split(".")[0] in ("tilelang", "tvm")]
print(f"{(t1 - t0) * 1e3:.2f} {(t2 - t0) * 1e3:.2f} {len(spawned)} {len(heavy)}")
"""


def cold_start(repeats: int = 5) -> dict:
    """A fresh process per sample: import tkaot + first call, measured beyond import torch and CUDA init."""
    samples = []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-c", COLD_START], capture_output=True, text=True, cwd=ROOT, env=os.environ)
        if proc.returncode != 0:
            return {"cold_start_error": proc.stderr[-500:]}
        imp, first, spawned, heavy = proc.stdout.split()[-4:]
        samples.append((float(imp), float(first), int(spawned), int(heavy)))
    samples.sort(key=lambda s: s[1])
    median = samples[len(samples) // 2]
    return {
        "cold_import_ms": median[0],
        "cold_first_kernel_ms": median[1],
        "cold_processes_spawned": max(s[2] for s in samples),
        "cold_heavy_modules": max(s[3] for s in samples),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--no-peer", action="store_true", help="skip TileKernels even if importable")
    args = parser.parse_args(argv)

    props = torch.cuda.get_device_properties(0)
    gpu = props.name
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    tk = None if args.no_peer else _tile_kernels()
    copy_tbps = timing.copy_ceiling_tbps()
    print(f"{gpu}: copy ceiling {copy_tbps:.2f} TB/s, L2 {l2 >> 20} MiB, tile_kernels {'yes' if tk else 'no'}")
    rows = []
    for family in args.families.split(","):
        module = importlib.import_module(f"bench.cases.{family}")
        for case in module.cases():
            row = run_case(case, tk, l2, copy_tbps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    host = launch_floor()
    cold = cold_start()
    result = {
        "date": datetime.date.today().isoformat(),
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "tile_kernels": getattr(tk, "__version__", None) if tk else None,
        "copy_ceiling_tbps": round(copy_tbps, 3),
        "host": host,
        "cold_start": cold,
        "rows": rows,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['date']}-{gpu.replace(' ', '-')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    from bench.report import table

    print(table(result))


if __name__ == "__main__":
    main()
