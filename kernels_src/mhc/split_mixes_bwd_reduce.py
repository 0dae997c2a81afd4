"""mhc_pre_split_mixes backward, second launch: mhc_base_grad and mhc_scale_grad, each the sum of its column of
`partials` (split_mixes_bwd.py) in row order, so the result depends only on the token count, not on the GPU.
A thread loads ROWS rows of its column before adding them, so it waits for memory once for up to ROWS rows
(the op makes at most 256; 64 at 8192 tokens), not once a row."""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import SPLIT_MIXES_BWD_REDUCE

DECL = SPLIT_MIXES_BWD_REDUCE  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
ROWS = 64  # partial rows a thread has in flight


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_partials = T.dynamic("num_partials")
    mixes = mhc * (mhc + 2)
    sums = mixes + 3

    @T.prim_func
    def split_mixes_bwd_reduce(
        partials: T.Tensor[(num_partials, sums), T.float32],
        mhc_scale_grad: T.Tensor[(3,), T.float32],
        mhc_base_grad: T.Tensor[(mixes,), T.float32],
    ):
        with T.Kernel(1, threads=THREADS) as _:
            kernel_entry()
            tid = T.get_thread_binding()
            total = T.alloc_var(T.float32)
            rows = T.alloc_local((ROWS,), T.float32)
            for k0 in T.serial(T.ceildiv(sums, THREADS)):
                k = k0 * THREADS + tid
                if k < sums:
                    total = 0.0
                    for chunk in T.serial(T.ceildiv(num_partials, ROWS)):
                        for r in T.unroll(ROWS):
                            if chunk * ROWS + r < num_partials:
                                rows[r] = partials[chunk * ROWS + r, k]
                        for r in T.unroll(ROWS):
                            if chunk * ROWS + r < num_partials:
                                total = total + rows[r]
                    if k < mixes:
                        mhc_base_grad[k] = total
                    else:
                        mhc_scale_grad[k - mixes] = total

    return split_mixes_bwd_reduce
