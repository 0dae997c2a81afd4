"""CUDA driver bindings: cffi ABI mode over libcuda.so.1, only the calls tkaot uses.

Every CUresult goes through `check`, which raises CudaDriverError with the
driver's own error name and text. tkaot uses torch's context (the device's
primary context) and torch's streams; it never creates a context of its own.
"""

from __future__ import annotations

import threading

from tkaot.errors import CudaDriverError, NoGPUError

# The declarations, parsed once at development time into tkaot/_cuda_ffi.py (cffi's
# out-of-line ABI mode), so importing tkaot needs neither pycparser nor a compiler.
# After editing them run `python -m tkaot._cuda` to regenerate; a test checks they agree.
CDEF = """
    typedef int CUresult;
    typedef int CUdevice;
    typedef struct CUctx_st *CUcontext;
    typedef struct CUmod_st *CUmodule;
    typedef struct CUfunc_st *CUfunction;
    CUresult cuInit(unsigned int flags);
    CUresult cuGetErrorName(CUresult error, const char **pStr);
    CUresult cuGetErrorString(CUresult error, const char **pStr);
    CUresult cuDeviceGet(CUdevice *device, int ordinal);
    CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
    CUresult cuCtxGetCurrent(CUcontext *pctx);
    CUresult cuCtxSetCurrent(CUcontext ctx);
    CUresult cuModuleLoadData(CUmodule *module, const void *image);
    CUresult cuModuleUnload(CUmodule hmod);
    CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
    CUresult cuFuncSetAttribute(CUfunction hfunc, int attrib, int value);
    CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                            unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                            unsigned int sharedMemBytes, uintptr_t hStream, void **kernelParams, void **extra);
    typedef struct {
        int id;
        char pad[4];
        int value[16];  /* CUlaunchAttributeValue: 64 bytes, 8-byte aligned after the pad */
    } CUlaunchAttribute;
    typedef struct {
        unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
        uintptr_t hStream;
        CUlaunchAttribute *attrs;
        unsigned int numAttrs;
    } CUlaunchConfig;
    CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
    """

try:
    from tkaot._cuda_ffi import ffi
except Exception:  # pragma: no cover - regenerating, or a cffi that cannot read it
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(CDEF)

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400  # among others: a launch into a stream of a device whose context is not current
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024

_lib = None
_lib_lock = threading.Lock()


def lib():
    """The driver library, opened and initialised once."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                try:
                    handle = ffi.dlopen("libcuda.so.1")
                except OSError as exc:
                    raise NoGPUError(f"cannot load the CUDA driver (libcuda.so.1): {exc}") from None
                _check(handle, handle.cuInit(0), "cuInit")
                _lib = handle
    return _lib


def launch_ex():
    """The driver's cuLaunchKernelEx (programmatic dependent launch goes through it)."""
    try:
        return lib().cuLaunchKernelEx
    except AttributeError:  # a driver older than CUDA 12, which cannot run sm90 cubins with PDL anyway
        raise NoGPUError(
            "the CUDA driver (libcuda.so.1) has no cuLaunchKernelEx, which programmatic dependent launch needs: "
            "update the driver, or set TKAOT_PDL=0 to launch every kernel plainly"
        ) from None


def launch_address(pdl: bool = False) -> int:
    """The address of the driver's cuLaunchKernel (cuLaunchKernelEx for `pdl`), for the compiled launcher to call."""
    return int(ffi.cast("uintptr_t", launch_ex() if pdl else lib().cuLaunchKernel))


def _check(handle, result: int, call: str) -> None:
    if result != CUDA_SUCCESS:
        name, text = ffi.new("const char **"), ffi.new("const char **")
        handle.cuGetErrorName(result, name)
        handle.cuGetErrorString(result, text)
        raise CudaDriverError(
            call,
            result,
            ffi.string(name[0]).decode() if name[0] != ffi.NULL else "CUDA_ERROR_UNKNOWN",
            ffi.string(text[0]).decode() if text[0] != ffi.NULL else "unknown error",
        )


def check(result: int, call: str) -> None:
    if result != CUDA_SUCCESS:
        _check(lib(), result, call)


def ensure_context(device_index: int) -> None:
    """Make the device's primary context (torch's) current on this thread if none is."""
    cu = lib()
    current = ffi.new("CUcontext *")
    check(cu.cuCtxGetCurrent(current), "cuCtxGetCurrent")
    if current[0] == ffi.NULL:
        dev, ctx = ffi.new("CUdevice *"), ffi.new("CUcontext *")
        check(cu.cuDeviceGet(dev, device_index), "cuDeviceGet")
        check(cu.cuDevicePrimaryCtxRetain(ctx, dev[0]), "cuDevicePrimaryCtxRetain")
        check(cu.cuCtxSetCurrent(ctx[0]), "cuCtxSetCurrent")


_primary: dict[int, object] = {}  # device index -> its primary context (torch's), retained once
_primary_lock = threading.Lock()


def primary_context(device_index: int):
    context = _primary.get(device_index)
    if context is None:
        with _primary_lock:  # preload's threads: retained once
            return _primary.get(device_index) or _retain_primary(device_index)
    return context


def _retain_primary(device_index: int):
    cu = lib()
    dev, ctx = ffi.new("CUdevice *"), ffi.new("CUcontext *")
    check(cu.cuDeviceGet(dev, device_index), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctx, dev[0]), "cuDevicePrimaryCtxRetain")
    context = _primary[device_index] = ctx[0]
    return context


def on_device(device_index: int, call, *args):
    """call(*args) with the device's primary context current on this thread, then the thread's own context again (a
    thread that had none keeps the device's, as ensure_context leaves it). For work on a device other than the
    current one: loading a module there, or a launch the driver refused from another device's context."""
    cu = lib()
    target = primary_context(device_index)
    current = ffi.new("CUcontext *")
    check(cu.cuCtxGetCurrent(current), "cuCtxGetCurrent")
    previous = current[0]
    if previous == target:
        return call(*args)
    check(cu.cuCtxSetCurrent(target), "cuCtxSetCurrent")
    try:
        return call(*args)
    finally:
        if previous != ffi.NULL:
            check(cu.cuCtxSetCurrent(previous), "cuCtxSetCurrent")


class Module:
    """One loaded cubin in a device's primary context, whichever device is current; unloaded when collected."""

    def __init__(self, image: bytes, device_index: int):
        self._image = ffi.from_buffer(image)
        self.handle = on_device(device_index, self._load)

    def _load(self):
        handle = ffi.new("CUmodule *")
        check(lib().cuModuleLoadData(handle, self._image), "cuModuleLoadData")
        return handle[0]

    def function(self, symbol: str, smem: int):
        cu = lib()
        fn = ffi.new("CUfunction *")
        check(cu.cuModuleGetFunction(fn, self.handle, symbol.encode()), f"cuModuleGetFunction({symbol})")
        if smem > DEFAULT_DYNAMIC_SMEM_LIMIT:
            check(
                cu.cuFuncSetAttribute(fn[0], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                f"cuFuncSetAttribute({symbol}, max dynamic shared memory {smem})",
            )
        return fn[0]

    def __del__(self):
        if getattr(self, "handle", None) is not None and _lib is not None:
            _lib.cuModuleUnload(self.handle)  # nothing to raise to from a finalizer
            self.handle = None


def write_ffi_module(path: str) -> None:
    """Write the out-of-line ABI-mode module holding CDEF, pre-parsed."""
    import cffi

    builder = cffi.FFI()
    builder.cdef(CDEF)
    builder.set_source("tkaot._cuda_ffi", None)
    builder.emit_python_code(path)


if __name__ == "__main__":  # pragma: no cover
    import os

    write_ffi_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cuda_ffi.py"))
