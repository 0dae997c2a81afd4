"""A weight's block scale factors -> DeepGEMM's per-row UE8M0 scale factors, for the weight and its transpose.

Input: fp32 powers of two, (num_groups, n / bs, k / bs) for bs x bs weight
blocks, contiguous. Two outputs of packed UE8M0 words (four exponent bytes an
int32, lowest block in the lowest byte, bytes past the last block 0):

- sf0: for every group, packed k block p and weight row r < n, the word of
  blocks 4p .. 4p + 3 of row block r // bs; laid out (group, p, r), i.e. the
  (group, n, ceil(k_blocks / 4)) int32 tensor with unit row stride;
- sf1: the same for the transposed weight: for packed n block q and column
  c < k, the word of row blocks 4q .. 4q + 3 at column block c // bs; laid out
  (group, q, c).

The exponent byte is the fp32 exponent field (sign and mantissa are checked to
be zero by the op). Each CTA fills one chunk of one output row of one group
(blockIdx.z): a p of sf0 or a q of sf1 (blockIdx.x walks sf0's rows, then sf1's);
every word of a row block is the same, so each thread forms one word and
stores it four times with one 16-byte store.
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from tkaot._quant.kernels import BATCHED_TRANSPOSE_WEIGHT_SF

DECL = BATCHED_TRANSPOSE_WEIGHT_SF  # the declaration this module builds (tkaot/_quant/kernels.py)


NUM_THREADS = 128
WORDS = 4  # words a thread stores at once (16 bytes)
CHUNK = NUM_THREADS * WORDS  # words of an output row a CTA fills
PACK = common.UE8M0_PACK
SF_DTYPE, WORD = "float32", "uint32"  # fp32 scale factors in, packed UE8M0 words out


def build(block_size):
    bs = block_size
    num_groups = T.dynamic("num_groups")
    num_sf_n = T.dynamic("num_sf_n")
    num_sf_k = T.dynamic("num_sf_k")
    packs_k = (num_sf_k + PACK - 1) // PACK
    packs_n = (num_sf_n + PACK - 1) // PACK
    n, k = num_sf_n * bs, num_sf_k * bs

    def exponent_byte(value, valid):
        """The exponent field of an fp32 scale factor as the word's byte, 0 where no block is."""
        return T.if_then_else(valid, (common.f32_bits(value) >> T.uint32(23)) & T.uint32(0xFF), T.uint32(0))

    @T.prim_func
    def batched_transpose_weight_sf(
        sf: T.Tensor[(num_groups, num_sf_n, num_sf_k), SF_DTYPE],
        sf0: T.Tensor[(num_groups, packs_k, n), WORD],
        sf1: T.Tensor[(num_groups, packs_n, k), WORD],
    ):
        with T.Kernel(packs_k + packs_n, T.ceildiv(T.max(n, k), CHUNK), num_groups, threads=NUM_THREADS) as (row, chunk, g):
            kernel_entry()
            tid = T.get_thread_binding()
            pos = chunk * CHUNK + tid * WORDS  # first word of this thread in its output row
            word = T.alloc_var(WORD)
            words = T.alloc_local((WORDS,), WORD)
            if row < packs_k:
                p = row
                if pos < n:
                    word = T.uint32(0)
                    for b in T.unroll(PACK):
                        kb = p * PACK + b
                        word = word | (exponent_byte(sf[g, pos // bs, T.min(kb, num_sf_k - 1)], kb < num_sf_k) << T.uint32(8 * b))
                    for w in T.unroll(WORDS):
                        words[w] = word
                    for w in T.vectorized(WORDS):
                        sf0[g, p, pos + w] = words[w]
            else:
                q = row - packs_k
                if pos < k:
                    word = T.uint32(0)
                    for b in T.unroll(PACK):
                        nb = q * PACK + b
                        word = word | (exponent_byte(sf[g, T.min(nb, num_sf_n - 1), pos // bs], nb < num_sf_n) << T.uint32(8 * b))
                    for w in T.unroll(WORDS):
                        words[w] = word
                    for w in T.vectorized(WORDS):
                        sf1[g, q, pos + w] = words[w]

    return batched_transpose_weight_sf
