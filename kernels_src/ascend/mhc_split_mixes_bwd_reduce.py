"""mHC split mixes, backward, second launch, for Ascend: mhc_base_grad and mhc_scale_grad, each the sum of its
column of `partials` (mhc_split_mixes_bwd.py) in row order from zero, as kernels_src/mhc/split_mixes_bwd_reduce.py.

One block; SIMT thread k reads column k of the partials from global memory (their count is a runtime value) and
leaves its sum in the Unified Buffer, from where the two gradients go out.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import SPLIT_MIXES_BWD_REDUCE

DECL = SPLIT_MIXES_BWD_REDUCE


def build(mhc_mult: int):
    a = mc.Args(mhc_mult)
    mixes = a.mixes

    @T.prim_func
    def mhc_split_mixes_bwd_reduce(partials: mc.fp32(T.dynamic("num_partials"), mixes + 3), mhc_scale_grad: a.scale, mhc_base_grad: a.base):
        with T.Kernel(1) as _:
            base_ub = T.alloc_shared((mixes,), T.float32)
            scale_ub = T.alloc_shared((3,), T.float32)
            with T.SimtVF(threads=mc.THREADS):
                total = T.alloc_local((1,), T.float32)
                for k in T.Parallel(mc.THREADS):
                    if k < mixes + 3:
                        mc.add_splits(total, 0, partials, k)
                        if k < mixes:
                            base_ub[k] = total[0]
                        else:
                            scale_ub[k - mixes] = total[0]
            T.copy(base_ub, mhc_base_grad)
            T.copy(scale_ub, mhc_scale_grad)

    return mhc_split_mixes_bwd_reduce
