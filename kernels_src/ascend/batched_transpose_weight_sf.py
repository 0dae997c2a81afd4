"""A weight's block scale factors -> packed UE8M0 words for the weight and its transpose, for Ascend.

The words of the CUDA kernel (kernels_src/quant/batched_transpose_weight_sf.py): for every group, sf0[g, p, r] packs
the fp32 exponent fields of blocks 4p .. 4p + 3 of row block r // bs (lowest block in the lowest byte, bytes past
the last block 0), and sf1[g, q, c] those of row blocks 4q .. 4q + 3 at column block c // bs. A block fills
`CHUNK` words of one output row: the blocks of sf0's rows come first, then sf1's. In a SIMT region each thread
forms one word from the fp32 scale factors, read from global memory directly, into the Unified Buffer; one DMA
copy writes the chunk (its last one clipped to the row).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.quant import common
from tkaot._quant.kernels import BATCHED_TRANSPOSE_WEIGHT_SF

DECL = BATCHED_TRANSPOSE_WEIGHT_SF
THREADS = 256
CHUNK = 2048  # words of an output row a block fills
PACK = common.UE8M0_PACK
WORD = "uint32"


def build(block_size: int):
    bs = block_size
    num_groups, num_sf_n, num_sf_k = T.dynamic("num_groups"), T.dynamic("num_sf_n"), T.dynamic("num_sf_k")
    packs_k, packs_n = T.ceildiv(num_sf_k, PACK), T.ceildiv(num_sf_n, PACK)
    n, k = num_sf_n * bs, num_sf_k * bs
    chunks_n, chunks_k = T.ceildiv(n, CHUNK), T.ceildiv(k, CHUNK)
    sf0_blocks = packs_k * chunks_n  # of a group; then sf1's packs_n * chunks_k

    def exponent_byte(value, valid, b):
        """Byte b of a word: the exponent field of an fp32 scale factor, 0 where no block is."""
        return T.if_then_else(valid, (common.f32_bits(value) >> T.uint32(23)) & T.uint32(0xFF), T.uint32(0)) << T.uint32(8 * b)

    @T.prim_func
    def batched_transpose_weight_sf(
        sf: T.Tensor[(num_groups, num_sf_n, num_sf_k), T.float32],
        sf0: T.Tensor[(num_groups, packs_k, n), WORD],
        sf1: T.Tensor[(num_groups, packs_n, k), WORD],
    ):
        with T.Kernel(num_groups * (sf0_blocks + packs_n * chunks_k)) as block:
            g = block // (sf0_blocks + packs_n * chunks_k)
            rest = block % (sf0_blocks + packs_n * chunks_k)
            transposed = rest >= sf0_blocks
            p, col0 = rest // chunks_n, rest % chunks_n * CHUNK  # sf0: packed k block, first word
            q, col1 = (rest - sf0_blocks) // chunks_k, (rest - sf0_blocks) % chunks_k * CHUNK  # sf1's
            words_ub = T.alloc_shared((CHUNK,), WORD)
            with T.SimtVF(threads=THREADS):
                word = T.alloc_var(WORD)
                for j in T.Parallel(CHUNK):
                    word = T.uint32(0)
                    if not transposed:
                        if col0 + j < n:
                            for b in T.unroll(PACK):
                                kb = p * PACK + b
                                word = word | exponent_byte(sf[g, (col0 + j) // bs, T.min(kb, num_sf_k - 1)], kb < num_sf_k, b)
                    elif col1 + j < k:
                        for b in T.unroll(PACK):
                            nb = q * PACK + b
                            word = word | exponent_byte(sf[g, T.min(nb, num_sf_n - 1), (col1 + j) // bs], nb < num_sf_n, b)
                    words_ub[j] = word
            if not transposed:
                T.copy(words_ub, sf0[g, p, col0 : col0 + CHUNK])
            else:
                T.copy(words_ub, sf1[g, q, col1 : col1 + CHUNK])

    return batched_transpose_weight_sf
