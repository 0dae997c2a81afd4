"""The generic MoE top-k gate forward for Ascend: moe_topk_gate with the expert count and k runtime values.

The Ascend moe_topk_gate's builder (kernels_src/ascend/moe_topk_gate.py) with both counts runtime values: tiles
sized for the most experts the declaration takes, copies clipped to the token's row, each lane holding the
experts of the widest layout (those past the count hold -inf and are never picked). Every route decides and
computes as the specialised kernel does, and ties go to the lower expert index in both layouts, so both write
the same indices and weights (a NaN logit aside: which expert it displaces depends on the layout).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.moe_topk_gate import REQUIRES, moe_topk_gate_kernel
from tkaot._moe.kernels import MAX_EXPERTS, MOE_TOPK_GATE_GENERIC

DECL = MOE_TOPK_GATE_GENERIC
REQUIRES = dict(REQUIRES)


def unsupported(tiling) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(tiling: str):
    return moe_topk_gate_kernel(T.dynamic("num_experts"), T.dynamic("num_topk"), MAX_EXPERTS)
