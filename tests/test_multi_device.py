"""One process driving several GPUs, on CPU with a fake driver (the real run: tests/gpu/test_multi_gpu.py).

Each device gets its own module load, made in that device's primary context whichever device is current, and the
thread's context is current again afterwards; tkaot.preload(device=...) loads a whole set into the device it names;
ops launch on their tensors' device and that device's current stream; a launch the driver refuses because another
device's context is current is made again from the tensors' device's context (and the thread's context restored).
"""

from __future__ import annotations

import random

import pytest
import torch

import tkaot
from tests.test_launcher import ARGS, KINDS, SIZES, SPEC, FakeDriver, make_kernel, values_for
from tkaot import _cuda, _kernel, _op
from tkaot import registry as reg

CONTEXT_BASE = 0x1000  # device d's primary context is CONTEXT_BASE + d


class ContextDriver(FakeDriver):
    """FakeDriver's launches, plus contexts and module loads: records (current context, module) of each load, and
    refuses a launch (CUDA_ERROR_INVALID_HANDLE) while a context other than `launch_context` is current."""

    def __init__(self, current: int | None):
        super().__init__()
        self.current = current
        self.loads: list[tuple[int, int]] = []
        self.launch_context: int | None = None
        self.launch_contexts: list[int] = []

    def cuDeviceGet(self, out, ordinal):
        out[0] = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, out, dev):
        out[0] = _cuda.ffi.cast("CUcontext", CONTEXT_BASE + dev)
        return 0

    def cuCtxGetCurrent(self, out):
        out[0] = _cuda.ffi.NULL if self.current is None else _cuda.ffi.cast("CUcontext", self.current)
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.current = int(_cuda.ffi.cast("uintptr_t", ctx)) or None
        return 0

    def cuModuleLoadData(self, out, image):
        self.loads.append((self.current, len(self.loads) + 1))
        out[0] = _cuda.ffi.cast("CUmodule", len(self.loads))
        return 0

    def cuFuncSetAttribute(self, fn, attribute, value):  # kernels with over 48 KiB of dynamic shared memory
        return 0

    def cuModuleGetFunction(self, out, module, name):
        out[0] = _cuda.ffi.cast("CUfunction", 0x100 * int(_cuda.ffi.cast("uintptr_t", module)))
        return 0

    def cuModuleUnload(self, module):
        return 0

    def _launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.launch_contexts.append(self.current)
        if self.launch_context is not None and self.current != self.launch_context:
            return _cuda.CUDA_ERROR_INVALID_HANDLE
        return super()._launch(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra)


@pytest.fixture
def two_devices(monkeypatch):
    """A fake driver whose thread has device 0's context current, for a fresh registry of the committed sm90 set."""
    fake = ContextDriver(current=CONTEXT_BASE)
    monkeypatch.setattr(_cuda, "_lib", fake)
    monkeypatch.setattr(_cuda, "lib", lambda: fake)
    monkeypatch.setattr(_cuda, "_primary", {})
    monkeypatch.setattr(_cuda, "launch_address", lambda pdl=False: fake.ex_address if pdl else fake.address)
    return fake


def test_each_device_loads_its_own_module_in_its_own_context(two_devices):
    kernel = make_kernel(SPEC)
    kernel.read_cubin = lambda: b"cubin"
    f1, f0, again = kernel.load(1), kernel.load(0), kernel.load(1)
    assert two_devices.loads == [(CONTEXT_BASE + 1, 1), (CONTEXT_BASE + 0, 2)]  # device 1's while device 0's was current
    assert two_devices.current == CONTEXT_BASE  # the thread's own context again
    assert f1 != f0 and again == f1 and set(kernel.functions) == {0, 1}
    # a thread with no context: the device's is made current, and stays (as for any first use on a thread)
    two_devices.current = None
    kernel.load(2)
    assert two_devices.loads[-1][0] == CONTEXT_BASE + 2 and two_devices.current == CONTEXT_BASE + 2


def test_preload_covers_the_device_it_names(two_devices, monkeypatch):
    r = reg.Registry()
    monkeypatch.delenv("TKAOT_PATH", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(r, "device_arch", lambda index: "sm90")
    monkeypatch.setattr(reg, "REGISTRY", r)
    count = tkaot.preload(device="cuda:1")
    assert count > 600 and len(two_devices.loads) == count
    assert {ctx for ctx, _ in two_devices.loads} == {CONTEXT_BASE + 1}
    assert tkaot.preload(device=torch.device("cuda", 0)) == count
    assert {ctx for ctx, _ in two_devices.loads[count:]} == {CONTEXT_BASE} and len(two_devices.loads) == 2 * count
    assert tkaot.preload(1) == count and len(two_devices.loads) == 2 * count  # loaded once per device
    assert two_devices.current == CONTEXT_BASE


@pytest.mark.parametrize("kind", KINDS)
def test_a_launch_refused_from_another_context_runs_from_the_devices(two_devices, kind, monkeypatch):
    monkeypatch.setattr(_kernel.Kernel, "load", lambda self, device: self.functions.setdefault(device, _cuda.ffi.cast("CUfunction", 7)))
    launch = make_kernel(SPEC).bind(ARGS, kind)
    two_devices.sizes = [SIZES[p.type] for p in SPEC.params]
    values = values_for(SPEC, ARGS, random.Random(11))
    two_devices.launch_context = CONTEXT_BASE + 1  # the driver takes device 1's launches only from its context
    launch(1, 0x51, *values)
    assert two_devices.launch_contexts == [CONTEXT_BASE, CONTEXT_BASE + 1] and len(two_devices.calls) == 1
    assert two_devices.current == CONTEXT_BASE
    two_devices.current = CONTEXT_BASE + 1  # current already: one launch
    launch(1, 0x51, *values)
    assert two_devices.launch_contexts[2:] == [CONTEXT_BASE + 1] and len(two_devices.calls) == 2


def test_ops_launch_on_their_tensors_device_and_its_stream(monkeypatch):
    """Tensors on device 1 while device 0 is current: every launcher is asked for device 1 and given device 1's stream."""
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 1)
    asked = []

    def get(self, device, *values, general_tiling=None):
        asked.append(("get", device))
        return lambda dev, stream, *args: asked.append(("launch", dev, stream))

    monkeypatch.setattr(_op.OpKernels, "get", get)
    for module in ("tkaot._quant.norm", "tkaot._quant.casts", "tkaot._moe.ops", "tkaot._transform.rotary"):
        mod = __import__(module, fromlist=["_"])
        monkeypatch.setattr(mod, "current_stream", lambda device: 0x5000 + device)
        for value in vars(mod).values():
            if isinstance(value, _op.OpKernels):
                monkeypatch.setattr(value, "cache", {})
    monkeypatch.setattr("tkaot._quant.casts._PLANS", {})
    x, w = torch.empty(4, 512, dtype=torch.bfloat16, device="meta"), torch.empty(512, dtype=torch.bfloat16, device="meta")
    tkaot.quant.norm_forward(x, w, 1e-6)
    tkaot.quant.per_token_cast(x, "e4m3", 128)
    tkaot.moe.topk_gate(torch.empty(4, 64, device="meta"), 4)
    tkaot.transform.apply_rotary(torch.empty(4, 8, 64, dtype=torch.bfloat16, device="meta"), torch.empty(64, 64, device="meta"))
    assert asked == [("get", 1), ("launch", 1, 0x5001)] * 4
