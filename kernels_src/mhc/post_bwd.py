"""mhc_post backward (the forward: out[o] = post[o] * x + sum over i of comb[i, o] * res[i]), one block a token
(kernels_src/mhc/common.py token_row_kernel):
  d_residual[t, i, :] = sum over o of comb[t, i, o] * d_o[t, o, :]       (fp32 from 0, stream order; bf16)
  d_x[t, :]           = sum over o of post[t, o] * d_o[t, o, :]          (likewise)
  d_comb[t, i, o]     = sum over h of residual[t, i, h] * d_o[t, o, h]   (fp32)
  d_post[t, o]        = sum over h of x[t, h] * d_o[t, o, h]             (fp32)
The two sums over h are each thread's, then the block's (kernels_src/mhc/common.py block_sum).
"""

import tilelang.language as T

from kernels_src.mhc.common import VEC, load_vec, row_dims, store_bf16, token_row_kernel
from tkaot._mhc.kernels import POST_BWD

DECL = POST_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens, hidden = row_dims()
    sums = mhc * mhc + mhc  # d_comb row-major, then d_post

    @T.macro
    def tiles():
        do = T.alloc_local((mhc, VEC), T.bfloat16)
        res = T.alloc_local((mhc, VEC), T.bfloat16)
        xv = T.alloc_local((VEC,), T.bfloat16)
        outv = T.alloc_local((VEC,), T.bfloat16)
        grad = T.alloc_local((VEC,), T.float32)
        comb = T.alloc_local((mhc, mhc), T.float32)
        post = T.alloc_local((mhc,), T.float32)
        acc = T.alloc_local((sums,), T.float32)
        return do, res, xv, outv, grad, comb, post, acc

    @T.macro
    def start(do, res, xv, outv, grad, comb, post, acc, d_o, comb_res_mix, residual, post_layer_mix, x, d_comb_res_mix,
              d_residual, d_post_layer_mix, d_x, token):  # fmt: skip
        for i in T.unroll(mhc):
            post[i] = post_layer_mix[token, i]
            for o in T.unroll(mhc):
                comb[i, o] = comb_res_mix[token, i, o]
        for k in T.unroll(sums):
            acc[k] = 0.0

    @T.macro
    def visit(do, res, xv, outv, grad, comb, post, acc, d_o, comb_res_mix, residual, post_layer_mix, x, d_comb_res_mix,
              d_residual, d_post_layer_mix, d_x, token, col: T.Ref):  # fmt: skip
        for o in T.unroll(mhc):
            load_vec(do, (o,), d_o, (token, o, col))
        for i in T.unroll(mhc):
            load_vec(res, (i,), residual, (token, i, col))
        load_vec(xv, (), x, (token, col))
        for i in T.unroll(mhc):
            for j in T.unroll(VEC):
                grad[j] = 0.0
            for o in T.unroll(mhc):
                for j in T.unroll(VEC):
                    grad[j] = grad[j] + comb[i, o] * T.cast(do[o, j], T.float32)
                    acc[i * mhc + o] = acc[i * mhc + o] + T.cast(res[i, j], T.float32) * T.cast(do[o, j], T.float32)
            store_bf16(outv, grad, d_residual, (token, i, col))
        for j in T.unroll(VEC):
            grad[j] = 0.0
        for o in T.unroll(mhc):
            for j in T.unroll(VEC):
                grad[j] = grad[j] + post[o] * T.cast(do[o, j], T.float32)
                acc[mhc * mhc + o] = acc[mhc * mhc + o] + T.cast(xv[j], T.float32) * T.cast(do[o, j], T.float32)
        store_bf16(outv, grad, d_x, (token, col))

    @T.macro
    def finish(do, res, xv, outv, grad, comb, post, acc, d_o, comb_res_mix, residual, post_layer_mix, x, d_comb_res_mix,
               d_residual, d_post_layer_mix, d_x, token):  # fmt: skip
        for i in T.unroll(mhc):
            for o in T.unroll(mhc):
                d_comb_res_mix[token, i, o] = acc[i * mhc + o]
        for o in T.unroll(mhc):
            d_post_layer_mix[token, o] = acc[mhc * mhc + o]

    @T.prim_func
    def post_bwd(
        d_o: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        comb_res_mix: T.Tensor[(num_tokens, mhc, mhc), T.float32],
        residual: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        post_layer_mix: T.Tensor[(num_tokens, mhc), T.float32],
        x: T.Tensor[(num_tokens, hidden), T.bfloat16],
        d_comb_res_mix: T.Tensor[(num_tokens, mhc, mhc), T.float32],
        d_residual: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        d_post_layer_mix: T.Tensor[(num_tokens, mhc), T.float32],
        d_x: T.Tensor[(num_tokens, hidden), T.bfloat16],
    ):
        tensors = (d_o, comb_res_mix, residual, post_layer_mix, x, d_comb_res_mix, d_residual, d_post_layer_mix, d_x)
        token_row_kernel(num_tokens, hidden, sums, tiles, start, visit, finish, tensors)

    return post_bwd
