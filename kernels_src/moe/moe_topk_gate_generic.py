"""The generic MoE top-k gate: moe_topk_gate with the expert count (a multiple of 4, up to 512) and k runtime values.

It serves the gate calls whose specialised variant is not built and writes the same bytes: it is the specialised
kernel's own body (moe_topk_gate.gate) over a runtime layout (common.Rows.runtime) that gives each lane the experts
the specialised layout gives it. Scores, the bias, the ballots that choose (ties to the lower index), the warp sum of
the chosen scores and the weights are then the same operations on the same values in the same order; only the
loops over a lane's slots run to a bound known at run time (the ballot's unrolled for the smallest slot bucket that
holds the lane's run, common.rows_topk).
"""

import tilelang.language as T

from kernels_src.moe.common import Rows
from kernels_src.moe.moe_topk_gate import gate
from tkaot._moe.kernels import MOE_TOPK_GATE_GENERIC

DECL = MOE_TOPK_GATE_GENERIC  # the declaration this module builds (tkaot/_moe/kernels.py)


def build(tiling: str):
    num_experts = T.dynamic("num_experts")
    func = gate(num_experts, T.dynamic("num_topk"), tiling, Rows.runtime(num_experts))
    return func.with_attr("global_symbol", "moe_topk_gate_generic")
