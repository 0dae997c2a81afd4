"""RMSNorm backward, pass 2: weight_grad = sum of the partial rows (+ weight_grad's own values), in a fixed order.

partials is (num_partials, hidden) fp32, one row per block of pass 1 (kernels_src/norm/rmsnorm_backward.py).
A block of ROW_GROUPS x COL_THREADS threads covers COL_THREADS * VEC columns: row group k adds partial rows k,
k + ROW_GROUPS, ... in order, then thread k of the block adds column k's row group sums in order through shared
memory. The order of a column's sum depends on ROW_GROUPS alone, so the block's width only sets the grid: 32
columns a block give 224 blocks at 7168 (128 columns gave 56 blocks on 132 SMs, each reading 264 partial rows). With
`accumulate`, the fp32 value of weight_grad's element is added last; the sum is rounded to weight_grad's
dtype. Partial count and hidden are runtime values (hidden a multiple of VEC).
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._quant.kernels import WEIGHT_GRAD_REDUCE

DECL = WEIGHT_GRAD_REDUCE  # the declaration this module builds (tkaot/_quant/kernels.py)

ROW_GROUPS = 8
COL_THREADS = 8  # threads of a row group (a block of 64 threads)
VEC = 4  # fp32 columns a thread: one 16-byte load a partial row


def build(dtype: str):
    cols_per_block = COL_THREADS * VEC
    num_partials = T.dynamic("num_partials")
    hidden = T.dynamic("hidden")

    @T.prim_func
    def weight_grad_reduce(
        partials: T.Tensor[(num_partials, hidden), T.float32],
        weight_grad: T.Tensor[(hidden,), dtype],
        accumulate: T.int32,
    ):
        with T.Kernel(T.ceildiv(hidden, cols_per_block), threads=ROW_GROUPS * COL_THREADS) as block:
            kernel_entry()
            T.assume(hidden % VEC == 0)
            tid = T.get_thread_binding()
            group = tid // COL_THREADS
            col = block * cols_per_block + (tid % COL_THREADS) * VEC
            acc = T.alloc_local((VEC,), T.float32)
            part = T.alloc_local((VEC,), T.float32)
            sums = T.alloc_shared((ROW_GROUPS, cols_per_block), T.float32)
            for j in T.unroll(VEC):
                acc[j] = 0.0
            if col < hidden:
                for p in T.serial(T.ceildiv(num_partials - group, ROW_GROUPS)):
                    for j in T.vectorized(VEC):
                        part[j] = partials[p * ROW_GROUPS + group, col + j]
                    for j in T.unroll(VEC):
                        acc[j] += part[j]
            for j in T.vectorized(VEC):
                sums[group, (tid % COL_THREADS) * VEC + j] = acc[j]
            T.sync_threads()
            if tid < cols_per_block and block * cols_per_block + tid < hidden:
                total = T.alloc_var(T.float32, init=sums[0, tid])
                for k in T.unroll(1, ROW_GROUPS):
                    total += sums[k, tid]
                if accumulate != 0:
                    total += T.cast(weight_grad[block * cols_per_block + tid], T.float32)
                weight_grad[block * cols_per_block + tid] = T.cast(total, dtype)

    return weight_grad_reduce
