"""mhc_post forward: out[t, o, :] = post_layer_mix[t, o] * x[t, :] + sum over i of comb_res_mix[t, i, o] *
residual[t, i, :], in fp32 (the product first, then one fused multiply-add a stream in stream order), rounded
once to bf16.

Vectors of 8 bf16 are numbered across (num_tokens, hidden) as in expand_fwd.py; each thread reads x's vector
and the mhc residual vectors above it, and writes the mhc output vectors; the token's mhc**2 + mhc mixes are
shared by the token's threads (cached).
"""

import tilelang.language as T

from kernels_src.mhc.common import VEC, flat_blocks, load_vec, row_dims, store_bf16, vec_entry
from tkaot._mhc.kernels import POST_FWD

DECL = POST_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 256


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens, hidden = row_dims()

    @T.prim_func
    def post_fwd(
        comb_res_mix: T.Tensor[(num_tokens, mhc, mhc), T.float32],
        residual: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        post_layer_mix: T.Tensor[(num_tokens, mhc), T.float32],
        x: T.Tensor[(num_tokens, hidden), T.bfloat16],
        out: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
    ):
        with T.Kernel(flat_blocks(num_tokens, hidden, THREADS), threads=THREADS) as block:
            vec_entry(hidden)
            tid = T.get_thread_binding()
            row_vecs = hidden // VEC
            res = T.alloc_local((mhc, VEC), T.bfloat16)
            xv = T.alloc_local((VEC,), T.bfloat16)
            comb = T.alloc_local((mhc, mhc), T.float32)
            post = T.alloc_local((mhc,), T.float32)
            acc = T.alloc_local((VEC,), T.float32)
            outv = T.alloc_local((VEC,), T.bfloat16)
            token = T.alloc_var(T.int32)
            col = T.alloc_var(T.int32)
            v = block * THREADS + tid
            token = v // row_vecs
            col = v % row_vecs
            if token < num_tokens:
                T.assume(0 <= token and 0 <= col and col < row_vecs)
                for i in T.unroll(mhc):
                    load_vec(res, (i,), residual, (token, i, col))
                load_vec(xv, (), x, (token, col))
                for i in T.unroll(mhc):
                    post[i] = post_layer_mix[token, i]
                    for k in T.unroll(mhc):
                        comb[i, k] = comb_res_mix[token, i, k]
                for o in T.unroll(mhc):
                    for j in T.unroll(VEC):
                        acc[j] = post[o] * T.cast(xv[j], T.float32)
                    for i in T.unroll(mhc):
                        for j in T.unroll(VEC):
                            acc[j] = acc[j] + comb[i, o] * T.cast(res[i, j], T.float32)
                    store_bf16(outv, acc, out, (token, o, col))

    return post_fwd
