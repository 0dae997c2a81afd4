"""mHC Sinkhorn, forward, for Ascend: each token's (mhc, mhc) fp32 matrix becomes its row softmax plus eps, then a
column normalisation and repeat - 1 times a row and a column normalisation, each dividing by (sum + eps); `repeat`
and `eps` are runtime values.

A block copies TOKENS tokens' matrices into the Unified Buffer; in a SIMT region each thread takes one matrix into
registers and runs the CUDA kernel's steps on it (kernels_src/ascend/mhc_common.py sinkhorn: the same sums in the
same order); the matrices go back through the Unified Buffer.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import SINKHORN_FWD

DECL = SINKHORN_FWD
TOKENS = 64  # a SIMT thread each


def build(mhc_mult: int):
    mm = mhc_mult * mhc_mult
    a = mc.Args(mhc_mult)

    @T.prim_func
    def mhc_sinkhorn_fwd(comb_res_mix: a.comb_rows, comb_res_mix_out: a.comb_rows, repeat: T.int32, eps: T.float32):
        with T.Kernel(T.ceildiv(a.num_tokens, TOKENS)) as block:
            tile = T.alloc_shared((TOKENS, mm), T.float32)
            T.copy(comb_res_mix[block * TOKENS : (block + 1) * TOKENS, :], tile)
            with T.SimtVF(threads=TOKENS):
                matrix = T.alloc_local((mm,), T.float32)
                sums = T.alloc_local((mhc_mult,), T.float32)
                for i in T.Parallel(TOKENS):
                    mc.load_row(matrix, tile, i, mm)
                    mc.sinkhorn(matrix, sums, mhc_mult, repeat, eps)
                    mc.store_row(tile, i, matrix, mm)
            T.copy(tile, comb_res_mix_out[block * TOKENS : (block + 1) * TOKENS, :])

    return mhc_sinkhorn_fwd
