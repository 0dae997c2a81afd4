"""mHC split-K reduction + RMSNorm of the mixes, backward, for Ascend (as kernels_src/mhc/reduce_partials_bwd.py).

With r = rsqrt(sqrsum[t, k] / rms_group_size + rms_eps): out_mul_grad[t, k, j] = out_grad[t, j] * r and
sqrsum_grad[t, k] = (the sum over j of out_grad[t, j] * out_mul[t, k, j]) * r / (sqrsum[t, k] + rms_eps_sum) / -2,
where rms_eps_sum = rms_eps * rms_group_size (rounded once by the op).

One SIMT thread a (token, group) pair, PAIRS a block, reading and writing global memory directly (sqrsum_grad goes
through the Unified Buffer); it sums over j
in order from zero (the CUDA kernel spreads j over a warp, so its sum may differ in the last bits). Every size is
a runtime value.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from kernels_src.mhc.common import partial_dims
from tkaot._mhc.kernels import REDUCE_PARTIALS_BWD

DECL = REDUCE_PARTIALS_BWD
PAIRS = 256


def build(dtype: str):
    num_tokens, n_rms_group, mhc_mult3 = partial_dims()
    groups = mc.fp32(num_tokens, n_rms_group, mhc_mult3)  # the mixes of each RMS group

    @T.prim_func
    def mhc_reduce_partials_bwd(
        out_grad: mc.fp32(num_tokens, mhc_mult3), out_mul: groups, sqrsum: mc.fp32(num_tokens, n_rms_group), out_mul_grad: groups,
        sqrsum_grad: mc.fp32(num_tokens, n_rms_group), rms_group_size: T.float32, rms_eps: T.float32, rms_eps_sum: T.float32,
    ):  # fmt: skip
        T.assume(n_rms_group > 0)
        with T.Kernel(T.ceildiv(num_tokens * n_rms_group, PAIRS)) as block:
            grad_ub = T.alloc_shared((PAIRS,), T.float32)
            with T.SimtVF(threads=mc.THREADS):
                r = T.alloc_var(T.float32)
                dot = T.alloc_var(T.float32)
                for p in T.Parallel(PAIRS):
                    if block * PAIRS + p < num_tokens * n_rms_group:
                        t = (block * PAIRS + p) // n_rms_group
                        k = (block * PAIRS + p) % n_rms_group
                        r = T.rsqrt(sqrsum[t, k] / rms_group_size + rms_eps)
                        dot = T.float32(0)
                        for j in T.serial(mhc_mult3):
                            out_mul_grad[t, k, j] = out_grad[t, j] * r
                            dot = dot + out_grad[t, j] * out_mul[t, k, j]
                        grad_ub[p] = dot * r / (sqrsum[t, k] + rms_eps_sum) / T.float32(-2)
            # the pairs' gradients as one run (the view keeps the parameter's name, which the launch spec maps to the op's)
            sqrsum_grad = T.Tensor((num_tokens * n_rms_group,), T.float32, data=sqrsum_grad.data)
            T.copy(grad_ub, sqrsum_grad[block * PAIRS : block * PAIRS + PAIRS])

    return mhc_reduce_partials_bwd
