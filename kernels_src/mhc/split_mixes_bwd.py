"""mhc_pre_split_mixes backward, first launch: the input gradient and per-block partial parameter gradients.

Each thread takes whole tokens, `num_partials * THREADS` apart. Of token t's element j (group g = 0, 1, 2 for
the pre, post and comb parts), the gradient of v = input_mixes * mhc_scale[g] + mhc_base[j] is
  pre:  d = pre_grad * s * (1 - s), s = sigmoid(v) recomputed
  post: d = post_grad * p * (1 - p / mhc_post_mult_value), p = post_layer_mix (the forward's output)
  comb: d = comb_grad
and input_mixes_grad[t, j] = d * mhc_scale[g]. Each thread sums d (mhc_base's gradient) and d * input_mixes
(mhc_scale's, per group) over its tokens; the block adds its threads' sums and writes them as row `block` of
`partials` (mhc_base's mhc * (mhc + 2) sums, then mhc_scale's 3), which split_mixes_bwd_reduce.py adds up.
A row a thread is kept: staging a block's rows through shared memory measured slower (H200, 8192 x 24:
13.7 µs against 7.2 with the same reduce).
"""

import tilelang.language as T

from kernels_src.mhc.common import WARP, block_sum
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import SPLIT_MIXES_BWD

DECL = SPLIT_MIXES_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens = T.dynamic("num_tokens")
    num_partials = T.dynamic("num_partials")
    mixes = mhc * (mhc + 2)
    sums = mixes + 3

    @T.prim_func
    def split_mixes_bwd(
        pre_layer_mix_grad: T.Tensor[(num_tokens, mhc), T.float32],
        post_layer_mix_grad: T.Tensor[(num_tokens, mhc), T.float32],
        comb_res_mix_grad: T.Tensor[(num_tokens, mhc * mhc), T.float32],
        input_mixes: T.Tensor[(num_tokens, mixes), T.float32],
        post_layer_mix: T.Tensor[(num_tokens, mhc), T.float32],
        mhc_scale: T.Tensor[(3,), T.float32],
        mhc_base: T.Tensor[(mixes,), T.float32],
        input_mixes_grad: T.Tensor[(num_tokens, mixes), T.float32],
        partials: T.Tensor[(num_partials, sums), T.float32],
        mhc_post_mult_value: T.float32,
    ):
        with T.Kernel(num_partials, threads=THREADS) as block:
            kernel_entry()
            tid = T.get_thread_binding()
            scale = T.alloc_local((3,), T.float32)
            base = T.alloc_local((mixes,), T.float32)
            acc = T.alloc_local((sums,), T.float32)
            d = T.alloc_local((mixes,), T.float32)
            red = T.alloc_shared((THREADS // WARP, sums), T.float32)
            token = T.alloc_var(T.int32)
            s = T.alloc_var(T.float32)
            p = T.alloc_var(T.float32)
            for g in T.unroll(3):
                scale[g] = mhc_scale[g]
            for j in T.unroll(mixes):
                base[j] = mhc_base[j]
            for k in T.unroll(sums):
                acc[k] = 0.0
            for step in T.serial(T.ceildiv(num_tokens, num_partials * THREADS)):
                token = (step * num_partials + block) * THREADS + tid
                if token < num_tokens:
                    T.assume(0 <= token)
                    for j in T.unroll(mhc):
                        s = T.sigmoid(input_mixes[token, j] * scale[0] + base[j])
                        d[j] = pre_layer_mix_grad[token, j] * s * (1.0 - s)
                    for j in T.unroll(mhc):
                        p = post_layer_mix[token, j]
                        d[mhc + j] = post_layer_mix_grad[token, j] * p * (1.0 - p / mhc_post_mult_value)
                    for j in T.unroll(mhc * mhc):
                        d[2 * mhc + j] = comb_res_mix_grad[token, j]
                    for j in T.unroll(mixes):
                        g = T.min(j // mhc, 2)
                        acc[j] = acc[j] + d[j]
                        acc[mixes + g] = acc[mixes + g] + d[j] * input_mixes[token, j]
                        input_mixes_grad[token, j] = d[j] * scale[g]
            block_sum(acc, red, sums, THREADS)
            if tid == 0:
                for k in T.unroll(sums):
                    partials[block, k] = acc[k]

    return split_mixes_bwd
