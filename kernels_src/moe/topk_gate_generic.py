"""The generic top-k gate: topk_gate with the expert count and k runtime values.

It serves the calls whose specialised topk_gate variant is not built, and returns the same
indices: each lane holds the experts the specialised kernel's layout gives it (common.py:
a run of `per` experts, 4 a vector when rows are 16-byte aligned, else 1; `per` now
computed at run time), and the warp selects by the same ballots in the same order (one
macro, common.warp_topk_ballot), so ties and NaNs resolve alike. A lane holds at most MAX_SLOTS experts; the selection loop is
unrolled for the smallest of SLOT_BUCKETS that holds `per` (a uniform branch), so a
256-expert gate scans the 8 slots the specialised kernel scans.
"""

import tilelang.language as T

from kernels_src.moe.common import MAX_SLOTS, SLOT_BUCKETS, TILINGS, WARP, warp_token, warp_topk_ballot
from kernels_src.moe.topk_gate import topk_gate_kernel
from tkaot._moe.kernels import TOPK_GATE_GENERIC

DECL = TOPK_GATE_GENERIC  # the declaration this module builds (tkaot/_moe/kernels.py)


def build(tiling: str):
    warps = TILINGS[tiling]  # tokens per block
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")

    @T.macro
    def select(scores, topk_idx, block, num_tokens):
        T.assume(num_experts > 0)
        lane, token = warp_token(block, warps)
        aligned = num_experts % 4 == 0  # rows are 16-byte aligned (the op checks the pointer): 4 experts a vector
        per = T.if_then_else(aligned, (num_experts + 4 * WARP - 1) // (4 * WARP) * 4, (num_experts + WARP - 1) // WARP)
        first = lane * per
        vals = T.alloc_local((MAX_SLOTS,), T.float32)
        idx = T.alloc_var(T.int32, init=-1)
        if token < num_tokens:
            if aligned:
                T.assume(num_experts % 4 == 0)
                for c in T.unroll(MAX_SLOTS // 4):
                    if c * 4 < per and first + c * 4 + 4 <= num_experts:
                        for j in T.vectorized(4):
                            vals[c * 4 + j] = scores[token, first + c * 4 + j]
                    else:
                        for j in T.unroll(4):
                            vals[c * 4 + j] = -T.infinity(T.float32)
            else:
                for s in T.unroll(MAX_SLOTS):
                    if s < per and first + s < num_experts:
                        vals[s] = scores[token, first + s]
                    else:
                        vals[s] = -T.infinity(T.float32)
            if per <= SLOT_BUCKETS[0]:
                warp_topk_ballot(vals, lane, num_experts, num_topk, idx, per, SLOT_BUCKETS[0])
            elif per <= SLOT_BUCKETS[1]:
                warp_topk_ballot(vals, lane, num_experts, num_topk, idx, per, SLOT_BUCKETS[1])
            else:
                warp_topk_ballot(vals, lane, num_experts, num_topk, idx, per, SLOT_BUCKETS[2])
            if lane < num_topk:
                topk_idx[token, lane] = T.Cast(T.int64, idx)

    return topk_gate_kernel(num_experts, num_topk, warps, select).with_attr("global_symbol", "topk_gate_generic")
