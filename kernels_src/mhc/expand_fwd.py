"""expand_to_mhc forward: o[t, m, :] = x[t, :] for each of the mhc streams.

The rows are read as 16-byte vectors of 8 bf16, numbered across the whole (num_tokens, hidden) input; each
thread copies FLAT_UNROLL of them, FLAT_THREADS apart (kernels_src/mhc/common.py flat_kernel; loads first, then
the mhc stores of each), so one cubin serves every token count and hidden size (a multiple of 8). Token and
column are found in 32-bit arithmetic (the op keeps num_tokens * hidden below 2**31).
"""

import tilelang.language as T

from kernels_src.mhc.common import FLAT_UNROLL, VEC, flat_kernel, load_vec, row_dims
from tkaot._mhc.kernels import EXPAND_FWD

DECL = EXPAND_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens, hidden = row_dims()

    @T.macro
    def load(u, reg, x, o, token, col):
        load_vec(reg, (u,), x, (token[u], col[u]))

    @T.macro
    def store(u, reg, x, o, token, col):
        for m in T.unroll(mhc):
            for j in T.vectorized(VEC):
                o[token[u], m, col[u] * VEC + j] = reg[u, j]

    @T.macro
    def tiles():
        reg = T.alloc_local((FLAT_UNROLL, VEC), T.bfloat16)
        return (reg,)

    @T.prim_func
    def expand_fwd(
        x: T.Tensor[(num_tokens, hidden), T.bfloat16],
        o: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
    ):
        flat_kernel(num_tokens, hidden, tiles, load, store, (x, o))

    return expand_fwd
