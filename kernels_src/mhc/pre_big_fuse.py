"""mHC pre-layer step, fused: split-K reduce + RMSNorm of the mixes, split into pre / post / comb mixes,
Sinkhorn on comb, and the pre mix applied to the residual streams.

Per token t (one block of 128 threads), with M = mhc_mult and the mixes m = sum over splits of
gemm_out_mul[:, t] times r = rsqrt(sum over splits of gemm_out_sqrsum[:, t] / (M * hidden) + rms_eps):
  post_mix[t, j]    = sigmoid(m[M + j] * mhc_scale[1] + mhc_base[M + j]) * mhc_post_mult_value
  comb_mix[t]       = Sinkhorn(m[2M:] * mhc_scale[2] + mhc_base[2M:], as M x M): a row softmax plus
                      mhc_sinkhorn_eps, a column normalisation, then sinkhorn_repeat - 1 times a row and
                      a column normalisation, each dividing by (sum + mhc_sinkhorn_eps)
  layer_input[t, h] = bf16(sum over i of pre[i] * residual[t, i, h]), pre[i] = sigmoid(m[i] * mhc_scale[0]
                      + mhc_base[i]) + mhc_pre_eps, summed in stream order from zero.

Threads 0 .. 3M²-ish (M * (M + 2)) reduce one mix each (the first M also make the pre mixes); after one
barrier, warp 0 runs Sinkhorn with one matrix element a lane (element lane % M², row and column sums by
xor shuffles over the lanes of a row, M/2 .. 1 apart, and of a column, M²/2 .. M apart), while warps 1..
apply the pre mix to 16-byte vectors of the hidden dimension. Hidden size, split count and
Sinkhorn repeats are runtime values; only M is static.
"""

from typing import NamedTuple

import tilelang.language as T

from kernels_src.mhc.sinkhorn_lanes import add
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import PRE_BIG_FUSE

DECL = PRE_BIG_FUSE  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
VEC = 8  # bf16 elements in 16 bytes
UNROLL = 2  # vectors a thread has in flight per stream
SPLITS = 16  # split partials a thread loads before adding them (in split order): one wait for 16 splits, not 16
MIN_BLOCKS = 8  # keeps the registers at 64 (as with a split at a time): 8 blocks an SM at 8192 tokens


def _log2(n: int) -> int:
    return n.bit_length() - 1


class Args(NamedTuple):
    """The arguments of both kernels (this one and kernels_src/mhc/pre_big_fuse_split.py), and the dims of the
    tensors, n_splits and hidden."""

    gemm_out_mul: T.Buffer
    gemm_out_sqrsum: T.Buffer
    mhc_scale: T.Buffer
    mhc_base: T.Buffer
    residual: T.Buffer
    post_mix: T.Buffer
    comb_mix: T.Buffer
    layer_input: T.Buffer
    rms_eps: T.Var
    mhc_pre_eps: T.Var
    mhc_sinkhorn_eps: T.Var
    mhc_post_mult_value: T.Var
    sinkhorn_repeat: T.Var
    n_splits: T.Var
    hidden: T.Var


def kernel(m: int, body):
    """The prim_func mhc_pre_big_fuse (both kernels' entry symbol) for M = m: body(args, num_tokens), a macro,
    emits it."""
    mm = m * m
    mix_count = m * (m + 2)
    num_tokens = T.dynamic("num_tokens")
    n_splits = T.dynamic("n_splits")
    hidden = T.dynamic("hidden")

    @T.prim_func
    def mhc_pre_big_fuse(
        gemm_out_mul: T.Tensor[(n_splits, num_tokens, mix_count), T.float32],
        gemm_out_sqrsum: T.Tensor[(n_splits, num_tokens), T.float32],
        mhc_scale: T.Tensor[(3,), T.float32],
        mhc_base: T.Tensor[(mix_count,), T.float32],
        residual: T.Tensor[(num_tokens, m, hidden), T.bfloat16],
        post_mix: T.Tensor[(num_tokens, m), T.float32],
        comb_mix: T.Tensor[(num_tokens, mm), T.float32],
        layer_input: T.Tensor[(num_tokens, hidden), T.bfloat16],
        rms_eps: T.float32,
        mhc_pre_eps: T.float32,
        mhc_sinkhorn_eps: T.float32,
        mhc_post_mult_value: T.float32,
        sinkhorn_repeat: T.int32,
    ):
        body(
            Args(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input, rms_eps,
                 mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits, hidden),
            num_tokens,
        )  # fmt: skip

    return mhc_pre_big_fuse


class Tiles(NamedTuple):
    """A block's shared mixes and pre mixes, and a thread's variables and local tiles."""

    mixes: T.Buffer
    pre: T.Buffer
    squares: T.Buffer
    mix: T.Buffer
    cm: T.Buffer
    total: T.Buffer
    xv: T.Buffer
    acc: T.Buffer
    out: T.Buffer
    sq_part: T.Buffer
    mix_part: T.Buffer


def token_tiles(m: int, unroll: int) -> Tiles:
    """The Tiles for M = m and `unroll` vectors a stream in flight, allocated in field order."""
    mixes = T.alloc_shared((m * (m + 2),), T.float32)
    pre = T.alloc_shared((m,), T.float32)
    squares = T.alloc_var(T.float32)
    mix = T.alloc_var(T.float32)
    cm = T.alloc_var(T.float32)
    total = T.alloc_var(T.float32)
    xv = T.alloc_local((unroll, m, VEC), T.bfloat16)
    acc = T.alloc_local((VEC,), T.float32)
    out = T.alloc_local((VEC,), T.bfloat16)
    sq_part = T.alloc_local((SPLITS,), T.float32)
    mix_part = T.alloc_local((SPLITS,), T.float32)
    return Tiles(mixes, pre, squares, mix, cm, total, xv, acc, out, sq_part, mix_part)


@T.macro
def token_entry(hidden, min_blocks: int):
    kernel_entry()
    T.assume(hidden % VEC == 0)
    T.annotate_min_blocks_per_sm(min_blocks)


@T.macro
def token_mixes(a: Args, b: Tiles, t, tid, m: int):
    """b.mixes[tid] for the threads tid < M * (M + 2): split sums from zero, times the RMS factor of token t's
    residual; b.pre[tid] the pre mix for tid < M."""
    n_splits = a.n_splits
    squares = b.squares
    mix = b.mix
    if tid < m * (m + 2):
        squares = T.float32(0)
        mix = T.float32(0)
        for chunk in T.serial(T.ceildiv(n_splits, SPLITS)):
            for u in T.unroll(SPLITS):
                if chunk * SPLITS + u < n_splits:
                    b.sq_part[u] = a.gemm_out_sqrsum[chunk * SPLITS + u, t]
                    b.mix_part[u] = a.gemm_out_mul[chunk * SPLITS + u, t, tid]
            for u in T.unroll(SPLITS):
                if chunk * SPLITS + u < n_splits:
                    squares = squares + b.sq_part[u]
            for u in T.unroll(SPLITS):
                if chunk * SPLITS + u < n_splits:
                    mix = mix + b.mix_part[u]
        mix = mix * T.rsqrt(squares / T.cast(m * a.hidden, T.float32) + a.rms_eps)
        b.mixes[tid] = mix
        if tid < m:
            b.pre[tid] = T.sigmoid(mix * a.mhc_scale[0] + a.mhc_base[tid]) + a.mhc_pre_eps


@T.macro
def butterfly(total: T.Ref, value, first, stride: int, m: int, combine):
    """total = combine over the M lanes of value's line, `stride` lanes apart, by xor shuffles M * stride / 2 ..
    stride apart (a line of post_and_comb; its first lane, `first`, is not needed)."""
    total = value
    for s in T.unroll(_log2(m)):
        total = combine(total, T.shfl_xor(total, (m * stride // 2) >> s))


@T.macro
def post_and_comb(a: Args, b: Tiles, t, tid, m: int, line=butterfly):
    """post_mix[t] and comb_mix[t] from the mixes, by one warp: one matrix element a lane; each row max, row sum
    and column sum by line(total, value, first, stride, m, combine) over the M lanes first, first + stride, ...
    (stride 1 along a row, M along a column), by default xor shuffles (butterfly)."""
    mm = m * m
    cm = b.cm
    total = b.total
    if tid < m:
        a.post_mix[t, tid] = T.sigmoid(b.mixes[m + tid] * a.mhc_scale[1] + a.mhc_base[m + tid]) * a.mhc_post_mult_value
    e = tid % mm
    base = tid - e  # the lanes of this copy of the matrix
    row = base + (e // m) * m  # lane of the row's first element
    col = base + e % m  # lane of the column's first element
    cm = b.mixes[2 * m + e] * a.mhc_scale[2] + a.mhc_base[2 * m + e]
    # row softmax (max and sum over the M lanes of a row), plus eps
    line(total, cm, row, 1, m, T.max)
    cm = T.exp(cm - total)
    line(total, cm, row, 1, m, add)
    cm = cm / total + a.mhc_sinkhorn_eps
    line(total, cm, col, m, m, add)
    cm = cm / (total + a.mhc_sinkhorn_eps)
    for _ in T.serial(a.sinkhorn_repeat - 1):
        line(total, cm, row, 1, m, add)
        cm = cm / (total + a.mhc_sinkhorn_eps)
        line(total, cm, col, m, m, add)
        cm = cm / (total + a.mhc_sinkhorn_eps)
    if tid < mm:
        a.comb_mix[t, tid] = cm


@T.macro
def load_residual(a: Args, b: Tiles, t, it, part, worker, vectors, workers: int, blocks: int, unroll: int, m: int):
    """b.xv[u], u < unroll: the streams of token t's vector (it * unroll + u) * workers * blocks + part * workers +
    worker of the hidden dimension (the `blocks` blocks' workers interleaved; worker < 0 or past the vectors: none)."""
    for u in T.unroll(unroll):
        if 0 <= worker and (it * unroll + u) * workers * blocks + part * workers + worker < vectors:
            for i in T.unroll(m):
                for k in T.vectorized(VEC):
                    b.xv[u, i, k] = a.residual[t, i, ((it * unroll + u) * workers * blocks + part * workers + worker) * VEC + k]


@T.macro
def pre_mixed_vector(a: Args, b: Tiles, t, u, v, m: int):
    """Vector v of layer_input[t] = bf16 of the pre-mix-weighted sum of b.xv[u]'s streams, in stream order from zero."""
    for k in T.unroll(VEC):
        b.acc[k] = T.float32(0)
    for i in T.unroll(m):
        for k in T.unroll(VEC):
            b.acc[k] = b.acc[k] + b.pre[i] * T.cast(b.xv[u, i, k], T.float32)
    for k in T.unroll(VEC):
        b.out[k] = T.cast(b.acc[k], T.bfloat16)
    for k in T.vectorized(VEC):
        a.layer_input[t, v * VEC + k] = b.out[k]


def build(mhc_mult: int):
    m = mhc_mult

    @T.macro
    def body(a: Args, num_tokens):
        with T.Kernel(num_tokens, threads=THREADS) as t:
            token_entry(a.hidden, MIN_BLOCKS)
            tid = T.get_thread_binding()
            b = token_tiles(m, UNROLL)

            token_mixes(a, b, t, tid, m)
            T.sync_threads()

            if tid < 32:
                post_and_comb(a, b, t, tid, m)

            # layer_input = the pre-mix-weighted sum of the residual streams
            # by warps 1.. only: warp 0 runs the Sinkhorn meanwhile, and their loads overlap it (H200, 20 repeats:
            # 141.96 us at 8192 tokens, 5.27 at 1 token; with warp 0 sharing the streams 145.78 and 7.36, and
            # sharing them only above 264 tokens 145.69 and 5.28)
            vectors = a.hidden // VEC
            workers = THREADS - 32
            worker = tid - 32
            for it in T.serial(T.ceildiv(vectors, workers * UNROLL)):
                load_residual(a, b, t, it, 0, worker, vectors, workers, 1, UNROLL, m)
                for u in T.unroll(UNROLL):
                    v = (it * UNROLL + u) * workers + worker
                    if 0 <= worker and v < vectors:
                        pre_mixed_vector(a, b, t, u, v, m)

    return kernel(m, body)
