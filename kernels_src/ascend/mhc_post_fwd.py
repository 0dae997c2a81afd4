"""mHC post, forward, for Ascend: out[t, o, :] = bf16(post_layer_mix[t, o] * x[t, :] + the sum over i of
comb_res_mix[t, i, o] * residual[t, i, :]), in fp32 with the product first and then the streams in order, as
kernels_src/mhc/post_fwd.py does.

Each block holds one token's segment of x and of its residual streams in the Unified Buffer; a SIMT region
(kernels_src/ascend/mhc_common.py post_streams) reads the token's mhc + mhc**2 mixes into every thread and forms
the mhc output streams, which the block sends out.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import POST_FWD

DECL = POST_FWD


def build(mhc_mult: int):
    a = mc.Args(mhc_mult)
    cols = mc.span(2 * (2 * mhc_mult + 1))

    @T.prim_func
    def mhc_post_fwd(comb_res_mix: a.comb, residual: a.streams, post_layer_mix: a.mix, x: a.row, out: a.streams):
        with T.Kernel(mc.segment_grid(a, cols)) as block:
            t, first = mc.segment_of(block, a, cols)
            res_ub = T.alloc_shared((mhc_mult, cols), T.bfloat16)
            x_ub = T.alloc_shared((cols,), T.bfloat16)
            out_ub = T.alloc_shared((mhc_mult, cols), T.bfloat16)
            T.copy(residual[t, :, first : first + cols], res_ub)
            T.copy(x[t, first : first + cols], x_ub)
            mc.post_streams(out_ub, res_ub, x_ub, post_layer_mix, comb_res_mix, t, cols, mhc_mult)
            T.copy(out_ub, out[t, :, first : first + cols])

    return mhc_post_fwd
