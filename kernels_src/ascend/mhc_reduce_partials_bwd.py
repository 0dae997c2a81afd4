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

from kernels_src.ascend.mhc_common import THREADS
from tkaot._mhc.kernels import REDUCE_PARTIALS_BWD

DECL = REDUCE_PARTIALS_BWD
REQUIRES: dict[str, int] = {}
PAIRS = 256


def unsupported(dtype) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(dtype: str):
    num_tokens, n_rms_group, mhc_mult3 = T.dynamic("num_tokens"), T.dynamic("n_rms_group"), T.dynamic("mhc_mult3")

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
        T.assume(n_rms_group > 0)
        with T.Kernel(T.ceildiv(num_tokens * n_rms_group, PAIRS)) as block:
            grad_ub = T.alloc_shared((PAIRS,), T.float32)
            with T.SimtVF(threads=THREADS):
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
