"""mHC pre-apply mix, backward, for Ascend (the forward: o = the sum over m of mix[t, m] * x[t, m, :]; the CUDA
kernel is kernels_src/mhc/pre_apply_mix_bwd.py):
  x_grad[t, m, :] += mix[t, m] * o_grad[t, :]             (in place: fp32, rounded once to bf16)
  mix_grad[t, m]   = the sum over h of o_grad[t, h] * x[t, m, h]   (fp32)

A token a block, which walks the token's hidden segments in order through the Unified Buffer; a thread's share of
each mix gradient waits in the `sums` tile between segments (kernels_src/ascend/mhc_common.py walk_columns).
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD, PRE_APPLY_MIX_BWD_TILINGS

DECL = PRE_APPLY_MIX_BWD


def unsupported(mhc_mult, tiling) -> str | None:
    """Why this module does not build these static values (None: it does). The tiling is the CUDA kernel's; this
    kernel is the same for all, so only the default tiling is built and the op's fallback to it serves the others."""
    default = PRE_APPLY_MIX_BWD_TILINGS["default"]
    return None if tiling == default else f"tiling={tiling} is a CUDA form (the tiling={default} kernel serves its calls)"


def build(mhc_mult: int, tiling: str):
    m = mhc_mult
    a = mc.Args(m)
    cols = mc.span(2 * (2 * m + 1), reserved=m * mc.THREADS * 4)

    @T.macro
    def column(j, acc, weights, og_ub, x_ub, xg_ub):
        for i in T.unroll(m):
            acc[i] = acc[i] + mc.as_f32(og_ub[j]) * mc.as_f32(x_ub[i, j])
            xg_ub[i, j] = T.cast(mc.as_f32(xg_ub[i, j]) + weights[i] * mc.as_f32(og_ub[j]), T.bfloat16)

    @T.macro
    def store(k, total, t, mix_grad):
        mix_grad[t, k] = total

    @T.prim_func
    def mhc_pre_apply_mix_bwd(o_grad: a.row, x: a.streams, mix: a.mix, x_grad: a.streams, mix_grad: a.mix):
        with T.Kernel(a.num_tokens) as t:
            og_ub = T.alloc_shared((cols,), T.bfloat16)
            x_ub = T.alloc_shared((m, cols), T.bfloat16)
            xg_ub = T.alloc_shared((m, cols), T.bfloat16)
            sums = T.alloc_shared((m, mc.THREADS), T.float32)
            for first in T.serial(0, a.hidden, cols):
                T.copy(o_grad[t, first : first + cols], og_ub)
                T.copy(x[t, :, first : first + cols], x_ub)
                T.copy(x_grad[t, :, first : first + cols], xg_ub)
                with T.SimtVF(threads=mc.THREADS):
                    acc = T.alloc_local((m,), T.float32)
                    weights = T.alloc_local((m,), T.float32)
                    mc.load_row(weights, mix, t, m)
                    mc.walk_columns(column, sums, first, cols, a.hidden, acc, weights, og_ub, x_ub, xg_ub)
                T.copy(xg_ub, x_grad[t, :, first : first + cols])
            mc.finish_sums(sums, store, t, mix_grad)

    return mhc_pre_apply_mix_bwd
