"""mHC split-K reduction + RMSNorm of the mixes, backward.

With r = rsqrt(sqrsum[t, k] / rms_group_size + rms_eps): out_mul_grad[t, k, j] = out_grad[t, j] * r and
sqrsum_grad[t, k] = (sum over j of out_grad[t, j] * out_mul[t, k, j]) * r / (sqrsum[t, k] + rms_eps_sum) / -2,
where rms_eps_sum = rms_eps * rms_group_size (rounded once, from double, by the op).

One warp a (token, group) pair: lane j takes mixes j, j + 32, ...; the warp sums by xor shuffles 16, 8,
4, 2, 1 apart. Every size is a runtime value.
"""

import tilelang.language as T

from kernels_src.mhc.common import partial_dims
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import REDUCE_PARTIALS_BWD

DECL = REDUCE_PARTIALS_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

WARPS = 4


def build(dtype: str):
    num_tokens, n_rms_group, mhc_mult3 = partial_dims()

    @T.prim_func
    def mhc_reduce_partials_bwd(
        out_grad: T.Tensor[(num_tokens, mhc_mult3), T.float32],
        out_mul: T.Tensor[(num_tokens, n_rms_group, mhc_mult3), T.float32],
        sqrsum: T.Tensor[(num_tokens, n_rms_group), T.float32],
        out_mul_grad: T.Tensor[(num_tokens, n_rms_group, mhc_mult3), T.float32],
        sqrsum_grad: T.Tensor[(num_tokens, n_rms_group), T.float32],
        rms_group_size: T.float32,
        rms_eps: T.float32,
        rms_eps_sum: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * n_rms_group, WARPS), threads=WARPS * 32) as block:
            kernel_entry()
            T.assume(n_rms_group > 0)
            tid = T.get_thread_binding()
            lane = tid % 32
            pair = block * WARPS + tid // 32
            squares = T.alloc_var(T.float32)
            r = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            grad = T.alloc_var(T.float32)
            if pair < num_tokens * n_rms_group:  # whole warps take this branch: the shuffles below are warp-uniform
                t = pair // n_rms_group
                k = pair % n_rms_group
                squares = sqrsum[t, k]
                r = T.rsqrt(squares / rms_group_size + rms_eps)
                total = T.float32(0)
                for i in T.serial(T.ceildiv(mhc_mult3 - lane, 32)):
                    j = lane + i * 32
                    grad = out_grad[t, j]
                    out_mul_grad[t, k, j] = grad * r
                    total = total + grad * out_mul[t, k, j]
                for step in T.unroll(5):
                    total = total + T.shfl_xor(total, 16 >> step)
                if lane == 0:
                    sqrsum_grad[t, k] = total * r / (squares + rms_eps_sum) / T.float32(-2)

    return mhc_reduce_partials_bwd
