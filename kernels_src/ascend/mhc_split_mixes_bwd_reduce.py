"""mHC split mixes, backward, second launch, for Ascend: mhc_base_grad and mhc_scale_grad, each the sum of its
column of `partials` (mhc_split_mixes_bwd.py) in row order from zero, as kernels_src/mhc/split_mixes_bwd_reduce.py.

One block; SIMT thread k reads column k of the partials from global memory (their count is a runtime value) and
leaves its sum in the Unified Buffer, from where the two gradients go out.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.mhc_common import THREADS, add_splits, every_value
from tkaot._mhc.kernels import SPLIT_MIXES_BWD_REDUCE

DECL = SPLIT_MIXES_BWD_REDUCE
REQUIRES: dict[str, int] = {}
unsupported = every_value


def build(mhc_mult: int):
    mixes = mhc_mult * (mhc_mult + 2)
    num_partials = T.dynamic("num_partials")

    @T.prim_func
    def mhc_split_mixes_bwd_reduce(
        partials: T.Tensor[(num_partials, mixes + 3), T.float32],
        mhc_scale_grad: T.Tensor[(3,), T.float32],
        mhc_base_grad: T.Tensor[(mixes,), T.float32],
    ):
        with T.Kernel(1) as _:
            base_ub = T.alloc_shared((mixes,), T.float32)
            scale_ub = T.alloc_shared((3,), T.float32)
            with T.SimtVF(threads=THREADS):
                total = T.alloc_local((1,), T.float32)
                for k in T.Parallel(THREADS):
                    if k < mixes + 3:
                        add_splits(total, 0, partials, k)
                        if k < mixes:
                            base_ub[k] = total[0]
                        else:
                            scale_ub[k - mixes] = total[0]
            T.copy(base_ub, mhc_base_grad)
            T.copy(scale_ub, mhc_scale_grad)

    return mhc_split_mixes_bwd_reduce
