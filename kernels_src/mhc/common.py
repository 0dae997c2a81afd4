"""Pieces the mHC kernels share: the bf16 vector width, sums in a fixed order, a block-wide sum, kernel frames, and the
runtime dims and argument types that several kernels (or both backends of one) take, written once."""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.tensors import fp32, tensor

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


@T.macro
def vec_entry(hidden):
    """The entry of a kernel over bf16 rows of `hidden` elements: the PDL wait (kernels_src/pdl.py) before any
    memory access, then the op's promise that hidden is a positive multiple of VEC."""
    kernel_entry()
    T.assume(hidden % VEC == 0)
    T.assume(hidden > 0)


@T.macro
def flat_slot(token, col, u, first, row_vecs):
    """token[u], col[u]: the token and 16-byte column of vector number `first` (vectors numbered row-major
    across (num_tokens, hidden), row_vecs a row)."""
    v = first
    token[u] = v // row_vecs
    col[u] = v % row_vecs


@T.macro
def load_vec(dst, di, src, si):
    """dst[*di, 0:VEC] = vector si[-1] of src[*si[:-1]] (its elements si[-1] * VEC ...), one 16-byte access. The
    indices come in tuples, which a macro takes as they are (a lone expression argument becomes a new local)."""
    for j in T.vectorized(VEC):
        dst[di + (j,)] = src[si[:-1] + (si[-1] * VEC + j,)]


@T.macro
def store_bf16(tmp, acc, dst, di):
    """Vector di[-1] of dst[*di[:-1]] = the fp32 acc[0:VEC] rounded to bf16 (through tmp), one access."""
    for j in T.unroll(VEC):
        tmp[j] = T.cast(acc[j], T.bfloat16)
    for j in T.vectorized(VEC):
        dst[di[:-1] + (di[-1] * VEC + j,)] = tmp[j]


def row_dims():
    """The runtime (num_tokens, hidden) of a kernel over bf16 rows."""
    return T.dynamic("num_tokens"), T.dynamic("hidden")


def stream_types(mhc: int):
    """The runtime (num_tokens, hidden) of a kernel between a token's row and its mhc streams (pre_apply_mix, both
    directions) and its argument types: the (num_tokens, hidden) bf16 rows, the (num_tokens, mhc, hidden) bf16
    streams and the (num_tokens, mhc) fp32 mixes."""
    num_tokens, hidden = row_dims()
    rows, streams = tensor(T.bfloat16, num_tokens, hidden), tensor(T.bfloat16, num_tokens, mhc, hidden)
    return num_tokens, hidden, rows, streams, fp32(num_tokens, mhc)


def normw_merge_types():
    """The norm-weight merge kernels' runtime (m, n) and their argument types: the (m, n) fp32 rows of the mixing
    projection and the (n,) fp32 weights."""
    m, n = T.dynamic("m"), T.dynamic("n")
    return m, n, fp32(m, n), fp32(n)


def normw_merge_fwd_kernel(body):
    """The mhc_normw_merge_fwd prim_func of both backends, its arguments written once in the declaration's order
    (tkaot/_mhc/kernels.py, which the build checks); body(m, n, fn, normw, out_fn), a @T.macro, emits the kernel."""
    m, n, rows, weights = normw_merge_types()

    @T.prim_func
    def mhc_normw_merge_fwd(fn: rows, normw: weights, out_fn: rows):
        body(m, n, fn, normw, out_fn)

    return mhc_normw_merge_fwd


def normw_merge_bwd_kernel(body):
    """The mhc_normw_merge_bwd prim_func of both backends (normw_merge_fwd_kernel); body(m, n, fn, normw,
    out_fn_grad, fn_grad, normw_grad), a @T.macro, emits the kernel."""
    m, n, rows, weights = normw_merge_types()

    @T.prim_func
    def mhc_normw_merge_bwd(fn: rows, normw: weights, out_fn_grad: rows, fn_grad: rows, normw_grad: weights):
        body(m, n, fn, normw, out_fn_grad, fn_grad, normw_grad)

    return mhc_normw_merge_bwd


def mix_types(num_tokens, width, scales: int):
    """The argument types of the mix kernels (head mix, split mixes): the (num_tokens, width) fp32 mixes, the (scales,)
    fp32 scales and the (width,) fp32 bases."""
    return fp32(num_tokens, width), fp32(scales), fp32(width)


def partial_dims():
    """The runtime (num_tokens, n_rms_group, mhc_mult3) of the reduce-partials kernels (both directions, both
    backends): a token's rows of RMS groups."""
    return T.dynamic("num_tokens"), T.dynamic("n_rms_group"), T.dynamic("mhc_mult3")


def flat_blocks(num_tokens, hidden, per_block: int):
    """Blocks enough for the num_tokens * hidden / VEC vectors of the rows, per_block vectors a block."""
    return T.ceildiv(num_tokens * (hidden // VEC), per_block)


@T.macro
def flat_slots(token, col, block, tid, row_vecs, num_tokens, threads: int, unroll: int, load, finish, bufs):
    """A thread's `unroll` vectors, `threads` apart from the block's first (flat_slot): load(u) for each vector
    in range first, then finish(u) for each; token and col are (unroll,) int32 locals."""
    for u in T.unroll(unroll):
        flat_slot(token, col, u, (block * unroll + u) * threads + tid, row_vecs)
        if token[u] < num_tokens:
            T.assume(0 <= token[u] and 0 <= col[u] and col[u] < row_vecs)
            load(u, *bufs)
    for u in T.unroll(unroll):
        if token[u] < num_tokens:
            T.assume(0 <= token[u] and 0 <= col[u] and col[u] < row_vecs)
            finish(u, *bufs)


# The kernels over a token's row (token_row_kernel): threads a block, one block a token
ROW_THREADS = 128


@T.macro
def token_row_kernel(num_tokens, hidden, count: int, tiles, start, visit, finish, tensors):
    """The kernel of an op with one block of ROW_THREADS a token: each thread walks the token's row of 16-byte
    vectors ROW_THREADS apart (so hidden is a runtime value), then `count` fp32 sums over the row are added across
    the block (block_sum). tiles() allocates the thread's local tiles and returns them, the (count,) sums last;
    start(*tiles, *tensors, token) runs before the walk, visit(*tiles, *tensors, token, col) for each of the
    thread's vectors col (an int32 variable: visit takes it as a T.Ref), finish(*tiles, *tensors, token) in thread
    0 with the block's sums."""
    threads = ROW_THREADS
    with T.Kernel(num_tokens, threads=threads) as token:
        vec_entry(hidden)
        tid = T.get_thread_binding()
        row_vecs = hidden // VEC
        bufs = tiles()
        red = T.alloc_shared((threads // WARP, count), T.float32)
        col = T.alloc_var(T.int32)
        start(*bufs, *tensors, token)
        for step in T.serial(T.ceildiv(row_vecs, threads)):
            col = step * threads + tid
            if col < row_vecs:
                T.assume(0 <= col)
                visit(*bufs, *tensors, token, col)
        block_sum(bufs[-1], red, count, threads)
        if tid == 0:
            finish(*bufs, *tensors, token)


# The tiling of the kernels over flat vectors (flat_kernel): threads a block, vectors a thread
FLAT_THREADS = 256
FLAT_UNROLL = 2


@T.macro
def flat_kernel(num_tokens, hidden, tiles, load, finish, tensors):
    """The kernel of an op over the vectors of bf16 rows (num_tokens, hidden): flat_blocks blocks of FLAT_THREADS,
    each thread FLAT_UNROLL vectors (flat_slots). tiles() allocates the thread's local tiles and returns them; load
    and finish take (u, *tiles, *tensors, token, col)."""
    threads, unroll = FLAT_THREADS, FLAT_UNROLL
    with T.Kernel(flat_blocks(num_tokens, hidden, threads * unroll), threads=threads) as block:
        vec_entry(hidden)
        tid = T.get_thread_binding()
        row_vecs = hidden // VEC
        bufs = tiles()
        token = T.alloc_local((unroll,), T.int32)
        col = T.alloc_local((unroll,), T.int32)

        flat_slots(token, col, block, tid, row_vecs, num_tokens, threads, unroll, load, finish, (*bufs, *tensors, token, col))


@T.macro
def stream_sum_store(acc, tmp, vals, weights, u, mhc: int, dst, di):
    """acc[0:VEC] = the sum over m of weights[u, m] * vals[u, m, :] (weights None: of vals[u, m, :]), in fp32 from 0
    in stream order, each weighted term a fused multiply-add; stored rounded to bf16 (store_bf16)."""
    for j in T.unroll(VEC):
        acc[j] = 0.0
    for m in T.unroll(mhc):
        for j in T.unroll(VEC):
            acc[j] = acc[j] + _term(vals, weights, u, m, j)
    store_bf16(tmp, acc, dst, di)


def _term(vals, weights, u, m, j):
    value = T.cast(vals[u, m, j], T.float32)
    return value if weights is None else weights[u, m] * value
