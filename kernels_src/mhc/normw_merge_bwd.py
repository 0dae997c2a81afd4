"""mHC norm-weight merge, backward, accumulating as TileKernels does:
fn_grad[i, k] += out_fn_grad[i, k] * normw[k]; normw_grad[k] += sum over i of out_fn_grad[i, k] * fn[i, k].

A thread owns one column k and walks the rows in order, the column sum starting from zero and added
to normw_grad once at the end. Both sizes are runtime values. The rows go ROWS at a time: all their loads
are issued before the first product, so a thread waits for memory once a chunk, not once a row (m is 24 in
DeepSeek's models: 3 chunks; a row at a time spent 13 µs at 24 x 28672, waiting 24 times).

With `ahead`, the next chunk's loads are issued before this chunk's stores (the compiler cannot move them
there itself: fn_grad may alias the inputs), so a thread waits about once for two chunks. Each element is still
read before the thread writes it, and the column sum adds in row order as before.
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import NORMW_MERGE_BWD

DECL = NORMW_MERGE_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
ROWS = 8  # rows a thread has in flight (H200, 24 x 28672: 5.85 us; 12 rows 6.81, 24 rows 6.84, one 12.99)
AHEAD = False  # the next chunk loaded before this chunk's stores (the module's docstring)


def build(dtype: str, rows: int = ROWS, ahead: bool = AHEAD):
    m = T.dynamic("m")
    n = T.dynamic("n")

    @T.macro
    def load_chunk(g, f, acc, out_fn_grad, fn, fn_grad, first, k):
        """Rows first .. first + rows (those below m) of column k: out_fn_grad's to g, fn's to f, fn_grad's to acc."""
        for r in T.unroll(rows):
            if first + r < m:
                g[r] = out_fn_grad[first + r, k]
                f[r] = fn[first + r, k]
                acc[r] = fn_grad[first + r, k]

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
            f = T.alloc_local((rows,), T.float32)
            g = T.alloc_local((rows,), T.float32)
            acc = T.alloc_local((rows,), T.float32)
            f_next = T.alloc_local((rows,), T.float32)
            g_next = T.alloc_local((rows,), T.float32)
            acc_next = T.alloc_local((rows,), T.float32)
            if k < n:
                w = normw[k]
                total = T.float32(0)
                if ahead:
                    load_chunk(g, f, acc, out_fn_grad, fn, fn_grad, 0, k)
                for chunk in T.serial(T.ceildiv(m, rows)):
                    if ahead:
                        if (chunk + 1) * rows < m:
                            load_chunk(g_next, f_next, acc_next, out_fn_grad, fn, fn_grad, (chunk + 1) * rows, k)
                    else:
                        load_chunk(g, f, acc, out_fn_grad, fn, fn_grad, chunk * rows, k)
                    for r in T.unroll(rows):
                        if chunk * rows + r < m:
                            fn_grad[chunk * rows + r, k] = acc[r] + g[r] * w
                            total = total + g[r] * f[r]
                    if ahead:
                        for r in T.unroll(rows):
                            g[r] = g_next[r]
                            f[r] = f_next[r]
                            acc[r] = acc_next[r]
                normw_grad[k] = normw_grad[k] + total

    return mhc_normw_merge_bwd
