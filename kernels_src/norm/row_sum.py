"""The row split and row reduction shared by RMSNorm and RMSNorm + cast: a thread's partial sum -> the row's sum."""

import copy
from collections.abc import Callable
from typing import NamedTuple

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


class ThreadRow(NamedTuple):
    """A thread's vectors of its row of a (batch, token, column) tensor: value j of vector v is buffer[at(v, j)];
    buffer[read_at(v, j)] is a load the split may make whatever the row's width (see RuntimeSplit.thread_row)."""

    buffer: object
    at: Callable
    read_at: Callable


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

    # Loads stay under the row's guards: a static row has no vectors past its width
    loads_unguarded = False

    def thread_row(self, buffer, b, token, lane, access: str) -> ThreadRow:
        """The thread's vectors of row (b, token) of `buffer`, indexed as the tensor is (`access`: "r" or "w")."""
        at = lambda v, j: (b, token, (v * self.row_threads + lane) * self.vec + j)  # noqa: E731
        return ThreadRow(buffer, at, at)

    def sf_row(self, out_sf, b, token) -> ThreadRow:
        """Row (b, token) of a (batch, token, group[, byte]) scale-factor tensor: at(g[, byte]) indexes it."""
        at = lambda *g: (b, token, *g)  # noqa: E731
        return ThreadRow(out_sf, at, at)

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

    The threads a row takes double at a few row widths (found by running row_split over every width), so their
    log2 is a sum of steps of hidden: in the grid, each step [hidden > width] spelt min(max(hidden - width, 0), 1),
    the arithmetic the runtime evaluates; in the kernel, a pure device function of hidden, clamped to its range so
    the compiler sees every index in bounds and every vector whole. A thread's lane, its row and a block's rows are
    a mask and shifts by that log2, never an integer division by a runtime value (which costs a thread tens of
    instructions per use, 64-bit ones in the address arithmetic a call of its own). Loops run to the most vectors
    any width gives a thread and skip the vectors past the width's count (a branch the same in every thread of a
    block, so the shuffles stay whole).
    """

    static = False
    exact = False

    def __init__(self, hidden, dtype: str, multiple: int):
        self.hidden, self.multiple = hidden, multiple
        self.vec = 16 // (2 if dtype == "bfloat16" else 4)
        first, steps, self.vectors = _thread_steps(dtype, multiple)
        grid_threads, before = first, first
        first_shift = first.bit_length() - 1
        c_shift, last_shift = str(first_shift), first_shift
        for width, factor in steps:
            grid_threads = grid_threads + before * (factor - 1) * T.min(T.max(hidden - width, 0), 1)
            c_shift += f" + (hidden > {width} ? {factor.bit_length() - 1} : 0)"
            before *= factor
            last_shift += factor.bit_length() - 1
        self._grid_rows = NUM_THREADS // grid_threads
        name = f"tkaot_row_shift_{dtype}_{multiple}"
        self.helpers = f"__device__ __forceinline__ int {name}(int hidden) {{\n    return {c_shift};\n}}\n" + _ROW_POINTER
        self.shift = T.min(T.max(T.call_pure_extern("int32", name, hidden), first_shift), last_shift)
        self.row_threads = T.shift_left(1, self.shift)
        self.rows_per_block = T.shift_right(NUM_THREADS, self.shift)
        self.warp_sums_shape = (NUM_THREADS // 32,)
        self.divisor = T.cast(hidden, "float32")  # of the sum of squares: IEEE division, as by the static one
        self._call, self._first_shift, self._last_shift = (name, hidden), first_shift, last_shift
        # The widths past widest_from take all the threads a row can (the common ones: 2048 < hidden <= MAX_HIDDEN)
        self.widest_from, self._last_step = (steps[-1][0], steps[-1][1].bit_length() - 1) if steps else (0, 0)
        self._dtype = dtype

    def width_classes(self) -> tuple["RuntimeSplit", "RuntimeSplit"]:
        """(the split for the widths past widest_from, the split for the others): a kernel branches on
        hidden > widest_from and runs one body a class, each thread holding the same vectors and reducing them as the
        whole split would. Past widest_from the shift is a constant, so each vector's address is an offset from the row
        pointer and its bound one compare, as in the specialised kernels; below it the shift stays a runtime value,
        and the loops run to the most vectors those widths give a thread (half the widest rows')."""
        wide = copy.copy(self)
        wide.shift = self._last_shift
        wide.row_threads = 1 << self._last_shift
        wide.rows_per_block = NUM_THREADS >> self._last_shift
        narrow = copy.copy(self)
        narrow_last = self._last_shift - self._last_step
        narrow.shift = T.min(T.max(T.call_pure_extern("int32", *self._call), self._first_shift), narrow_last)
        narrow.row_threads = T.shift_left(1, narrow.shift)
        narrow.rows_per_block = T.shift_right(NUM_THREADS, narrow.shift)
        narrow.vectors = max(row_split(h, self._dtype)[2] for h in range(self.multiple, self.widest_from + 1, self.multiple))
        return wide, narrow

    def enter(self):
        T.assume(self.hidden % self.multiple == 0)  # as declared: whole vectors, so each access is one

    def grid(self, num_tokens):
        return T.ceildiv(num_tokens, self._grid_rows)

    def lane(self, tid):
        return T.bitwise_and(tid, self.row_threads - 1)

    def row(self, tid):
        return T.shift_right(tid, self.shift)

    # Loads are made whatever the width (read_at), the values outside the row zeroed after: no branch around a
    # load, so a thread's loads are all in flight at once, as the specialised kernel's are
    loads_unguarded = True

    def thread_row(self, buffer, b, token, lane, access: str) -> ThreadRow:
        """The thread's vectors of row (b, token) of `buffer`, from a pointer to the row taken once: each vector is
        then a 32-bit offset from it, where the tensor's 64-bit address, taken in every vector's branch, would be
        computed again in each. read_at(v, j) reads the vector clamped into the row, of the last token for a
        token past the tensor (a block's rows past num_tokens): always in the tensor, so loaded unconditionally."""
        batch_stride, token_stride, _ = buffer.strides
        token = T.min(token, buffer.shape[1] - 1)
        # The row's offset goes through an opaque move, so the compiler keeps it in registers rather than taking the
        # tensor's 64-bit address again at each access; the pointer, still the tensor's plus an offset, keeps the
        # tensor's no-alias and read-only facts. (A plain pointer: the code generator declares it void *.)
        offset = T.cast(b, "int64") * batch_stride + T.cast(token, "int64") * token_stride
        size = T.int64(tvm_dtype_bytes(buffer.dtype))
        start = T.call_extern("handle", "tkaot_row_pointer", T.access_ptr(buffer[0, 0, 0], access), offset * size)
        view = T.make_tensor_from_addr(start, (MAX_HIDDEN,), buffer.dtype)

        def vector(v):
            return T.shift_left(v, self.shift) + lane

        last = self.hidden // self.vec - 1
        return ThreadRow(view, lambda v, j: (vector(v) * self.vec + j,), lambda v, j: (T.min(vector(v), last) * self.vec + j,))

    def sf_row(self, out_sf, b, token) -> ThreadRow:
        """Row (b, token) of a (batch, token, group[, byte]) scale-factor tensor from a pointer taken once (as
        thread_row's; the token is in the tensor wherever a store is made)."""
        batch_stride, token_stride, group_stride, *byte = out_sf.strides
        offset = T.cast(b, "int64") * batch_stride + T.cast(token, "int64") * token_stride
        start = T.call_extern("handle", "tkaot_row_pointer", T.access_ptr(out_sf[(0,) * len(out_sf.shape)], "w"),
                              offset * T.int64(tvm_dtype_bytes(out_sf.dtype)))  # fmt: skip
        groups = MAX_HIDDEN // self.multiple
        shape, strides = ((groups, 4), (group_stride, 1)) if byte else ((groups,), (group_stride,))
        view = T.make_tensor_from_addr(start, shape, out_sf.dtype, strides=strides)
        return ThreadRow(view, lambda *g: g, lambda *g: g)

    def in_row(self, col):
        return col + self.vec <= self.hidden  # (the same as col < hidden) spelt so each access is seen in bounds

    def live(self, v):
        return T.shift_left(v, self.shift) < self.hidden // self.vec

    def reduce(self, acc, warp_sums, row, lane):
        row_sum_runtime(acc, warp_sums, row, lane, self.row_threads, self.shift)


_ROW_POINTER = """__device__ __forceinline__ void* tkaot_row_pointer(const void* tensor, long long offset) {
    asm("mov.b64 %0, %0;" : "+l"(offset));
    return const_cast<char*>(static_cast<const char*>(tensor)) + offset;
}
"""


def tvm_dtype_bytes(dtype) -> int:
    from tilelang import tvm

    return tvm.DataType(str(dtype)).bits // 8


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
def row_sum_runtime(acc, warp_sums, row, lane, row_threads, shift):
    """row_sum with a runtime (power of two) `row_threads` = 1 << shift: the same shuffles in the same order (offsets
    from min(row_threads, 32) / 2 down to 1), then, over more than one warp, the warps' sums in warp order."""
    for i in T.unroll(5):
        if T.shift_right(16, i) < row_threads:
            acc[0] += T.shfl_xor(acc[0], T.shift_right(16, i))
    if row_threads > 32:
        row_warps = T.shift_right(row_threads, 5)
        if T.bitwise_and(lane, 31) == 0:
            warp_sums[T.shift_left(row, shift - 5) + T.shift_right(lane, 5)] = acc[0]
        T.sync_threads()
        acc[0] = 0.0
        for w in T.unroll(NUM_THREADS // 32):
            if w < row_warps:
                acc[0] += warp_sums[T.shift_left(row, shift - 5) + w]
