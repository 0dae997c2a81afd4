"""Normalize top-k weights: denominator = 1e-20 + sum(w), normalized = w / denominator.

One thread per token. The sum is folded in halves (16, 8, 4, 2, 1 apart, zero
padded to 32), the order moe_topk_gate's warp sum uses, so a token's
denominator here equals the one that kernel divides by.
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._moe.kernels import MAX_TOPK, NORMALIZE_WEIGHT

DECL = NORMALIZE_WEIGHT  # the declaration this module builds (tkaot/_moe/kernels.py)


THREADS = 128
RUNTIME_SLOTS = (8, 16, MAX_TOPK)  # the generic kernel's bodies: weights a token they hold


def build(num_topk: int):
    return normalize(num_topk)


def normalize(num_topk):
    """The kernel for `num_topk` weights a token: an int, or (the generic kernel's) a runtime value up to MAX_TOPK,
    which only bounds the same loops at run time: the same additions in the same order. The generic kernel takes
    the body of the fewest slots (RUNTIME_SLOTS) that hold num_topk, so a token of 9 weights runs loops of 16, not 32."""
    num_tokens = T.dynamic("num_tokens")
    static = isinstance(num_topk, int)

    @T.macro
    def body(topk_weights, denominator, normalized_weights, token, slots: int):
        w = T.alloc_local((slots,), T.float32)
        part = T.alloc_local((slots,), T.float32)
        total = T.alloc_var(T.float32)
        for i in T.unroll(slots):
            if static or i < num_topk:
                w[i] = topk_weights[token, i]
                part[i] = w[i]
        for step in T.unroll(5):
            half = 16 >> step
            for i in T.unroll(slots):
                if i < half and i + half < slots and (static or i + half < num_topk):
                    part[i] = part[i] + part[i + half]
        total = T.float32(1e-20) + part[0]
        denominator[token] = total
        for i in T.unroll(slots):
            if static or i < num_topk:
                normalized_weights[token, i] = w[i] / total

    @T.prim_func
    def normalize_weight(
        topk_weights: T.Tensor[(num_tokens, num_topk), T.float32],
        denominator: T.Tensor[(num_tokens,), T.float32],
        normalized_weights: T.Tensor[(num_tokens, num_topk), T.float32],
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as block:
            kernel_entry()  # kernels_src/pdl.py: before any memory access
            token = block * THREADS + T.get_thread_binding()
            if token < num_tokens:
                if static:
                    body(topk_weights, denominator, normalized_weights, token, num_topk)
                elif num_topk <= RUNTIME_SLOTS[0]:
                    body(topk_weights, denominator, normalized_weights, token, RUNTIME_SLOTS[0])
                elif num_topk <= RUNTIME_SLOTS[1]:
                    body(topk_weights, denominator, normalized_weights, token, RUNTIME_SLOTS[1])
                else:
                    body(topk_weights, denominator, normalized_weights, token, RUNTIME_SLOTS[2])

    return normalize_weight
