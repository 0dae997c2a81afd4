"""The two launchers on CPU, through a fake cuLaunchKernel.

The compiled launcher (tkaot/_launch.c) must hand the driver exactly what the ABI launcher
(struct.pack_into + cffi) hands it: the same function, grid, block, shared memory, stream and
bytes of every parameter, for every argument type, for synthetic specs and for every kernel of
the committed prebuilt set. Driver errors take the same path; bad arguments raise TypeError
(never a crash); many threads may launch at once; and TKAOT_LAUNCHER / a missing extension
pick the ABI launcher.
"""

import ctypes
import json
import math
import os
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers import run_on_threads
from tkaot import _cuda, _kernel
from tkaot._kernel import Kernel
from tkaot._spec import Arg, LaunchSpec, Param, compile_grid
from tkaot.errors import ArtifactError, CudaDriverError, ManifestError, NoGPUError

try:
    from tkaot import _launch
except ImportError:
    _launch = None

ROOT = Path(__file__).resolve().parent.parent
ORIGINAL_LAUNCH_ADDRESS = _cuda.launch_address  # before any fixture patches it
needs_ext = pytest.mark.skipif(_launch is None, reason="the compiled launcher is not built here (make ext)")
KINDS = ["abi", pytest.param("compiled", marks=needs_ext)]
SIZES = {"ptr": 8, "i64": 8, "i32": 4, "f32": 4}
CODES = {"ptr": "<Q", "i64": "<q", "i32": "<i", "f32": "<f"}
FUNCTION = 0xF00D0
LAUNCH_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p
)
CFFI_LAUNCH_TYPE = (
    "CUresult(*)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, "
    "unsigned int, uintptr_t, void **, void **)"
)
PDL_ATTRS = ((6, 1),)  # what a pdl launch hands cuLaunchKernelEx: programmatic stream serialization, allowed


class LaunchAttribute(ctypes.Structure):  # cuda.h's CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):  # cuda.h's CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint), ("stream", ctypes.c_size_t),
        ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint),
    ]  # fmt: skip


LAUNCH_EX_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p
)


class FakeDriver:
    """A C-callable cuLaunchKernel that records each launch (bytes of every parameter included) and
    returns the next code of `codes` (0 once they run out); both launchers call it. Its
    cuLaunchKernelEx records the same, and the (id, first value word) of every launch attribute."""

    def __init__(self):
        self.sizes: list[int] = []
        self.calls: list[tuple] = []
        self.codes: list[int] = []
        self.contexts: list[int] = []
        self.callback = LAUNCH_TYPE(self._launch)  # kept alive as long as the driver
        self.address = ctypes.cast(self.callback, ctypes.c_void_p).value
        self.cuLaunchKernel = _cuda.ffi.cast(CFFI_LAUNCH_TYPE, self.address)
        self.callback_ex = LAUNCH_EX_TYPE(self._launch_ex)
        self.ex_address = ctypes.cast(self.callback_ex, ctypes.c_void_p).value
        self.cuLaunchKernelEx = _cuda.ffi.cast("CUresult(*)(const CUlaunchConfig *, CUfunction, void **, void **)", self.ex_address)
        self._names = {}

    def _launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        data = tuple(ctypes.string_at(params[i], size) for i, size in enumerate(self.sizes))
        self.calls.append((threading.get_ident(), fn, (gx, gy, gz), (bx, by, bz), smem, stream, data, extra))
        return self.codes.pop(0) if self.codes else 0

    def _launch_ex(self, config, fn, params, extra):
        c = config.contents
        result = self._launch(fn, *c.grid, *c.block, c.smem, c.stream, params, extra)
        self.calls[-1] += (tuple((c.attrs[i].id, c.attrs[i].value[0]) for i in range(c.num_attrs)),)
        return result

    def _string(self, text: str, out) -> int:
        out[0] = self._names.setdefault(text, _cuda.ffi.new("char[]", text.encode()))
        return 0

    def cuGetErrorName(self, code, out):
        return self._string({700: "CUDA_ERROR_ILLEGAL_ADDRESS", 201: "CUDA_ERROR_INVALID_CONTEXT"}.get(code, "CUDA_ERROR_UNKNOWN"), out)

    def cuGetErrorString(self, code, out):
        return self._string(f"error {code}", out)


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(_cuda, "_lib", fake)
    monkeypatch.setattr(_cuda, "lib", lambda: fake)
    monkeypatch.setattr(_cuda, "launch_address", lambda pdl=False: fake.ex_address if pdl else fake.address)
    monkeypatch.setattr(_cuda, "ensure_context", fake.contexts.append)
    monkeypatch.setattr(Kernel, "load", lambda self, device: self.functions.setdefault(device, _cuda.ffi.cast("CUfunction", FUNCTION)))
    return fake


def make_kernel(spec: LaunchSpec) -> Kernel:
    return Kernel("fake", "key=1", spec, Path("/nonexistent.cubin"), "0" * 64, "test")


# every type, kernel parameters in another order than the op's arguments, a dim only the grid reads
PARAMS = [("b", "ptr"), ("n", "i32"), ("scale", "f32"), ("a", "ptr"), ("big", "i64"), ("flags", "i32"), ("m", "i64")]
OP_ARGS = [
    ("a", "tensor", "ptr"), ("scale", "scalar", "f32"), ("flags", "scalar", "i32"), ("big", "scalar", "i64"),
    ("b", "tensor", "ptr"), ("n", "dim", "i32"), ("m", "dim", "i64"), ("k", "dim", "i32"),
]  # fmt: skip
SPEC = LaunchSpec(
    symbol="fake_kernel",
    params=tuple(Param(n, t) for n, t in PARAMS),
    args=tuple(Arg(n, r, t) for n, r, t in OP_ARGS),
    grid=("(n + 3) // 4", "max(m % 5, 1) * 2 - 1", "min(k, 7) + (n - 1) % 3"),
    block=(128, 2, 1),
    smem=4096,
)
ARGS = tuple(a[0] for a in OP_ARGS)
EDGE = {
    "ptr": [0, 16, 0x7F00_1234_5670, 2**64 - 1],
    "i64": [0, -1, 2**63 - 1, -(2**63), 123456789012],
    "i32": [0, -1, 2**31 - 1, -(2**31), 7168],
    "f32": [0.0, -0.0, 1e-6, 0.1, 1.0, -2.5, 3.4e38, 1e-45, math.inf, -math.inf, math.nan],
}


def values_for(spec: LaunchSpec, arg_names, rng: random.Random, dims=(1, 4097)) -> tuple:
    types = {a.name: (a.role, a.type) for a in spec.args}
    out = []
    for name in arg_names:
        role, kind = types[name]
        out.append(rng.randint(*dims) if role == "dim" else rng.choice(EDGE[kind]))
    return tuple(out)


def expected(spec: LaunchSpec, arg_names, values, stream=0x5EED, pdl=False) -> tuple:
    """The record the driver must see, (function, grid, block, smem, stream, parameter bytes, extra),
    and with `pdl` the launch attributes, computed from the spec alone; None if the grid is empty
    (nothing launched)."""
    by_name = dict(zip(arg_names, values))
    grid = compile_grid(spec.grid, arg_names, {a.name for a in spec.args if a.role == "dim"})(values)
    if min(grid) <= 0:
        return None
    data = tuple(struct.pack(CODES[p.type], by_name[p.name]) for p in spec.params)
    return (FUNCTION, grid, spec.block, spec.smem, stream, data, None) + ((PDL_ATTRS,) if pdl else ())


def launch_both(driver, spec, arg_names, values, stream=0x5EED, pdl=None):
    """Launch through the ABI and the compiled launcher; return each one's record."""
    driver.sizes = [SIZES[p.type] for p in spec.params]
    kernel = make_kernel(spec)
    records = []
    for kind in ("abi", "compiled"):
        driver.calls.clear()
        kernel.bind(arg_names, kind, pdl)(0, stream, *values)
        records.append(list(driver.calls))
    return records


@needs_ext
def test_compiled_packs_what_the_abi_launcher_packs(driver):
    rng = random.Random(1)
    for _ in range(300):
        values = values_for(SPEC, ARGS, rng)
        abi, compiled = launch_both(driver, SPEC, ARGS, values)
        # records hold bytes, not floats: a NaN parameter compares by its bits
        assert [c[1:] for c in compiled] == [c[1:] for c in abi] == [expected(SPEC, ARGS, values)]


@needs_ext
def test_pdl_launches_go_through_cuLaunchKernelEx_alike_both_ways(driver, monkeypatch):
    """A pdl spec: cuLaunchKernelEx with the same launch, plus programmatic stream serialization allowed;
    TKAOT_PDL=0 (PDL_ALLOWED false) or pdl=False: plain cuLaunchKernel. A spec without pdl refuses it."""
    pdl_spec = SPEC.replace(pdl=True)
    rng = random.Random(7)
    for _ in range(100):
        values = values_for(pdl_spec, ARGS, rng)
        want = expected(pdl_spec, ARGS, values, pdl=True)
        abi, compiled = launch_both(driver, pdl_spec, ARGS, values)
        assert [c[1:] for c in compiled] == [c[1:] for c in abi] == ([want] if want else [])
        abi, compiled = launch_both(driver, pdl_spec, ARGS, values, pdl=False)
        assert [c[1:] for c in compiled] == [c[1:] for c in abi] == [expected(pdl_spec, ARGS, values)]
    monkeypatch.setattr(_kernel, "PDL_ALLOWED", False)
    abi, compiled = launch_both(driver, pdl_spec, ARGS, values)
    assert [c[1:] for c in compiled] == [c[1:] for c in abi] == [expected(pdl_spec, ARGS, values)]
    for kind in ("abi", "compiled"):
        with pytest.raises(ValueError, match="cannot be launched with PDL"):
            make_kernel(SPEC).bind(ARGS, kind, pdl=True)
    # a driver error names cuLaunchKernelEx
    for kind in ("abi", "compiled"):
        driver.codes = [700]
        with pytest.raises(CudaDriverError, match=r"cuLaunchKernelEx\(fake \[key=1\]\) failed: CUDA_ERROR_ILLEGAL_ADDRESS"):
            make_kernel(pdl_spec).bind(ARGS, kind, True)(0, 0, *values)
    launch = make_kernel(pdl_spec).bind(ARGS, "compiled", True)
    assert launch.__self__.pdl is True and make_kernel(pdl_spec).bind(ARGS, "compiled", False).__self__.pdl is False


@pytest.mark.parametrize("kind", KINDS)
def test_values_fixed_at_bind_launch_as_if_passed(driver, kind):
    """A generic variant's runtime axes are bound once (tkaot/_op.py): the launch is the one passing them would make."""
    rng = random.Random(5)
    driver.sizes = [SIZES[p.type] for p in SPEC.params]
    for fixed_names in (("m",), ("n", "k"), ("scale", "big"), ("b", "n", "m", "k")):
        rest = tuple(a for a in ARGS if a not in fixed_names)
        for _ in range(40):
            values = values_for(SPEC, ARGS, rng)
            by_name = dict(zip(ARGS, values))
            launch = make_kernel(SPEC).bind(rest, kind, fixed={n: by_name[n] for n in fixed_names})
            driver.calls.clear()
            launch(0, 0x5EED, *(by_name[n] for n in rest))
            want = expected(SPEC, ARGS, values)
            assert [c[1:] for c in driver.calls] == ([want] if want else [])
    with pytest.raises((TypeError, struct.error)):  # a fixed value is not passed again
        make_kernel(SPEC).bind(ARGS[:-1], kind, fixed={"k": 3})(0, 0, *values_for(SPEC, ARGS, rng))


@pytest.mark.parametrize("kind", KINDS)
def test_a_driver_without_cuLaunchKernelEx_says_so_before_any_launch(driver, monkeypatch, kind):
    monkeypatch.setattr(_cuda, "launch_address", ORIGINAL_LAUNCH_ADDRESS)
    del driver.cuLaunchKernelEx
    values = values_for(SPEC, ARGS, random.Random(8))
    with pytest.raises(NoGPUError, match="no cuLaunchKernelEx.*TKAOT_PDL=0"):
        make_kernel(SPEC.replace(pdl=True)).bind(ARGS, kind, True)(0, 0, *values)
    assert driver.calls == []


def test_pdl_setting(monkeypatch):
    for value, allowed in (("", True), ("1", True), ("0", False)):
        monkeypatch.setenv("TKAOT_PDL", value)
        assert _kernel._pdl_allowed() is allowed
    monkeypatch.setenv("TKAOT_PDL", "off")
    with pytest.raises(ValueError, match="TKAOT_PDL='off'"):
        _kernel._pdl_allowed()


def test_pdl_in_the_manifest():
    """Written only when set, read back; anything but a bool is refused."""
    assert "pdl" not in SPEC.to_json() and LaunchSpec.from_json(SPEC.to_json()).pdl is False
    pdl_spec = SPEC.replace(pdl=True)
    assert pdl_spec.to_json()["pdl"] is True and LaunchSpec.from_json(pdl_spec.to_json()) == pdl_spec
    with pytest.raises(ManifestError, match="pdl must be true or false"):
        LaunchSpec.from_json({**SPEC.to_json(), "pdl": 1})


def _prebuilt_specs() -> list[LaunchSpec]:
    manifest = json.loads((ROOT / "prebuilt" / "sm90" / "manifest.json").read_text())
    seen: dict[tuple, LaunchSpec] = {}
    for entry in manifest["variants"]:
        spec = LaunchSpec.from_json(entry["launch"])
        seen.setdefault((entry["kernel"], spec.grid, tuple(spec.params)), spec)
    return list(seen.values())


@needs_ext
def test_every_prebuilt_kernel_launches_alike_both_ways(driver):
    rng = random.Random(2)
    specs = _prebuilt_specs()
    assert len(specs) > 10
    for spec in specs:
        arg_names = tuple(a.name for a in spec.args)
        for _ in range(5):
            values = values_for(spec, arg_names, rng, dims=(1, 70000))
            abi, compiled = launch_both(driver, spec, arg_names, values)
            want = expected(spec, arg_names, values, pdl=spec.pdl and _kernel.PDL_ALLOWED)
            # random sizes can make a grid empty (e.g. hidden 2 of a per-128-column grid): then neither launches
            assert [c[1:] for c in compiled] == [c[1:] for c in abi] == ([] if want is None else [want])


@needs_ext
def test_grid_follows_python_arithmetic(driver):
    """Floor division and modulo of negatives, min/max, and no launch where a dimension is not positive."""
    spec = LaunchSpec(
        "g",
        (Param("n", "i64"),),
        (Arg("n", "dim", "i64"),),
        ("(n - 10) // 3 + 5", "(n - 10) % 7 + (2 - n) % 4", "max(n * 3 - 40, min(n, 2))"),
        (1, 1, 1),
        0,
    )
    for n in range(-40, 40):
        abi, compiled = launch_both(driver, spec, ("n",), (n,))
        want = expected(spec, ("n",), (n,))
        assert [c[1:] for c in compiled] == [c[1:] for c in abi] == ([want] if want else [])


@needs_ext
def test_grid_errors(driver):
    def launcher(grid):
        spec = LaunchSpec("g", (Param("n", "i64"),), (Arg("n", "dim", "i64"),), grid, (1, 1, 1), 0)
        driver.sizes = [8]
        return make_kernel(spec).bind(("n",), "compiled")

    with pytest.raises(ZeroDivisionError):
        launcher(("1 // n", "1", "1"))(0, 0, 0)
    with pytest.raises(OverflowError, match="32 bits"):
        launcher(("n * 2", "1", "1"))(0, 0, 2**32)
    with pytest.raises(OverflowError, match="64 bits"):
        launcher(("n * n", "1", "1"))(0, 0, 2**40)
    assert driver.calls == []
    launcher(("(n * n) // n", "1", "1"))(0, 0, 2**31)
    assert driver.calls[0][2] == (2**31, 1, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_driver_errors_raise_with_the_driver_name(driver, kind):
    launch = make_kernel(SPEC).bind(ARGS, kind)
    values = values_for(SPEC, ARGS, random.Random(3))
    driver.sizes = [SIZES[p.type] for p in SPEC.params]
    driver.codes = [700]
    with pytest.raises(CudaDriverError, match=r"cuLaunchKernel\(fake \[key=1\]\) failed: CUDA_ERROR_ILLEGAL_ADDRESS \(700\)") as info:
        launch(0, 0, *values)
    assert info.value.code == 700 and driver.contexts == []
    # a thread without torch's context: bind it and launch again, once
    driver.calls.clear()
    driver.codes = [201]
    launch(3, 0, *values)
    assert driver.contexts == [3] and len(driver.calls) == 2 and driver.calls[0][1:] == driver.calls[1][1:]
    driver.codes = [201, 201]
    with pytest.raises(CudaDriverError, match="CUDA_ERROR_INVALID_CONTEXT"):
        launch(0, 0, *values)


@needs_ext
def test_bad_arguments_raise_and_launch_nothing(driver):
    launch = make_kernel(SPEC).bind(ARGS, "compiled")
    driver.sizes = [SIZES[p.type] for p in SPEC.params]
    good = list(values_for(SPEC, ARGS, random.Random(4)))
    with pytest.raises(TypeError, match="with 8 values, got 7 values"):
        launch(0, 0, *good[:-1])
    with pytest.raises(TypeError):
        launch(0, 0, *good, 1)
    with pytest.raises(TypeError):
        launch()
    with pytest.raises(TypeError):
        launch(0, 0, *good, flags=1)
    for index, bad, error in [
        (0, "0x10", TypeError),  # ptr
        (0, 1.5, TypeError),
        (0, None, TypeError),
        (1, "1.0", TypeError),  # f32
        (1, None, TypeError),
        (2, 2.0, TypeError),  # i32
        (3, object(), TypeError),  # i64
        (0, -1, OverflowError),
        (0, 2**64, OverflowError),
        (2, 2**31, OverflowError),
        (3, 2**63, OverflowError),
        (1, 1e300, OverflowError),
    ]:
        values = list(good)
        values[index] = bad
        with pytest.raises(error):
            launch(0, 0, *values)
    with pytest.raises(TypeError):
        launch("0", 0, *good)
    with pytest.raises(OverflowError):
        launch(0, -1, *good)
    with pytest.raises(ValueError, match="device index"):
        launch(_launch.MAX_DEVICES, 0, *good)
    assert driver.calls == []
    # ints given as anything with __index__ (numpy-like) and bools are taken, as struct takes them
    import operator

    class Index:
        def __index__(self):
            return 64

    values = list(good)
    values[0], values[2] = Index(), True
    launch(0, 0, *values)
    assert driver.calls[-1][6][3] == struct.pack("<Q", operator.index(Index())) and driver.calls[-1][6][5] == struct.pack("<i", 1)


@needs_ext
def test_module_loads_once_per_device_and_load_errors_propagate(driver, monkeypatch):
    kernel = make_kernel(SPEC)
    launch = kernel.bind(ARGS, "compiled")
    driver.sizes = [SIZES[p.type] for p in SPEC.params]
    values = values_for(SPEC, ARGS, random.Random(5))
    loads = []
    real_load = Kernel.load

    def load(self, device):
        loads.append(device)
        if device == 2:
            raise ArtifactError("cubin corrupt")
        return real_load(self, device)

    monkeypatch.setattr(Kernel, "load", load)
    for device in (0, 0, 1, 0, 1):
        launch(device, 0, *values)
    assert loads == [0, 1] and launch.__self__.loaded() == [0, 1]
    with pytest.raises(ArtifactError, match="cubin corrupt"):
        launch(2, 0, *values)
    with pytest.raises(ArtifactError):
        launch(2, 0, *values)  # not cached: tried again
    assert loads == [0, 1, 2, 2] and len(driver.calls) == 5
    assert launch.__self__.kernel is kernel and launch.__self__.arg_names == ARGS
    # an empty grid launches nothing and loads nothing
    empty = list(values)
    empty[ARGS.index("n")] = 0
    launch(5, 0, *empty)
    assert loads == [0, 1, 2, 2] and len(driver.calls) == 5


@pytest.mark.parametrize("kind", KINDS)
def test_threads_launch_concurrently_without_mixing_arguments(driver, kind):
    launch = make_kernel(SPEC).bind(ARGS, kind)
    driver.sizes = [SIZES[p.type] for p in SPEC.params]
    per_thread = 300
    plans = {}

    def worker(seed, barrier):
        rng = random.Random(seed)
        plan = [values_for(SPEC, ARGS, rng) for _ in range(per_thread)]
        plans[threading.get_ident()] = plan
        barrier.wait()
        for values in plan:
            launch(seed % 2, 0x1000 + seed, *values)

    run_on_threads(worker, 8)
    assert len(driver.calls) == 8 * per_thread
    for ident, plan in plans.items():
        seen = [c[6] for c in driver.calls if c[0] == ident]
        assert seen == [expected(SPEC, ARGS, values)[5] for values in plan]


@needs_ext
def test_many_threads_through_the_c_noop(driver, monkeypatch):
    """The compiled path with the GIL released around the launch, at full speed, from 16 threads."""
    monkeypatch.setattr(_cuda, "launch_address", lambda pdl=False: _launch.NOOP_LAUNCH_EX if pdl else _launch.NOOP_LAUNCH)
    launch = make_kernel(SPEC).bind(ARGS, "compiled")
    values = values_for(SPEC, ARGS, random.Random(6))

    def worker(i, barrier):
        for _ in range(20000):
            launch(0, 0, *values)

    run_on_threads(worker, 16)
    # and through cuLaunchKernelEx (the config and its attribute on each thread's C stack)
    launch = make_kernel(SPEC.replace(pdl=True)).bind(ARGS, "compiled", True)
    run_on_threads(worker, 16)
    assert driver.calls == []


def _select(env: dict, block_extension: bool = False) -> subprocess.CompletedProcess:
    code = "import sys\n"
    if block_extension:
        code += "sys.modules['tkaot._launch'] = None\n"  # what a checkout without the .so sees
    code += "import tkaot, tkaot._kernel as k\nprint(tkaot.launcher_kind(), '|', k.LAUNCHER_WHY)\n"
    full_env = {k: v for k, v in os.environ.items() if k != "TKAOT_LAUNCHER"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={**full_env, **env})


def test_launcher_selection():
    forced = _select({"TKAOT_LAUNCHER": "abi"})
    assert forced.stdout.startswith("abi | TKAOT_LAUNCHER=abi"), forced.stderr
    missing = _select({}, block_extension=True)
    assert missing.stdout.startswith("abi | no compiled launcher here"), missing.stderr
    required = _select({"TKAOT_LAUNCHER": "compiled"}, block_extension=True)
    assert required.returncode != 0 and "TKAOT_LAUNCHER=compiled, but the compiled launcher does not import" in required.stderr
    typo = _select({"TKAOT_LAUNCHER": "cffi"})
    assert typo.returncode != 0 and "TKAOT_LAUNCHER='cffi'" in typo.stderr
    if _launch is not None:
        default = _select({})
        assert default.stdout.startswith("compiled | ") and default.stdout.strip().endswith("_launch.abi3.so"), default.stderr
        assert _select({"TKAOT_LAUNCHER": "compiled"}).stdout.startswith("compiled")


def test_bind_follows_the_selection(monkeypatch):
    kernel = make_kernel(SPEC)
    monkeypatch.setattr(_kernel, "LAUNCHER_KIND", "abi")
    assert isinstance(kernel.bind(ARGS), _kernel.Launcher)
    monkeypatch.setattr(_kernel, "_compiled", None)
    with pytest.raises(ValueError, match="'compiled' is not available"):
        kernel.bind(ARGS, "compiled")
    if _launch is not None:
        monkeypatch.setattr(_kernel, "_compiled", _launch)
        monkeypatch.setattr(_kernel, "LAUNCHER_KIND", "compiled")
        launch = kernel.bind(ARGS)
        assert isinstance(launch.__self__, _launch.Launcher) and launch.__name__ == "launch"


def test_sets_command_names_the_launcher():
    from build_tools.cli import main

    result = CliRunner().invoke(main, ["sets"])
    assert result.exit_code == 0 and f"launcher: {_kernel.LAUNCHER_KIND} (" in result.output


@needs_ext
def test_extension_agrees_with_its_python_side():
    """The C source and the Python that feeds it share numbers: the abi3 floor and the grid opcodes."""
    from build_tools.ext import ABI3_SINCE
    from tkaot import _spec

    source = (ROOT / "tkaot" / "_launch.c").read_text()
    assert "#define Py_LIMITED_API 0x030B0000" in source and ABI3_SINCE == "cp311"
    assert "enum { G_CONST = 0, G_ARG, G_ADD, G_SUB, G_MUL, G_FLOORDIV, G_MOD, G_MIN, G_MAX, G_END };" in source
    assert (_spec._G_CONST, _spec._G_ARG, _spec._G_END) == (0, 1, 9)
    assert list(_spec._G_BINOPS.values()) + list(_spec._G_CALLS.values()) == [2, 3, 4, 5, 6, 7, 8]
    assert set(_kernel._PACK_CODES.values()) == {"Q", "q", "i", "f"}
    with pytest.raises(ValueError, match="malformed grid"):
        _launch.Launcher("q", b"\0", struct.pack("=qq", 0, 1) * 2, (1, 1, 1), 0, print, print)
    with pytest.raises(ValueError, match="not an integer argument"):
        _launch.Launcher("f", b"\0", struct.pack("=qqqq", 1, 0, 9, 0) * 3, (1, 1, 1), 0, print, print)
    with pytest.raises(ValueError, match="unknown value type"):
        _launch.Launcher("x", b"", struct.pack("=qqqq", 0, 1, 9, 0) * 3, (1, 1, 1), 0, print, print)
    grid = struct.pack("=qqqq", 0, 1, 9, 0) * 3
    with pytest.raises(ValueError, match="constants must be"):
        _launch.Launcher("q", b"\1", grid, (1, 1, 1), 0, print, print, None, None, False, b"\0" * 7)
    with pytest.raises(ValueError, match="constants must be"):
        _launch.Launcher("q", b"\1", grid, (1, 1, 1), 0, print, print, None, None, False, b"\0" * 8 * (_launch.MAX_CONSTANTS + 1))
    with pytest.raises(ValueError, match="past the end"):
        _launch.Launcher("q", b"\2", grid, (1, 1, 1), 0, print, print, None, None, False, b"\0" * 8)


def test_extension_builds_reproducibly(tmp_path):
    from build_tools import ext
    from build_tools.wheel import elf_needs, platform_tag

    if ext.compiler() is None:
        pytest.skip("no C compiler")
    try:
        first = ext.build(tmp_path / "a.so").read_bytes()
    except ext.ExtError as exc:
        if "failed:" in str(exc):
            raise
        pytest.skip(str(exc))
    assert ext.build(tmp_path / "b.so").read_bytes() == first
    machine, needed, _ = elf_needs(first)
    assert needed == ["libc.so.6"]  # no libpython, libcuda or libtorch
    assert platform_tag(first).startswith("manylinux_2_") and platform_tag(first).endswith(machine)
