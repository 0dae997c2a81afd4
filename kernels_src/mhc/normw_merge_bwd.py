"""mHC norm-weight merge, backward, accumulating as TileKernels does:
fn_grad[i, k] += out_fn_grad[i, k] * normw[k]; normw_grad[k] += sum over i of out_fn_grad[i, k] * fn[i, k].

A thread owns `columns` columns (k, k + THREADS, ...; one as shipped) and walks the rows in order, each column's
sum starting from zero and added to normw_grad once at the end. Both sizes are runtime values. The rows go ROWS at a time: all their loads
are issued before the first product, so a thread waits for memory once a chunk, not once a row (m is 24 in
DeepSeek's models: 3 chunks; a row at a time spent 13 µs at 24 x 28672, waiting 24 times).
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import NORMW_MERGE_BWD

DECL = NORMW_MERGE_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
ROWS = 8  # rows a thread has in flight (H200, 24 x 28672: 5.85 us; 12 rows 6.81, 24 rows 6.84, one 12.99)
COLUMNS = 1  # columns a thread owns (TileKernels: 2, 256 a block of 128 threads; tuning candidates c2, c2r4)


def build(dtype: str, rows: int = ROWS, columns: int = COLUMNS):
    m = T.dynamic("m")
    n = T.dynamic("n")
    span = THREADS * columns  # columns a block

    def inside(first, c, n):
        """Whether the thread's column c is in range (the first is tested once for all)."""
        return True if c == 0 else first + c * THREADS < n

    @T.prim_func
    def mhc_normw_merge_bwd(
        fn: T.Tensor[(m, n), T.float32],
        normw: T.Tensor[(n,), T.float32],
        out_fn_grad: T.Tensor[(m, n), T.float32],
        fn_grad: T.Tensor[(m, n), T.float32],
        normw_grad: T.Tensor[(n,), T.float32],
    ):
        with T.Kernel(T.ceildiv(n, span), threads=THREADS) as block:
            kernel_entry()
            first = block * span + T.get_thread_binding()
            w = T.alloc_local((columns,), T.float32)
            total = T.alloc_local((columns,), T.float32)
            f = T.alloc_local((rows, columns), T.float32)
            g = T.alloc_local((rows, columns), T.float32)
            acc = T.alloc_local((rows, columns), T.float32)
            if first < n:  # the thread's first column; the others are tested where read (inside)
                for c in T.unroll(columns):
                    if inside(first, c, n):
                        w[c] = normw[first + c * THREADS]
                    total[c] = T.float32(0)
                for chunk in T.serial(T.ceildiv(m, rows)):
                    for r in T.unroll(rows):
                        for c in T.unroll(columns):
                            if chunk * rows + r < m and inside(first, c, n):
                                g[r, c] = out_fn_grad[chunk * rows + r, first + c * THREADS]
                                f[r, c] = fn[chunk * rows + r, first + c * THREADS]
                                acc[r, c] = fn_grad[chunk * rows + r, first + c * THREADS]
                    for r in T.unroll(rows):
                        for c in T.unroll(columns):
                            if chunk * rows + r < m and inside(first, c, n):
                                fn_grad[chunk * rows + r, first + c * THREADS] = acc[r, c] + g[r, c] * w[c]
                                total[c] = total[c] + g[r, c] * f[r, c]
                for c in T.unroll(columns):
                    if inside(first, c, n):
                        normw_grad[first + c * THREADS] = normw_grad[first + c * THREADS] + total[c]

    return mhc_normw_merge_bwd
