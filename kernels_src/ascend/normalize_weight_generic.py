"""The generic top-k weight normalisation for Ascend: normalize_weight with the weight count a runtime value.

The Ascend normalize_weight's builder (kernels_src/ascend/normalize_weight.py) with num_topk a runtime value: tiles
sized for the most weights the declaration takes, copies clipped to the token's row, the same fold in halves, so
both kernels write the same bits.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.normalize_weight import REQUIRES, normalize_weight_kernel
from tkaot._moe.kernels import MAX_TOPK, NORMALIZE_WEIGHT_GENERIC

DECL = NORMALIZE_WEIGHT_GENERIC
REQUIRES = dict(REQUIRES)


def unsupported() -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build():
    return normalize_weight_kernel(T.dynamic("num_topk"), MAX_TOPK)
