"""mhc_pre_apply_mix backward, one block a token (kernels_src/mhc/common.py token_row_kernel):
x_grad[t, m, :] += mix[t, m] * o_grad[t, :] (in place: fp32 fused multiply-add on the bf16 value, rounded
once), and mix_grad[t, m] = sum over h of o_grad[t, h] * x[t, m, h] (fp32; each thread sums its vectors,
then the block adds the threads' sums, kernels_src/mhc/common.py block_sum).
"""

import tilelang.language as T

from kernels_src.mhc.common import VEC, load_vec, stream_types, token_row_kernel
from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD

DECL = PRE_APPLY_MIX_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens, hidden, rows, streams, mixes = stream_types(mhc)

    @T.macro
    def tiles():
        og = T.alloc_local((VEC,), T.bfloat16)
        xs = T.alloc_local((mhc, VEC), T.bfloat16)
        xg = T.alloc_local((mhc, VEC), T.bfloat16)
        mixes = T.alloc_local((mhc,), T.float32)
        acc = T.alloc_local((mhc,), T.float32)
        return og, xs, xg, mixes, acc

    @T.macro
    def start(og, xs, xg, mixes, acc, o_grad, x, mix, x_grad, mix_grad, token):
        for m in T.unroll(mhc):
            mixes[m] = mix[token, m]
            acc[m] = 0.0

    @T.macro
    def visit(og, xs, xg, mixes, acc, o_grad, x, mix, x_grad, mix_grad, token, col: T.Ref):
        load_vec(og, (), o_grad, (token, col))
        for m in T.unroll(mhc):
            load_vec(xs, (m,), x, (token, m, col))
            load_vec(xg, (m,), x_grad, (token, m, col))
        for m in T.unroll(mhc):
            for j in T.unroll(VEC):
                acc[m] = acc[m] + T.cast(og[j], T.float32) * T.cast(xs[m, j], T.float32)
                xg[m, j] = T.cast(T.cast(xg[m, j], T.float32) + mixes[m] * T.cast(og[j], T.float32), T.bfloat16)
            for j in T.vectorized(VEC):
                x_grad[token, m, col * VEC + j] = xg[m, j]

    @T.macro
    def finish(og, xs, xg, mixes, acc, o_grad, x, mix, x_grad, mix_grad, token):
        for m in T.unroll(mhc):
            mix_grad[token, m] = acc[m]

    @T.prim_func
    def pre_apply_mix_bwd(o_grad: rows, x: streams, mix: mixes, x_grad: streams, mix_grad: mixes):
        token_row_kernel(num_tokens, hidden, mhc, tiles, start, visit, finish, (o_grad, x, mix, x_grad, mix_grad))

    return pre_apply_mix_bwd
