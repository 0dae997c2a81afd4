"""Measure cffi's API mode (a compiled launcher) against ABI mode for the same cuLaunchKernel.

Builds a throw-away extension in a temp dir (needs a C compiler and Python headers on
the machine running it), launches the same pre-built norm kernel both ways, and prints
host µs per launch. Not used by the runtime; it decides whether a compiled launcher is
worth shipping.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch

from bench import timing

SOURCE = r"""
#include <dlfcn.h>
#include <stdint.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, uintptr_t, void **, void **);
static launch_t real_launch;
static int tk_init(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return -1;
    real_launch = (launch_t)dlsym(h, "cuLaunchKernel");
    return real_launch ? 0 : -2;
}
static int tk_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                     unsigned smem, uintptr_t stream, void **params) {
    return real_launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, 0);
}
"""


def main() -> None:
    import cffi

    import tkaot
    import tkaot.reference
    from bench.prebuilt_launch import prebuilt_norm_launch
    from tkaot import _cuda

    builder = cffi.FFI()
    builder.cdef(
        "int tk_init(void); int tk_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, "
        "unsigned bz, unsigned smem, uintptr_t stream, void **params);"
    )
    builder.set_source("_tk_api_launch", SOURCE, libraries=["dl"])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            builder.compile(tmpdir=tmp, verbose=False)
        except Exception as exc:
            print(json.dumps({"api_mode_error": f"{type(exc).__name__}: {exc}"[:300]}))
            return
        sys.path.insert(0, tmp)
        import _tk_api_launch

        api = _tk_api_launch.lib
        assert api.tk_init() == 0
        pre = prebuilt_norm_launch()
        x, w, out, fn, params, stream = pre.x, pre.weight, pre.out, pre.fn, pre.params, pre.stream
        api_params = _tk_api_launch.ffi.cast("void **", int(_cuda.ffi.cast("uintptr_t", params)))
        api_fn = _tk_api_launch.ffi.cast("void *", int(_cuda.ffi.cast("uintptr_t", fn)))
        abi, null = _cuda._lib, _cuda.ffi.NULL
        (gx, gy, gz), (bx, by, bz), smem = pre.grid, pre.block, pre.smem
        abi_call = lambda: abi.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params, null)
        api_call = lambda: api.tk_launch(api_fn, gx, gy, gz, bx, by, bz, smem, stream, api_params)
        result = {"abi_launch_host_us": round(timing.host_us(abi_call), 2), "api_launch_host_us": round(timing.host_us(api_call), 2)}
        out.fill_(float("nan"))
        assert api.tk_launch(api_fn, gx, gy, gz, bx, by, bz, smem, stream, api_params) == 0
        torch.cuda.synchronize()
        ref = tkaot.reference.norm_forward(x, w, 1e-6)[0]
        result["api_launch_correct"] = bool(torch.allclose(out.float(), ref.float(), rtol=2**-7, atol=2**-7))
        print(json.dumps(result))


if __name__ == "__main__":
    main()
