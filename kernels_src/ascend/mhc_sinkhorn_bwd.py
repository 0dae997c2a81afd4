"""mHC Sinkhorn, backward, for Ascend, one SIMT thread a token (as kernels_src/mhc/sinkhorn_bwd.py): replay the
forward from x, keeping each step's input matrix and sums in `scratch`, then walk the steps back.

scratch is (repeat, 2, num_tokens, record) fp32, allocated by the op: record (r, 0) holds the softmax output for
r = 0, else the matrix entering the r-th row normalisation and its row sums; record (r, 1) the matrix entering the
r-th column normalisation and its column sums. Each thread writes and reads back only its token's records, in
global memory; x, grad_output and grad_input go through the Unified Buffer, TOKENS tokens a block.

Back through y = x / (s + eps), s the sums along one axis: dx = (dy - sum(dy * x) / (s + eps)) / (s + eps) along
that axis; through the softmax p: dx = (dy - the row sum of dy * p) * p. Sums add in butterfly order
(kernels_src/mhc/common.py tree_sum), as on CUDA; the CUDA kernel rounds each product before the sum, which
bisheng may instead fuse into the additions.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from kernels_src.mhc.common import tree_sum
from kernels_src.mhc.sinkhorn_fwd import normalise_cols, normalise_rows, softmax_rows
from tkaot._mhc.kernels import SINKHORN_BWD, sinkhorn_record_row

DECL = SINKHORN_BWD
TOKENS = 64  # a SIMT thread each


def cell(line, pos, mhc: int, along_rows: bool):
    """Index of element `pos` of line `line` of a row-major (mhc, mhc) matrix, the line a row or a column."""
    return line * mhc + pos if along_rows else pos * mhc + line


def build(mhc_mult: int):
    m, mm = mhc_mult, mhc_mult * mhc_mult
    row = sinkhorn_record_row(m)
    a = mc.Args(m)
    repeat = T.dynamic("repeat")

    @T.macro
    def record(scratch, r, half: int, t, x, sums, along_rows: bool):
        """sums = x's sums along rows (or columns); x and its sums become record (r, half) of token t."""
        for line in T.unroll(m):
            sums[line] = tree_sum([x[cell(line, pos, m, along_rows)] for pos in range(m)])
        for k in T.unroll(mm):
            scratch[r, half, t, k] = x[k]
        for line in T.unroll(m):
            scratch[r, half, t, mm + line] = sums[line]

    @T.macro
    def back_through(g, rec, dots, scratch, r, half: int, t, eps, along_rows: bool):
        """g = the gradient before the normalisation along rows (or columns) that record (r, half) entered."""
        for k in T.unroll(m + mm):
            rec[k] = scratch[r, half, t, k]
        for line in T.unroll(m):
            dots[line] = tree_sum([g[cell(line, pos, m, along_rows)] * rec[cell(line, pos, m, along_rows)] for pos in range(m)])
        for line in T.unroll(m):
            for pos in T.unroll(m):
                k = cell(line, pos, m, along_rows)
                g[k] = (g[k] - dots[line] / (rec[mm + line] + eps)) / (rec[mm + line] + eps)

    @T.prim_func
    def mhc_sinkhorn_bwd(
        grad_output: a.comb_rows, x: a.comb_rows, grad_input: a.comb_rows, scratch: mc.fp32(repeat, 2, a.num_tokens, row), eps: T.float32
    ):
        with T.Kernel(T.ceildiv(a.num_tokens, TOKENS)) as block:
            first = block * TOKENS
            x_ub = T.alloc_shared((TOKENS, mm), T.float32)
            g_ub = T.alloc_shared((TOKENS, mm), T.float32)
            T.copy(x[first : first + TOKENS, :], x_ub)
            T.copy(grad_output[first : first + TOKENS, :], g_ub)
            with T.SimtVF(threads=TOKENS):
                mat = T.alloc_local((mm,), T.float32)
                g = T.alloc_local((mm,), T.float32)
                rec = T.alloc_local((m + mm,), T.float32)
                sums = T.alloc_local((m,), T.float32)
                for i in T.Parallel(TOKENS):
                    if first + i < a.num_tokens:
                        mc.load_row(mat, x_ub, i, mm)
                        softmax_rows(mat, sums, m)
                        record(scratch, 0, 0, first + i, mat, sums, True)
                        for k in T.unroll(mm):
                            mat[k] = mat[k] + eps
                        record(scratch, 0, 1, first + i, mat, sums, False)
                        normalise_cols(mat, sums, m, eps)
                        for r in T.serial(1, repeat):
                            record(scratch, r, 0, first + i, mat, sums, True)
                            normalise_rows(mat, sums, m, eps)
                            record(scratch, r, 1, first + i, mat, sums, False)
                            normalise_cols(mat, sums, m, eps)
                        mc.load_row(g, g_ub, i, mm)
                        for back in T.serial(repeat):
                            back_through(g, rec, sums, scratch, repeat - 1 - back, 1, first + i, eps, False)
                            if back < repeat - 1:
                                back_through(g, rec, sums, scratch, repeat - 1 - back, 0, first + i, eps, True)
                        # through the softmax: the record (0, 0) holds its output p
                        for k in T.unroll(mm):
                            rec[k] = scratch[0, 0, first + i, k]
                        for line in T.unroll(m):
                            sums[line] = tree_sum([g[line * m + k] * rec[line * m + k] for k in range(m)])
                        for k in T.unroll(mm):
                            g[k] = (g[k] - sums[k // m]) * rec[k]
                        mc.store_row(g_ub, i, g, mm)
            T.copy(g_ub, grad_input[first : first + TOKENS, :])

    return mhc_sinkhorn_bwd
