"""mHC split mixes, forward, for Ascend (as kernels_src/mhc/split_mixes_fwd.py): of input_mixes (num_tokens,
mhc * (mhc + 2)) fp32, with v = input_mixes[t, j] * mhc_scale[g] + mhc_base[j] (g = 0, 1, 2 for the three parts),
  j < mhc:      pre_layer_mix[t, j]          = mc.sigmoid(v) + mhc_pre_eps
  j < 2 * mhc:  post_layer_mix[t, j - mhc]   = mc.sigmoid(v) * mhc_post_mult_value
  otherwise:    comb_res_mix[t, j - 2 * mhc] = v

A block copies TOKENS tokens' mixes into the Unified Buffer; a SIMT region splits them into three tiles (the scale
and base read from global memory), which go out by DMA.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import SPLIT_MIXES_FWD

DECL = SPLIT_MIXES_FWD
TOKENS = 64


def build(mhc_mult: int):
    m = mhc_mult
    a = mc.Args(m)

    @T.prim_func
    def mhc_split_mixes_fwd(
        input_mixes: a.all_mixes, mhc_scale: a.scale, mhc_base: a.base, pre_layer_mix: a.mix, post_layer_mix: a.mix,
        comb_res_mix: a.comb_rows, mhc_post_mult_value: T.float32, mhc_pre_eps: T.float32,
    ):  # fmt: skip
        with T.Kernel(T.ceildiv(a.num_tokens, TOKENS)) as block:
            first = block * TOKENS
            in_ub = T.alloc_shared((TOKENS, a.mixes), T.float32)
            pre_ub = T.alloc_shared((TOKENS, m), T.float32)
            post_ub = T.alloc_shared((TOKENS, m), T.float32)
            comb_ub = T.alloc_shared((TOKENS, m * m), T.float32)
            T.copy(input_mixes[first : first + TOKENS, :], in_ub)
            with T.SimtVF(threads=mc.THREADS):
                for i, j in T.Parallel(TOKENS, a.mixes):
                    v = in_ub[i, j] * mhc_scale[T.min(j // m, 2)] + mhc_base[j]
                    if j < m:
                        pre_ub[i, j] = mc.sigmoid(v) + mhc_pre_eps
                    elif j < 2 * m:
                        post_ub[i, j - m] = mc.sigmoid(v) * mhc_post_mult_value
                    else:
                        comb_ub[i, j - 2 * m] = v
            T.copy(pre_ub, pre_layer_mix[first : first + TOKENS, :])
            T.copy(post_ub, post_layer_mix[first : first + TOKENS, :])
            T.copy(comb_ub, comb_res_mix[first : first + TOKENS, :])

    return mhc_split_mixes_fwd
