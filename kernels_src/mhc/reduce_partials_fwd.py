"""mHC split-K reduction + RMSNorm of the mixes, forward.

For each token t and RMS group k: sqrsum[t, k] = sum over splits of sqrsum_splitted, out_mul[t, k, :] =
sum over splits of out_mul_splitted, both in split order from zero; then
out[t, j] = sum over k of out_mul[t, k, j] * rsqrt(sqrsum[t, k] / rms_group_size + rms_eps).

One thread a (token, j) output, flattened, so the split count, group count, mix count (mhc_mult3) and
tokens are all runtime values; each thread of a token sums the (cached) squared sums itself.
"""

import tilelang.language as T

from kernels_src.mhc.common import partial_dims
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import REDUCE_PARTIALS_FWD

DECL = REDUCE_PARTIALS_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128


def build(dtype: str):
    n_splits = T.dynamic("n_splits")
    num_tokens, n_rms_group, mhc_mult3 = partial_dims()

    @T.prim_func
    def mhc_reduce_partials_fwd(
        out_mul_splitted: T.Tensor[(n_splits, num_tokens, n_rms_group, mhc_mult3), T.float32],
        sqrsum_splitted: T.Tensor[(n_splits, num_tokens, n_rms_group), T.float32],
        out_mul: T.Tensor[(num_tokens, n_rms_group, mhc_mult3), T.float32],
        sqrsum: T.Tensor[(num_tokens, n_rms_group), T.float32],
        out: T.Tensor[(num_tokens, mhc_mult3), T.float32],
        rms_group_size: T.float32,
        rms_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * mhc_mult3, THREADS), threads=THREADS) as block:
            kernel_entry()
            T.assume(mhc_mult3 > 0)
            e = block * THREADS + T.get_thread_binding()
            total = T.alloc_var(T.float32)
            squares = T.alloc_var(T.float32)
            mix = T.alloc_var(T.float32)
            if e < num_tokens * mhc_mult3:
                t = e // mhc_mult3
                j = e % mhc_mult3
                total = T.float32(0)
                for k in T.serial(n_rms_group):
                    squares = T.float32(0)
                    for split in T.serial(n_splits):
                        squares = squares + sqrsum_splitted[split, t, k]
                    if j == 0:
                        sqrsum[t, k] = squares
                    mix = T.float32(0)
                    for split in T.serial(n_splits):
                        mix = mix + out_mul_splitted[split, t, k, j]
                    out_mul[t, k, j] = mix
                    total = total + mix * T.rsqrt(squares / rms_group_size + rms_eps)
                out[t, j] = total

    return mhc_reduce_partials_fwd
