"""mHC expand, forward, for Ascend: o[t, m, :] = x[t, :] for each of the mhc streams.

A block copies one token's segment of x into the Unified Buffer and copies it out mhc times, once a stream;
no vector code runs. Token count and hidden size are runtime values (kernels_src/ascend/mhc_common.py).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.mhc_common import MAX_SPAN, Args, every_value, segments
from tkaot._mhc.kernels import EXPAND_FWD

DECL = EXPAND_FWD
REQUIRES: dict[str, int] = {}
unsupported = every_value


def build(mhc_mult: int):
    a = Args(mhc_mult)
    blocks, place = segments(a, MAX_SPAN)

    @T.prim_func
    def mhc_expand_fwd(x: a.row, o: a.streams):
        with T.Kernel(blocks) as block:
            t, first = place(block)
            x_ub = T.alloc_shared((MAX_SPAN,), T.bfloat16)
            T.copy(x[t, first : first + MAX_SPAN], x_ub)
            for m in T.unroll(mhc_mult):
                T.copy(x_ub, o[t, m, first : first + MAX_SPAN])

    return mhc_expand_fwd
