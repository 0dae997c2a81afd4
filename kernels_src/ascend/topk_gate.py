"""Top-k gate for Ascend: the indices of each token's num_topk largest scores, ties to the lower index.

A block takes `rows` tokens' scores into the Unified Buffer; in a SIMT region one thread selects for one
token: pick t is the largest (score, -index) pair below pick t - 1 in that order, found in one pass over the
experts, so ties go to the lower index and no score is overwritten. A NaN score is never picked (every
comparison with it is false). Indices are written as int64.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import refuse
from tkaot._moe.kernels import TOPK_GATE

DECL = TOPK_GATE
REQUIRES: dict[str, int] = {}
MAX_ROWS = 64  # tokens a block, one SIMT thread each
UB_SCORES = 96 * 1024  # bytes of scores a block holds


def rows_per_block(num_experts: int) -> int:
    rows = MAX_ROWS
    while rows > 8 and rows * num_experts * 4 > UB_SCORES:
        rows //= 2
    return rows


def unsupported(num_experts, num_topk, tiling) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if num_topk > num_experts:
        return f"num_topk={num_topk} exceeds num_experts={num_experts}"
    return None


def build(num_experts: int, num_topk: int, tiling: str):
    refuse(DECL, unsupported(num_experts, num_topk, tiling))
    return topk_gate_kernel(num_experts, num_topk, num_experts, num_topk)


def topk_gate_kernel(num_experts, num_topk, max_experts: int, max_topk: int):
    """The kernel for `num_experts` and `num_topk` (ints, or the generic kernel's runtime values) in tiles sized for
    max_experts and max_topk (the counts themselves, or the largest the generic kernel takes)."""
    ROWS = rows_per_block(max_experts)
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def topk_gate(
        scores: T.Tensor[(num_tokens, num_experts), T.float32],
        topk_idx: T.Tensor[(num_tokens, num_topk), T.int64],
    ):
        with T.Kernel(T.ceildiv(num_tokens, ROWS)) as block:
            row = block * ROWS
            scores_ub = T.alloc_shared((ROWS, max_experts), T.float32)
            idx_ub = T.alloc_shared((ROWS, max_topk), T.int64)
            T.copy(scores[row : row + ROWS, 0:num_experts], scores_ub[:, 0:num_experts])
            with T.SimtVF(threads=ROWS):
                prev_v = T.alloc_fragment((ROWS,), T.float32)
                prev_e = T.alloc_fragment((ROWS,), T.int32)
                best_v = T.alloc_fragment((ROWS,), T.float32)
                best_e = T.alloc_fragment((ROWS,), T.int32)
                for i in T.Parallel(ROWS):
                    prev_v[i] = T.infinity(T.float32)
                    prev_e[i] = -1
                    for t in T.serial(num_topk):
                        best_v[i] = -T.infinity(T.float32)
                        best_e[i] = num_experts
                        for e in T.serial(num_experts):
                            v = scores_ub[i, e]
                            below = v < prev_v[i] or (v == prev_v[i] and e > prev_e[i])
                            better = v > best_v[i] or (v == best_v[i] and e < best_e[i])
                            if below and better:
                                best_v[i] = v
                                best_e[i] = e
                        idx_ub[i, t] = T.cast(best_e[i], T.int64)
                        prev_v[i] = best_v[i]
                        prev_e[i] = best_e[i]
            T.copy(idx_ub[:, 0:num_topk], topk_idx[row : row + ROWS, 0:num_topk])

    return topk_gate
