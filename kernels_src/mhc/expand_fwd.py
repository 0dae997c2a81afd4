"""expand_to_mhc forward: o[t, m, :] = x[t, :] for each of the mhc streams.

The rows are read as 16-byte vectors of 8 bf16, numbered across the whole (num_tokens, hidden) input; each
thread copies UNROLL of them, THREADS apart (loads first, then the mhc stores of each), so one cubin serves
every token count and hidden size (a multiple of 8). Token and column are found in 32-bit arithmetic (the op
keeps num_tokens * hidden below 2**31).
"""

import tilelang.language as T

from kernels_src.mhc.common import VEC
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import EXPAND_FWD

DECL = EXPAND_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 256
UNROLL = 2


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")

    @T.prim_func
    def expand_fwd(
        x: T.Tensor[(num_tokens, hidden), T.bfloat16],
        o: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
    ):
        with T.Kernel(T.ceildiv(num_tokens * (hidden // VEC), THREADS * UNROLL), threads=THREADS) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()
            T.assume(hidden % VEC == 0)
            T.assume(hidden > 0)
            tid = T.get_thread_binding()
            row_vecs = hidden // VEC
            reg = T.alloc_local((UNROLL, VEC), T.bfloat16)
            token = T.alloc_local((UNROLL,), T.int32)
            col = T.alloc_local((UNROLL,), T.int32)
            for u in T.unroll(UNROLL):
                v = (block * UNROLL + u) * THREADS + tid
                token[u] = v // row_vecs
                col[u] = v % row_vecs
                if token[u] < num_tokens:
                    T.assume(0 <= token[u] and 0 <= col[u] and col[u] < row_vecs)
                    for j in T.vectorized(VEC):
                        reg[u, j] = x[token[u], col[u] * VEC + j]
            for u in T.unroll(UNROLL):
                if token[u] < num_tokens:
                    T.assume(0 <= token[u] and 0 <= col[u] and col[u] < row_vecs)
                    for m in T.unroll(mhc):
                        for j in T.vectorized(VEC):
                            o[token[u], m, col[u] * VEC + j] = reg[u, j]

    return expand_fwd
