"""mhc_pre_apply_mix forward: o[t, :] = sum over m of mix[t, m] * x[t, m, :], in fp32 in stream order (from 0,
each term a fused multiply-add), rounded once to bf16.

Vectors of 8 bf16 are numbered across (num_tokens, hidden) as in expand_fwd.py; each thread reads the mhc
vectors below one output vector and the token's mhc mixes (shared by the token's threads, so cached).
"""

import tilelang.language as T

from kernels_src.mhc.common import FLAT_UNROLL, VEC, flat_kernel, load_vec, stream_sum_store, stream_types
from tkaot._mhc.kernels import PRE_APPLY_MIX_FWD

DECL = PRE_APPLY_MIX_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens, hidden, rows, streams, mixes = stream_types(mhc)

    @T.macro
    def load(u, xs, mixes, acc, out, x, mix, o, token, col):
        for m in T.unroll(mhc):
            load_vec(xs, (u, m), x, (token[u], m, col[u]))
        for m in T.unroll(mhc):
            mixes[u, m] = mix[token[u], m]

    @T.macro
    def finish(u, xs, mixes, acc, out, x, mix, o, token, col):
        stream_sum_store(acc, out, xs, mixes, u, mhc, o, (token[u], col[u]))

    @T.macro
    def tiles():
        xs = T.alloc_local((FLAT_UNROLL, mhc, VEC), T.bfloat16)
        mixes = T.alloc_local((FLAT_UNROLL, mhc), T.float32)
        acc = T.alloc_local((VEC,), T.float32)
        out = T.alloc_local((VEC,), T.bfloat16)
        return xs, mixes, acc, out

    @T.prim_func
    def pre_apply_mix_fwd(x: streams, mix: mixes, o: rows):
        flat_kernel(num_tokens, hidden, tiles, load, finish, (x, mix, o))

    return pre_apply_mix_fwd
