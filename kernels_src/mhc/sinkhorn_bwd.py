"""mhc_sinkhorn backward, one thread per token: replay the forward (sinkhorn_fwd.py) from x, keeping each
step's input matrix and sums, then walk the steps back.

Step records go to `scratch`, (repeat, 2, num_tokens, row) fp32 allocated by the op: record (r, 0) holds the
softmax output for r = 0, else the matrix entering the r-th row normalisation and its row sums; record (r, 1)
the matrix entering the r-th column normalisation and its column sums. Each thread writes and reads back only
its own rows (a few dozen bytes a step, most of it still in L2), so `repeat` is a runtime value.

Back through y = x / (s + eps), s the sums over one axis: dx = (dy - sum(dy * x) / (s + eps)) / (s + eps)
along that axis; through the softmax p: dx = (dy - sum over the row of dy * p) * p. The products are rounded
before they are summed (__fmul_rn) and sums add in butterfly order, as in the forward.
"""

import tilelang.language as T

from kernels_src.mhc.common import tree_sum
from kernels_src.mhc.sinkhorn_fwd import normalise_cols, normalise_rows, softmax_rows
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import SINKHORN_BWD
from tkaot._mhc.kernels import sinkhorn_record_row as record_row

DECL = SINKHORN_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 64


def _mul(a, b):
    return T.call_extern("float32", "__fmul_rn", a, b)


@T.macro
def save(scratch, rec, x, sums, r, half, token, mhc: int):
    for k in T.unroll(mhc * mhc):
        rec[k] = x[k]
    for k in T.unroll(mhc):
        rec[mhc * mhc + k] = sums[k]
    for k in T.vectorized(record_row(mhc)):
        scratch[r, half, token, k] = rec[k]


@T.macro
def back_through_cols(g, scratch, rec, t, r, token, mhc: int, eps):
    for k in T.vectorized(record_row(mhc)):
        rec[k] = scratch[r, 1, token, k]
    for k in T.unroll(mhc):
        t[k] = tree_sum([_mul(g[i * mhc + k], rec[i * mhc + k]) for i in range(mhc)]) / (rec[mhc * mhc + k] + eps)
    for i in T.unroll(mhc):
        for k in T.unroll(mhc):
            g[i * mhc + k] = (g[i * mhc + k] - t[k]) / (rec[mhc * mhc + k] + eps)


@T.macro
def back_through_rows(g, scratch, rec, t, r, token, mhc: int, eps):
    for k in T.vectorized(record_row(mhc)):
        rec[k] = scratch[r, 0, token, k]
    for i in T.unroll(mhc):
        t[i] = tree_sum([_mul(g[i * mhc + k], rec[i * mhc + k]) for k in range(mhc)]) / (rec[mhc * mhc + i] + eps)
    for i in T.unroll(mhc):
        for k in T.unroll(mhc):
            g[i * mhc + k] = (g[i * mhc + k] - t[i]) / (rec[mhc * mhc + i] + eps)


def build(mhc_mult: int):
    mhc = mhc_mult  # streams a token
    num_tokens = T.dynamic("num_tokens")
    repeat = T.dynamic("repeat")
    mm = mhc * mhc
    row = record_row(mhc)

    @T.prim_func
    def sinkhorn_bwd(
        grad_output: T.Tensor[(num_tokens, mm), T.float32],
        x: T.Tensor[(num_tokens, mm), T.float32],
        grad_input: T.Tensor[(num_tokens, mm), T.float32],
        scratch: T.Tensor[(repeat, 2, num_tokens, row), T.float32],
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()
            tid = T.get_thread_binding()
            m = T.alloc_local((mm,), T.float32)
            g = T.alloc_local((mm,), T.float32)
            sums = T.alloc_local((mhc,), T.float32)
            rec = T.alloc_local((row,), T.float32)
            token = block * THREADS + tid
            if token < num_tokens:
                for k in T.vectorized(mm):
                    m[k] = x[token, k]
                for k in T.unroll(row):
                    rec[k] = 0.0
                softmax_rows(m, sums, mhc)
                save(scratch, rec, m, sums, 0, 0, token, mhc)
                for k in T.unroll(mm):
                    m[k] = m[k] + eps
                for k in T.unroll(mhc):
                    sums[k] = tree_sum([m[i * mhc + k] for i in range(mhc)])
                save(scratch, rec, m, sums, 0, 1, token, mhc)
                normalise_cols(m, sums, mhc, eps)
                for r in T.serial(repeat - 1):
                    for i in T.unroll(mhc):
                        sums[i] = tree_sum([m[i * mhc + k] for k in range(mhc)])
                    save(scratch, rec, m, sums, r + 1, 0, token, mhc)
                    normalise_rows(m, sums, mhc, eps)
                    for k in T.unroll(mhc):
                        sums[k] = tree_sum([m[i * mhc + k] for i in range(mhc)])
                    save(scratch, rec, m, sums, r + 1, 1, token, mhc)
                    normalise_cols(m, sums, mhc, eps)

                for k in T.vectorized(mm):
                    g[k] = grad_output[token, k]
                for back in T.serial(repeat):
                    back_through_cols(g, scratch, rec, sums, repeat - 1 - back, token, mhc, eps)
                    if back < repeat - 1:
                        back_through_rows(g, scratch, rec, sums, repeat - 1 - back, token, mhc, eps)
                for k in T.vectorized(row):
                    rec[k] = scratch[0, 0, token, k]
                for i in T.unroll(mhc):
                    sums[i] = tree_sum([_mul(g[i * mhc + k], rec[i * mhc + k]) for k in range(mhc)])
                for i in T.unroll(mhc):
                    for k in T.unroll(mhc):
                        g[i * mhc + k] = (g[i * mhc + k] - sums[i]) * rec[i * mhc + k]
                for k in T.vectorized(mm):
                    grad_input[token, k] = g[k]

    return sinkhorn_bwd
