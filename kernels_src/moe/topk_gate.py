"""Top-k gate: the indices of each token's num_topk largest scores, ties to the lower index.

One warp selects for one token (see common.warp_topk); scores are read once
with 16-byte loads when rows allow it.
"""

import tilelang.language as T

from kernels_src.axes import Axis
from kernels_src.moe.common import WARP, layout, load_row, warp_topk

KERNEL = "topk_gate"
OPS = ("tkaot.moe.topk_gate",)
MAX_EXPERTS = 512

AXES = (
    Axis("num_experts", int, check=lambda e: 1 <= e <= MAX_EXPERTS, rule=f"in [1, {MAX_EXPERTS}]"),
    Axis("num_topk", int, check=lambda k: 1 <= k <= WARP, rule=f"in [1, {WARP}]"),
)
DYNAMIC_DIMS = ("num_tokens",)

WARPS = 4  # tokens per block


def build(num_experts: int, num_topk: int):
    if num_topk > num_experts:
        raise ValueError(f"num_topk={num_topk} exceeds num_experts={num_experts}")
    vec, chunks = layout(num_experts)
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def topk_gate(
        scores: T.Tensor[(num_tokens, num_experts), T.float32],
        topk_idx: T.Tensor[(num_tokens, num_topk), T.int64],
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS), threads=WARPS * WARP) as block:
            tid = T.get_thread_binding()
            lane = tid % WARP
            token = block * WARPS + tid // WARP
            vals = T.alloc_local((chunks * vec,), T.float32)
            idx = T.alloc_var(T.int32, init=-1)
            if token < num_tokens:
                load_row(vals, scores, token, lane, num_experts)
                warp_topk(vals, lane, num_experts, num_topk, idx)
                if lane < num_topk:
                    topk_idx[token, lane] = T.Cast(T.int64, idx)

    return topk_gate
