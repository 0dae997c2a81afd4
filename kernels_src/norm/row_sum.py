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


# ---- The split as a kernel body reads it: fixed by a static hidden (specialised) or computed from a runtime one
# (generic). Both give each thread the same vectors of a row and reduce them in the same order, so the generic
# kernels write the specialised kernels' bytes.

MAX_HIDDEN = 8192  # the widest row a norm kernel takes


class StaticSplit:
    """row_split of a static hidden, as the specialised kernels use it."""

    static = True
    helpers = ""  # device functions the split needs

    def __init__(self, hidden: int, dtype: str):
        self.hidden = hidden
        self.vec, self.row_threads, self.vectors = row_split(hidden, dtype)
        self.rows_per_block = NUM_THREADS // self.row_threads
        self.lanes = min(self.row_threads, 32)
        self.row_warps = self.row_threads // self.lanes
        self.exact = hidden % (self.vec * self.row_threads) == 0  # every thread's vectors are in range
        self.warp_sums_shape = (self.rows_per_block, self.row_warps)
        self.divisor = hidden  # of the sum of squares

    def grid(self, num_tokens):
        return T.ceildiv(num_tokens, self.rows_per_block)

    def lane(self, tid):
        return tid % self.row_threads

    def row(self, tid):
        return tid // self.row_threads

    def enter(self):
        """In the kernel, before the split is read (nothing to compute)."""

    def in_row(self, col):
        """Whether the vector at column col is in the row."""
        return self.exact or col < self.hidden

    def live(self, v) -> bool:
        """Whether the thread's unrolled vector v may be in its row (always: the loop runs to the split's count)."""
        return True

    def reduce(self, acc, warp_sums, row, lane):
        row_sum(acc, warp_sums, row, lane, self.lanes, self.row_warps)


class RuntimeSplit:
    """row_split of a runtime hidden (a multiple of `multiple` in (0, MAX_HIDDEN]), as expressions of it.

    The threads a row takes grow at a few row widths (found by running row_split over every width), so they are
    a sum of steps of hidden: in the grid, each step [hidden > width] spelt min(max(hidden - width, 0), 1), the
    arithmetic the runtime evaluates; in the kernel, a pure device function of hidden, clamped to its range so
    the compiler sees every index in bounds and every vector whole. Loops run to the most vectors any width
    gives a thread and skip the vectors past the width's count (a branch the same in every thread of a block,
    so the shuffles stay whole).
    """

    static = False
    exact = False

    def __init__(self, hidden, dtype: str, multiple: int):
        self.hidden, self.multiple = hidden, multiple
        self.vec = 16 // (2 if dtype == "bfloat16" else 4)
        first, steps, self.vectors = _thread_steps(dtype, multiple)
        grid_threads, c_threads, before = first, str(first), first
        for width, factor in steps:
            grid_threads = grid_threads + before * (factor - 1) * T.min(T.max(hidden - width, 0), 1)
            c_threads += f" + (hidden > {width} ? {before * (factor - 1)} : 0)"
            before *= factor
        self._grid_rows = NUM_THREADS // grid_threads
        name = f"tkaot_row_threads_{dtype}_{multiple}"
        self.helpers = f"__device__ __forceinline__ int {name}(int hidden) {{\n    return {c_threads};\n}}\n"
        self.row_threads = T.min(T.max(T.call_pure_extern("int32", name, hidden), first), before)
        self.rows_per_block = NUM_THREADS // self.row_threads
        self.warp_sums_shape = (NUM_THREADS // 32,)
        self.divisor = T.cast(hidden, "float32")  # of the sum of squares: IEEE division, as by the static one

    def enter(self):
        T.assume(self.hidden % self.multiple == 0)  # as declared: whole vectors, so each access is one

    def grid(self, num_tokens):
        return T.ceildiv(num_tokens, self._grid_rows)

    def lane(self, tid):
        return tid % self.row_threads

    def row(self, tid):
        return tid // self.row_threads

    def in_row(self, col):
        return col + self.vec <= self.hidden  # (the same as col < hidden) spelt so each access is seen in bounds

    def live(self, v):
        return v * self.row_threads < self.hidden // self.vec

    def reduce(self, acc, warp_sums, row, lane):
        row_sum_runtime(acc, warp_sums, row, lane, self.row_threads)


def _thread_steps(dtype: str, multiple: int) -> tuple[int, tuple[tuple[int, int], ...], int]:
    """(threads a row of the narrowest width takes, ((width past which they grow, by what factor), ...), the most
    vectors a thread holds), from row_split over every width in (0, MAX_HIDDEN] that is a multiple of `multiple`."""
    first, steps, most, prev = None, [], 0, None
    for hidden in range(multiple, MAX_HIDDEN + 1, multiple):
        _, threads, vectors = row_split(hidden, dtype)
        most = max(most, vectors)
        if prev is None:
            first = threads
        elif threads != prev[1]:
            if threads % prev[1] or threads & (threads - 1):
                raise AssertionError(f"row_split's threads go from {prev[1]} to {threads}: not a doubling")
            steps.append((prev[0], threads // prev[1]))
        prev = (hidden, threads)
    return first, tuple(steps), most


@T.macro
def row_sum_runtime(acc, warp_sums, row, lane, row_threads):
    """row_sum with a runtime (power of two) `row_threads`: the same shuffles in the same order (offsets from
    min(row_threads, 32) / 2 down to 1), then, over more than one warp, the warps' sums in warp order."""
    for i in T.unroll(5):
        if T.shift_right(16, i) < row_threads:
            acc[0] += T.shfl_xor(acc[0], T.shift_right(16, i))
    if row_threads > 32:
        row_warps = T.shift_right(row_threads, 5)
        if lane % 32 == 0:
            warp_sums[row * row_warps + lane // 32] = acc[0]
        T.sync_threads()
        acc[0] = 0.0
        for w in T.unroll(NUM_THREADS // 32):
            if w < row_warps:
                acc[0] += warp_sums[row * row_warps + w]
