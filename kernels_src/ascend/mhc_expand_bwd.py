"""mHC expand, backward, for Ascend: x_grad[t, :] = the sum over m of o_grad[t, m, :], in fp32 in stream order from
zero, rounded once to bf16 (the CUDA kernel's order, kernels_src/mhc/expand_bwd.py).

The sum is a mix of the streams with unit weights, whose products are exact: a block takes one token's (mhc,
span) segment of o_grad into the Unified Buffer and mixes it (kernels_src/ascend/mhc_common.py mix_streams).
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from tkaot._mhc.kernels import EXPAND_BWD

DECL = EXPAND_BWD
REQUIRES: dict[str, int] = {}
unsupported = mc.every_value


def build(mhc_mult: int):
    a = mc.Args(mhc_mult)
    cols = mc.span(2 * (mhc_mult + 1))
    blocks, place = mc.segments(a, cols)

    @T.prim_func
    def mhc_expand_bwd(o_grad: a.streams, x_grad: a.row):
        with T.Kernel(blocks) as block:
            t, first = place(block)
            og_ub = T.alloc_shared((mhc_mult, cols), T.bfloat16)
            xg_ub = T.alloc_shared((cols,), T.bfloat16)
            T.copy(o_grad[t, :, first : first + cols], og_ub)
            mc.mix_streams(xg_ub, og_ub, lambda i: T.float32(1), cols, mhc_mult)
            T.copy(xg_ub, x_grad[t, first : first + cols])

    return mhc_expand_bwd
