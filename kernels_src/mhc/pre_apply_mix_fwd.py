"""mhc_pre_apply_mix forward: o[t, :] = sum over m of mix[t, m] * x[t, m, :], in fp32 in stream order (from 0,
each term a fused multiply-add), rounded once to bf16.

Vectors of 8 bf16 are numbered across (num_tokens, hidden) as in expand_fwd.py; each thread reads the mhc
vectors below one output vector and the token's mhc mixes (shared by the token's threads, so cached).
"""

import tilelang.language as T

from kernels_src.mhc.common import VEC
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import PRE_APPLY_MIX_FWD

DECL = PRE_APPLY_MIX_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 256
UNROLL = 2


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")

    @T.prim_func
    def pre_apply_mix_fwd(
        x: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        mix: T.Tensor[(num_tokens, mhc), T.float32],
        o: T.Tensor[(num_tokens, hidden), T.bfloat16],
    ):
        with T.Kernel(T.ceildiv(num_tokens * (hidden // VEC), THREADS * UNROLL), threads=THREADS) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()
            T.assume(hidden % VEC == 0)
            T.assume(hidden > 0)
            tid = T.get_thread_binding()
            row_vecs = hidden // VEC
            xs = T.alloc_local((UNROLL, mhc, VEC), T.bfloat16)
            mixes = T.alloc_local((UNROLL, mhc), T.float32)
            acc = T.alloc_local((VEC,), T.float32)
            out = T.alloc_local((VEC,), T.bfloat16)
            token = T.alloc_local((UNROLL,), T.int32)
            col = T.alloc_local((UNROLL,), T.int32)
            for u in T.unroll(UNROLL):
                v = (block * UNROLL + u) * THREADS + tid
                token[u] = v // row_vecs
                col[u] = v % row_vecs
                if token[u] < num_tokens:
                    T.assume(0 <= token[u] and 0 <= col[u] and col[u] < row_vecs)
                    for m in T.unroll(mhc):
                        for j in T.vectorized(VEC):
                            xs[u, m, j] = x[token[u], m, col[u] * VEC + j]
                    for m in T.unroll(mhc):
                        mixes[u, m] = mix[token[u], m]
            for u in T.unroll(UNROLL):
                if token[u] < num_tokens:
                    T.assume(0 <= token[u] and 0 <= col[u] and col[u] < row_vecs)
                    for j in T.unroll(VEC):
                        acc[j] = 0.0
                    for m in T.unroll(mhc):
                        for j in T.unroll(VEC):
                            acc[j] = acc[j] + mixes[u, m] * T.cast(xs[u, m, j], T.float32)
                    for j in T.unroll(VEC):
                        out[j] = T.cast(acc[j], T.bfloat16)
                    for j in T.vectorized(VEC):
                        o[token[u], col[u] * VEC + j] = out[j]

    return pre_apply_mix_fwd
