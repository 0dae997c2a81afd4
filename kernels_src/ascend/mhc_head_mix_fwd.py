"""mHC head mix, forward, for Ascend: output_mix = sigmoid(input_mix * mhc_scale[0] + mhc_base[j]) + mhc_pre_eps.

Elementwise over the (num_tokens, mhc_mult) mixes, flattened as on CUDA (kernels_src/mhc/head_mix_fwd.py): a
block copies `ELEMS` consecutive elements into the Unified Buffer, a SIMT region applies the sigmoid (1 / (1 +
exp(-x))) with column j = element % mhc_mult, and the results go back; the expansion rate is a runtime value.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32
from kernels_src.ascend.common import unsupported as unsupported
from tkaot._mhc.kernels import HEAD_MIX_FWD

DECL = HEAD_MIX_FWD
ELEMS = 4096
THREADS = 256


def build(dtype: str):
    num_tokens, mhc_mult = T.dynamic("num_tokens"), T.dynamic("mhc_mult")
    mixes = fp32(num_tokens, mhc_mult)

    @T.prim_func
    def mhc_head_mix_fwd(input_mix: mixes, mhc_scale: fp32(1), mhc_base: fp32(mhc_mult), output_mix: mixes, mhc_pre_eps: T.float32):
        T.assume(mhc_mult > 0)
        with T.Kernel(T.ceildiv(num_tokens * mhc_mult, ELEMS)) as block:
            first = block * ELEMS
            mix_ub = T.alloc_shared((ELEMS,), T.float32)
            # the mixes as one run (the views keep the parameters' names, which the launch spec maps to the op's)
            input_mix = T.Tensor((num_tokens * mhc_mult,), T.float32, data=input_mix.data)
            output_mix = T.Tensor((num_tokens * mhc_mult,), T.float32, data=output_mix.data)
            T.copy(input_mix[first : first + ELEMS], mix_ub)
            with T.SimtVF(threads=THREADS):
                for j in T.Parallel(ELEMS):
                    x = mix_ub[j] * mhc_scale[0] + mhc_base[(first + j) % mhc_mult]
                    mix_ub[j] = T.float32(1) / (T.float32(1) + T.exp(-x)) + mhc_pre_eps
            T.copy(mix_ub, output_mix[first : first + ELEMS])

    return mhc_head_mix_fwd
