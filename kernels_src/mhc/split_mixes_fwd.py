"""mhc_pre_split_mixes forward, one thread per element of input_mixes (num_tokens, mhc * (mhc + 2)) fp32:
with v = input_mixes[t, j] * mhc_scale[group] + mhc_base[j] (group 0, 1, 2 for the three parts),
  j < mhc:          pre_layer_mix[t, j]            = sigmoid(v) + mhc_pre_eps
  j < 2 * mhc:      post_layer_mix[t, j - mhc]     = sigmoid(v) * mhc_post_mult_value
  otherwise:        comb_res_mix[t, j - 2 * mhc]   = v
sigmoid(v) is 1 / (1 + exp(0 - v)) in fp32, as TileLang's sigmoid.
"""

import tilelang.language as T

from kernels_src.mhc.common import mix_types
from kernels_src.pdl import kernel_entry
from kernels_src.tensors import fp32
from tkaot._mhc.kernels import SPLIT_MIXES_FWD

DECL = SPLIT_MIXES_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 256


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens = T.dynamic("num_tokens")
    mixes = mhc * (mhc + 2)
    inputs, scale, base = mix_types(num_tokens, mixes, 3)

    @T.prim_func
    def split_mixes_fwd(
        input_mixes: inputs,
        mhc_scale: scale,
        mhc_base: base,
        pre_layer_mix: fp32(num_tokens, mhc),
        post_layer_mix: fp32(num_tokens, mhc),
        comb_res_mix: fp32(num_tokens, mhc * mhc),
        mhc_post_mult_value: T.float32,
        mhc_pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * mixes, THREADS), threads=THREADS) as block:
            kernel_entry()
            tid = T.get_thread_binding()
            token = T.alloc_var(T.int32)
            j = T.alloc_var(T.int32)
            token = (block * THREADS + tid) // mixes
            j = (block * THREADS + tid) % mixes
            if token < num_tokens:
                T.assume(0 <= token and 0 <= j and j < mixes)
                if j < mhc:
                    pre_layer_mix[token, j] = T.sigmoid(input_mixes[token, j] * mhc_scale[0] + mhc_base[j]) + mhc_pre_eps
                elif j < 2 * mhc:
                    post_layer_mix[token, j - mhc] = T.sigmoid(input_mixes[token, j] * mhc_scale[1] + mhc_base[j]) * mhc_post_mult_value
                else:
                    comb_res_mix[token, j - 2 * mhc] = input_mixes[token, j] * mhc_scale[2] + mhc_base[j]

    return split_mixes_fwd
