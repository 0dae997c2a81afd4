"""The generic RMSNorm backward (pass 1) for Ascend: rmsnorm_backward with the row width `hidden` a runtime value.

The Ascend rmsnorm_backward's builder (kernels_src/ascend/rmsnorm_backward.py) with hidden a runtime value: tiles
as wide as the widest row the declaration takes, copies clipped to the row, each row's dot product in chunks of
256 columns up to the row's end (the columns past it adding zeros), the weight gradient over the row's columns
only. For a row width that is a multiple of 256 (every model width of the default set) each row is summed in the
specialised kernel's order, so both write the same bytes; other widths are summed in other chunks, so x_grad may
differ in the last bits. Pass 2 (weight_grad_reduce) takes the row width at run time already.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.rmsnorm_backward import REQUIRES, rmsnorm_backward_kernel
from tkaot._quant.kernels import RMSNORM_BACKWARD_GENERIC

DECL = RMSNORM_BACKWARD_GENERIC
REQUIRES = dict(REQUIRES)
MAX_HIDDEN = 8192  # rmsnorm_backward's hidden axis: a multiple of 32 up to 8192


def unsupported(dtype) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(dtype: str):
    return rmsnorm_backward_kernel(T.dynamic("hidden"), MAX_HIDDEN, dtype)
