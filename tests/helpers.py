"""Helpers shared by the test modules (CPU and GPU)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from contextlib import contextmanager

import pytest
import torch

from tkaot import _op
from tkaot.errors import NoGPUError

# ---- validation without a GPU: meta tensors stand in for CUDA ones (the fake_cuda fixture, tests/conftest.py)


def meta(*shape, dtype=torch.bfloat16, strides=None) -> torch.Tensor:
    if strides is None:
        return torch.empty(*shape, dtype=dtype, device="meta")
    return torch.empty_strided(shape, strides, dtype=dtype, device="meta")


def serve_ops(monkeypatch, registry, modules=(), kernels=(), path=None) -> None:
    """The ops launch through `registry` (the artifacts at `path` on TKAOT_PATH, when given) with no fallback announced
    yet and TKAOT_STRICT unset; the op `modules` get stream 0 and the OpKernels `kernels` empty caches."""
    monkeypatch.setattr(_op, "REGISTRY", registry)
    monkeypatch.setattr(_op, "_WARNED", set())
    for module in modules:
        monkeypatch.setattr(module, "current_stream", lambda device: 0)
    for op_kernels in kernels:
        monkeypatch.setattr(op_kernels, "cache", {})
    monkeypatch.delenv("TKAOT_STRICT", raising=False)
    if path is not None:
        monkeypatch.setenv("TKAOT_PATH", str(path))


def build_by_kernel(out, variants, build_cache) -> tuple:
    """Build `variants` for sm90 into the folder `out` through the session's build cache: (out, {kernel: its manifest
    entry})."""
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants

    build_variants(variants, out, "sm90", jobs=1, cache=BuildCache(build_cache))
    manifest = json.loads((out / "manifest.json").read_text())
    return out, {e["kernel"]: e for e in manifest["variants"]}


def record_launches(monkeypatch, modules, with_args: bool = False) -> list:
    """Meta tensors read as CUDA device 0, and every op's kernel lookup validates the static values against the
    kernel's declaration and returns a launcher that checks its argument count and records (kernel, key), or
    (kernel, key, {argument: value}) with_args, in the list returned. The op modules get stream 0 and empty
    kernel caches."""
    get_device = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "meta" else get_device(self))
    recorded: list[tuple] = []

    def get(self, device, *values, general_tiling=None):
        for axis, value in zip(self.decl.axes, values):
            axis.validate(value)
        key = self.decl.key(values)

        def launch(dev, stream, *args):
            assert len(args) == len(self.args), f"{self.kernel}: {len(args)} values for {len(self.args)} arguments"
            recorded.append((self.kernel, key, dict(zip(self.args, args))) if with_args else (self.kernel, key))

        return launch

    monkeypatch.setattr(_op.OpKernels, "get", get)
    for module in modules:
        monkeypatch.setattr(module, "current_stream", lambda device: 0)
        for value in vars(module).values():
            if isinstance(value, _op.OpKernels):
                monkeypatch.setattr(value, "cache", {})
    return recorded


def registry_holding(monkeypatch, module, kernels, built: set) -> tuple[list, list]:
    """Calls of `module`'s ops on meta tensors against a registry holding only the variant keys in `built` (any other
    raises VariantNotBuilt), with `kernels` (the op's OpKernels) uncached and launches recorded, not made; returns the
    keys looked up and the keys launched, in order."""
    from tkaot.errors import VariantNotBuilt

    get_device = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "meta" else get_device(self))
    monkeypatch.setattr(module, "current_stream", lambda device: 0)
    monkeypatch.setattr(kernels, "cache", {})
    looked_up, launched = [], []

    class Found:
        def __init__(self, key):
            self.key = key

        def bind(self, args):
            return lambda *values: launched.append(self.key)

    def kernel(op, kernel, key, device):
        looked_up.append(key)
        if key not in built:
            raise VariantNotBuilt(op, kernel, key, [], "tkaot-build ...", [])
        return Found(key)

    monkeypatch.setattr(_op.REGISTRY, "kernel", kernel)
    return looked_up, launched


def dense(shape) -> tuple:
    """The strides of a contiguous tensor of `shape` (a zero extent counted as one)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def I8(*shape) -> torch.Tensor:
    return meta(*shape, dtype=torch.int8)


def I32(*shape) -> torch.Tensor:
    return meta(*shape, dtype=torch.int32)


def F32(*shape) -> torch.Tensor:
    return meta(*shape, dtype=torch.float32)


def FP8(*shape) -> torch.Tensor:
    return meta(*shape, dtype=torch.float8_e4m3fn)


def assert_each_reaches_the_registry(*calls: Callable[[], object]) -> None:
    """Each call passes the op's validation: it gets as far as asking for a kernel, which without a GPU raises NoGPUError."""
    for call in calls:
        with pytest.raises(NoGPUError):
            call()


# ---- threads


def run_on_threads(worker: Callable[[int, threading.Barrier], None], count: int = 8) -> None:
    """Call worker(i, barrier) for i in range(count), each on a thread of its own, and wait for all of them.

    barrier (count parties) lets the workers start their real work at the same moment; the first
    exception a worker raised fails the calling test.
    """
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        try:
            worker(i, barrier)
        except BaseException as exc:  # reported on the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def refusals(cases: list, doc: str):
    """A test of `cases`, each (call, error, match): `call(tkaot.quant)` raises `error` matching `match` (before any
    launch: the test runs on the fake device of the `fake_cuda` fixture). Assign it to a module-level test name."""
    import tkaot

    @pytest.mark.parametrize("call, error, match", cases)
    def test(fake_cuda, call, error, match):
        with pytest.raises(error, match=match):
            call(tkaot.quant)

    test.__doc__ = doc
    return test


@contextmanager
def poisoned_allocations():
    """Every CUDA tensor torch.empty / empty_like / empty_strided / Tensor.new_empty makes inside starts as 0xFF bytes
    (NaN for floats), so an output element a kernel leaves unwritten shows."""
    originals = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    new_empty = torch.Tensor.new_empty

    def poisoning(make):
        def make_poisoned(*args, **kwargs):
            t = make(*args, **kwargs)
            if t.is_cuda and t.numel():
                t.untyped_storage().fill_(0xFF)
            return t

        return make_poisoned

    try:
        for name, make in originals.items():
            setattr(torch, name, poisoning(make))
        torch.Tensor.new_empty = poisoning(new_empty)
        yield
    finally:
        for name, make in originals.items():
            setattr(torch, name, make)
        torch.Tensor.new_empty = new_empty
