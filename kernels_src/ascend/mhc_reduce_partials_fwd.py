"""mHC split-K reduction + RMSNorm of the mixes, forward, for Ascend (as kernels_src/mhc/reduce_partials_fwd.py).

For each token t and RMS group k: sqrsum[t, k] and out_mul[t, k, :] are the sums over splits of sqrsum_splitted
and out_mul_splitted, in split order from zero; out[t, j] = the sum over k of out_mul[t, k, j] * rsqrt(sqrsum[t,
k] / rms_group_size + rms_eps), in group order from zero.

One SIMT thread an output (t, j), ELEMS a block, reading and writing global memory directly but for `out`, which
goes through the Unified Buffer; the split count, group count, mix count (mhc_mult3) and tokens are all runtime
values. Each thread sums its token's squares itself; the thread of j = 0 writes them.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from kernels_src.mhc.common import partial_dims
from tkaot._mhc.kernels import REDUCE_PARTIALS_FWD

DECL = REDUCE_PARTIALS_FWD
ELEMS = 1024


def build(dtype: str):
    n_splits = T.dynamic("n_splits")
    num_tokens, n_rms_group, mhc_mult3 = partial_dims()
    mixes, squares = (num_tokens, n_rms_group, mhc_mult3), (num_tokens, n_rms_group)  # of a split

    @T.prim_func
    def mhc_reduce_partials_fwd(
        out_mul_splitted: mc.fp32(n_splits, *mixes), sqrsum_splitted: mc.fp32(n_splits, *squares), out_mul: mc.fp32(*mixes),
        sqrsum: mc.fp32(*squares), out: mc.fp32(num_tokens, mhc_mult3), rms_group_size: T.float32, rms_eps: T.float32,
    ):  # fmt: skip
        T.assume(mhc_mult3 > 0)
        with T.Kernel(T.ceildiv(num_tokens * mhc_mult3, ELEMS)) as block:
            out_ub = T.alloc_shared((ELEMS,), T.float32)
            with T.SimtVF(threads=mc.THREADS):
                part = T.alloc_local((3,), T.float32)  # the squares, the mix, the normalised sum
                for e in T.Parallel(ELEMS):
                    if block * ELEMS + e < num_tokens * mhc_mult3:
                        t = (block * ELEMS + e) // mhc_mult3
                        j = (block * ELEMS + e) % mhc_mult3
                        part[2] = T.float32(0)
                        for k in T.serial(n_rms_group):
                            mc.add_splits(part, 0, sqrsum_splitted, t, k)
                            mc.add_splits(part, 1, out_mul_splitted, t, k, j)
                            if j == 0:
                                sqrsum[t, k] = part[0]
                            out_mul[t, k, j] = part[1]
                            part[2] = part[2] + part[1] * T.rsqrt(part[0] / rms_group_size + rms_eps)
                        out_ub[e] = part[2]
            # the outputs as one run (the view keeps the parameter's name, which the launch spec maps to the op's)
            out = T.Tensor((num_tokens * mhc_mult3,), T.float32, data=out.data)
            T.copy(out_ub, out[block * ELEMS : block * ELEMS + ELEMS])

    return mhc_reduce_partials_fwd
