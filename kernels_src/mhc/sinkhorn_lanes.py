"""Sinkhorn with one matrix element a lane (kernels_src/mhc/sinkhorn_fwd.py, sinkhorn_bwd.py): a token's (mhc, mhc)
matrix lies on a group of `group` lanes (mhc * mhc rounded up to a power of two) of one warp, element e on lane
e of its group, row-major. A row or column sum is a reduction over mhc lanes `stride` apart (1 along a row, mhc
along a column), in tree_sum's order (kernels_src/mhc/common.py), so every lane of the line gets the same bits
as a sum over registers in that order."""

import tilelang.language as T

from kernels_src.mhc.common import WARP


def lane_layout(mhc: int, threads: int) -> tuple[int, int]:
    """(lanes a token, tokens a block of `threads`)."""
    group = 1 << (mhc * mhc - 1).bit_length()
    assert group <= WARP, "a matrix wider than a warp keeps one thread a token"
    return group, threads // group


@T.macro
def lane_reduce(out, value, first, mhc: int, stride: int, combine):
    """out[0] = combine over lanes first, first + stride, ..., first + (mhc - 1) * stride of `value`, in
    tree_sum's order: a butterfly of xor shuffles (mhc / 2 .. 1 lines apart) for a power of two; else every
    line's value fetched from its lane and combined left to right."""
    if mhc & (mhc - 1) == 0:
        out[0] = value
        for s in T.unroll((mhc - 1).bit_length()):
            out[0] = combine(out[0], T.shfl_xor(out[0], (mhc // 2 >> s) * stride))
    else:
        out[0] = _gathered(value, first, mhc, stride, combine)


def add(a, b):
    """The combine of a sum (lane_reduce)."""
    return a + b


@T.macro
def lane_first_step(x, total, p, d0, row, col, mhc: int, eps):
    """The Sinkhorn's first step on the lanes, in place on x[0]: its row softmax (kept in p[0]) plus eps, divided by
    its column's sum plus eps (kept in d0[0]); total is scratch. p and d0 may be x and total themselves."""
    lane_reduce(total, x[0], row, mhc, 1, T.max)
    x[0] = T.exp(x[0] - total[0])
    lane_reduce(total, x[0], row, mhc, 1, add)
    p[0] = x[0] / total[0]
    x[0] = p[0] + eps
    lane_reduce(total, x[0], col, mhc, mhc, add)
    d0[0] = total[0] + eps
    x[0] = x[0] / d0[0]


def _gathered(value, first, mhc: int, stride: int, combine):
    """combine(...combine(v0, v1)..., v_last) of the values on lanes first + j * stride (plain Python: unrolled)."""
    total = T.shfl_sync(value, first)
    for j in range(1, mhc):
        total = combine(total, T.shfl_sync(value, first + j * stride))
    return total
