"""Python-side cost of each op's launch path, measured on a CPU-only machine, per launcher.

CPU tensors stand in for CUDA ones (get_device/is_cuda are patched to claim device 0),
the registry believes the device is sm90 and reads this checkout's prebuilt set, and
cuLaunchKernel(Ex) is replaced by a C no-op (the compiled extension's NOOP_LAUNCH(_EX), called
through cffi by the ABI launcher and directly by the compiled one; a Python no-op for the
ABI launcher when the extension is not built), so the number is everything tkaot does
per call except the driver call itself (allocation included, at CPU cost). Compare
against the same loop around `torch.empty_like(x)` to see tkaot's own share.

    python -m bench.host_overhead            # both launchers, each in its own process
    python -m bench.host_overhead --kind abi # one
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

_LAUNCH_TYPE = (
    "CUresult(*)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, "
    "unsigned int, uintptr_t, void **, void **)"
)


def patch_for_cpu() -> None:
    from tkaot import _cuda
    from tkaot.registry import REGISTRY

    torch.Tensor.get_device = lambda self: 0
    torch.Tensor.is_cuda = property(lambda self: True)
    REGISTRY.device_arch = lambda index: "sm90"

    try:
        from tkaot._launch import NOOP_LAUNCH, NOOP_LAUNCH_EX
    except ImportError:
        NOOP_LAUNCH = NOOP_LAUNCH_EX = None

    class NoDriver:
        if NOOP_LAUNCH is not None:
            cuLaunchKernel = _cuda.ffi.cast(_LAUNCH_TYPE, NOOP_LAUNCH)
            cuLaunchKernelEx = _cuda.ffi.cast("CUresult(*)(const CUlaunchConfig *, CUfunction, void **, void **)", NOOP_LAUNCH_EX)
        else:

            @staticmethod
            def cuLaunchKernel(*args):
                return 0

            @staticmethod
            def cuLaunchKernelEx(*args):
                return 0

    _cuda._lib = NoDriver()
    from tkaot._kernel import Kernel

    fake_function = _cuda.ffi.cast("CUfunction", 0x1000)
    Kernel.load = lambda self, device_index: self.functions.setdefault(device_index, fake_function)
    _cuda.lib = lambda: NoDriver
    _cuda.launch_address = lambda pdl=False: NOOP_LAUNCH_EX if pdl else NOOP_LAUNCH
    torch._C._cuda_getCurrentRawStream = lambda index: 0
    import sys

    import tkaot.moe
    import tkaot.quant
    import tkaot.transform

    for family in (tkaot.quant, tkaot.moe, tkaot.transform):  # op modules load lazily: load them all before patching
        for op in family.__all__:
            getattr(family, op)

    for name, module in list(sys.modules.items()):
        if name.startswith("tkaot") and hasattr(module, "current_stream"):
            module.current_stream = lambda index: 0


# Wall time, median of 5 loops by default; TKAOT_HOST_CLOCK=cpu takes this thread's CPU time, least of 15 loops,
# which a machine loaded by other work disturbs far less (for A/B comparisons there)
_CPU_CLOCK = os.environ.get("TKAOT_HOST_CLOCK") == "cpu"


def per_call_us(fn, n: int = 20000) -> float:
    for _ in range(200):
        fn()
    clock, loops, pick = (time.thread_time_ns, 15, min) if _CPU_CLOCK else (time.perf_counter_ns, 5, statistics.median)
    samples = []
    for _ in range(loops):
        t0 = clock()
        for _ in range(n):
            fn()
        samples.append((clock() - t0) / n / 1000)
    return pick(samples)


def cases(device: str = "cpu") -> dict:
    """The 1-token calls timed, on CPU tensors (the patched no-driver run) or on a GPU (bench.host_compare)."""
    import tkaot

    torch.set_default_device(device)
    x = torch.randn(1, 7168, dtype=torch.bfloat16)
    w = torch.randn(7168, dtype=torch.bfloat16)
    out = {
        "empty_like (reference cost)": lambda: torch.empty_like(x),
        "norm_forward 1x7168": lambda: tkaot.quant.norm_forward(x, w, 1e-6),
        "per_token_cast 1x7168 e4m3/128": lambda: tkaot.quant.per_token_cast(x, "e4m3", 128),
    }
    gate_up = torch.randn(1, 4096, dtype=torch.bfloat16)
    out["swiglu_forward_and_per_token_cast 1x4096"] = lambda: tkaot.quant.swiglu_forward_and_per_token_cast(gate_up, "e4m3", 128)
    logits = torch.randn(1, 256)
    out["moe_topk_gate_forward 1x256 top-8"] = lambda: tkaot.moe.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0)
    q = torch.randn(1, 16, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 1, 64, dtype=torch.bfloat16)
    cos_sin = torch.randn(4096, 64)
    pos = torch.zeros(1, dtype=torch.int64)
    out["apply_rotary 1x16x64"] = lambda: tkaot.transform.apply_rotary(q, cos_sin, key=k, positions=pos)
    out["norm_forward_and_per_token_cast 1x7168"] = lambda: tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32)
    torch.set_default_device(None)
    return out


def measure() -> dict:
    """{case: µs per call or an error string} with this process's launcher."""
    patch_for_cpu()
    import tkaot

    result = {"launcher": tkaot.launcher_kind()}
    for name, fn in cases().items():
        try:
            result[name] = round(per_call_us(fn), 3)
        except Exception as exc:
            result[name] = f"error: {type(exc).__name__}: {exc}"
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=("abi", "compiled"), help="measure one launcher, in this process, as JSON")
    args = parser.parse_args(argv)
    if args.kind:
        os.environ["TKAOT_LAUNCHER"] = args.kind
        print(json.dumps(measure()))
        return
    columns = {}
    for kind in ("abi", "compiled"):
        proc = subprocess.run([sys.executable, "-m", "bench.host_overhead", "--kind", kind], capture_output=True, text=True)
        last = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else []
        columns[kind] = json.loads(last[0]) if last else {"error": proc.stderr.strip().splitlines()[-1:]}
    abi, compiled = columns["abi"], columns["compiled"]
    if "error" in compiled:
        print(f"compiled launcher unavailable: {compiled['error']}")
    print(f"{'µs per call':45s} {'abi':>7s} {'compiled':>9s} {'saved':>7s}")
    for name in cases_names(abi):
        a, c = abi.get(name), compiled.get(name)
        saved = f"{a - c:7.2f}" if isinstance(a, float) and isinstance(c, float) else ""
        show = lambda v: f"{v:7.2f}" if isinstance(v, float) else str(v)
        print(f"{name:45s} {show(a):>7s} {show(c):>9s} {saved:>7s}")


def cases_names(column: dict) -> list[str]:
    return [k for k in column if k not in ("launcher", "error")]


if __name__ == "__main__":
    main()
