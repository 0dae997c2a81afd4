"""The row reduction shared by RMSNorm and RMSNorm + cast: a thread's partial sum -> the row's sum."""

import tilelang.language as T


@T.macro
def row_sum(acc, warp_sums, row, lane, lanes: int, row_warps: int):
    """acc[0], a thread's partial sum, becomes its row's sum in every thread of the row: shuffles over
    the `lanes` lanes of a warp, then (over `row_warps` warps) warp_sums[row, :] and a block barrier."""
    for i in T.unroll(lanes.bit_length() - 1):
        acc[0] += T.shfl_xor(acc[0], lanes >> (i + 1))
    if row_warps > 1:
        if lane % 32 == 0:
            warp_sums[row, lane // 32] = acc[0]
        T.sync_threads()
        acc[0] = 0.0
        for w in T.unroll(row_warps):
            acc[0] += warp_sums[row, w]
