"""mHC expand, forward, for Ascend: o[t, m, :] = x[t, :] for each of the mhc streams.

Data movement only: a block brings one token's segment of x into the Unified Buffer and sends it out mhc times,
once a stream. Token count and hidden size are runtime values.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import EXPAND_FWD

DECL = EXPAND_FWD


def build(mhc_mult: int):
    a = mc.Args(mhc_mult)

    @T.prim_func
    def mhc_expand_fwd(x: a.row, o: a.streams):
        with T.Kernel(mc.segment_grid(a, mc.MAX_SPAN)) as block:
            t, first = mc.segment_of(block, a, mc.MAX_SPAN)
            x_ub = T.alloc_shared((mc.MAX_SPAN,), T.bfloat16)
            T.copy(x[t, first : first + mc.MAX_SPAN], x_ub)
            for m in T.unroll(mhc_mult):
                T.copy(x_ub, o[t, m, first : first + mc.MAX_SPAN])

    return mhc_expand_fwd
