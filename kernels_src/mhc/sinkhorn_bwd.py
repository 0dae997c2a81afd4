"""mhc_sinkhorn backward: replay the forward (sinkhorn_fwd.py) from x, keeping each step's input matrix and
sums, then walk the steps back.

Where a matrix fits in a warp (mhc <= 5), one matrix element a lane (kernels_src/mhc/sinkhorn_lanes.py), as the
forward: each lane keeps its element of every step's input, and its line's denominator (sum + eps, one copy a
line), in shared memory (SHARED_RECORDS steps, every step up to 21 repeats; later steps go to `scratch`, the
denominators where the sums are), so the way back reduces only the products; the softmax output stays in a
register. The common repeat count (UNROLLED_REPEAT) runs an unrolled copy of the steps. Wider matrices keep one
thread per token, described below.

Step records go to `scratch`, (repeat, 2, num_tokens, row) fp32 allocated by the op: record (r, 0) holds the
softmax output for r = 0, else the matrix entering the r-th row normalisation and its row sums; record (r, 1)
the matrix entering the r-th column normalisation and its column sums. Each thread writes and reads back only
its own rows (a few dozen bytes a step, most of it still in L2), so `repeat` is a runtime value.

Back through y = x / (s + eps), s the sums over one axis: dx = (dy - sum(dy * x) / (s + eps)) / (s + eps)
along that axis; through the softmax p: dx = (dy - sum over the row of dy * p) * p. The products are rounded
before they are summed (__fmul_rn) and sums add in butterfly order, as in the forward.
"""

import tilelang.language as T

from kernels_src.mhc.common import WARP, tree_sum
from kernels_src.mhc.sinkhorn_fwd import normalise_cols, normalise_rows, per_thread_kernel, softmax_rows
from kernels_src.mhc.sinkhorn_lanes import add, lane_first_step, lane_layout, lane_reduce
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import SINKHORN_BWD
from tkaot._mhc.kernels import sinkhorn_record_row as record_row

DECL = SINKHORN_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

LANE_THREADS = 128  # one element a lane: 8 tokens a block at mhc 4 (H200: 28.0 us; 64 threads 27.8, within noise)
# Records (steps' input elements) a lane keeps in shared memory: 2 * (repeat - 1), so up to 21 repeats, in
# 20 KB a block of LANE_THREADS, and 5 KB of denominators: 25,600 bytes, so at most 8 blocks an SM (8192 tokens at
# mhc 4: 1024 blocks, one wave on 132 SMs). H200, 8192 x 4 x 4, 20 repeats: 16.61 us against 18.52 at 38 records
# (24,320 bytes: 9 blocks an SM), TileKernels 17.20; also timed, slower: a thread a matrix row (19.17-19.98), 2 tokens
# a lane (19.85-21.47), divisions without the IEEE slow-path branch (20.48-22.24), and the 38-record kernel without
# PDL (17.30) or without launch_dependents at entry (17.08) (f014b86:bench/results/2026-12-03-H200-s17-tune_sinkbwd9.log, by
# bench/tuning/tune_sinkbwd9.py as of commit d7ca7a9)
SHARED_RECORDS = 40
# The repeat count DeepSeek's models use: a copy of the steps unrolled for it. H200 (session 11, identical to
# TileKernels): 18.50 us, against 21.41 without the unrolled copy, 18.33 at 64 threads, 27.98 before; TileKernels 17.02
UNROLLED_REPEAT = 20


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


def _back_through(by_rows: bool):
    """The macro taking g back through a row (by_rows) or column normalisation, from its record in scratch."""
    half = 0 if by_rows else 1

    def line(i, k):
        return i if by_rows else k

    def cells(a, mhc: int):
        return [a * mhc + k for k in range(mhc)] if by_rows else [i * mhc + a for i in range(mhc)]

    @T.macro
    def back_through(g, scratch, rec, t, r, token, mhc: int, eps):
        for k in T.vectorized(record_row(mhc)):
            rec[k] = scratch[r, half, token, k]
        for a in T.unroll(mhc):
            t[a] = tree_sum([_mul(g[c], rec[c]) for c in cells(a, mhc)]) / (rec[mhc * mhc + a] + eps)
        for i in T.unroll(mhc):
            for k in T.unroll(mhc):
                g[i * mhc + k] = (g[i * mhc + k] - t[line(i, k)]) / (rec[mhc * mhc + line(i, k)] + eps)

    return back_through


back_through_rows, back_through_cols = _back_through(True), _back_through(False)


def build(mhc_mult: int, unrolled_repeat: int = UNROLLED_REPEAT):
    mhc = mhc_mult
    num_tokens = T.dynamic("num_tokens")
    repeat = T.dynamic("repeat")
    mm = mhc * mhc
    if mm <= WARP:
        body = _lanes_body(mhc, num_tokens, repeat, unrolled_repeat)
    else:
        body = _per_thread_body(mhc, num_tokens, repeat)

    @T.prim_func
    def sinkhorn_bwd(
        grad_output: T.Tensor[(num_tokens, mm), T.float32],
        x: T.Tensor[(num_tokens, mm), T.float32],
        grad_input: T.Tensor[(num_tokens, mm), T.float32],
        scratch: T.Tensor[(repeat, 2, num_tokens, record_row(mhc)), T.float32],
        eps: T.float32,
    ):
        body(grad_output, x, grad_input, scratch, eps)

    return sinkhorn_bwd


def _per_thread_body(mhc: int, num_tokens, repeat):
    """One thread a token (the module's docstring)."""
    mm = mhc * mhc
    row = record_row(mhc)

    @T.macro
    def tiles():
        m = T.alloc_local((mm,), T.float32)
        g = T.alloc_local((mm,), T.float32)
        sums = T.alloc_local((mhc,), T.float32)
        rec = T.alloc_local((row,), T.float32)
        return m, g, sums, rec

    @T.macro
    def finish(m, g, sums, rec, grad_output, grad_input, scratch, eps, token):
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

    @T.macro
    def body(grad_output, x, grad_input, scratch, eps):
        per_thread_kernel(num_tokens, mm, tiles, x, finish, (grad_output, grad_input, scratch, eps))

    return body


def _lanes_body(mhc: int, num_tokens, repeat, unrolled_repeat: int):
    """One matrix element a lane (the module's docstring); a `repeat` of unrolled_repeat (0: none) runs an
    unrolled copy of the steps, every record in shared memory at a fixed place."""
    mm = mhc * mhc
    group, per_block = lane_layout(mhc, LANE_THREADS)
    assert unrolled_repeat == 0 or 2 * (unrolled_repeat - 1) <= SHARED_RECORDS

    @T.macro
    def keep(records, denoms, scratch, m, d, r, half: int, tid, slot, line, token, e, live):
        """m becomes record (r, half), r >= 1: the input of step r's row (0) or column (1) normalisation, and d
        the denominator of its line."""
        if 2 * r - 2 + half < SHARED_RECORDS:
            records[2 * r - 2 + half, tid] = m[0]
            if e < mm:  # lanes past the matrix (mhc 3, 5) would write over line 0's
                denoms[2 * r - 2 + half, slot, line] = d[0]
        elif live:
            scratch[r, half, token, e] = m[0]
            scratch[r, half, token, mm + line] = d[0]

    @T.macro
    def fetch(records, denoms, scratch, m, d, r, half: int, tid, slot, line, token, e, live):
        m[0] = T.float32(0)
        d[0] = T.float32(1)
        if 2 * r - 2 + half < SHARED_RECORDS:
            m[0] = records[2 * r - 2 + half, tid]
            d[0] = denoms[2 * r - 2 + half, slot, line]
        elif live:
            m[0] = scratch[r, half, token, e]
            d[0] = scratch[r, half, token, mm + line]

    @T.macro
    def back_through(g, m, d, t, prod, first_lane, stride: int):
        """g = the gradient at the input m of a normalisation along the lines from first_lane, stride apart,
        d = the line's sum of m plus eps."""
        prod[0] = _mul(g[0], m[0])
        lane_reduce(t, prod[0], first_lane, mhc, stride, add)
        t[0] = t[0] / d[0]
        g[0] = (g[0] - t[0]) / d[0]

    @T.macro
    def steps(steps_loop, repeat, records, denoms, scratch, p, d0, m, d, g, t, prod, tid, slot, rline, cline, token, e,
              live, row, col, eps):  # fmt: skip
        """The forward replay from the first column normalisation's output in m, then the steps back."""
        for r in steps_loop(1, repeat):
            lane_reduce(d, m[0], row, mhc, 1, add)
            d[0] = d[0] + eps
            keep(records, denoms, scratch, m, d, r, 0, tid, slot, rline, token, e, live)
            m[0] = m[0] / d[0]
            lane_reduce(d, m[0], col, mhc, mhc, add)
            d[0] = d[0] + eps
            keep(records, denoms, scratch, m, d, r, 1, tid, slot, cline, token, e, live)
            m[0] = m[0] / d[0]
        for back in steps_loop(repeat):
            if back == repeat - 1:
                m[0] = p[0] + eps  # the first column normalisation's input
                d[0] = d0[0]
            else:
                fetch(records, denoms, scratch, m, d, repeat - 1 - back, 1, tid, slot, cline, token, e, live)
            back_through(g, m, d, t, prod, col, mhc)
            if back < repeat - 1:
                fetch(records, denoms, scratch, m, d, repeat - 1 - back, 0, tid, slot, rline, token, e, live)
                back_through(g, m, d, t, prod, row, 1)

    def unrolled(start, stop=None):
        return T.unroll(start, stop, explicit=True)

    @T.macro
    def body(grad_output, x, grad_input, scratch, eps):
        with T.Kernel(T.ceildiv(num_tokens, per_block), threads=LANE_THREADS) as block:
            kernel_entry()
            tid = T.get_thread_binding()
            e = tid % group  # the element (e // mhc, e % mhc) of token `token`
            slot = tid // group  # the token's place in the block
            token = block * per_block + slot
            live = token < num_tokens and e < mm
            first = tid % WARP - e  # the lane of the token's element 0
            row = first + e // mhc * mhc  # the lane of element 0 of this lane's row
            col = first + e % mhc  # and of its column
            rline = T.if_then_else(e < mm, e // mhc, 0)  # the lane's row, and column (lanes past the matrix: 0)
            cline = T.if_then_else(e < mm, e % mhc, 0)
            records = T.alloc_shared((SHARED_RECORDS, LANE_THREADS), T.float32)
            denoms = T.alloc_shared((SHARED_RECORDS, per_block, mhc), T.float32)
            p = T.alloc_local((1,), T.float32)  # the softmax output
            d0 = T.alloc_local((1,), T.float32)  # the first column normalisation's denominator
            m = T.alloc_local((1,), T.float32)  # the forward's matrix, then each step's input
            d = T.alloc_local((1,), T.float32)  # the denominator of m's line: its sum plus eps
            g = T.alloc_local((1,), T.float32)
            prod = T.alloc_local((1,), T.float32)
            t = T.alloc_local((1,), T.float32)

            # Every lane takes part in the shuffles; lanes past the tokens or the matrix work on zeros
            m[0] = T.float32(0)
            g[0] = T.float32(0)
            if live:
                m[0] = x[token, e]
                g[0] = grad_output[token, e]
            lane_first_step(m, d, p, d0, row, col, mhc, eps)
            if unrolled_repeat and repeat == unrolled_repeat:
                steps(unrolled, unrolled_repeat, records, denoms, scratch, p, d0, m, d, g, t, prod, tid, slot, rline,
                      cline, token, e, live, row, col, eps)  # fmt: skip
            else:
                steps(T.serial, repeat, records, denoms, scratch, p, d0, m, d, g, t, prod, tid, slot, rline, cline,
                      token, e, live, row, col, eps)  # fmt: skip
            prod[0] = _mul(g[0], p[0])
            lane_reduce(t, prod[0], row, mhc, 1, add)
            g[0] = (g[0] - t[0]) * p[0]
            if live:
                grad_input[token, e] = g[0]

    return body
