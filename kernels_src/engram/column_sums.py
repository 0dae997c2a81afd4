"""Column sums over a stack of partials (rows p = 0, 1, ... of a (num_partials, numel) fp32 matrix), staged by
cp.async into shared memory: the fixed-order reductions of tkaot.engram (grad_w_reduce.py, sinkhorn_step_reduce.py).

A thread owns COLS = 4 adjacent columns. It copies a batch of rows of them into shared memory, one 16-byte copy a
row, so the loads in flight hold no register; then it adds them into its accumulators in row order. Every column's
sum thus runs through the rows in order from 0.0, whatever the tiling, and the result is the same bytes for every
tiling. A 16-byte copy needs the matrix (and whatever else the kernel moves in fours) on 16-byte boundaries and numel
a multiple of 4; where that is not so (tested in the kernel, `in_fours`), or past numel's last whole four, a thread
copies its columns one 4-byte copy at a time. A thread reads back only what it copied itself, after its own wait, so
a kernel built on this needs no barrier (PASS_CONFIGS).
"""

import re

import tilelang.language as T

COLS = 4  # columns a thread (one 16-byte copy a row)
ADD_UNROLL = 8  # staged rows added per unrolled run (their shared-memory loads issued together)
SMEM_BYTES = 227 * 1024  # shared memory a CTA may take on sm90

# a thread reads back only what it staged itself: no barriers to insert
PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}

# 1 if the address is 16-byte aligned, else 0
ALIGNED16_SOURCE = """
__device__ __forceinline__ int tkaot_aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}
"""


def parse_tiling(kernel: str, tiling: str) -> tuple[int, int, bool]:
    """Tiling "t<threads>r<rows><s|d>" of a kernel built on ordered_sums: threads a CTA (a multiple of 8 in [8, 1024],
    COLS columns each), partials staged at a time (1-512), and one buffer ("s") or two ("d"), within the shared memory."""
    match = re.fullmatch(r"t(\d+)r(\d+)([sd])", tiling)
    if match is None:
        raise ValueError(f"{kernel} tiling {tiling!r} is not t<threads>r<rows><s|d>")
    threads, rows, double = int(match[1]), int(match[2]), match[3] == "d"
    if not (threads % 8 == 0 and 8 <= threads <= 1024 and 1 <= rows <= 512):
        raise ValueError(f"{kernel} tiling {tiling!r}: threads a multiple of 8 in [8, 1024], rows 1-512")
    if (1 + double) * rows * threads * COLS * 4 > SMEM_BYTES:
        raise ValueError(f"{kernel} tiling {tiling!r}: buffers x rows x threads x 16 bytes above {SMEM_BYTES}")
    return threads, rows, double


def staging(rows: int, double: bool, width: int):
    """(stash, other, acc), allocated in the kernel being built: the shared buffers ordered_sums copies `rows` partials
    of a CTA's `width` columns into (other only with `double`), and a thread's COLS accumulators."""
    stash = T.alloc_shared((rows, width), T.float32)
    other = T.alloc_shared((rows if double else 1, width), T.float32)
    acc = T.alloc_local((COLS,), T.float32)
    return stash, other, acc


def in_fours(columns, col, *firsts):
    """The kernel-time test that a thread's columns col .. col + COLS - 1 move as 16-byte copies: the column count a
    multiple of COLS, the thread's COLS columns all inside it, and every tensor (its first element) on a 16-byte
    boundary."""
    test = T.And(columns % COLS == 0, col + COLS <= columns)
    for first in firsts:
        test = T.And(test, T.call_extern("int32", "tkaot_aligned16", T.address_of(first)) != 0)
    return test


@T.macro
def stage_rows(partial, stash, first, count, tid, col, vectors):
    """Rows first .. first + count - 1 of partial (count at most stash's rows) of this thread's columns into stash's
    rows 0 .. count - 1, one commit group; `vectors`: one 16-byte copy a row, else a 4-byte copy a column (none past
    numel). In a loop: an iteration does not wait for its copy, so every row is in flight at once, in a fraction of
    the code the copies take unrolled (hundreds of KB with both column paths for a long batch, and twice the time)."""
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


def ordered_sums(rows: int, double: bool):
    """The macro sums(partial, stash, other, tid, col, acc, vectors): acc = this thread's COLS column sums of
    partial, from 0.0 in row order, the rows copied (stage_rows) `rows` at a time into stash, one batch at a time, or
    with `double` into stash and other in turn, the next batch's copy issued before this one is added."""

    def batches(partial):
        return T.ceildiv(partial.shape[0], rows)

    def count(partial, batch):
        """The rows of batch `batch` (the last one may be short)."""
        return T.min(rows, partial.shape[0] - batch * rows)

    @T.macro
    def copy(partial, stash, batch, tid, col, vectors):
        stage_rows(partial, stash, batch * rows, count(partial, batch), tid, col, vectors)

    @T.macro
    def add(partial, stash, batch, tid, acc):
        """acc += the staged rows of `batch`, in row order."""
        rows_here = count(partial, batch)
        for run in T.serial(rows_here // ADD_UNROLL):
            for k in T.unroll(ADD_UNROLL):
                for j in T.vectorized(COLS):
                    acc[j] += stash[run * ADD_UNROLL + k, tid * COLS + j]
        for u in T.serial(rows_here // ADD_UNROLL * ADD_UNROLL, rows_here):
            for j in T.vectorized(COLS):
                acc[j] += stash[u, tid * COLS + j]

    @T.macro
    def next_batch(partial, now, then, i, tid, col, acc, vectors):
        """With two buffers: batch i + 1's copy into `then` issued, then batch i (in `now`) waited for and added."""
        if i < batches(partial):
            if i + 1 < batches(partial):
                copy(partial, then, i + 1, tid, col, vectors)
                T.ptx_wait_group(1)
            else:
                T.ptx_wait_group(0)
            add(partial, now, i, tid, acc)

    @T.macro
    def sums(partial, stash, other, tid, col, acc, vectors):
        T.clear(acc)
        if double:  # even batches in stash, odd ones in other
            copy(partial, stash, 0, tid, col, vectors)
            for pair in T.serial(T.ceildiv(batches(partial), 2)):
                next_batch(partial, stash, other, pair * 2, tid, col, acc, vectors)
                next_batch(partial, other, stash, pair * 2 + 1, tid, col, acc, vectors)
        else:
            for i in T.serial(batches(partial)):
                copy(partial, stash, i, tid, col, vectors)
                T.ptx_wait_group(0)
                add(partial, stash, i, tid, acc)

    return sums
