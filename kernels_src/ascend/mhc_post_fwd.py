"""mHC post, forward, for Ascend: out[t, o, :] = post_layer_mix[t, o] * x[t, :] + the sum over i of
comb_res_mix[t, i, o] * residual[t, i, :], in fp32 (the product first, then the streams in order), rounded once
to bf16 (as kernels_src/mhc/post_fwd.py).

A block takes one token's segments of x and of the residual streams into the Unified Buffer; in a SIMT region
every thread reads the token's mhc + mhc**2 mixes from global memory, then mixes its columns
(kernels_src/ascend/mhc_common.py post_mix).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.mhc_common import THREADS, Args, every_value, load_row, load_square, post_mix, segments, span
from tkaot._mhc.kernels import POST_FWD

DECL = POST_FWD
REQUIRES: dict[str, int] = {}
unsupported = every_value


def build(mhc_mult: int):
    m = mhc_mult
    a = Args(m)
    cols = span(2 * (2 * m + 1))
    blocks, place = segments(a, cols)

    @T.prim_func
    def mhc_post_fwd(comb_res_mix: a.comb, residual: a.streams, post_layer_mix: a.mix, x: a.row, out: a.streams):
        with T.Kernel(blocks) as block:
            t, first = place(block)
            res_ub = T.alloc_shared((m, cols), T.bfloat16)
            x_ub = T.alloc_shared((cols,), T.bfloat16)
            out_ub = T.alloc_shared((m, cols), T.bfloat16)
            T.copy(residual[t, :, first : first + cols], res_ub)
            T.copy(x[t, first : first + cols], x_ub)
            with T.SimtVF(threads=THREADS):
                post = T.alloc_local((m,), T.float32)
                comb = T.alloc_local((m * m,), T.float32)
                mixed = T.alloc_local((m,), T.float32)
                load_row(post, post_layer_mix, t, m)
                load_square(comb, comb_res_mix, t, m)
                for j in T.Parallel(cols):
                    post_mix(out_ub, mixed, post, comb, x_ub, res_ub, j, m)
            T.copy(out_ub, out[t, :, first : first + cols])

    return mhc_post_fwd
