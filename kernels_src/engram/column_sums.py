"""Column sums over a stack of partials (rows p = 0, 1, ... of a (num_partials, numel) fp32 matrix), staged by
cp.async into shared memory: the fixed-order reductions of tkaot.engram (grad_w_reduce.py, sinkhorn_step_reduce.py).

A thread owns COLS = 4 adjacent columns. It copies a batch of rows of them into shared memory, one 16-byte copy a
row, so the loads in flight hold no register; then it adds them into its accumulators in row order. Every column's
sum thus runs through the rows in order from 0.0, whatever the tiling, and the result is the same bytes for every
tiling. A 16-byte copy needs the matrix (and whatever else the kernel moves in fours) on 16-byte boundaries and numel
a multiple of 4; where that is not so (tested in the kernel, `aligned`), or past numel's last whole four, a thread
copies its columns one 4-byte copy at a time. A thread reads back only what it copied itself, after its own wait, so
a kernel built on this needs no barrier (PASS_CONFIGS).
"""

import tilelang.language as T

COLS = 4  # columns a thread (one 16-byte copy a row)
SMEM_BYTES = 227 * 1024  # shared memory a CTA may take on sm90

# a thread reads back only what it staged itself: no barriers to insert
PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}

# 1 if the address is 16-byte aligned, else 0
ALIGNED16_SOURCE = """
__device__ __forceinline__ int tkaot_aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}
"""


def aligned(*firsts):
    """The kernel-time test that every tensor (its first element) starts on a 16-byte boundary."""
    test = None
    for first in firsts:
        one = T.call_extern("int32", "tkaot_aligned16", T.address_of(first)) != 0
        test = one if test is None else T.And(test, one)
    return test


@T.macro
def stage(partial, stash, first, tid, col, rows, vectors):
    """Rows first .. first + rows - 1 of partial (none past its last) of this thread's columns into stash's rows 0 ..
    rows - 1, one commit group; `vectors`: one 16-byte copy a row, else a 4-byte copy a column (none past numel)."""
    for u in T.unroll(rows):
        if first + u < partial.shape[0]:
            if vectors:
                src = partial[first + u, col]
                T.ptx_cp_async(T.access_ptr(stash[u, tid * COLS], "w", COLS), T.access_ptr(src, "r", COLS), COLS)
            else:
                for j in T.unroll(COLS):
                    if col + j < partial.shape[1]:
                        src = partial[first + u, col + j]
                        T.ptx_cp_async(T.access_ptr(stash[u, tid * COLS + j], "w", 1), T.access_ptr(src, "r", 1), 1)
    T.ptx_commit_group()


@T.macro
def stage_rows(partial, stash, first, count, tid, col, vectors):
    """As `stage`, rows first .. first + count - 1 (count at most stash's rows) in a loop rather than unrolled: a
    copy's loop iteration does not wait for it, so every row is still in flight at once, in a fraction of the code
    (a long batch unrolled, with both column paths, runs to hundreds of KB of instructions, fetched once a batch)."""
    for u in T.serial(count):
        if vectors:
            src = partial[first + u, col]
            T.ptx_cp_async(T.access_ptr(stash[u, tid * COLS], "w", COLS), T.access_ptr(src, "r", COLS), COLS)
        else:
            for j in T.unroll(COLS):
                if col + j < partial.shape[1]:
                    src = partial[first + u, col + j]
                    T.ptx_cp_async(T.access_ptr(stash[u, tid * COLS + j], "w", 1), T.access_ptr(src, "r", 1), 1)
    T.ptx_commit_group()
