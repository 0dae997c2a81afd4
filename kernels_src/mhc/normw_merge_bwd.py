"""mHC norm-weight merge, backward, accumulating as TileKernels does:
fn_grad[i, k] += out_fn_grad[i, k] * normw[k]; normw_grad[k] += sum over i of out_fn_grad[i, k] * fn[i, k].

A thread owns one column k and walks the rows in order, the column sum starting from zero and added
to normw_grad once at the end. Both sizes are runtime values. The rows go ROWS at a time: all their loads
are issued before the first product, so a thread waits for memory once a chunk, not once a row (m is 24 in
DeepSeek's models: 3 chunks; a row at a time spent 13 µs at 24 x 28672, waiting 24 times).
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import NORMW_MERGE_BWD

DECL = NORMW_MERGE_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
ROWS = 8  # rows a thread has in flight (H200, 24 x 28672: 5.85 us; 12 rows 6.81, 24 rows 6.84, one 12.99)


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
            kernel_entry()
            k = block * THREADS + T.get_thread_binding()
            w = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            f = T.alloc_local((ROWS,), T.float32)
            g = T.alloc_local((ROWS,), T.float32)
            acc = T.alloc_local((ROWS,), T.float32)
            if k < n:
                w = normw[k]
                total = T.float32(0)
                for chunk in T.serial(T.ceildiv(m, ROWS)):
                    for r in T.unroll(ROWS):
                        if chunk * ROWS + r < m:
                            g[r] = out_fn_grad[chunk * ROWS + r, k]
                            f[r] = fn[chunk * ROWS + r, k]
                            acc[r] = fn_grad[chunk * ROWS + r, k]
                    for r in T.unroll(ROWS):
                        if chunk * ROWS + r < m:
                            fn_grad[chunk * ROWS + r, k] = acc[r] + g[r] * w
                            total = total + g[r] * f[r]
                normw_grad[k] = normw_grad[k] + total

    return mhc_normw_merge_bwd
