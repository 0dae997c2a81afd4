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

A thread moves its token's rows as 16-byte vectors (at mhc 4: 6 loads of input_mixes and 6 stores of its gradient,
not 24 each; a warp's scalar access to 32 rows 96 bytes apart touches 24 cache lines an instruction, so the L1 does
about a quarter of the work) when every row is a multiple of 16 bytes (mhc a multiple of 4: fixed at build time) and
every tensor starts on a 16-byte boundary, which the kernel checks at run time (the op does not require it);
otherwise it reads and writes as scalars. Both paths compute the same values in the same order (H200, 8192 x 24:
4.44 µs against 7.10 scalar, session 13).
"""

import tilelang.language as T

from kernels_src.mhc.common import WARP, block_sum
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import SPLIT_MIXES_BWD

DECL = SPLIT_MIXES_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
F32_VEC = 4  # fp32 elements of a 16-byte access

# 1 if the address is 16-byte aligned, else 0
ALIGNED16_SOURCE = """
__device__ __forceinline__ int tkaot_aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}
"""


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens = T.dynamic("num_tokens")
    num_partials = T.dynamic("num_partials")
    mixes = mhc * (mhc + 2)
    sums = mixes + 3
    vector_rows = mhc % F32_VEC == 0  # every row (mhc, mhc * mhc, mixes floats) a multiple of 16 bytes

    def aligned(*tensors):
        """The kernel-time test that every tensor starts on a 16-byte boundary."""
        test = None
        for t in tensors:
            one = T.call_extern("int32", "tkaot_aligned16", T.address_of(t[0, 0])) != 0
            test = one if test is None else T.And(test, one)
        return test

    @T.macro
    def load_row(dst, first: int, src, ti, n: int, vectors: bool):
        """dst[first:first + n] = src[*ti, 0:n], as 16-byte vectors if `vectors`, else as scalars (ti, the token as a
        tuple: a macro takes a tuple as it is, a lone expression becomes a new local and loses what is assumed of it)."""
        if vectors:
            for q in T.unroll(n // F32_VEC):
                for k in T.vectorized(F32_VEC):
                    dst[first + q * F32_VEC + k] = src[ti + (q * F32_VEC + k,)]
        else:
            for j in T.unroll(n):
                dst[first + j] = src[ti + (j,)]

    @T.macro
    def load_token(im, grads, post, pre_grad, post_grad, comb_grad, input_mixes, post_layer_mix, ti, vectors: bool):
        load_row(im, 0, input_mixes, ti, mixes, vectors)
        load_row(grads, 0, pre_grad, ti, mhc, vectors)
        load_row(grads, mhc, post_grad, ti, mhc, vectors)
        load_row(grads, 2 * mhc, comb_grad, ti, mhc * mhc, vectors)
        load_row(post, 0, post_layer_mix, ti, mhc, vectors)

    @T.macro
    def store_token(input_mixes_grad, im, ti, vectors: bool):
        if vectors:
            for q in T.unroll(mixes // F32_VEC):
                for k in T.vectorized(F32_VEC):
                    input_mixes_grad[ti + (q * F32_VEC + k,)] = im[q * F32_VEC + k]
        else:
            for j in T.unroll(mixes):
                input_mixes_grad[ti + (j,)] = im[j]

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
            kernel_entry(ALIGNED16_SOURCE if vector_rows else "")
            tid = T.get_thread_binding()
            scale = T.alloc_local((3,), T.float32)
            base = T.alloc_local((mixes,), T.float32)
            acc = T.alloc_local((sums,), T.float32)
            d = T.alloc_local((mixes,), T.float32)
            im = T.alloc_local((mixes,), T.float32)  # the token's input_mixes, then its gradient
            grads = T.alloc_local((mixes,), T.float32)  # the token's pre, post and comb gradients
            post = T.alloc_local((mhc,), T.float32)
            red = T.alloc_shared((THREADS // WARP, sums), T.float32)
            token = T.alloc_var(T.int32)
            s = T.alloc_var(T.float32)
            p = T.alloc_var(T.float32)
            aligned_all = T.alloc_var(T.int32)  # 1: every tensor 16-byte aligned, the rows moved as vectors
            aligned_all = 0
            if vector_rows:
                aligned_all = T.if_then_else(
                    aligned(pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes, post_layer_mix, input_mixes_grad),
                    1, 0,
                )  # fmt: skip
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
                    if vector_rows:
                        if aligned_all != 0:
                            load_token(im, grads, post, pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes,
                                       post_layer_mix, (token,), True)  # fmt: skip
                        else:
                            load_token(im, grads, post, pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes,
                                       post_layer_mix, (token,), False)  # fmt: skip
                    else:
                        load_token(im, grads, post, pre_layer_mix_grad, post_layer_mix_grad, comb_res_mix_grad, input_mixes,
                                   post_layer_mix, (token,), False)  # fmt: skip
                    for j in T.unroll(mhc):
                        s = T.sigmoid(im[j] * scale[0] + base[j])
                        d[j] = grads[j] * s * (1.0 - s)
                    for j in T.unroll(mhc):
                        p = post[j]
                        d[mhc + j] = grads[mhc + j] * p * (1.0 - p / mhc_post_mult_value)
                    for j in T.unroll(mhc * mhc):
                        d[2 * mhc + j] = grads[2 * mhc + j]
                    for j in T.unroll(mixes):
                        g = T.min(j // mhc, 2)
                        acc[j] = acc[j] + d[j]
                        acc[mixes + g] = acc[mixes + g] + d[j] * im[j]
                        im[j] = d[j] * scale[g]
                    if vector_rows:
                        if aligned_all != 0:
                            store_token(input_mixes_grad, im, (token,), True)
                        else:
                            store_token(input_mixes_grad, im, (token,), False)
                    else:
                        store_token(input_mixes_grad, im, (token,), False)
            block_sum(acc, red, sums, THREADS)
            if tid == 0:
                for k in T.unroll(sums):
                    partials[block, k] = acc[k]

    return split_mixes_bwd
