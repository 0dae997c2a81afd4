"""The Ascend launcher: cffi ABI mode over libascendcl, loaded only when an op first receives an NPU tensor.

A process serves NPUs when torch_npu is installed and torch sees no CUDA device (`npu_process`); there, the
ops' device index (their input checks read it with get_device()) is an NPU's, so the ops' own path serves
it: the registry takes the arch `ascend950` for every device and hands out an
`AscendKernel` per manifest entry (build_tools/ascend.py writes them: a launch spec whose grid is the block
count, whose shared memory is the dynamic Unified Buffer bytes, an AscendC source and, once compiled on a
host with CANN, a binary). Binding packs the op's values as the kernel's parameters: pointers 8 bytes,
scalars at their own size aligned to at least 4, the whole buffer padded to 8. A launch is
aclrtLaunchKernelWithHostArgs on torch_npu's current stream, the dynamic UB size passed as the launch
config's attribute.

Neither torch_npu nor libascendcl is a dependency: both are reached only here, on first use, and their
absence is a clear error. TKAOT_ASCENDCL names another library to load (the tests' fake one).
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading

from tkaot._spec import LaunchSpec, compile_grid
from tkaot.errors import ArtifactError, TkaotError

ARCH = "ascend950"
LIBRARY_ENV = "TKAOT_ASCENDCL"
ACL_LAUNCH_ATTR_DYN_UBUF_SIZE = 2

CDEF = """
    typedef int aclError;
    aclError aclrtBinaryLoadFromData(const void *data, size_t length, const void *options, void **binHandle);
    aclError aclrtBinaryGetFunction(void *binHandle, const char *kernelName, void **funcHandle);
    aclError aclrtBinaryUnLoad(void *binHandle);
    typedef struct {
        int id;
        union { unsigned char schemMode; unsigned int dynUBufSize; unsigned int reserved[4]; } value;
    } aclrtLaunchKernelAttr;
    typedef struct { aclrtLaunchKernelAttr *attrs; size_t numAttrs; } aclrtLaunchKernelCfg;
    aclError aclrtLaunchKernelWithHostArgs(void *funcHandle, unsigned int numBlocks, void *stream, aclrtLaunchKernelCfg *cfg,
                                           void *hostArgs, size_t argsSize, void *placeHolderArray, size_t placeHolderNum);
    const char *aclGetRecentErrMsg(void);
"""


class AscendError(TkaotError):
    """An ACL runtime call failed, or the Ascend runtime (libascendcl, torch_npu) is not available."""


_LIB = None
_FFI = None
_LOCK = threading.Lock()


def acl():
    """(ffi, the opened libascendcl), opened on first use."""
    global _LIB, _FFI
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                import cffi

                ffi = cffi.FFI()
                ffi.cdef(CDEF)
                name = os.environ.get(LIBRARY_ENV) or "libascendcl.so"
                try:
                    _LIB = ffi.dlopen(name)
                except OSError as exc:
                    raise AscendError(
                        f"cannot load {name} ({exc}); an NPU tensor needs CANN's runtime: source CANN's set_env.sh "
                        f"(or set {LIBRARY_ENV} to libascendcl.so's path)"
                    ) from None
                _FFI = ffi
    return _FFI, _LIB


def check(result: int, call: str) -> None:
    if result != 0:
        ffi, lib = acl()
        try:
            text = lib.aclGetRecentErrMsg()
            detail = ffi.string(text).decode(errors="replace") if text != ffi.NULL else ""
        except AttributeError:  # a CANN without aclGetRecentErrMsg
            detail = ""
        raise AscendError(f"{call} failed with ACL error {result}" + (f": {detail}" if detail else ""))


_NPU_PROCESS: list[bool] = []


def npu_process() -> bool:
    """Whether this process launches on NPUs: torch_npu is installed and torch sees no CUDA device (a host with
    both is not supported yet). Decided once."""
    if not _NPU_PROCESS:
        import importlib.util

        npu = importlib.util.find_spec("torch_npu") is not None
        if npu:
            import torch

            npu = not torch.cuda.is_available()
        _NPU_PROCESS.append(npu)
    return _NPU_PROCESS[0]


def npu_stream(device: int) -> int:
    """torch_npu's current stream of NPU `device`, as an integer handle."""
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError:
        raise AscendError("an NPU tensor needs torch_npu to find the current stream; pip install torch_npu") from None
    index = device
    raw = getattr(getattr(torch_npu, "_C", None), "_npu_getCurrentRawStream", None)
    return int(raw(index)) if raw is not None else int(torch.npu.current_stream(index).npu_stream)


def with_npu_streams(cuda_stream):
    """tkaot/_op.py's current_stream: torch's CUDA raw-stream accessor itself where torch_npu is not installed (no
    cost on the CUDA path), else one that answers with torch_npu's current stream in an NPU process."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        return cuda_stream

    def current_stream(device: int) -> int:
        if npu_process():
            return npu_stream(device)
        if cuda_stream is None:
            from tkaot.errors import NoGPUError

            raise NoGPUError("this torch has no CUDA; tkaot runs on CUDA GPUs and Ascend NPUs (torch_npu) only")
        return cuda_stream(device)

    return current_stream


def binaries_command(set_root: str) -> str:
    """The command that compiles a sources-only set's binaries on a host with CANN."""
    return f"tkaot-build build --arch {ARCH} --sources {set_root} --out ./tkaot-artifacts"


class AscendKernel:
    """A built Ascend variant: its binary (or, before stage 2, only its source) and the launch spec."""

    def __init__(self, kernel: str, key: str, entry: dict, root: str, origin: str):
        self.kernel, self.key, self.origin, self.root = kernel, key, origin, root
        self.spec = LaunchSpec.from_json(entry.get("launch"))
        self.requires = dict(entry.get("requires", {}))
        # static axes this variant's kernel takes as runtime values (one kernel serving several variants): their
        # values, passed after the op's
        self.fixed = dict(entry.get("fixed", {}))
        self.binary = entry.get("binary")
        self.binary_path = os.path.join(root, "binaries", f"{self.binary}.o") if self.binary else None
        self.functions: dict[int, object] = {}
        self._handles: dict[int, object] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AscendKernel({self.kernel} [{self.key}] from {self.origin})"

    def read_binary(self) -> bytes:
        if self.binary_path is None:
            raise ArtifactError(
                f"{self}: the set holds the AscendC source only, no binary. Compile the set's binaries on this host "
                f"(CANN's bisheng) with:\n    {binaries_command(self.root)}\nand put ./tkaot-artifacts on TKAOT_PATH"
            )
        try:
            with open(self.binary_path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ArtifactError(f"{self}: binary {self.binary_path} cannot be read: {exc.strerror}") from None
        if hashlib.sha256(data).hexdigest() != self.binary:
            raise ArtifactError(f"{self}: binary {self.binary_path} is corrupt (sha256 mismatch); rebuild it with tkaot-build")
        return data

    def load(self, device: int):
        """Load the binary (once per device) and return the kernel's function handle."""
        with self._lock:
            fn = self.functions.get(device)
            if fn is None:
                data = self.read_binary()
                ffi, lib = acl()
                handle = ffi.new("void **")
                check(lib.aclrtBinaryLoadFromData(data, len(data), ffi.NULL, handle), f"aclrtBinaryLoadFromData({self.kernel})")
                out = ffi.new("void **")
                check(lib.aclrtBinaryGetFunction(handle[0], self.spec.symbol.encode(), out), f"aclrtBinaryGetFunction({self.spec.symbol})")
                self._handles[device], fn = handle[0], out[0]
                self.functions[device] = fn
            return fn

    def bind(self, arg_names: tuple[str, ...], kind: str | None = None, pdl: bool | None = None, fixed=None):
        """launcher(device, stream, *values in arg_names order); the stream argument is ignored (torch_npu's current
        stream of the device is used). `fixed`: arguments given once, here (a generic kernel's runtime axes), as are
        the entry's own fixed values. Refuses a set without binaries here, before any call."""
        self.read_binary()
        return AscendLauncher(self, arg_names, {**dict(fixed or {}), **self.fixed})


def pack_plan(params) -> tuple[list[tuple[str, int]], int]:
    """[(struct code, offset)] of each kernel parameter and the buffer size: pointers 8 bytes, scalars aligned
    to at least 4, the buffer padded to 8 (ACL's host-argument layout)."""
    codes = {"ptr": "Q", "i64": "q", "i32": "i", "f32": "f"}
    plan, offset = [], 0
    for p in params:
        size = struct.calcsize(codes[p.type])
        align = max(size, 4)
        offset = -(-offset // align) * align
        plan.append((codes[p.type], offset))
        offset += size
    return plan, -(-offset // 8) * 8


class AscendLauncher:
    """Packs one op's values into the kernel's host arguments and launches it."""

    def __init__(self, kernel: AscendKernel, arg_names: tuple[str, ...], constants: dict | None = None):
        spec = kernel.spec
        constants = dict(constants or {})
        position = {name: i for i, name in enumerate(arg_names)}
        missing = [p.name for p in spec.params if p.name not in position and p.name not in constants]
        if missing:
            raise ArtifactError(f"{kernel}: the kernel needs {missing}, which the op does not supply")
        plan, self.size = pack_plan(spec.params)
        fields = list(zip(plan, spec.params))
        self.fields = [(code, offset, position[p.name]) for (code, offset), p in fields if p.name not in constants]
        # values fixed at bind: packed once into each thread's buffer
        self.constants = [(code, offset, constants[p.name]) for (code, offset), p in fields if p.name in constants]
        self.requires = [(position[name], name, value) for name, value in kernel.requires.items()]
        dims = {a.name for a in spec.args if a.role == "dim"}
        self.grid = compile_grid(spec.grid, arg_names, dims, {n: v for n, v in constants.items() if n in dims})
        self.kernel, self.ub = kernel, spec.smem
        self._tls = threading.local()

    def __call__(self, device: int, stream, *values) -> None:
        for pos, name, value in self.requires:
            if values[pos] != value:
                raise ValueError(
                    f"{self.kernel.kernel} on Ascend: {name}={values[pos]!r} is not supported yet (the Ascend kernel takes {name}={value})"
                )
        blocks = self.grid(values)[0]
        if blocks <= 0:
            return
        ffi, lib = acl()
        try:
            buf, cfg = self._tls.buffers
        except AttributeError:
            buf = ffi.new("uint64_t[]", max(1, self.size // 8))
            attr = ffi.new("aclrtLaunchKernelAttr *")
            attr.id = ACL_LAUNCH_ATTR_DYN_UBUF_SIZE
            attr.value.dynUBufSize = self.ub
            cfg = ffi.new("aclrtLaunchKernelCfg *")
            cfg.attrs, cfg.numAttrs = attr, 1
            self._tls.buffers, self._tls.attr = (buf, cfg), attr
            for code, offset, value in self.constants:
                struct.pack_into("=" + code, ffi.buffer(buf, self.size), offset, value)
        view = ffi.buffer(buf, self.size)
        for code, offset, pos in self.fields:
            struct.pack_into("=" + code, view, offset, values[pos])
        fn = self.kernel.functions.get(device) or self.kernel.load(device)
        check(
            lib.aclrtLaunchKernelWithHostArgs(
                fn, blocks, ffi.cast("void *", stream), cfg if self.ub else ffi.NULL, buf, self.size, ffi.NULL, 0
            ),
            f"aclrtLaunchKernelWithHostArgs({self.kernel.kernel} [{self.kernel.key}])",
        )
