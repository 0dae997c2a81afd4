"""The generic top-k gate: topk_gate with the expert count and k runtime values.

It serves the calls whose specialised topk_gate variant is not built, and returns the same
indices: each lane holds the experts the specialised kernel's layout gives it (common.py:
a run of `per` experts, 4 a vector when rows are 16-byte aligned, else 1; `per` now
computed at run time), and the warp selects by the same ballots in the same order, so ties
and NaNs resolve alike. A lane holds at most MAX_SLOTS experts; the selection loop is
unrolled for the smallest of SLOT_BUCKETS that holds `per` (a uniform branch), so a
256-expert gate scans the 8 slots the specialised kernel scans.
"""

import tilelang.language as T

from kernels_src.moe.common import NONE, TILINGS, WARP
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._moe.kernels import MAX_EXPERTS, TOPK_GATE_GENERIC

DECL = TOPK_GATE_GENERIC  # the declaration this module builds (tkaot/_moe/kernels.py)

MAX_SLOTS = MAX_EXPERTS // WARP
SLOT_BUCKETS = (4, 8, MAX_SLOTS)


def build(tiling: str):
    warps = TILINGS[tiling]  # tokens per block
    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")

    @T.macro
    def select(vals, lane, per, slots: int, out_idx: T.Ref):
        """Lane k (< num_topk) gets the k-th largest of the warp's `vals` (common.warp_topk_ballot, k and per at
        run time, at most `slots` slots a lane)."""
        removed = T.alloc_var(T.uint32, init=0)
        best = T.alloc_var(T.float32)
        best_slot = T.alloc_var(T.int32)
        top = T.alloc_var(T.float32)
        hit = T.alloc_var(T.uint32)
        winner = T.alloc_var(T.int32)
        slot = T.alloc_var(T.int32)
        for k in T.serial(num_topk):
            best = -T.infinity(T.float32)
            best_slot = NONE
            for s in T.unroll(slots):
                if s < per and lane * per + s < num_experts and ((removed >> T.Cast(T.uint32, s)) & T.uint32(1)) == T.uint32(0):
                    if vals[s] > best or best_slot == NONE:
                        best = vals[s]
                        best_slot = s
            top = best
            for i in T.unroll(5):
                top = T.max(top, T.shfl_xor(top, 16 >> i))
            hit = T.Cast(T.uint32, T.ballot(best_slot != NONE and best == top))
            if hit == T.uint32(0):
                # only when a value is NaN: any lane with slots left, so the route stays in range
                hit = T.Cast(T.uint32, T.ballot(best_slot != NONE))
            winner = T.__ffs(hit) - 1
            slot = T.shfl_sync(best_slot, winner)
            if lane == k:
                out_idx = winner * per + slot  # noqa: F841 (a T.Ref: the caller's variable is written)
            if lane == winner:
                removed = removed | (T.uint32(1) << T.Cast(T.uint32, slot))

    @T.prim_func
    def topk_gate_generic(
        scores: T.Tensor[(num_tokens, num_experts), T.float32],
        topk_idx: T.Tensor[(num_tokens, num_topk), T.int64],
    ):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(num_experts > 0)
            tid = T.get_thread_binding()
            lane = tid % WARP
            token = block * warps + tid // WARP
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
                    select(vals, lane, per, SLOT_BUCKETS[0], idx)
                elif per <= SLOT_BUCKETS[1]:
                    select(vals, lane, per, SLOT_BUCKETS[1], idx)
                else:
                    select(vals, lane, per, SLOT_BUCKETS[2], idx)
                if lane < num_topk:
                    topk_idx[token, lane] = T.Cast(T.int64, idx)

    return topk_gate_generic
