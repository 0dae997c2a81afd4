"""The generic RMSNorm backward (pass 1): rmsnorm_backward with the row width `hidden` a runtime value.

It serves the norm_backward calls whose specialised rmsnorm_backward variant is not built, and writes the same
bytes: the kernel body of kernels_src/norm/rmsnorm_backward.py over tilings equal to norm_backward_tiling at every
width. The kernel branches once on hidden: the widths whose rows take LEAST_CLASS_THREADS threads or more run on a
body of their width class (ClassTiling: the row's threads, slots and warps constants, as in the specialised kernel),
the narrower on one body whose tiling is computed from hidden (RuntimeTiling). Each thread holds the same vectors of
the same rows, adds their products in the same order, the row's dot product is reduced by the same shuffles and
warp order, and a block's row slots are added in slot order; a thread's vectors past its count are skipped.
"""

import tilelang.language as T

from kernels_src.norm.rmsnorm_backward import PASS_CONFIGS, rmsnorm_backward_kernel, width_classes
from tkaot._quant.kernels import RMSNORM_BACKWARD_GENERIC

DECL = RMSNORM_BACKWARD_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)
__all__ = ["DECL", "PASS_CONFIGS", "build"]  # PASS_CONFIGS: the specialised kernel's barriers, its own


# Rows of at least this many threads (bf16: hidden > 1792, fp32: > 896) take a body of their width class each, with
# the row's threads a constant; the narrower rows one body over a runtime count of threads
LEAST_CLASS_THREADS = 64


def build(dtype: str):
    narrow, classes = width_classes(T.dynamic("hidden"), dtype, LEAST_CLASS_THREADS)
    return rmsnorm_backward_kernel(narrow, dtype, classes)
