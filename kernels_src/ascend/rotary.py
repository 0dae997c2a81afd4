"""Rotary position embedding for Ascend, in place, on (batch, seqlen, heads, rot_dim) views of query and key.

Head rows are flattened over (seqlen, q_heads + k_heads) as on CUDA (kernels_src/transform/rotary.py): a row's
head index below q_heads names a query head, else a key head (k_heads is 0 when the op rotates query alone), so
one launch rotates both and one binary serves every head count. A block takes `ROWS` head rows of one batch:
each row (of query or key) and its cos / sin cache row
(at the token's position: positions[b, token] + seqlen_offset when has_positions, else token +
seqlen_offset) is copied into the Unified Buffer by its own DMA copy (rows of a block need not be evenly
spaced in memory); a SIMT region rotates every pair in fp32, a * cos - b * sin and a * sin + b * cos with
sin negated when conjugate, rounds to the row's dtype, and the rows are copied back. NeoX pairs are
(j, j + rot_dim / 2), interleaved (GPT-J) pairs (2j, 2j + 1). Positions are int32 words with a runtime stride,
so int64 positions are read through their low word, as on CUDA.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import split_block
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.transform.rotary import rotary_kernel
from tkaot._transform.kernels import ROTARY

DECL = ROTARY
ROWS = 32  # head rows a block
THREADS = 128


def build(rot_dim: int, dtype: str, interleaved: bool):
    half = rot_dim // 2

    @T.macro
    def rotate(query, key, cos_sin_cache, positions, has_positions, conjugate, seqlen_offset, dims):
        batch, seqlen, q_heads, k_heads = dims.batch, dims.seqlen, dims.q_heads, dims.k_heads
        T.assume(q_heads >= 0 and k_heads >= 0 and q_heads + k_heads > 0)
        # the tile count inline, not a variable: a macro would bind it to a name
        with T.Kernel(batch * T.ceildiv(seqlen * (q_heads + k_heads), ROWS)) as block:
            b, first = split_block(block, T.ceildiv(seqlen * (q_heads + k_heads), ROWS), ROWS)
            x_ub = T.alloc_shared((ROWS, rot_dim), dtype)
            cs_ub = T.alloc_shared((ROWS, rot_dim), T.float32)
            for r in T.serial(ROWS):
                if first + r < seqlen * (q_heads + k_heads):
                    token = (first + r) // (q_heads + k_heads)
                    head = (first + r) % (q_heads + k_heads)
                    pos = T.if_then_else(has_positions != 0, positions[b, token], token) + seqlen_offset
                    if head < q_heads:
                        T.copy(query[b, token, head, 0:rot_dim], x_ub[r, :])
                    else:
                        T.copy(key[b, token, head - q_heads, 0:rot_dim], x_ub[r, :])
                    T.copy(cos_sin_cache[pos, 0:rot_dim], cs_ub[r, :])
            with T.SimtVF(threads=THREADS):
                for r, j in T.Parallel(ROWS, half):
                    sign = T.if_then_else(conjugate != 0, T.float32(-1), T.float32(1))
                    cos = cs_ub[r, j]
                    sin = cs_ub[r, half + j] * sign
                    lo, hi = (2 * j, 2 * j + 1) if interleaved else (j, half + j)
                    a = T.cast(x_ub[r, lo], T.float32)
                    c = T.cast(x_ub[r, hi], T.float32)
                    x_ub[r, lo] = T.cast(a * cos - c * sin, dtype)
                    x_ub[r, hi] = T.cast(a * sin + c * cos, dtype)
            for r in T.serial(ROWS):
                if first + r < seqlen * (q_heads + k_heads):
                    token = (first + r) // (q_heads + k_heads)
                    head = (first + r) % (q_heads + k_heads)
                    if head < q_heads:
                        T.copy(x_ub[r, :], query[b, token, head, 0:rot_dim])
                    else:
                        T.copy(x_ub[r, :], key[b, token, head - q_heads, 0:rot_dim])

    return rotary_kernel(rot_dim, dtype, rotate)
