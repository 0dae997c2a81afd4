"""The generic top-k gate for Ascend: topk_gate with the expert count and k runtime values.

The Ascend topk_gate's builder (kernels_src/ascend/topk_gate.py) with both counts runtime values: tiles sized for
the most experts and slots the declaration takes, copies clipped to the token's row. One thread selects for one
token by the same passes over the experts, so both kernels pick the same indices.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.topk_gate import REQUIRES, topk_gate_kernel
from tkaot._moe.kernels import MAX_EXPERTS, MAX_TOPK, TOPK_GATE_GENERIC

DECL = TOPK_GATE_GENERIC
REQUIRES = dict(REQUIRES)


def unsupported(tiling) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(tiling: str):
    return topk_gate_kernel(T.dynamic("num_experts"), T.dynamic("num_topk"), MAX_EXPERTS, MAX_TOPK)
