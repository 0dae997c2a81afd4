"""mHC split mixes, backward, first launch, for Ascend: the input gradient and per-block partial sums of the
parameter gradients (as kernels_src/mhc/split_mixes_bwd.py; mhc_split_mixes_bwd_reduce.py adds the partials up).

Block p's SIMT thread u takes tokens t = (s * num_partials + p) * THREADS + u, s = 0, 1, ... Of token t's mix j
(group g = 0, 1, 2 for the pre, post and comb parts), the gradient of v = input_mixes * mhc_scale[g] + mhc_base[j]:
  pre:  d = pre_grad * s * (1 - s), s = sigmoid(v) recomputed
  post: d = post_grad * p * (1 - p / mhc_post_mult_value), p = post_layer_mix (the forward's output)
  comb: d = comb_grad
and input_mixes_grad[t, j] = d * mhc_scale[g], written to global memory. The thread sums d (mhc_base's gradient)
and d * input_mixes (mhc_scale's, a sum a group) over its tokens; row p of `partials` gets the block's sums
(mhc_base's mhc * (mhc + 2), then mhc_scale's 3), the threads' sums added in thread order
(kernels_src/ascend/mhc_common.py thread_total).
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import SPLIT_MIXES_BWD

DECL = SPLIT_MIXES_BWD


def build(mhc_mult: int):
    m = mhc_mult
    a = mc.Args(m)
    mixes, count = a.mixes, a.mixes + 3
    num_partials = T.dynamic("num_partials")

    @T.macro
    def token_grads(d, t, pre_grad, post_grad, comb_grad, input_mixes, post_layer_mix, mhc_scale, mhc_base, mhc_post_mult_value):
        """d[j] = the gradient of token t's v[j]."""
        for j in T.unroll(m):
            s = mc.sigmoid(input_mixes[t, j] * mhc_scale[0] + mhc_base[j])
            d[j] = pre_grad[t, j] * s * (T.float32(1) - s)
        for j in T.unroll(m):
            p = post_layer_mix[t, j]
            d[m + j] = post_grad[t, j] * p * (T.float32(1) - p / mhc_post_mult_value)
        for j in T.unroll(m * m):
            d[2 * m + j] = comb_grad[t, j]

    @T.macro
    def store(k, total, row_ub):
        row_ub[k] = total

    @T.prim_func
    def mhc_split_mixes_bwd(
        pre_layer_mix_grad: a.mix, post_layer_mix_grad: a.mix, comb_res_mix_grad: a.comb_rows, input_mixes: a.all_mixes,
        post_layer_mix: a.mix, mhc_scale: a.scale, mhc_base: a.base, input_mixes_grad: a.all_mixes,
        partials: mc.fp32(num_partials, count), mhc_post_mult_value: T.float32,
    ):  # fmt: skip
        with T.Kernel(num_partials) as block:
            sums = T.alloc_shared((count, mc.THREADS), T.float32)
            row_ub = T.alloc_shared((count,), T.float32)
            with T.SimtVF(threads=mc.THREADS):
                acc = T.alloc_local((count,), T.float32)
                d = T.alloc_local((mixes,), T.float32)
                for u in T.Parallel(mc.THREADS):
                    for k in T.unroll(count):
                        acc[k] = T.float32(0)
                    for step in T.serial(T.ceildiv(a.num_tokens, num_partials * mc.THREADS)):
                        t = (step * num_partials + block) * mc.THREADS + u
                        if t < a.num_tokens:
                            token_grads(
                                d, t, pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix,
                                mhc_scale, mhc_base, mhc_post_mult_value,
                            )  # fmt: skip
                            for j in T.unroll(mixes):
                                acc[j] = acc[j] + d[j]
                                acc[mixes + T.min(j // m, 2)] = acc[mixes + T.min(j // m, 2)] + d[j] * input_mixes[t, j]
                                input_mixes_grad[t, j] = d[j] * mhc_scale[T.min(j // m, 2)]
                    for k in T.unroll(count):
                        sums[k, u] = acc[k]
            mc.finish_sums(sums, store, row_ub)
            T.copy(row_ub, partials[block, :])

    return mhc_split_mixes_bwd
