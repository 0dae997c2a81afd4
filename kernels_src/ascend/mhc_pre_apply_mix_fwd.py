"""mHC pre-apply mix, forward, for Ascend: o[t, :] = the sum over m of mix[t, m] * x[t, m, :], in fp32 in stream
order from zero, rounded once to bf16 (as kernels_src/mhc/pre_apply_mix_fwd.py).

A block takes one token's (mhc, span) segment of x into the Unified Buffer; in a SIMT region every thread reads
the token's mixes from global memory, then sums its columns (kernels_src/ascend/mhc_common.py stream_sum).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.mhc_common import THREADS, Args, every_value, load_row, segments, span, stream_sum
from tkaot._mhc.kernels import PRE_APPLY_MIX_FWD

DECL = PRE_APPLY_MIX_FWD
REQUIRES: dict[str, int] = {}
unsupported = every_value


def build(mhc_mult: int):
    a = Args(mhc_mult)
    cols = span(2 * (mhc_mult + 1))
    blocks, place = segments(a, cols)

    @T.prim_func
    def mhc_pre_apply_mix_fwd(x: a.streams, mix: a.mix, o: a.row):
        with T.Kernel(blocks) as block:
            t, first = place(block)
            x_ub = T.alloc_shared((mhc_mult, cols), T.bfloat16)
            o_ub = T.alloc_shared((cols,), T.bfloat16)
            T.copy(x[t, :, first : first + cols], x_ub)
            with T.SimtVF(threads=THREADS):
                weights = T.alloc_local((mhc_mult,), T.float32)
                total = T.alloc_local((1,), T.float32)
                load_row(weights, mix, t, mhc_mult)
                for j in T.Parallel(cols):
                    stream_sum(total, 0, T.float32(0), weights, x_ub, j, mhc_mult)
                    o_ub[j] = T.cast(total[0], T.bfloat16)
            T.copy(o_ub, o[t, first : first + cols])

    return mhc_pre_apply_mix_fwd
