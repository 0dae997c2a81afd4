"""mHC pre-apply mix, forward, for Ascend: o[t, :] = bf16(the sum over m of mix[t, m] * x[t, m, :]), in fp32 in
stream order from zero (as kernels_src/mhc/pre_apply_mix_fwd.py).

A (token, hidden segment) a block: the streams' segment comes into the Unified Buffer, every SIMT thread reads the
token's mixes from global memory once, and the mixed row goes back (kernels_src/ascend/mhc_common.py mix_segments).
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import PRE_APPLY_MIX_FWD

DECL = PRE_APPLY_MIX_FWD


def build(mhc_mult: int):
    a = mc.Args(mhc_mult)

    @T.prim_func
    def mhc_pre_apply_mix_fwd(x: a.streams, mix: a.mix, o: a.row):
        mc.mix_segments(x, o, lambda t, i: mix[t, i], a)

    return mhc_pre_apply_mix_fwd
