"""Engram n-gram hash for Ascend: output[layer, token, col] = (h_n mod vocab[layer, col]) + offset[layer, col],
h_n = XOR over i <= n of ids[token, i] * multipliers[layer, i] (int64, wrapping), n = col // num_tables + 1; mod
is the floor modulo. Image tokens (has_mask) get -1 in every column.

A block takes `ELEMS` consecutive (token, column) elements of one layer: one SIMT thread an element, as on CUDA
(kernels_src/engram/hash.py), reading the token ids and the layer's tables from global memory directly (their
widths are runtime values), the results collected in the Unified Buffer and copied out to the layer's run of
output. Tokens, layers and tables are runtime values; the n-gram order is static.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import split_block
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.engram.hash import hash_dims, hash_kernel
from tkaot._engram.kernels import ENGRAM_HASH

DECL = ENGRAM_HASH
ELEMS = 2048
THREADS = 256


def build(max_ngram_size: int):
    dims = hash_dims(max_ngram_size)
    num_tokens, num_layers, num_tables, cols = dims

    @T.macro
    def body(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask, output, has_mask):
        T.assume(num_tables > 0)
        chunks = T.ceildiv(num_tokens * cols, ELEMS)
        with T.Kernel(num_layers * chunks) as block:
            layer, first = split_block(block, chunks, ELEMS)
            out_ub = T.alloc_shared((ELEMS,), T.int32)
            with T.SimtVF(threads=THREADS):
                hashed = T.alloc_var(T.int64)
                for j in T.Parallel(ELEMS):
                    index = first + j
                    token = index // cols
                    col = index % cols
                    masked = T.alloc_var(T.bool)
                    masked = False
                    if has_mask != 0 and index < num_tokens * cols:  # nested: an absent mask is never read
                        masked = image_token_mask[token]
                    out_ub[j] = -1
                    if index < num_tokens * cols and not masked:
                        hashed = T.Cast("int64", ngram_token_ids[token, 0]) * multipliers[layer, 0]
                        for i in T.unroll(1, max_ngram_size):
                            if i <= col // num_tables + 1:
                                hashed = T.bitwise_xor(hashed, T.Cast("int64", ngram_token_ids[token, i]) * multipliers[layer, i])
                        vocab = T.Cast("int64", vocab_sizes[layer, col])
                        out_ub[j] = T.Cast("int32", T.floormod(hashed, vocab) + T.Cast("int64", offsets[layer, col]))
            # the layer's (token, column) run as one row (the view keeps the parameter's name, as the spec needs)
            output = T.StridedTensor((num_layers, num_tokens * cols), (num_tokens * cols, 1), T.int32, data=output.data)
            T.copy(out_ub, output[layer, first : first + ELEMS])

    return hash_kernel(max_ngram_size, dims, body)
