"""Pieces the mHC kernels share: the bf16 vector width, sums in a fixed order, and a block-wide sum."""

import tilelang.language as T

VEC = 8  # bf16 elements of one 16-byte access; callers keep hidden a multiple of it
WARP = 32


def tree_sum(values: list):
    """The sum of `values` in the order a butterfly reduction adds them: for n = 2**k, the first half plus the
    second half, pairwise, then again on the n/2 partial sums ((a0 + a2) + (a1 + a3) for four). TileLang's
    all-reduce over a power-of-two group of threads adds in this order, so the per-thread kernels here give the
    same bits as a kernel spreading one row over n threads. Other lengths add left to right."""
    n = len(values)
    if n == 1:
        return values[0]
    if n & (n - 1):
        total = values[0]
        for v in values[1:]:
            total = total + v
        return total
    half = n // 2
    return tree_sum([values[i] + values[i + half] for i in range(half)])


@T.macro
def block_sum(acc, red, count: int, threads: int):
    """acc[0:count], one partial sum each per thread, become the block's sums in every thread: a butterfly of
    shuffles within each warp, then the warps' sums added in warp order through red (shared, (warps, count))."""
    tid = T.get_thread_binding()
    for k in T.unroll(count):
        for i in T.unroll(5):
            acc[k] += T.shfl_xor(acc[k], 16 >> i)
    if threads > WARP:
        if tid % WARP == 0:
            for k in T.unroll(count):
                red[tid // WARP, k] = acc[k]
        T.sync_threads()
        for k in T.unroll(count):
            acc[k] = red[0, k]
            for w in T.unroll(threads // WARP - 1):
                acc[k] += red[w + 1, k]
