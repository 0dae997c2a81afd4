"""The generic RMSNorm + per-token E4M3 cast for Ascend: norm_cast with the row width `hidden` a runtime value.

The Ascend norm_cast's builder (kernels_src/ascend/norm_cast.py) with hidden a runtime value: tiles as wide as the
widest row the declaration takes, copies clipped to the row, the sum of squares in chunks of 256 columns up to the
row's end (kernels_src/ascend/rms.py), the groups and scale factors of the row's width. For a row width that is a
multiple of 256 (every model width of the default set) each row is summed in the specialised kernel's order, so
both write the same bytes; other widths are summed in other chunks, so rstd (and through it y) may differ in the
last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.norm_cast import REQUIRES, norm_cast_kernel
from tkaot._quant.kernels import NORM_CAST_GENERIC

DECL = NORM_CAST_GENERIC
REQUIRES = dict(REQUIRES)
MAX_HIDDEN = 8192  # norm_cast's hidden axis: a multiple of 32 up to 8192


def unsupported(dtype, sf, tiling) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(dtype: str, sf: str, tiling: str):
    return norm_cast_kernel(T.dynamic("hidden"), MAX_HIDDEN, dtype, sf)
