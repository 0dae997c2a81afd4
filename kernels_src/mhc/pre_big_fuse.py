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

import tilelang.language as T

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


def build(mhc_mult: int):
    m = mhc_mult
    mm = m * m
    mix_count = m * (m + 2)
    num_tokens = T.dynamic("num_tokens")
    n_splits = T.dynamic("n_splits")
    hidden = T.dynamic("hidden")

    @T.macro
    def row_sum(x):
        for s in T.unroll(_log2(m)):
            x = x + T.shfl_xor(x, (m // 2) >> s)
        return x

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
        with T.Kernel(num_tokens, threads=THREADS) as t:
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

            if tid < 32:
                if tid < m:
                    post_mix[t, tid] = T.sigmoid(mixes[m + tid] * mhc_scale[1] + mhc_base[m + tid]) * mhc_post_mult_value
                e = tid % mm
                cm = mixes[2 * m + e] * mhc_scale[2] + mhc_base[2 * m + e]
                # row softmax (max and sum over the M lanes of a row), plus eps
                total = cm
                for s in T.unroll(_log2(m)):
                    total = T.max(total, T.shfl_xor(total, (m // 2) >> s))
                cm = T.exp(cm - total)
                total = cm
                for s in T.unroll(_log2(m)):
                    total = total + T.shfl_xor(total, (m // 2) >> s)
                cm = cm / total + mhc_sinkhorn_eps
                total = cm
                for s in T.unroll(_log2(m)):
                    total = total + T.shfl_xor(total, (mm // 2) >> s)
                cm = cm / (total + mhc_sinkhorn_eps)
                for _ in T.serial(sinkhorn_repeat - 1):
                    total = cm
                    for s in T.unroll(_log2(m)):
                        total = total + T.shfl_xor(total, (m // 2) >> s)
                    cm = cm / (total + mhc_sinkhorn_eps)
                    total = cm
                    for s in T.unroll(_log2(m)):
                        total = total + T.shfl_xor(total, (mm // 2) >> s)
                    cm = cm / (total + mhc_sinkhorn_eps)
                if tid < mm:
                    comb_mix[t, tid] = cm

            # layer_input = the pre-mix-weighted sum of the residual streams
            # by warps 1.. only: warp 0 runs the Sinkhorn meanwhile, and their loads overlap it (H200, 20 repeats:
            # 141.96 us at 8192 tokens, 5.27 at 1 token; with warp 0 sharing the streams 145.78 and 7.36, and
            # sharing them only above 264 tokens 145.69 and 5.28)
            vectors = hidden // VEC
            workers = THREADS - 32
            worker = tid - 32
            for it in T.serial(T.ceildiv(vectors, workers * UNROLL)):
                for u in T.unroll(UNROLL):
                    v = (it * UNROLL + u) * workers + worker
                    if 0 <= worker and v < vectors:
                        for i in T.unroll(m):
                            for k in T.vectorized(VEC):
                                xv[u, i, k] = residual[t, i, v * VEC + k]
                for u in T.unroll(UNROLL):
                    v = (it * UNROLL + u) * workers + worker
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
