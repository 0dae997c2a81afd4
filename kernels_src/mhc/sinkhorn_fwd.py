"""mhc_sinkhorn forward of each token's (mhc, mhc) fp32 matrix:
  x = softmax over each row (max subtracted, exp, divided by the row sum) + eps
  x = x / (column sums + eps)
  then repeat - 1 times: x = x / (row sums + eps); x = x / (column sums + eps)
`repeat` and `eps` are runtime values. Every row or column sum adds in butterfly order
(kernels_src/mhc/common.py tree_sum), the order TileLang's all-reduce uses when a matrix is spread one
element a thread, so results match such kernels bit for bit; exp is expf, divisions are IEEE.

Where a matrix fits in a warp (mhc <= 5), one matrix element a lane (kernels_src/mhc/sinkhorn_lanes.py): an
IEEE division's code ends in a branch to its slow path, so a thread's divisions run one after another and
only many threads hide their latency (a thread per token left 2 warps an SM at 8192 tokens, 3.6x slower).
Wider matrices keep one thread per token, the matrix in its registers.
"""

import tilelang.language as T

from kernels_src.mhc.common import WARP, tree_sum
from kernels_src.mhc.sinkhorn_lanes import add, lane_first_step, lane_layout, lane_reduce
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import SINKHORN_FWD

DECL = SINKHORN_FWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 64  # one thread a token: few tokens a block, so that 8192 tokens reach every SM
# One element a lane: 16 tokens a block at mhc 4 (H200, 8192 tokens: 5.14 us; 128 threads 5.34, 64 threads 5.39)
LANE_THREADS = 256


def row_sum(x, i, mhc: int):
    return tree_sum([x[i * mhc + k] for k in range(mhc)])


def col_sum(x, k, mhc: int):
    return tree_sum([x[i * mhc + k] for i in range(mhc)])


def _line(i, k, rows: bool):
    """The line of element (i, k): its row, or its column."""
    return i if rows else k


@T.macro
def normalise_lines(x, sums, mhc: int, eps, rows: bool):
    """x's rows (rows) or columns divided by their sums plus eps."""
    if rows:
        for i in T.unroll(mhc):
            sums[i] = row_sum(x, i, mhc)
    else:
        for k in T.unroll(mhc):
            sums[k] = col_sum(x, k, mhc)
    for i in T.unroll(mhc):
        for k in T.unroll(mhc):
            x[i * mhc + k] = x[i * mhc + k] / (sums[_line(i, k, rows)] + eps)


@T.macro
def normalise_rows(x, sums, mhc: int, eps):
    normalise_lines(x, sums, mhc, eps, True)


@T.macro
def normalise_cols(x, sums, mhc: int, eps):
    normalise_lines(x, sums, mhc, eps, False)


@T.macro
def softmax_rows(x, sums, mhc: int):
    """x's rows become their softmax: exp of (x - row max), divided by the row's sum."""
    for i in T.unroll(mhc):
        sums[i] = x[i * mhc]
        for k in T.unroll(mhc - 1):
            sums[i] = T.max(sums[i], x[i * mhc + k + 1])
    for i in T.unroll(mhc):
        for k in T.unroll(mhc):
            x[i * mhc + k] = T.exp(x[i * mhc + k] - sums[i])
    for i in T.unroll(mhc):
        sums[i] = row_sum(x, i, mhc)
    for i in T.unroll(mhc):
        for k in T.unroll(mhc):
            x[i * mhc + k] = x[i * mhc + k] / sums[i]


@T.macro
def sinkhorn(x, sums, mhc: int, repeat, eps):
    """One thread's Sinkhorn of the (mhc, mhc) matrix x (local, row-major), in place: a row softmax plus eps, a
    column normalisation, then repeat - 1 times a row and a column normalisation, each dividing by (sum + eps)
    (this kernel's one-thread form and the Ascend kernels', kernels_src/ascend/mhc_common.py)."""
    softmax_rows(x, sums, mhc)
    for k in T.unroll(mhc * mhc):
        x[k] = x[k] + eps
    normalise_cols(x, sums, mhc, eps)
    for _ in T.serial(repeat - 1):
        normalise_rows(x, sums, mhc, eps)
        normalise_cols(x, sums, mhc, eps)


def build(mhc_mult: int):
    mhc = mhc_mult
    num_tokens = T.dynamic("num_tokens")
    mm = mhc * mhc
    body = (_lanes_body if mm <= WARP else _per_thread_body)(mhc, num_tokens)

    @T.prim_func
    def sinkhorn_fwd(
        comb_res_mix: T.Tensor[(num_tokens, mm), T.float32],
        comb_res_mix_out: T.Tensor[(num_tokens, mm), T.float32],
        repeat: T.int32,
        eps: T.float32,
    ):
        body(comb_res_mix, comb_res_mix_out, repeat, eps)

    return sinkhorn_fwd


@T.macro
def per_thread_kernel(num_tokens, mm: int, tiles, source, body, args):
    """One thread a token, THREADS a block: tiles() allocates the thread's local tiles, the first the token's (mm,)
    matrix, loaded from source[token]; then body(*tiles, *args, token) for a token in range."""
    with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as block:
        kernel_entry()
        tid = T.get_thread_binding()
        bufs = tiles()
        token = block * THREADS + tid
        if token < num_tokens:
            for k in T.vectorized(mm):
                bufs[0][k] = source[token, k]
            body(*bufs, *args, token)


def _per_thread_body(mhc: int, num_tokens):
    """One thread a token (the module's docstring)."""
    mm = mhc * mhc

    @T.macro
    def tiles():
        x = T.alloc_local((mm,), T.float32)
        sums = T.alloc_local((mhc,), T.float32)
        return x, sums

    @T.macro
    def finish(x, sums, comb_res_mix_out, repeat, eps, token):
        sinkhorn(x, sums, mhc, repeat, eps)
        for k in T.vectorized(mm):
            comb_res_mix_out[token, k] = x[k]

    @T.macro
    def body(comb_res_mix, comb_res_mix_out, repeat, eps):
        per_thread_kernel(num_tokens, mm, tiles, comb_res_mix, finish, (comb_res_mix_out, repeat, eps))

    return body


def _lanes_body(mhc: int, num_tokens):
    """One matrix element a lane, row and column sums by shuffles (kernels_src/mhc/sinkhorn_lanes.py)."""
    mm = mhc * mhc
    group, per_block = lane_layout(mhc, LANE_THREADS)

    @T.macro
    def body(comb_res_mix, comb_res_mix_out, repeat, eps):
        with T.Kernel(T.ceildiv(num_tokens, per_block), threads=LANE_THREADS) as block:
            kernel_entry()
            tid = T.get_thread_binding()
            e = tid % group  # the element (e // mhc, e % mhc) of token `token`
            token = block * per_block + tid // group
            first = tid % WARP - e  # the lane of the token's element 0
            row = first + e // mhc * mhc  # the lane of element 0 of this lane's row
            col = first + e % mhc  # and of its column
            x = T.alloc_local((1,), T.float32)
            total = T.alloc_local((1,), T.float32)
            # Every lane takes part in the shuffles; lanes past the tokens or the matrix work on zeros
            x[0] = T.float32(0)
            if token < num_tokens and e < mm:
                x[0] = comb_res_mix[token, e]
            lane_first_step(x, total, x, total, row, col, mhc, eps)
            for _ in T.serial(repeat - 1):
                lane_reduce(total, x[0], row, mhc, 1, add)
                x[0] = x[0] / (total[0] + eps)
                lane_reduce(total, x[0], col, mhc, mhc, add)
                x[0] = x[0] / (total[0] + eps)
            if token < num_tokens and e < mm:
                comb_res_mix_out[token, e] = x[0]

    return body
