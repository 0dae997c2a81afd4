"""mhc_pre_split_mixes backward, first launch: the input gradient and per-block partial parameter gradients.

Each thread takes whole tokens, `num_partials * THREADS` apart. Of token t's element j (group g = 0, 1, 2 for
the pre, post and comb parts), the gradient of v = input_mixes * mhc_scale[g] + mhc_base[j] is
  pre:  d = pre_grad * s * (1 - s), s = sigmoid(v) recomputed
  post: d = post_grad * p * (1 - p / mhc_post_mult_value), p = post_layer_mix (the forward's output)
  comb: d = comb_grad
and input_mixes_grad[t, j] = d * mhc_scale[g]. Each thread sums d (mhc_base's gradient) and d * input_mixes
(mhc_scale's, per group) over its tokens; the block adds its threads' sums and writes them as row `block` of
`partials` (mhc_base's mhc * (mhc + 2) sums, then mhc_scale's 3), which split_mixes_bwd_reduce.py adds up.

A block's THREADS tokens are contiguous rows of every input and of input_mixes_grad: they move between global
and shared memory with consecutive threads on consecutive words (a row a thread would touch THREADS rows per
warp-wide access, 32 cache lines each), and each thread works on its token's row in shared memory.
"""

import tilelang.language as T

from kernels_src.mhc.common import WARP, block_sum
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import SPLIT_MIXES_BWD

DECL = SPLIT_MIXES_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens = T.dynamic("num_tokens")
    num_partials = T.dynamic("num_partials")
    mixes = mhc * (mhc + 2)
    sums = mixes + 3

    @T.macro
    def stage_in(src, rows, cols: int, first, tid):
        """rows[r, c] = src[first + r, c] for the block's THREADS tokens (row stride cols + 1: no bank conflicts)."""
        for u in T.unroll(cols):
            f = u * THREADS + tid
            if first + f // cols < num_tokens:
                rows[f // cols, f % cols] = src[first + f // cols, f % cols]

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
            T.import_source(PDL_SOURCE)
            pdl_entry()
            tid = T.get_thread_binding()
            scale = T.alloc_local((3,), T.float32)
            base = T.alloc_local((mixes,), T.float32)
            acc = T.alloc_local((sums,), T.float32)
            d = T.alloc_local((mixes,), T.float32)
            red = T.alloc_shared((THREADS // WARP, sums), T.float32)
            im_rows = T.alloc_shared((THREADS, mixes + 1), T.float32)  # input_mixes, then input_mixes_grad
            comb_rows = T.alloc_shared((THREADS, mhc * mhc + 1), T.float32)
            pre_rows = T.alloc_shared((THREADS, mhc + 1), T.float32)
            post_g_rows = T.alloc_shared((THREADS, mhc + 1), T.float32)
            post_rows = T.alloc_shared((THREADS, mhc + 1), T.float32)
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
                first = (step * num_partials + block) * THREADS
                T.sync_threads()  # the last step's rows are read
                stage_in(input_mixes, im_rows, mixes, first, tid)
                stage_in(comb_res_mix_grad, comb_rows, mhc * mhc, first, tid)
                stage_in(pre_layer_mix_grad, pre_rows, mhc, first, tid)
                stage_in(post_layer_mix_grad, post_g_rows, mhc, first, tid)
                stage_in(post_layer_mix, post_rows, mhc, first, tid)
                T.sync_threads()
                token = first + tid
                if token < num_tokens:
                    for j in T.unroll(mhc):
                        s = T.sigmoid(im_rows[tid, j] * scale[0] + base[j])
                        d[j] = pre_rows[tid, j] * s * (1.0 - s)
                    for j in T.unroll(mhc):
                        p = post_rows[tid, j]
                        d[mhc + j] = post_g_rows[tid, j] * p * (1.0 - p / mhc_post_mult_value)
                    for j in T.unroll(mhc * mhc):
                        d[2 * mhc + j] = comb_rows[tid, j]
                    for j in T.unroll(mixes):
                        g = T.min(j // mhc, 2)
                        acc[j] = acc[j] + d[j]
                        acc[mixes + g] = acc[mixes + g] + d[j] * im_rows[tid, j]
                        im_rows[tid, j] = d[j] * scale[g]
                T.sync_threads()
                for u in T.unroll(mixes):
                    f = u * THREADS + tid
                    if first + f // mixes < num_tokens:
                        input_mixes_grad[first + f // mixes, f % mixes] = im_rows[f // mixes, f % mixes]
            block_sum(acc, red, sums, THREADS)
            if tid == 0:
                for k in T.unroll(sums):
                    partials[block, k] = acc[k]

    return split_mixes_bwd
