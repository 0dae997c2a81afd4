"""mHC norm-weight merge, forward: out_fn[i, k] = fn[i, k] * normw[k] (folding an RMSNorm weight into the
(mhc_mult3, mhc_mult * hidden) mixing projection). Both sizes are runtime values; a thread takes
`VEC` elements a block-stride apart, so loads stay coalesced for any width.
"""

import tilelang.language as T

from kernels_src.mhc.common import normw_merge_fwd_kernel
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import NORMW_MERGE_FWD

DECL = NORMW_MERGE_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 256
VEC = 4  # elements a thread
SPAN = THREADS * VEC  # columns a block


def build(dtype: str):
    @T.macro
    def body(m, n, fn, normw, out_fn):
        with T.Kernel(T.ceildiv(n, SPAN), m, threads=THREADS) as (block, row):
            kernel_entry()
            for v in T.unroll(VEC):
                k = block * SPAN + v * THREADS + T.get_thread_binding()
                if k < n:
                    out_fn[row, k] = fn[row, k] * normw[k]

    return normw_merge_fwd_kernel(body)
