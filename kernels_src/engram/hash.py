"""Engram n-gram hash: output[layer, token, col] = (h_n mod vocab[layer, col]) + offset[layer, col].

h_n = XOR over i <= n of ids[token, i] * multipliers[layer, i] (int64, wrapping), for the n-gram
order n = col // num_tables + 1 of column col; mod is the floor modulo (never negative for a
positive vocab). Image tokens (has_mask) get -1 in every column.

One thread an output element (token, col) of a layer, so tokens, layers and tables are runtime
values and the stores are coalesced; only the n-gram order is static (its XOR chain is unrolled).
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import ENGRAM_HASH

DECL = ENGRAM_HASH  # the declaration this module builds (tkaot/_engram/kernels.py)

THREADS = 256


def build(max_ngram_size: int):
    orders = max_ngram_size - 1
    num_tokens = T.dynamic("num_tokens")
    num_layers = T.dynamic("num_layers")
    num_tables = T.dynamic("num_tables")
    cols = orders * num_tables

    @T.prim_func
    def engram_hash(
        ngram_token_ids: T.Tensor[(num_tokens, max_ngram_size), T.int32],
        multipliers: T.Tensor[(num_layers, max_ngram_size), T.int64],
        vocab_sizes: T.Tensor[(num_layers, cols), T.int32],
        offsets: T.Tensor[(num_layers, cols), T.int32],
        image_token_mask: T.Tensor[(num_tokens,), T.bool],
        output: T.Tensor[(num_layers, num_tokens, cols), T.int32],
        has_mask: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * cols, THREADS), num_layers, threads=THREADS) as (block, layer):
            kernel_entry()
            T.assume(num_tables > 0)
            index = block * THREADS + T.get_thread_binding()
            token = index // cols
            col = index % cols
            order = col // num_tables  # h_{order + 1}
            hashed = T.alloc_var(T.int64)
            if index < num_tokens * cols:
                if has_mask != 0 and image_token_mask[token]:
                    output[layer, token, col] = -1
                else:
                    hashed = T.cast(ngram_token_ids[token, 0], T.int64) * multipliers[layer, 0]
                    for i in T.unroll(1, max_ngram_size):
                        if i <= order + 1:
                            hashed = T.bitwise_xor(hashed, T.cast(ngram_token_ids[token, i], T.int64) * multipliers[layer, i])
                    output[layer, token, col] = T.cast(
                        T.floormod(hashed, T.cast(vocab_sizes[layer, col], T.int64)) + T.cast(offsets[layer, col], T.int64), T.int32
                    )

    return engram_hash
