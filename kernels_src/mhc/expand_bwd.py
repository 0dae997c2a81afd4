"""expand_to_mhc backward: x_grad[t, :] = the sum over m of o_grad[t, m, :], added in fp32 in stream order
(from 0) and rounded once to bf16.

Vectors of 8 bf16 are numbered across (num_tokens, hidden) as in expand_fwd.py; each thread reads the mhc
vectors above one output vector, UNROLL outputs a thread.
"""

import tilelang.language as T

from kernels_src.mhc.common import VEC
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import EXPAND_BWD

DECL = EXPAND_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 256
UNROLL = 2


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")

    @T.prim_func
    def expand_bwd(
        o_grad: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        x_grad: T.Tensor[(num_tokens, hidden), T.bfloat16],
    ):
        with T.Kernel(T.ceildiv(num_tokens * (hidden // VEC), THREADS * UNROLL), threads=THREADS) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()
            T.assume(hidden % VEC == 0)
            T.assume(hidden > 0)
            tid = T.get_thread_binding()
            row_vecs = hidden // VEC
            grads = T.alloc_local((UNROLL, mhc, VEC), T.bfloat16)
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
                            grads[u, m, j] = o_grad[token[u], m, col[u] * VEC + j]
            for u in T.unroll(UNROLL):
                if token[u] < num_tokens:
                    T.assume(0 <= token[u] and 0 <= col[u] and col[u] < row_vecs)
                    for j in T.unroll(VEC):
                        acc[j] = 0.0
                    for m in T.unroll(mhc):
                        for j in T.unroll(VEC):
                            acc[j] = acc[j] + T.cast(grads[u, m, j], T.float32)
                    for j in T.unroll(VEC):
                        out[j] = T.cast(acc[j], T.bfloat16)
                    for j in T.vectorized(VEC):
                        x_grad[token[u], col[u] * VEC + j] = out[j]

    return expand_bwd
