"""The generic RMSNorm for Ascend: rmsnorm with the row width `hidden` a runtime value.

The Ascend rmsnorm's builder (kernels_src/ascend/rmsnorm.py) with hidden a runtime value: tiles as wide as the
widest row the declaration takes, copies clipped to the row, the sum of squares in chunks of 256 columns up to the
row's end (kernels_src/ascend/rms.py). For a row width that is a multiple of 256 (every model width of the default
set) each row is summed in the specialised kernel's order, so both write the same bytes; other widths are summed
in other chunks, so rstd may differ in the last bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.rmsnorm import REQUIRES, rmsnorm_kernel
from tkaot._quant.kernels import RMSNORM_GENERIC

DECL = RMSNORM_GENERIC
REQUIRES = dict(REQUIRES)
MAX_HIDDEN = 8192  # rmsnorm's hidden axis: a multiple of 16 up to 8192


def unsupported(dtype, with_weight, with_residual, with_rstd) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(dtype: str, with_weight: bool, with_residual: bool, with_rstd: bool):
    return rmsnorm_kernel(T.dynamic("hidden"), MAX_HIDDEN, dtype, with_weight, with_residual, with_rstd)
