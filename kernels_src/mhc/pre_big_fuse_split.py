"""mHC pre-layer step, fused (kernels_src/mhc/pre_big_fuse.py's sums, order and outputs), for few tokens:
BLOCKS blocks a token of THREADS threads, so a decode step's one token is not one block's work alone.

Every block reduces the token's mixes (the same sums in the same order); block 0's warp 0 writes post_mix and
runs the Sinkhorn for comb_mix; warps 1.. of every block apply the pre mix to their share of the hidden
vectors (a vector of 8 bf16 a worker, the blocks' workers interleaved). A worker issues its first residual
loads before the mixes are reduced, so a decode token waits for memory about once (the splits and the
residual together), not once a round of vectors. The token is the grid's y index: the op launches this kernel
for at most tkaot/_mhc/big_fuse.py's SPLIT_MAX_TOKENS tokens, far below the grid's y limit (65535).
"""

import tilelang.language as T

from kernels_src.mhc.common import VEC, WARP
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import PRE_BIG_FUSE_SPLIT

DECL = PRE_BIG_FUSE_SPLIT  # the declaration this module builds (tkaot/_mhc/kernels.py)

# H200, 1 x 4 x 7168 bf16, 16 splits, 20 repeats: 4 x 256 threads 4.83 us, 2 x 512 4.96, the one-block kernel 5.28
# (TileKernels 4.78); at 8192 tokens 208.24, 234.57 and 140.92: the op chooses by token count
THREADS = 256
BLOCKS = 4
UNROLL = 1  # vectors a worker has in flight per stream
SPLITS = 16  # split partials a thread loads before adding them, as the one-block kernel
MIN_BLOCKS = 1024 // THREADS  # registers capped as the one-block kernel's: 64 a thread


def _log2(n: int) -> int:
    return n.bit_length() - 1


def build(mhc_mult: int):
    m = mhc_mult
    mm = m * m
    mix_count = m * (m + 2)
    workers = THREADS - WARP  # warps 1.. of every block
    log_m = _log2(m)
    num_tokens = T.dynamic("num_tokens")
    n_splits = T.dynamic("n_splits")
    hidden = T.dynamic("hidden")

    @T.macro
    def load_residual(xv, residual, t, it, part, worker, vectors):
        for u in T.unroll(UNROLL):
            if 0 <= worker and (it * UNROLL + u) * workers * BLOCKS + part * workers + worker < vectors:
                for i in T.unroll(m):
                    for k in T.vectorized(VEC):
                        xv[u, i, k] = residual[t, i, ((it * UNROLL + u) * workers * BLOCKS + part * workers + worker) * VEC + k]

    # named as the one-block kernel: the same entry symbol
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
        with T.Kernel(BLOCKS, num_tokens, threads=THREADS) as (part, t):
            kernel_entry()
            T.assume(hidden % VEC == 0)
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tid = T.get_thread_binding()
            mixes = T.alloc_shared((mix_count,), T.float32)
            pre = T.alloc_shared((m,), T.float32)
            squares = T.alloc_var(T.float32)
            mix = T.alloc_var(T.float32)
            cm = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            xv = T.alloc_local((UNROLL, m, VEC), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            out = T.alloc_local((VEC,), T.bfloat16)
            sq_part = T.alloc_local((SPLITS,), T.float32)
            mix_part = T.alloc_local((SPLITS,), T.float32)
            vectors = hidden // VEC
            worker = tid - WARP

            # the first residual vectors are in flight while the mixes are reduced
            load_residual(xv, residual, t, 0, part, worker, vectors)

            # the mixes: split sums from zero, times the RMS factor of the token's residual
            if tid < mix_count:
                squares = T.float32(0)
                mix = T.float32(0)
                for chunk in T.serial(T.ceildiv(n_splits, SPLITS)):
                    for u in T.unroll(SPLITS):
                        if chunk * SPLITS + u < n_splits:
                            sq_part[u] = gemm_out_sqrsum[chunk * SPLITS + u, t]
                            mix_part[u] = gemm_out_mul[chunk * SPLITS + u, t, tid]
                    for u in T.unroll(SPLITS):
                        if chunk * SPLITS + u < n_splits:
                            squares = squares + sq_part[u]
                    for u in T.unroll(SPLITS):
                        if chunk * SPLITS + u < n_splits:
                            mix = mix + mix_part[u]
                mix = mix * T.rsqrt(squares / T.cast(m * hidden, T.float32) + rms_eps)
                mixes[tid] = mix
                if tid < m:
                    pre[tid] = T.sigmoid(mix * mhc_scale[0] + mhc_base[tid]) + mhc_pre_eps
            T.sync_threads()

            # post mix and Sinkhorn, once a token: block 0's warp 0, one matrix element a lane
            if tid < WARP and part == 0:
                if tid < m:
                    post_mix[t, tid] = T.sigmoid(mixes[m + tid] * mhc_scale[1] + mhc_base[m + tid]) * mhc_post_mult_value
                e = tid % mm
                cm = mixes[2 * m + e] * mhc_scale[2] + mhc_base[2 * m + e]
                total = cm
                for s in T.unroll(log_m):
                    total = T.max(total, T.shfl_xor(total, (m // 2) >> s))
                cm = T.exp(cm - total)
                total = cm
                for s in T.unroll(log_m):
                    total = total + T.shfl_xor(total, (m // 2) >> s)
                cm = cm / total + mhc_sinkhorn_eps
                total = cm
                for s in T.unroll(log_m):
                    total = total + T.shfl_xor(total, (mm // 2) >> s)
                cm = cm / (total + mhc_sinkhorn_eps)
                for _ in T.serial(sinkhorn_repeat - 1):
                    total = cm
                    for s in T.unroll(log_m):
                        total = total + T.shfl_xor(total, (m // 2) >> s)
                    cm = cm / (total + mhc_sinkhorn_eps)
                    total = cm
                    for s in T.unroll(log_m):
                        total = total + T.shfl_xor(total, (mm // 2) >> s)
                    cm = cm / (total + mhc_sinkhorn_eps)
                if tid < mm:
                    comb_mix[t, tid] = cm

            # layer_input = the pre-mix-weighted sum of the residual streams, in stream order from zero
            for it in T.serial(T.ceildiv(vectors, workers * BLOCKS * UNROLL)):
                if it > 0:
                    load_residual(xv, residual, t, it, part, worker, vectors)
                for u in T.unroll(UNROLL):
                    v = (it * UNROLL + u) * workers * BLOCKS + part * workers + worker
                    if 0 <= worker and v < vectors:
                        for k in T.unroll(VEC):
                            acc[k] = T.float32(0)
                        for i in T.unroll(m):
                            for k in T.unroll(VEC):
                                acc[k] = acc[k] + pre[i] * T.cast(xv[u, i, k], T.float32)
                        for k in T.unroll(VEC):
                            out[k] = T.cast(acc[k], T.bfloat16)
                        for k in T.vectorized(VEC):
                            layer_input[t, v * VEC + k] = out[k]

    return mhc_pre_big_fuse
