"""What the Ascend mHC kernels (kernels_src/ascend/mhc_*.py) share: segment sizing, the types of their arguments,
whole SIMT regions that mix streams, and the sums of per-thread partial sums. Each kernel module re-exports
REQUIRES and unsupported from here: every mHC kernel takes every runtime value and every static value its CUDA
twin takes.

Kernels over the (num_tokens, mhc, hidden) bf16 streams give a block one token and a segment of `span` hidden
columns (a (mhc, span) tile in the Unified Buffer; the DMA stops at `hidden`, a runtime value); the backward
kernels that sum over the hidden size take one token a block and walk its segments in order. Every sum of
streams runs in fp32 in stream order from its start value, as on CUDA (kernels_src/mhc/), and rounds once.

Sums over many elements go through `sums`, a (count, THREADS) fp32 tile: SIMT thread u adds its elements into
column u, in its own order, and `thread_total` adds a row's columns in thread order, so every such sum is the
same on every run (its order is not the CUDA kernel's: results may differ from CUDA in the last bits).

A macro names a Var it is given after its own parameter (TileLang binds macro arguments by name), so a kernel
argument or dynamic dim goes into a macro only under its own name (`hidden`), or inside a buffer or tuple;
the build's check of the lowered arguments against the declaration catches any that got renamed.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, split_block
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.ascend.tile import UB_BUDGET
from kernels_src.mhc.sinkhorn_fwd import sinkhorn as sinkhorn  # one thread's Sinkhorn, the CUDA kernel's

THREADS = 128  # SIMT threads of a vector-function region
MAX_SPAN = 4096


def span(column_bytes: int, reserved: int = 0) -> int:
    """Hidden columns a block takes: the largest power of two up to MAX_SPAN whose tiles, `column_bytes` a
    column, fit UB_BUDGET beside `reserved` bytes."""
    columns = MAX_SPAN
    while columns > THREADS and columns * column_bytes + reserved > UB_BUDGET:
        columns //= 2
    return columns


class Args:
    """The argument types of the mHC ops at expansion rate `mhc`, over the dynamic dims num_tokens and hidden, as
    factories (fp32)."""

    def __init__(self, mhc: int):
        self.mhc, self.mixes = mhc, mhc * (mhc + 2)
        self.num_tokens, self.hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
        self.mix = fp32(self.num_tokens, mhc)
        self.comb = fp32(self.num_tokens, mhc, mhc)
        self.comb_rows = fp32(self.num_tokens, mhc * mhc)
        self.all_mixes = fp32(self.num_tokens, self.mixes)  # pre, post and comb mixes of a token, in that order
        self.scale = fp32(3)
        self.base = fp32(self.mixes)

    def streams(self):
        return T.Tensor[(self.num_tokens, self.mhc, self.hidden), T.bfloat16]

    def row(self):
        return T.Tensor[(self.num_tokens, self.hidden), T.bfloat16]


def segment_grid(args: Args, columns: int):
    """The block count of a (token, hidden segment) grid, segments `columns` wide."""
    return args.num_tokens * T.ceildiv(args.hidden, columns)


def segment_of(block, args: Args, columns: int):
    """(token, first column) of a block of that grid."""
    return split_block(block, T.ceildiv(args.hidden, columns), columns)


def as_f32(value):
    return T.cast(value, T.float32)


def sigmoid(x):
    """1 / (1 + exp(-x)) in fp32, TileLang's sigmoid on CUDA."""
    return T.float32(1) / (T.float32(1) + T.exp(-x))


@T.macro
def stream_sum(total, k, start, weights, tile, j, mhc: int, base=0, stride=1):
    """total[k] = start + the sum over i < mhc of weights[base + i * stride] * tile[i, j], added in that order."""
    total[k] = start
    for i in T.unroll(mhc):
        total[k] = total[k] + weights[base + i * stride] * as_f32(tile[i, j])


@T.macro
def mix_streams(out_ub, x_ub, weight, cols: int, mhc: int):
    """A SIMT region: out_ub[j] = bf16(the sum over i of weight(i) * x_ub[i, j]) for every column j, in fp32 in
    stream order from zero; each thread reads the weights once."""
    with T.SimtVF(threads=THREADS):
        weights = T.alloc_local((mhc,), T.float32)
        total = T.alloc_local((1,), T.float32)
        for i in T.unroll(mhc):
            weights[i] = weight(i)
        for j in T.Parallel(cols):
            stream_sum(total, 0, T.float32(0), weights, x_ub, j, mhc)
            out_ub[j] = T.cast(total[0], T.bfloat16)


@T.macro
def mix_segments(streams, row, weight, args: Args):
    """A kernel's body: row[t, :] = bf16(the sum over i of weight(t, i) * streams[t, i, :]), a (token, hidden
    segment) a block, the segment's streams in the Unified Buffer (mix_streams)."""
    cols = span(2 * (args.mhc + 1))
    with T.Kernel(segment_grid(args, cols)) as block:
        t, first = segment_of(block, args, cols)
        x_ub = T.alloc_shared((args.mhc, cols), T.bfloat16)
        out_ub = T.alloc_shared((cols,), T.bfloat16)
        T.copy(streams[t, :, first : first + cols], x_ub)
        mix_streams(out_ub, x_ub, lambda i: weight(t, i), cols, args.mhc)
        T.copy(out_ub, row[t, first : first + cols])


@T.macro
def post_streams(out_ub, res_ub, x_ub, post, comb, t, cols: int, mhc: int):
    """A SIMT region: column j of out_ub[o] = bf16(post[t, o] * x_ub[j] + the sum over i of comb[t, i, o] *
    res_ub[i, j]), in fp32 (the product first, then the streams in order); a column's outputs are all formed before
    any is stored, so out_ub may be res_ub."""
    with T.SimtVF(threads=THREADS):
        post_w = T.alloc_local((mhc,), T.float32)
        comb_w = T.alloc_local((mhc * mhc,), T.float32)
        mixed = T.alloc_local((mhc,), T.float32)
        load_row(post_w, post, t, mhc)
        load_square(comb_w, comb, t, mhc)
        for j in T.Parallel(cols):
            for o in T.unroll(mhc):
                stream_sum(mixed, o, post_w[o] * as_f32(x_ub[j]), comb_w, res_ub, j, mhc, o, mhc)
            for o in T.unroll(mhc):
                out_ub[o, j] = T.cast(mixed[o], T.bfloat16)


@T.macro
def load_row(local, source, t, count: int):
    """local[0:count] = source[t, 0:count], each thread its own copy (a token's mixes, read from global memory)."""
    for k in T.unroll(count):
        local[k] = source[t, k]


@T.macro
def store_row(dest, t, local, count: int):
    for k in T.unroll(count):
        dest[t, k] = local[k]


@T.macro
def load_square(local, source, t, mhc: int):
    """local[i * mhc + o] = source[t, i, o]: a token's (mhc, mhc) mixes, row-major."""
    for i in T.unroll(mhc):
        for o in T.unroll(mhc):
            local[i * mhc + o] = source[t, i, o]


@T.macro
def add_splits(total, k, source, *at):
    """total[k] = the sum over s of source[s, *at], s = 0, 1, ... from zero in order (a split-K sum)."""
    total[k] = T.float32(0)
    for split in T.serial(source.shape[0]):
        total[k] = total[k] + source[(split, *at)]


@T.macro
def walk_columns(column, sums, first, cols: int, hidden, acc, *more):
    """Thread u's columns u, u + THREADS, ... of the segment at `first` (those below `hidden`), in order, each given
    to column(j, acc, *more); acc holds the thread's running sums meanwhile: column u of `sums`, zero at the first
    segment."""
    for u in T.Parallel(THREADS):
        for k in T.unroll(sums.shape[0]):
            acc[k] = T.if_then_else(first == 0, T.float32(0), sums[k, u])
        for c in T.serial(cols // THREADS):
            if first + c * THREADS + u < hidden:
                column(c * THREADS + u, acc, *more)
        for k in T.unroll(sums.shape[0]):
            sums[k, u] = acc[k]


@T.macro
def thread_total(total, sums, k):
    """total[0] = the sum of row k of `sums` over its THREADS columns, in column order from zero."""
    total[0] = T.float32(0)
    for u in T.serial(THREADS):
        total[0] = total[0] + sums[k, u]


@T.macro
def finish_sums(sums, store, *outs):
    """A SIMT region: thread k < the row count of `sums` adds up row k (thread_total) and calls store(k, total, *outs)."""
    with T.SimtVF(threads=THREADS):
        total = T.alloc_local((1,), T.float32)
        for k in T.Parallel(THREADS):
            if k < sums.shape[0]:
                thread_total(total, sums, k)
                store(k, total[0], *outs)
