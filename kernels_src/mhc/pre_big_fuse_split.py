"""mHC pre-layer step, fused (kernels_src/mhc/pre_big_fuse.py's sums, order and outputs), for few tokens:
BLOCKS blocks a token of THREADS threads, so a decode step's one token is not one block's work alone.

Every block reduces the token's mixes (the same sums in the same order); block 0's warp 0 writes post_mix and
runs the Sinkhorn for comb_mix (each row or column sum and row max from the line's M values gathered at once, see
gathered); warps 1.. of every block apply the pre mix to their share of the hidden vectors (a vector of 8 bf16 a
worker, the blocks' workers interleaved). A worker issues its first residual loads before the mixes are reduced, so
a decode token waits for memory about once (the splits and the residual together), not once a round of vectors.
The token is the grid's y index: the op launches this kernel for at most tkaot/_mhc/big_fuse.py's SPLIT_MAX_TOKENS
tokens, far below the grid's y limit (65535).
"""

import tilelang.language as T

from kernels_src.mhc.common import VEC, WARP
from kernels_src.mhc.pre_big_fuse import Args, kernel, load_residual, post_and_comb, pre_mixed_vector, token_entry, token_mixes, token_tiles
from tkaot._mhc.kernels import PRE_BIG_FUSE_SPLIT

DECL = PRE_BIG_FUSE_SPLIT  # the declaration this module builds (tkaot/_mhc/kernels.py)

# H200, 1 x 4 x 7168 bf16, 16 splits, 20 repeats: 4 x 256 threads 4.83 us, 2 x 512 4.96, the one-block kernel 5.28
# (TileKernels 4.78); at 8192 tokens 208.24, 234.57 and 140.92: the op chooses by token count
THREADS = 256
BLOCKS = 4
UNROLL = 1  # vectors a worker has in flight per stream
MIN_BLOCKS = 1024 // THREADS  # registers capped as the one-block kernel's: 64 a thread


def _tree(values: list, combine):
    """values combined in tree_sum's order (kernels_src/mhc/common.py), for a power-of-two count: the first half with
    the second half, pairwise, then again on the halves' results (plain Python: unrolled)."""
    while len(values) > 1:
        half = len(values) // 2
        values = [combine(values[k], values[k + half]) for k in range(half)]
    return values[0]


# H200, 4 x 7168 bf16, 16 splits, 20 repeats (f014b86:bench/results/2026-12-03-H200-s19-tune_lat1.log, harness on branch lat1 at
# b2a33ee): gathered 4.68 us at 1 token, 5.76 at 32; the butterfly 4.88 and 5.91; TileKernels 4.84 and 7.47. Block 0
# left to the Sinkhorn alone, or its warp 0 only arriving at the workers' barrier, was not faster at 1 token.
@T.macro
def gathered(total: T.Ref, value, first, stride: int, m: int, combine):
    """The Sinkhorn's line reduction (post_and_comb's `line`) for few tokens: the M values of the line fetched by
    independent shuffles, combined in the order the xor butterfly combines them (so the same bits), in one shuffle
    latency instead of log2(M) dependent ones. M a power of two."""
    total = _tree([T.shfl_sync(value, first + k * stride) for k in range(m)], combine)  # noqa: F841 (a T.Ref: the caller's variable is written)


def build(mhc_mult: int):
    m = mhc_mult
    workers = THREADS - WARP  # warps 1.. of every block

    # the one-block kernel's arguments and entry symbol
    @T.macro
    def body(a: Args, num_tokens):
        with T.Kernel(BLOCKS, num_tokens, threads=THREADS) as (part, t):
            token_entry(a.hidden, MIN_BLOCKS)
            tid = T.get_thread_binding()
            b = token_tiles(m, UNROLL)
            vectors = a.hidden // VEC
            worker = tid - WARP

            # the first residual vectors are in flight while the mixes are reduced
            load_residual(a, b, t, 0, part, worker, vectors, workers, BLOCKS, UNROLL, m)

            token_mixes(a, b, t, tid, m)
            T.sync_threads()

            # post mix and Sinkhorn, once a token: block 0's warp 0, one matrix element a lane
            if tid < WARP and part == 0:
                post_and_comb(a, b, t, tid, m, gathered)

            # layer_input = the pre-mix-weighted sum of the residual streams, in stream order from zero
            for it in T.serial(T.ceildiv(vectors, workers * BLOCKS * UNROLL)):
                if it > 0:
                    load_residual(a, b, t, it, part, worker, vectors, workers, BLOCKS, UNROLL, m)
                for u in T.unroll(UNROLL):
                    v = (it * UNROLL + u) * workers * BLOCKS + part * workers + worker
                    if 0 <= worker and v < vectors:
                        pre_mixed_vector(a, b, t, u, v, m)

    return kernel(m, body)
