"""The row split and row reduction shared by RMSNorm and RMSNorm + cast: a thread's partial sum -> the row's sum."""

import tilelang.language as T

NUM_THREADS = 128  # threads a block
ELEMS_PER_THREAD = 32  # a thread's share of its row, at most, below NUM_THREADS threads a row


def row_split(hidden: int, dtype: str) -> tuple[int, int, int]:
    """(elements per 16-byte vector, threads per row, vectors per thread).

    A power of two of a block's threads take a row: enough for ELEMS_PER_THREAD elements each, at least 8
    (fewer for rows of fewer vectors) and at most NUM_THREADS (7 vectors each for hidden 7168 bf16).
    TileKernels splits its rows the same way, so every thread sums the same elements in the same order.
    """
    vec = 16 // (2 if dtype == "bfloat16" else 4)
    num_vecs = hidden // vec
    row_threads = min(NUM_THREADS, max(min(8, _pow2_ceil(num_vecs)), _pow2_ceil(-(-hidden // ELEMS_PER_THREAD))))
    return vec, row_threads, -(-num_vecs // row_threads)


def _pow2_ceil(n: int) -> int:
    return 1 << (n - 1).bit_length()


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
