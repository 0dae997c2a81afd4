"""mHC expand, backward, for Ascend: x_grad[t, :] = the sum over m of o_grad[t, m, :], in fp32 in stream order from
zero, rounded once to bf16 (the CUDA kernel's order, kernels_src/mhc/expand_bwd.py).

The sum is a mix of the streams with unit weights, whose products are exact: the pre-apply mix's kernel body
(kernels_src/ascend/mhc_common.py mix_segments) with every weight 1.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import EXPAND_BWD

DECL = EXPAND_BWD


def build(mhc_mult: int):
    a = mc.Args(mhc_mult)

    @T.prim_func
    def mhc_expand_bwd(o_grad: a.streams, x_grad: a.row):
        mc.mix_segments(o_grad, x_grad, lambda t, i: T.float32(1), a)

    return mhc_expand_bwd
