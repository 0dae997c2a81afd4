"""The generic SwiGLU forward for Ascend: swiglu with the row width `hidden` and the FP8 group `group` runtime values.

The Ascend swiglu's builder (kernels_src/ascend/swiglu.py) with both runtime values: a block takes one segment of
SEGMENT columns of each half of its rows (the last one clipped to the row), so any row width the declaration
takes fits the Unified Buffer, the widest fp32 rows the specialised kernel leaves out among them. Each value,
group amax, scale factor and rounding is the specialised kernel's expression on the same inputs (nothing is
summed), so both write the same bytes.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import refuse
from kernels_src.ascend.swiglu import REQUIRES, swiglu_kernel
from tkaot._quant.kernels import SWIGLU_GENERIC

DECL = SWIGLU_GENERIC
REQUIRES = dict(REQUIRES)
SEGMENT = 1024  # columns of each half a block takes: a multiple of either group


def unsupported(dtype, fmt, sf, tiling) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if fmt == "e4m3" and sf not in ("fp32", "pow2"):
        return "E4M3 output with fp32 or pow2 scale factors only"
    if fmt != "e4m3" and sf != "none":
        return f"fmt={fmt} takes sf=none"
    return None


def build(dtype: str, fmt: str, sf: str, tiling: str):
    refuse(DECL, unsupported(dtype, fmt, sf, tiling))
    return swiglu_kernel(T.dynamic("hidden"), SEGMENT, T.dynamic("group"), dtype, fmt, sf)
