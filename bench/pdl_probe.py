"""Probe: what programmatic dependent launch (PDL) buys the fused kernels, before the runtime learns it.

The "...g" tilings run griddepcontrol.wait / launch_dependents at entry (kernels_src/pdl.py). Here their
launches go through cuLaunchKernelEx with the programmatic-stream-serialization attribute: the compiled
launcher is handed a ctypes stand-in for cuLaunchKernel that adds it while `PDL[0]` is set. Each tiling is
timed plainly and (the "g" ones) under PDL, by CUDA-graph replay over rotating inputs larger than L2; a chain
of PDL launches whose inputs are the previous launch's outputs is checked against the pure-torch reference.

    TKAOT_PATH=<artifact set with the tilings> python -m bench.pdl_probe
"""

from __future__ import annotations

import ctypes

import torch

import tkaot
from bench.timing import copy_ceiling_tbps, device_us
from tkaot import _cuda, _fused, reference

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
PDL = [False]
TOKENS, SWIGLU_HIDDEN, NORM_HIDDEN = 8192, 2048, 7168


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("smem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)),
        ("num_attrs", ctypes.c_uint),
    ]


_libcuda = ctypes.CDLL("libcuda.so.1")
_launch_ex = _libcuda.cuLaunchKernelEx
_launch_ex.argtypes = (ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_launch_ex.restype = ctypes.c_int
_LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, *(ctypes.c_uint,) * 7, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p
)
_attr = _Attr(id=CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
_attr.value[0] = 1


@_LAUNCH
def _launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
    config = _Config((gx, gy, gz), (bx, by, bz), smem, stream, ctypes.pointer(_attr), 1 if PDL[0] else 0)
    return _launch_ex(ctypes.byref(config), f, params, extra)


_cuda.launch_address = lambda: ctypes.cast(_launch, ctypes.c_void_p).value


def _time(name, call, inputs, nbytes, pdl):
    PDL[0] = pdl
    call(inputs[0])
    us, mode = device_us(call, inputs)
    PDL[0] = False
    return f"{name:34s} {us:7.2f} µs {nbytes / us / 1e6:5.2f} TB/s {'' if mode == 'graph' else '(events)'}"


def _norm_chain_ok(weight) -> bool:
    """Four PDL launches, each normalising the previous one's bf16 output, against the reference."""
    _fused.NORM_CAST_TILING = "lean8nlbwdg"
    PDL[0] = True
    x = torch.randn(4097, NORM_HIDDEN, dtype=torch.bfloat16, device="cuda") * 3
    outs = []
    for _ in range(4):
        (q, sf), y, rstd, _ = tkaot.quant.norm_forward_and_per_token_cast(x, weight, 1e-6, "e4m3", 32, with_rstd=True, with_out_bf16=True)
        outs.append((x, q, sf, y, rstd))
        x = y
    PDL[0] = False
    torch.cuda.synchronize()
    ok = True
    for x, q, sf, y, rstd in outs:
        (want_q, want_sf), want_y, _, _ = reference.fused.norm_forward_and_per_token_cast(x, weight, 1e-6, None, 1.0, rstd=rstd)
        ok &= torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(sf, want_sf) and torch.equal(y, want_y.bfloat16())
    return bool(ok)


def main() -> None:
    print(f"device: {torch.cuda.get_device_name()}")
    weight = torch.randn(NORM_HIDDEN, dtype=torch.bfloat16, device="cuda")
    norm_inputs = [{"x": torch.randn(TOKENS, NORM_HIDDEN, dtype=torch.bfloat16, device="cuda") * 3} for _ in range(3)]
    swiglu_inputs = [{"x": torch.randn(TOKENS, 2 * SWIGLU_HIDDEN, dtype=torch.bfloat16, device="cuda")} for _ in range(3)]
    norm_bytes = TOKENS * NORM_HIDDEN * (2 + 1) + TOKENS * (NORM_HIDDEN // 32) * 4 + NORM_HIDDEN * 2
    swiglu_bytes = TOKENS * SWIGLU_HIDDEN * (2 * 2 + 1) + TOKENS * (SWIGLU_HIDDEN // 128) * 4
    print(f"PDL chain of norm + cast (4097 tokens) exact: {_norm_chain_ok(weight)}")
    rows = []
    for _rep in range(2):
        for tiling, pdl in (("lean8nlbwd", False), ("lean8nlbwdg", False), ("lean8nlbwdg", True)):
            _fused.NORM_CAST_TILING = tiling

            def norm(a):
                return tkaot.quant.norm_forward_and_per_token_cast(a["x"], weight, 1e-6, "e4m3", 32)

            rows.append(_time(f"norm+cast {tiling}{' PDL' if pdl else ''}", norm, norm_inputs, norm_bytes, pdl))
        for tiling, pdl in (("wscc2v9b1", False), ("wscc2v9b1g", False), ("wscc2v9b1g", True)):
            _fused.SWIGLU_TILING = tiling

            def swiglu(a):
                return tkaot.quant.swiglu_forward_and_per_token_cast(a["x"], "e4m3", 128)

            rows.append(_time(f"swiglu+cast {tiling}{' PDL' if pdl else ''}", swiglu, swiglu_inputs, swiglu_bytes, pdl))
    for tokens in (2048, 4096, 16384):
        count = max(2, 16384 * 3 // tokens)
        sets = [{"x": torch.randn(tokens, NORM_HIDDEN, dtype=torch.bfloat16, device="cuda") * 3} for _ in range(count)]
        nbytes = norm_bytes * tokens // TOKENS
        for tiling, pdl in (("lean8nlbwd", False), ("lean8nlbwdg", True)):
            _fused.NORM_CAST_TILING = tiling

            def norm(a):
                return tkaot.quant.norm_forward_and_per_token_cast(a["x"], weight, 1e-6, "e4m3", 32)

            rows.append(_time(f"norm+cast {tokens} tokens {tiling}{' PDL' if pdl else ''}", norm, sets, nbytes, pdl))
    ceiling = copy_ceiling_tbps()
    print("\n".join(rows))
    print(f"copy ceiling {ceiling:.2f} TB/s")


if __name__ == "__main__":
    main()
