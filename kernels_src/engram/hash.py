"""Engram n-gram hash: output[layer, token, col] = (h_n mod vocab[layer, col]) + offset[layer, col].

h_n = XOR over i <= n of ids[token, i] * multipliers[layer, i] (int64, wrapping), for the n-gram
order n = col // num_tables + 1 of column col; mod is the floor modulo (never negative for a
positive vocab). Image tokens (has_mask) get -1 in every column.

One thread an output element (token, col) of a layer, so tokens, layers and tables are runtime
values and the stores are coalesced; only the n-gram order is static (its XOR chain is unrolled).
"""

from typing import NamedTuple

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.tensors import tensor
from tkaot._engram.kernels import ENGRAM_HASH

DECL = ENGRAM_HASH  # the declaration this module builds (tkaot/_engram/kernels.py)

THREADS = 256


class HashDims(NamedTuple):
    """The hash's runtime sizes, and its output columns a layer (orders * num_tables)."""

    num_tokens: T.Var
    num_layers: T.Var
    num_tables: T.Var
    cols: T.PrimExpr


def hash_dims(max_ngram_size: int) -> HashDims:
    """The runtime sizes of the hash of n-grams up to max_ngram_size tokens (both backends)."""
    num_tokens, num_layers, num_tables = T.dynamic("num_tokens"), T.dynamic("num_layers"), T.dynamic("num_tables")
    return HashDims(num_tokens, num_layers, num_tables, (max_ngram_size - 1) * num_tables)


def hash_kernel(max_ngram_size: int, dims: HashDims, body):
    """The engram_hash prim_func of both backends: its arguments, in the declaration's order (tkaot/_engram/kernels.py,
    which the build checks), written once; body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask,
    output, has_mask), a @T.macro, emits the kernel."""
    num_tokens, num_layers, cols = dims.num_tokens, dims.num_layers, dims.cols
    tables = tensor(T.int32, num_layers, cols)

    @T.prim_func
    def engram_hash(
        ngram_token_ids: tensor(T.int32, num_tokens, max_ngram_size),
        multipliers: tensor(T.int64, num_layers, max_ngram_size),
        vocab_sizes: tables,
        offsets: tables,
        image_token_mask: tensor(T.bool, num_tokens),
        output: tensor(T.int32, num_layers, num_tokens, cols),
        has_mask: T.int32,
    ):
        body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, output, has_mask)

    return engram_hash


def build(max_ngram_size: int):
    dims = hash_dims(max_ngram_size)
    num_tokens, num_layers, num_tables, cols = dims

    @T.macro
    def body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, output, has_mask):
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

    return hash_kernel(max_ngram_size, dims, body)
