"""Elementwise dtype cast for Ascend, round to nearest or stochastic, of a contiguous tensor of n elements.

A block copies `BLOCK` elements into the Unified Buffer, converts them in a SIMT region and copies them back
(the last block's copies stop at n). The conversions are the CUDA kernel's (kernels_src/quant/cast.py): FP8
results saturate (E4M3 at +-448, E5M2 at +-57344); E4M3 NaN widens to fp32 with its sign and an all-ones
mantissa; stochastic rounding (fp32 -> bf16, fp32 -> e4m3, bf16 -> e4m3) takes its bits from the same hash
of (element index, value), so it rounds each element the way the CUDA kernel does.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import refuse
from kernels_src.quant.cast import convert
from tkaot._quant.kernels import CAST, STOCHASTIC_PAIRS

DECL = CAST
REQUIRES: dict[str, int] = {}
BLOCK = 8192  # elements a block
THREADS = 256
_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_FP8 = ("e4m3", "e5m2")


def unsupported(in_dtype, out_dtype, stochastic) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if in_dtype == out_dtype or (in_dtype in _FP8 and out_dtype in _FP8):
        return f"no cast from {in_dtype} to {out_dtype}"
    if stochastic and (in_dtype, out_dtype) not in STOCHASTIC_PAIRS:
        return f"stochastic rounding of {in_dtype} -> {out_dtype}"
    return None


def build(in_dtype: str, out_dtype: str, stochastic: bool):
    refuse(DECL, unsupported(in_dtype, out_dtype, stochastic))
    src, dst = _DTYPE[in_dtype], _DTYPE[out_dtype]
    n = T.dynamic("n")

    @T.prim_func
    def cast(x: T.Tensor[(n,), src], y: T.Tensor[(n,), dst]):
        with T.Kernel(T.ceildiv(n, BLOCK)) as block:
            first = block * BLOCK
            x_ub = T.alloc_shared((BLOCK,), src)
            y_ub = T.alloc_shared((BLOCK,), dst)
            T.copy(x[first : first + BLOCK], x_ub)
            with T.SimtVF(threads=THREADS):
                for j in T.Parallel(BLOCK):
                    y_ub[j] = convert(x_ub[j], first + j, in_dtype, out_dtype, stochastic, dst)
            T.copy(y_ub, y[first : first + BLOCK])

    return cast
