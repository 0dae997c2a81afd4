"""expand_to_mhc backward: x_grad[t, :] = the sum over m of o_grad[t, m, :], added in fp32 in stream order
(from 0) and rounded once to bf16.

Vectors of 8 bf16 are numbered across (num_tokens, hidden) as in expand_fwd.py; each thread reads the mhc
vectors above one output vector, FLAT_UNROLL outputs a thread.
"""

import tilelang.language as T

from kernels_src.mhc.common import FLAT_UNROLL, VEC, flat_kernel, load_vec, row_dims, stream_sum_store
from tkaot._mhc.kernels import EXPAND_BWD

DECL = EXPAND_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens, hidden = row_dims()

    @T.macro
    def load(u, grads, acc, out, o_grad, x_grad, token, col):
        for m in T.unroll(mhc):
            load_vec(grads, (u, m), o_grad, (token[u], m, col[u]))

    @T.macro
    def finish(u, grads, acc, out, o_grad, x_grad, token, col):
        stream_sum_store(acc, out, grads, None, u, mhc, x_grad, (token[u], col[u]))

    @T.macro
    def tiles():
        grads = T.alloc_local((FLAT_UNROLL, mhc, VEC), T.bfloat16)
        acc = T.alloc_local((VEC,), T.float32)
        out = T.alloc_local((VEC,), T.bfloat16)
        return grads, acc, out

    @T.prim_func
    def expand_bwd(
        o_grad: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        x_grad: T.Tensor[(num_tokens, hidden), T.bfloat16],
    ):
        flat_kernel(num_tokens, hidden, tiles, load, finish, (o_grad, x_grad))

    return expand_bwd
