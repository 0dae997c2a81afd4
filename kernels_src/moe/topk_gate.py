"""Top-k gate: the indices of each token's num_topk largest scores, ties to the lower index.

One warp selects for one token (common.warp_topk_ballot); scores are read once with 16-byte loads when rows allow it.
"""

import tilelang.language as T

from kernels_src.moe.common import TILINGS, WARP, Rows, load_row, warp_token, warp_topk_ballot
from kernels_src.pdl import kernel_entry
from tkaot._moe.kernels import TOPK_GATE

DECL = TOPK_GATE  # the declaration this module builds (tkaot/_moe/kernels.py)


def build(num_experts: int, num_topk: int, tiling: str):
    if num_topk > num_experts:
        raise ValueError(f"num_topk={num_topk} exceeds num_experts={num_experts}")
    warps = TILINGS[tiling]  # tokens per block
    rows = Rows.of(num_experts)

    @T.macro
    def select(scores, topk_idx, block, num_tokens):
        lane, token = warp_token(block, warps)
        vals = T.alloc_local((rows.slots,), T.float32)
        idx = T.alloc_var(T.int32, init=-1)
        if token < num_tokens:
            load_row(vals, scores, token, lane, rows)
            warp_topk_ballot(vals, lane, num_experts, num_topk, idx, rows.per, rows.slots)
            if lane < num_topk:
                topk_idx[token, lane] = T.Cast(T.int64, idx)

    return topk_gate_kernel(num_experts, num_topk, warps, select)


def topk_gate_kernel(num_experts, num_topk, warps: int, select):
    """The gate's signature and grid, `warps` tokens a block (a warp each), for num_experts and num_topk (ints, or
    the generic kernel's runtime values, topk_gate_generic.py); select(scores, topk_idx, block, num_tokens), a
    macro, is the kernel's body."""
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def topk_gate(
        scores: T.Tensor[(num_tokens, num_experts), T.float32],
        topk_idx: T.Tensor[(num_tokens, num_topk), T.int64],
    ):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as block:
            kernel_entry()  # kernels_src/pdl.py: before any memory access
            select(scores, topk_idx, block, num_tokens)

    return topk_gate
