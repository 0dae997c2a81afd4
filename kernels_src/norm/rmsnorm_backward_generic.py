"""The generic RMSNorm backward (pass 1): rmsnorm_backward with the row width `hidden` a runtime value.

It serves the norm_backward calls whose specialised rmsnorm_backward variant is not built, and writes the same
bytes: the kernel body of kernels_src/norm/rmsnorm_backward.py over tilings equal to norm_backward_tiling at every
width. The kernel branches once on hidden into the body of its width class (the widths whose rows take the same
threads; ClassTiling: the row's threads, slots and warps constants, as in the specialised kernel). Each thread holds
the same vectors of the same rows, adds their products in the same order, the row's dot product is reduced by the
same shuffles and warp order, and a block's row slots are added in slot order; a thread's vectors past its count are
skipped.
"""

import tilelang.language as T

from kernels_src.norm.rmsnorm_backward import PASS_CONFIGS, rmsnorm_backward_kernel, width_classes
from tkaot._quant.kernels import RMSNORM_BACKWARD_GENERIC

DECL = RMSNORM_BACKWARD_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)
__all__ = ["DECL", "PASS_CONFIGS", "build"]  # PASS_CONFIGS: the specialised kernel's barriers, its own


def build(dtype: str):
    return rmsnorm_backward_kernel(width_classes(T.dynamic("hidden"), dtype), dtype)
