"""mHC norm-weight merge, backward, accumulating as TileKernels does:
fn_grad[i, k] += out_fn_grad[i, k] * normw[k]; normw_grad[k] += sum over i of out_fn_grad[i, k] * fn[i, k].

A block owns COLS columns with GROUPS groups of COLS threads, a thread one column of its group's rows: the rows
go a chunk of GROUPS * ROWS at a time, group j loading rows j * ROWS .. of the chunk, every load issued before
the first product (m is 24 in DeepSeek's models: one chunk, the whole column in flight, one wait for memory).
The column sum starts from zero and is added in row order by the first group, the other groups' products passing
through shared memory, and reaches normw_grad once at the end. Both sizes are runtime values.
"""

import tilelang.language as T

from kernels_src.mhc.common import normw_merge_bwd_kernel
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import NORMW_MERGE_BWD

DECL = NORMW_MERGE_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

# H200, 24 x 28672: 4 groups of 6 rows, 128 columns a block: 5.29 us (TileKernels 5.30); a thread a column with
# 8-row chunks 5.66, 6 groups of 4 rows 5.31, 3 of 8 (32 columns) 6.22, 2 of 12 5.72
GROUPS = 4
ROWS = 6  # rows a thread has in flight
COLS = 128  # columns a block
THREADS = GROUPS * COLS
CHUNK_ROWS = GROUPS * ROWS


def build(dtype: str):
    @T.macro
    def body(m, n, fn, normw, out_fn_grad, fn_grad, normw_grad):
        with T.Kernel(T.ceildiv(n, COLS), threads=THREADS) as block:
            kernel_entry()
            tid = T.get_thread_binding()
            group = tid // COLS
            c = tid % COLS
            k = block * COLS + c
            w = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            f = T.alloc_local((ROWS,), T.float32)
            g = T.alloc_local((ROWS,), T.float32)
            acc = T.alloc_local((ROWS,), T.float32)
            shared_g = T.alloc_shared((GROUPS, ROWS, COLS), T.float32)
            shared_f = T.alloc_shared((GROUPS, ROWS, COLS), T.float32)
            w = T.float32(0)
            if k < n:
                w = normw[k]
            total = T.float32(0)
            for chunk in T.serial(T.ceildiv(m, CHUNK_ROWS)):
                for r in T.unroll(ROWS):
                    if k < n and chunk * CHUNK_ROWS + group * ROWS + r < m:
                        g[r] = out_fn_grad[chunk * CHUNK_ROWS + group * ROWS + r, k]
                        f[r] = fn[chunk * CHUNK_ROWS + group * ROWS + r, k]
                        acc[r] = fn_grad[chunk * CHUNK_ROWS + group * ROWS + r, k]
                for r in T.unroll(ROWS):
                    if k < n and chunk * CHUNK_ROWS + group * ROWS + r < m:
                        fn_grad[chunk * CHUNK_ROWS + group * ROWS + r, k] = acc[r] + g[r] * w
                        if group > 0:
                            shared_g[group, r, c] = g[r]
                            shared_f[group, r, c] = f[r]
                T.sync_threads()
                # the column sum in row order: the first group's rows from its registers, the others' from shared
                if group == 0 and k < n:
                    for r in T.unroll(ROWS):
                        if chunk * CHUNK_ROWS + r < m:
                            total = total + g[r] * f[r]
                    for j in T.unroll(1, GROUPS):
                        for r in T.unroll(ROWS):
                            if chunk * CHUNK_ROWS + j * ROWS + r < m:
                                total = total + shared_g[j, r, c] * shared_f[j, r, c]
                T.sync_threads()
            if group == 0 and k < n:
                normw_grad[k] = normw_grad[k] + total

    return normw_merge_bwd_kernel(body)
