"""mHC post, backward, for Ascend, one block a token (the forward: out[o] = post[o] * x + the sum over i of
comb[i, o] * res[i]; as kernels_src/mhc/post_bwd.py):
  d_residual[t, i, :] = the sum over o of comb[t, i, o] * d_o[t, o, :]    (fp32 from zero, stream order; bf16)
  d_x[t, :]           = the sum over o of post[t, o] * d_o[t, o, :]       (likewise)
  d_comb[t, i, o]     = the sum over h of residual[t, i, h] * d_o[t, o, h] (fp32)
  d_post[t, o]        = the sum over h of x[t, h] * d_o[t, o, h]           (fp32)

Segment by segment the block brings d_o, the residual streams and x into the Unified Buffer and sends the two
stream gradients back; the mhc**2 + mhc sums over h build up per thread in the `sums` tile
(kernels_src/ascend/mhc_common.py walk_columns) and are added up once the row is done.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import POST_BWD

DECL = POST_BWD


def build(mhc_mult: int):
    m = mhc_mult
    mm = m * m
    a = mc.Args(m)
    cols = mc.span(2 * (3 * m + 2), reserved=(mm + m) * mc.THREADS * 4)

    @T.macro
    def column(j, acc, post, comb, grad, do_ub, res_ub, x_ub, dres_ub, dx_ub):
        for i in T.unroll(m):
            mc.stream_sum(grad, 0, T.float32(0), comb, do_ub, j, m, i * m)
            dres_ub[i, j] = T.cast(grad[0], T.bfloat16)
            for o in T.unroll(m):
                acc[i * m + o] = acc[i * m + o] + mc.as_f32(res_ub[i, j]) * mc.as_f32(do_ub[o, j])
        mc.stream_sum(grad, 0, T.float32(0), post, do_ub, j, m)
        dx_ub[j] = T.cast(grad[0], T.bfloat16)
        for o in T.unroll(m):
            acc[mm + o] = acc[mm + o] + mc.as_f32(x_ub[j]) * mc.as_f32(do_ub[o, j])

    @T.macro
    def store(k, total, t, d_comb_res_mix, d_post_layer_mix):
        if k < mm:
            d_comb_res_mix[t, k // m, k % m] = total
        else:
            d_post_layer_mix[t, k - mm] = total

    @T.prim_func
    def mhc_post_bwd(
        d_o: a.streams, comb_res_mix: a.comb, residual: a.streams, post_layer_mix: a.mix, x: a.row,
        d_comb_res_mix: a.comb, d_residual: a.streams, d_post_layer_mix: a.mix, d_x: a.row,
    ):  # fmt: skip
        with T.Kernel(a.num_tokens) as t:
            do_ub = T.alloc_shared((m, cols), T.bfloat16)
            res_ub = T.alloc_shared((m, cols), T.bfloat16)
            x_ub = T.alloc_shared((cols,), T.bfloat16)
            dres_ub = T.alloc_shared((m, cols), T.bfloat16)
            dx_ub = T.alloc_shared((cols,), T.bfloat16)
            sums = T.alloc_shared((mm + m, mc.THREADS), T.float32)  # d_comb row-major, then d_post
            for first in T.serial(0, a.hidden, cols):
                T.copy(d_o[t, :, first : first + cols], do_ub)
                T.copy(residual[t, :, first : first + cols], res_ub)
                T.copy(x[t, first : first + cols], x_ub)
                with T.SimtVF(threads=mc.THREADS):
                    acc = T.alloc_local((mm + m,), T.float32)
                    post = T.alloc_local((m,), T.float32)
                    comb = T.alloc_local((mm,), T.float32)
                    grad = T.alloc_local((1,), T.float32)
                    mc.load_row(post, post_layer_mix, t, m)
                    mc.load_square(comb, comb_res_mix, t, m)
                    mc.walk_columns(column, sums, first, cols, a.hidden, acc, post, comb, grad, do_ub, res_ub, x_ub, dres_ub, dx_ub)
                T.copy(dres_ub, d_residual[t, :, first : first + cols])
                T.copy(dx_ub, d_x[t, first : first + cols])
            mc.finish_sums(sums, store, t, d_comb_res_mix, d_post_layer_mix)

    return mhc_post_bwd
