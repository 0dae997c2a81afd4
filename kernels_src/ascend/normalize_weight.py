"""Top-k weight normalisation for Ascend: denominator = 1e-20 + sum(w), normalized = w / denominator.

A block copies `TOKENS` tokens' weights into the Unified Buffer; in a SIMT region one thread a token folds the
sum in halves (16, 8, 4, 2, 1 apart, zero padded to 32), the CUDA kernel's order, so a token's denominator is
the one moe_topk_gate divides by, bit for bit.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, stage
from kernels_src.ascend.common import unsupported as unsupported
from tkaot._moe.kernels import NORMALIZE_WEIGHT

DECL = NORMALIZE_WEIGHT
TOKENS = 64


def build(num_topk: int):
    return normalize_weight_kernel(num_topk, num_topk)


def normalize_weight_kernel(num_topk, max_topk: int):
    """The kernel for `num_topk` weights a token (an int, or the generic kernel's runtime value) in tiles sized for
    max_topk (num_topk itself, or the most the generic kernel takes). The fold adds part[k + half] only where it is
    one of the token's weights, so a runtime count folds in the same order."""
    num_tokens = T.dynamic("num_tokens")

    weights = fp32(num_tokens, num_topk)

    @T.prim_func
    def normalize_weight(topk_weights: weights, denominator: fp32(num_tokens), normalized_weights: weights):
        with T.Kernel(T.ceildiv(num_tokens, TOKENS)) as block:
            first = block * TOKENS
            w_ub = stage(topk_weights[first : first + TOKENS, 0:num_topk], (TOKENS, max_topk), T.float32, cols=num_topk)
            out_ub = T.alloc_shared((TOKENS, max_topk), T.float32)
            den_ub = T.alloc_shared((TOKENS,), T.float32)
            with T.SimtVF(threads=TOKENS):
                part = T.alloc_local((max_topk,), T.float32)
                total = T.alloc_var(T.float32)
                for i in T.Parallel(TOKENS):
                    for k in T.serial(num_topk):
                        part[k] = w_ub[i, k]
                    for step in T.unroll(5):
                        half = 16 >> step
                        for k in T.unroll(max_topk):
                            if k < half and k + half < num_topk:
                                part[k] = part[k] + part[k + half]
                    total = T.float32(1e-20) + part[0]
                    den_ub[i] = total
                    for k in T.serial(num_topk):
                        out_ub[i, k] = w_ub[i, k] / total
            T.copy(den_ub, denominator[first : first + TOKENS])
            T.copy(out_ub[:, 0:num_topk], normalized_weights[first : first + TOKENS, 0:num_topk])

    return normalize_weight
