"""mHC Sinkhorn, forward, for Ascend: each token's (mhc, mhc) fp32 matrix becomes its row softmax plus eps, then a
column normalisation and repeat - 1 times a row and a column normalisation, each dividing by (sum + eps); `repeat`
and `eps` are runtime values.

A block copies TOKENS tokens' matrices into the Unified Buffer; in a SIMT region each thread takes one matrix into
registers and runs the CUDA kernel's steps on it (kernels_src/ascend/mhc_common.py sinkhorn: the same sums in the
same order); the matrices go back through the Unified Buffer.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.mhc_common import every_value, load_row, sinkhorn, store_row
from tkaot._mhc.kernels import SINKHORN_FWD

DECL = SINKHORN_FWD
REQUIRES: dict[str, int] = {}
TOKENS = 64  # a SIMT thread each
unsupported = every_value


def build(mhc_mult: int):
    m, mm = mhc_mult, mhc_mult * mhc_mult
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def mhc_sinkhorn_fwd(
        comb_res_mix: T.Tensor[(num_tokens, mm), T.float32],
        comb_res_mix_out: T.Tensor[(num_tokens, mm), T.float32],
        repeat: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, TOKENS)) as block:
            first = block * TOKENS
            x_ub = T.alloc_shared((TOKENS, mm), T.float32)
            T.copy(comb_res_mix[first : first + TOKENS, :], x_ub)
            with T.SimtVF(threads=TOKENS):
                x = T.alloc_local((mm,), T.float32)
                sums = T.alloc_local((m,), T.float32)
                for i in T.Parallel(TOKENS):
                    load_row(x, x_ub, i, mm)
                    sinkhorn(x, sums, m, repeat, eps)
                    store_row(x_ub, i, x, mm)
            T.copy(x_ub, comb_res_mix_out[first : first + TOKENS, :])

    return mhc_sinkhorn_fwd
