"""mHC norm-weight merge, backward, accumulating as TileKernels does:
fn_grad[i, k] += out_fn_grad[i, k] * normw[k]; normw_grad[k] += sum over i of out_fn_grad[i, k] * fn[i, k].

A thread owns one column k and walks the rows in order, the column sum starting from zero and added
to normw_grad once at the end. Both sizes are runtime values.
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import NORMW_MERGE_BWD

DECL = NORMW_MERGE_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128


def build(dtype: str):
    m = T.dynamic("m")
    n = T.dynamic("n")

    @T.prim_func
    def mhc_normw_merge_bwd(
        fn: T.Tensor[(m, n), T.float32],
        normw: T.Tensor[(n,), T.float32],
        out_fn_grad: T.Tensor[(m, n), T.float32],
        fn_grad: T.Tensor[(m, n), T.float32],
        normw_grad: T.Tensor[(n,), T.float32],
    ):
        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            k = block * THREADS + T.get_thread_binding()
            w = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            if k < n:
                w = normw[k]
                total = T.float32(0)
                for i in T.serial(m):
                    fn_grad[i, k] = fn_grad[i, k] + out_fn_grad[i, k] * w
                    total = total + out_fn_grad[i, k] * fn[i, k]
                normw_grad[k] = normw_grad[k] + total

    return mhc_normw_merge_bwd
