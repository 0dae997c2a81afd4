"""mHC head mix, forward: output_mix = sigmoid(input_mix * mhc_scale[0] + mhc_base[j]) + mhc_pre_eps.

Elementwise over the (num_tokens, mhc_mult) mixes, flattened: one thread an element, the expansion rate a
runtime value (column j = element % mhc_mult), so one cubin serves every rate and token count. The
sigmoid is TileLang's (1 / (1 + exp(-x)), IEEE division and expf), as TileKernels computes it.

Its argument is one fused multiply-add, fma(input_mix, scale, base), written out: nvcc contracts TileKernels'
`x * scale + base` into one, but not ours, where the 64-bit `% mhc_mult` (a branch) falls between the multiply and
the add; the product rounded on its own moved outputs by 1 to 3 ulps.
"""

import tilelang.language as T

from kernels_src.mhc.common import mix_types
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import HEAD_MIX_FWD

DECL = HEAD_MIX_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 256


def build(dtype: str):
    num_tokens, mhc_mult = T.dynamic("num_tokens"), T.dynamic("mhc_mult")
    mixes, scale, base = mix_types(num_tokens, mhc_mult, 1)

    @T.prim_func
    def mhc_head_mix_fwd(input_mix: mixes, mhc_scale: scale, mhc_base: base, output_mix: mixes, mhc_pre_eps: T.float32):
        with T.Kernel(T.ceildiv(num_tokens * mhc_mult, THREADS), threads=THREADS) as block:
            kernel_entry()
            T.assume(mhc_mult > 0)
            e = block * THREADS + T.get_thread_binding()
            if e < num_tokens * mhc_mult:
                token = e // mhc_mult
                j = e % mhc_mult
                output_mix[token, j] = T.sigmoid(T.fma(input_mix[token, j], mhc_scale[0], mhc_base[j])) + mhc_pre_eps

    return mhc_head_mix_fwd
