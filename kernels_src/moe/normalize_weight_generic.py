"""The generic weight normalisation: normalize_weight with the number of weights a token (1 to 32) a runtime value.

It serves the calls whose specialised variant is not built and writes the same bytes: it is the specialised kernel's
body (normalize_weight.normalize) with the weight loops bounded at run time, so each token's sum is the same
additions in the same order.
"""

import tilelang.language as T

from kernels_src.moe.normalize_weight import normalize
from tkaot._moe.kernels import NORMALIZE_WEIGHT_GENERIC

DECL = NORMALIZE_WEIGHT_GENERIC  # the declaration this module builds (tkaot/_moe/kernels.py)


def build():
    return normalize(T.dynamic("num_topk")).with_attr("global_symbol", "normalize_weight_generic")
