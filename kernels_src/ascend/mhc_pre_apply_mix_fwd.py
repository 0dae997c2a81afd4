"""mHC pre-apply mix, forward, for Ascend: o[t, :] = bf16(the sum over m of mix[t, m] * x[t, m, :]), in fp32 in
stream order from zero (as kernels_src/mhc/pre_apply_mix_fwd.py).

A (token, hidden segment) a block: the streams' segment comes into the Unified Buffer, every SIMT thread reads the
token's mixes from global memory once, and the mixed row goes back (kernels_src/ascend/mhc_common.py mix_streams).
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from tkaot._mhc.kernels import PRE_APPLY_MIX_FWD

DECL = PRE_APPLY_MIX_FWD
REQUIRES: dict[str, int] = {}
unsupported = mc.every_value


def build(mhc_mult: int):
    a = mc.Args(mhc_mult)
    cols = mc.span(2 * (mhc_mult + 1))
    blocks, place = mc.segments(a, cols)

    @T.prim_func
    def mhc_pre_apply_mix_fwd(x: a.streams, mix: a.mix, o: a.row):
        with T.Kernel(blocks) as block:
            t, first = place(block)
            x_ub = T.alloc_shared((mhc_mult, cols), T.bfloat16)
            o_ub = T.alloc_shared((cols,), T.bfloat16)
            T.copy(x[t, :, first : first + cols], x_ub)
            mc.mix_streams(o_ub, x_ub, lambda i: mix[t, i], cols, mhc_mult)
            T.copy(o_ub, o[t, first : first + cols])

    return mhc_pre_apply_mix_fwd
