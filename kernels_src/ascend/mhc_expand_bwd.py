"""mHC expand, backward, for Ascend: x_grad[t, :] = the sum over m of o_grad[t, m, :], in fp32 in stream order
from zero, rounded once to bf16 (as kernels_src/mhc/expand_bwd.py).

A block takes one token's (mhc, span) segment of o_grad into the Unified Buffer; a SIMT region sums each column
(kernels_src/ascend/mhc_common.py stream_sum with unit weights, exact products) and the sums go out.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.mhc_common import THREADS, Args, every_value, segments, span, stream_sum
from tkaot._mhc.kernels import EXPAND_BWD

DECL = EXPAND_BWD
REQUIRES: dict[str, int] = {}
unsupported = every_value


def build(mhc_mult: int):
    a = Args(mhc_mult)
    cols = span(2 * (mhc_mult + 1))
    blocks, place = segments(a, cols)

    @T.prim_func
    def mhc_expand_bwd(o_grad: a.streams, x_grad: a.row):
        with T.Kernel(blocks) as block:
            t, first = place(block)
            og_ub = T.alloc_shared((mhc_mult, cols), T.bfloat16)
            xg_ub = T.alloc_shared((cols,), T.bfloat16)
            T.copy(o_grad[t, :, first : first + cols], og_ub)
            with T.SimtVF(threads=THREADS):
                ones = T.alloc_local((mhc_mult,), T.float32)
                total = T.alloc_local((1,), T.float32)
                for i in T.unroll(mhc_mult):
                    ones[i] = T.float32(1)
                for j in T.Parallel(cols):
                    stream_sum(total, 0, T.float32(0), ones, og_ub, j, mhc_mult)
                    xg_ub[j] = T.cast(total[0], T.bfloat16)
            T.copy(xg_ub, x_grad[t, first : first + cols])

    return mhc_expand_bwd
