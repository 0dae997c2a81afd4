"""Kernel: one prebuilt variant; its launchers: the hot launch path for one op's argument order.

Two launchers do the same thing per call: evaluate the grid, pack the argument
values into the kernel's parameter layout, and call cuLaunchKernel on the given
stream. The compiled one (tkaot/_launch.c, an abi3 extension shipped in the
platform wheel) does it all in C with the parameters on its stack; the ABI one
(`Launcher` below) does it in Python with one struct.pack_into into a per-thread
buffer and a cffi ABI-mode call. The compiled one is used when its .so imports;
TKAOT_LAUNCHER=abi forces the ABI one, TKAOT_LAUNCHER=compiled refuses to run
without the compiled one.

A variant whose spec says `pdl` (it waits for the grids ahead of it at entry,
kernels_src/pdl.py) is launched by both through cuLaunchKernelEx with
programmatic dependent launch, so its launch and block ramp overlap the tail of
the kernel before it. TKAOT_PDL=0 launches every kernel plainly (the wait is
then a no-op).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import threading
from collections.abc import Mapping

from tkaot import _cuda
from tkaot._spec import LaunchSpec, compile_grid, grid_program
from tkaot.errors import ArtifactError, ManifestError

_PACK_CODES = {"ptr": "Q", "i64": "q", "i32": "i", "f32": "f"}
_NULL = _cuda.ffi.NULL
LAUNCHER_ENV = "TKAOT_LAUNCHER"
PDL_ENV = "TKAOT_PDL"


def _pdl_allowed() -> bool:
    """Whether kernels built for it are launched with programmatic dependent launch (TKAOT_PDL, default 1)."""
    choice = os.environ.get(PDL_ENV, "")
    if choice not in ("", "0", "1"):
        raise ValueError(f"{PDL_ENV}={choice!r}: use 0 (plain launches), 1 or leave it unset (the default, 1)")
    return choice != "0"


def _select_launcher():
    """(the compiled module or None, "compiled" or "abi", why), from TKAOT_LAUNCHER and what imports."""
    choice = os.environ.get(LAUNCHER_ENV, "")
    if choice not in ("", "compiled", "abi"):
        raise ValueError(f"{LAUNCHER_ENV}={choice!r}: use 'compiled', 'abi' or leave it unset")
    if choice == "abi":
        return None, "abi", f"{LAUNCHER_ENV}=abi"
    try:
        from tkaot import _launch

        if not hasattr(_launch, "MAX_CONSTANTS"):  # built from an older _launch.c: no values fixed at bind
            raise ImportError(f"{_launch.__file__} is older than its source; rebuild it (python -m build_tools.ext)")
    except ImportError as exc:
        if choice == "compiled":
            raise ImportError(f"{LAUNCHER_ENV}=compiled, but the compiled launcher does not import: {exc}") from None
        return None, "abi", f"no compiled launcher here ({exc})"
    return _launch, "compiled", _launch.__file__


_compiled, LAUNCHER_KIND, LAUNCHER_WHY = _select_launcher()
PDL_ALLOWED = _pdl_allowed()


# A launch spec's last two fields as tkaot-build writes them (keys sorted), closing the spec
_LINE_ENTRY = re.compile(r'"smem": (\d+), "symbol": "([A-Za-z_]\w*)"\}')


def _manifest_line(line: str, kernel) -> dict:
    try:
        return json.loads(line.rstrip(","))
    except ValueError as exc:
        raise ManifestError(f"{kernel}: its manifest entry is not valid JSON: {exc}") from None


class Kernel:
    """A built variant: where its cubin is, how to launch it, and its loaded functions per device."""

    def __init__(
        self,
        kernel: str,
        key: str,
        spec: LaunchSpec | dict | str,
        cubin_path: str,
        cubin_sha256: str,
        origin: str,
        fixed: Mapping | None = None,
    ):
        """`spec`: the LaunchSpec, or its manifest JSON, or the variant's whole manifest line (text), parsed and
        checked when first needed (preloading a whole set reads only each variant's symbol and shared memory size).
        `fixed`: the manifest entry's values of the static axes the kernel takes at run time (a cubin that serves
        several variants), passed at every launch."""
        self.kernel, self.key = kernel, key
        self.fixed = dict(fixed or {})
        self._spec, self._spec_json = (spec, None) if isinstance(spec, LaunchSpec) else (None, spec)
        self.cubin_path, self.cubin_sha256, self.origin = str(cubin_path), cubin_sha256, origin
        self._modules: dict[int, _cuda.Module] = {}
        self.functions: dict[int, object] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Kernel({self.kernel} [{self.key}] from {self.origin})"

    @property
    def spec(self) -> LaunchSpec:
        spec = self._spec
        if spec is None:
            data = self._spec_json
            if type(data) is str:
                data = self._spec_json = _manifest_line(data, self)["launch"]
            spec = self._spec = LaunchSpec.from_json(data)
        return spec

    def _entry(self) -> tuple[str, int]:
        """(symbol, dynamic shared memory bytes), from the JSON or the manifest line when the spec is not parsed yet
        and both are plain."""
        data = self._spec_json
        if self._spec is None:
            if type(data) is dict:
                symbol, smem = data.get("symbol"), data.get("smem")
                if type(symbol) is str and symbol.isidentifier() and type(smem) is int and smem >= 0:
                    return symbol, smem
            elif type(data) is str:
                match = _LINE_ENTRY.search(data)
                if match is not None:
                    return match.group(2), int(match.group(1))
        return self.spec.symbol, self.spec.smem

    def read_cubin(self) -> bytes:
        try:
            with open(self.cubin_path, "rb") as f:
                image = f.read()
        except OSError as exc:
            raise ArtifactError(f"{self}: cubin {self.cubin_path} cannot be read: {exc.strerror}") from None
        digest = hashlib.sha256(image).hexdigest()
        if digest != self.cubin_sha256:
            raise ArtifactError(
                f"{self}: cubin {self.cubin_path} is corrupt (sha256 {digest[:16]}…, manifest says {self.cubin_sha256[:16]}…); "
                "reinstall the artifact set or rebuild it with tkaot-build"
            )
        return image

    def load(self, device_index: int, image: bytes | None = None):
        """Load the module on a device (once) and return its CUfunction. `image`: the cubin, already read by
        read_cubin()."""
        with self._lock:
            fn = self.functions.get(device_index)
            if fn is None:
                module = _cuda.Module(self.read_cubin() if image is None else image, device_index)
                fn = module.function(*self._entry())
                self._modules[device_index] = module
                self.functions[device_index] = fn
            return fn

    def bind(self, arg_names: tuple[str, ...], kind: str | None = None, pdl: bool | None = None, fixed: Mapping | None = None):
        """A callable launcher(device_index, stream, *values in arg_names order) -> None.

        `kind` is "compiled" or "abi"; by default the one this process selected (LAUNCHER_KIND).
        `pdl`: launch with programmatic dependent launch; by default when the spec allows it and
        TKAOT_PDL does not say 0. A spec without `pdl` is never launched so (ValueError).
        `fixed`: arguments given once, here, rather than per call (a generic kernel's runtime axes,
        tkaot/_op.py): packed at bind and folded into the grid, so a call costs what it would without them.
        """
        kind = kind or LAUNCHER_KIND
        pdl = self.spec.pdl and PDL_ALLOWED if pdl is None else pdl
        fixed = {**dict(fixed or {}), **self.fixed}
        if pdl and not self.spec.pdl:
            raise ValueError(f"{self} does not wait for the kernel before it, so it cannot be launched with PDL")
        if kind == "abi":
            return Launcher(self, arg_names, pdl, fixed)
        if kind != "compiled" or _compiled is None:
            raise ValueError(f"launcher kind {kind!r} is not available here (this process uses {LAUNCHER_KIND!r}: {LAUNCHER_WHY})")
        types, param_values = _layout(self, (*arg_names, *fixed))
        dims = {a.name for a in self.spec.args if a.role == "dim"}
        constants = b"".join(_slot(t, v) for t, v in zip(types[len(arg_names) :], fixed.values()))
        launcher = _compiled.Launcher(
            "".join(_PACK_CODES[t] for t in types[: len(arg_names)]), bytes(param_values),
            grid_program(self.spec.grid, arg_names, dims, fixed), self.spec.block, self.spec.smem,
            functools.partial(self._addresses, pdl=pdl), self._launch_failed, self, arg_names, pdl, constants,
        )  # fmt: skip
        # The bound method: a call through it skips the tuple a call of the object would build.
        return launcher.launch

    def _addresses(self, device_index: int, pdl: bool = False) -> tuple[int, int]:
        """For the compiled launcher's first call on a device: (cuLaunchKernel or, for pdl, cuLaunchKernelEx,
        CUfunction) addresses."""
        fn = self.load(device_index)
        return _cuda.launch_address(pdl), int(_cuda.ffi.cast("uintptr_t", fn))

    def _launch_failed(self, launcher, result: int, device_index: int, stream: int, *values) -> None:
        """The compiled launcher's error path: the same retry and message as the ABI launcher's."""
        if result == _cuda.CUDA_ERROR_INVALID_CONTEXT:
            # A thread that has not touched CUDA through torch yet: bind torch's context, then launch.
            _cuda.ensure_context(device_index)
            result = launcher.try_launch(device_index, stream, *values)
        elif result == _cuda.CUDA_ERROR_INVALID_HANDLE:
            # Launched while another device's context is current (the tensors are not on the current device): again
            # with the tensors' device's context current
            result = _cuda.on_device(device_index, launcher.try_launch, device_index, stream, *values)
        _cuda.check(result, f"{'cuLaunchKernelEx' if launcher.pdl else 'cuLaunchKernel'}({self.kernel} [{self.key}])")


def _slot(type_: str, value) -> bytes:
    """One value as the compiled launcher holds it: eight bytes, the value in the low ones (little-endian)."""
    return struct.pack("<" + _PACK_CODES[type_], value).ljust(8, b"\0")


def _layout(kernel: Kernel, arg_names: tuple[str, ...]) -> tuple[list[str], list[int]]:
    """(the type of each op argument, the argument index of each kernel parameter), checked."""
    spec = kernel.spec
    types = {a.name: a.type for a in spec.args}
    unknown = [n for n in arg_names if n not in types]
    if unknown:
        raise ArtifactError(f"{kernel}: the manifest has no arguments {unknown}; the artifact set is from another tkaot version")
    missing = [p.name for p in spec.params if p.name not in arg_names]
    if missing:
        raise ArtifactError(f"{kernel}: the kernel needs {missing}, which the op does not supply")
    position = {name: i for i, name in enumerate(arg_names)}
    return [types[n] for n in arg_names], [position[p.name] for p in spec.params]


class Launcher:
    """The ABI launcher: launches one Kernel with values given positionally in `arg_names` order."""

    __slots__ = (
        "kernel", "arg_names", "pdl", "_pack_into", "_fixed", "_size", "_offsets", "_grid", "_block", "_smem", "_functions", "_tls",
        "_launch", "_launch_ex",
    )  # fmt: skip

    def __init__(self, kernel: Kernel, arg_names: tuple[str, ...], pdl: bool = False, fixed: Mapping | None = None):
        spec = kernel.spec
        fixed = dict(fixed or {})
        types, param_values = _layout(kernel, (*arg_names, *fixed))
        offsets = []
        pos = 0
        for t in types:
            offsets.append(pos)
            pos += struct.calcsize("=" + _PACK_CODES[t])
        self.kernel, self.arg_names, self.pdl = kernel, arg_names, pdl
        codes = [_PACK_CODES[t] for t in types]
        self._pack_into = struct.Struct("=" + "".join(codes[: len(arg_names)])).pack_into
        # the fixed values follow the per-call ones in the buffer, packed once per thread
        self._fixed = struct.pack("=" + "".join(codes[len(arg_names) :]), *fixed.values())
        self._size = pos
        self._offsets = tuple(offsets[i] for i in param_values)
        dims = {a.name for a in spec.args if a.role == "dim"}
        self._grid = compile_grid(spec.grid, arg_names, dims, fixed)
        self._block = spec.block
        self._smem = spec.smem
        self._functions = kernel.functions
        self._tls = threading.local()
        self._launch = None  # the driver's cuLaunchKernel (or _launch_pdl), bound at the first launch
        self._launch_ex = None  # the driver's cuLaunchKernelEx, for _launch_pdl

    def _buffers(self):
        storage = bytearray(self._size)
        storage[self._size - len(self._fixed) :] = self._fixed
        base = _cuda.ffi.cast("char *", _cuda.ffi.from_buffer(storage))
        params = _cuda.ffi.new("void *[]", max(1, len(self._offsets)))
        for i, off in enumerate(self._offsets):
            params[i] = base + off
        bufs = (storage, params, base)
        self._tls.bufs = bufs
        return bufs

    def __call__(self, device_index: int, stream: int, *values) -> None:
        gx, gy, gz = self._grid(values)
        if gx <= 0 or gy <= 0 or gz <= 0:
            return  # nothing to do (empty batch)
        try:
            storage, params, _ = self._tls.bufs
        except AttributeError:
            storage, params, _ = self._buffers()
        self._pack_into(storage, 0, *values)
        fn = self._functions.get(device_index)
        if fn is None or self._launch is None:
            fn = self.kernel.load(device_index)
            if self.pdl:
                self._launch_ex, self._launch = _cuda.launch_ex(), self._launch_pdl
            else:
                self._launch = _cuda.lib().cuLaunchKernel
        bx, by, bz = self._block
        result = self._launch(fn, gx, gy, gz, bx, by, bz, self._smem, stream, params, _NULL)
        if result:
            self._retry(result, device_index, (fn, gx, gy, gz, bx, by, bz, self._smem, stream, params, _NULL))

    def _launch_pdl(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> int:
        """cuLaunchKernel's arguments, launched through cuLaunchKernelEx with programmatic dependent launch."""
        try:
            config = self._tls.config
        except AttributeError:
            attr = _cuda.ffi.new("CUlaunchAttribute *")
            attr.id = _cuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value[0] = 1
            config = _cuda.ffi.new("CUlaunchConfig *")
            config.attrs, config.numAttrs = attr, 1
            self._tls.config, self._tls.attr = config, attr
        config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
        config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
        config.sharedMemBytes, config.hStream = smem, stream
        return self._launch_ex(config, fn, params, extra)

    def _retry(self, result: int, device_index: int, launch_args: tuple) -> None:
        if result == _cuda.CUDA_ERROR_INVALID_CONTEXT:
            # A thread that has not touched CUDA through torch yet: bind torch's context, then launch.
            _cuda.ensure_context(device_index)
            result = self._launch(*launch_args)
        elif result == _cuda.CUDA_ERROR_INVALID_HANDLE:
            # Launched while another device's context is current (the tensors are not on the current device): again
            # with the tensors' device's context current
            result = _cuda.on_device(device_index, self._launch, *launch_args)
        _cuda.check(result, f"{'cuLaunchKernelEx' if self.pdl else 'cuLaunchKernel'}({self.kernel.kernel} [{self.kernel.key}])")
