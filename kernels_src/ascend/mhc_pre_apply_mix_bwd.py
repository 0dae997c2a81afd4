"""mHC pre-apply mix, backward, for Ascend, one block a token (as kernels_src/mhc/pre_apply_mix_bwd.py):
x_grad[t, m, :] += mix[t, m] * o_grad[t, :] (in place: fp32, rounded once to bf16), and
mix_grad[t, m] = the sum over h of o_grad[t, h] * x[t, m, h] (fp32).

The block walks the token's hidden segments in order, each through the Unified Buffer; SIMT thread u takes
columns u, u + THREADS, ... and keeps its part of the sums in column u of the `sums` tile
(kernels_src/ascend/mhc_common.py walk_columns), whose rows are added up at the end.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.mhc_common import THREADS, Args, every_value, f32, load_row, span, thread_total, walk_columns
from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD

DECL = PRE_APPLY_MIX_BWD
REQUIRES: dict[str, int] = {}
unsupported = every_value


def build(mhc_mult: int):
    m = mhc_mult
    a = Args(m)
    cols = span(2 * (2 * m + 1), reserved=m * THREADS * 4)

    @T.macro
    def column(j, acc, weights, og_ub, x_ub, xg_ub):
        for i in T.unroll(m):
            acc[i] = acc[i] + f32(og_ub[j]) * f32(x_ub[i, j])
            xg_ub[i, j] = T.cast(f32(xg_ub[i, j]) + weights[i] * f32(og_ub[j]), T.bfloat16)

    @T.prim_func
    def mhc_pre_apply_mix_bwd(o_grad: a.row, x: a.streams, mix: a.mix, x_grad: a.streams, mix_grad: a.mix):
        with T.Kernel(a.num_tokens) as t:
            og_ub = T.alloc_shared((cols,), T.bfloat16)
            x_ub = T.alloc_shared((m, cols), T.bfloat16)
            xg_ub = T.alloc_shared((m, cols), T.bfloat16)
            sums = T.alloc_shared((m, THREADS), T.float32)
            for first in T.serial(0, a.hidden, cols):
                T.copy(o_grad[t, first : first + cols], og_ub)
                T.copy(x[t, :, first : first + cols], x_ub)
                T.copy(x_grad[t, :, first : first + cols], xg_ub)
                with T.SimtVF(threads=THREADS):
                    acc = T.alloc_local((m,), T.float32)
                    weights = T.alloc_local((m,), T.float32)
                    load_row(weights, mix, t, m)
                    walk_columns(column, sums, first, cols, a.hidden, acc, weights, og_ub, x_ub, xg_ub)
                T.copy(xg_ub, x_grad[t, :, first : first + cols])
            with T.SimtVF(threads=THREADS):
                total = T.alloc_local((1,), T.float32)
                for k in T.Parallel(THREADS):
                    if k < m:
                        thread_total(total, sums, k)
                        mix_grad[t, k] = total[0]

    return mhc_pre_apply_mix_bwd
