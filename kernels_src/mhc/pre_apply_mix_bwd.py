"""mhc_pre_apply_mix backward, one block of ROW_THREADS a token: x_grad[t, m, :] += mix[t, m] * o_grad[t, :] (in
place: fp32 fused multiply-add on the bf16 value, rounded once), and mix_grad[t, m] = sum over h of o_grad[t, h] *
x[t, m, h] (fp32; each thread sums its vectors in walk order, then the block adds the threads' sums in
kernels_src/mhc/common.py block_sum's order).

Each thread walks the row's 16-byte vectors ROW_THREADS apart, UNROLL at a time: the loads of UNROLL vectors (o_grad,
x and x_grad of each stream) issued before the first is computed and stored, so three times the bytes in flight of a
one-vector walk at the same sums (H200, 8192 x 4 x 7168: 355.4 µs against 361.3 for the one-vector walk and
TileKernels' 357.7 in one run; 2 vectors 358.0, 2 tokens a block 357.5, a cp.async ring 354.5 but a different
mix_grad order; bench/tuning/tune_ceiling1.py). Narrow rows lose: at hidden 1024 (one vector a thread) 59.4 µs against
the one-vector walk's 52.4 and TileKernels' 53.4, its 151 registers leaving 3 blocks an SM (bench/RESULTS.md, twentieth
session).
"""

import tilelang.language as T

from kernels_src.mhc.common import ROW_THREADS, VEC, WARP, block_sum, load_vec, stream_types, vec_entry
from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD

DECL = PRE_APPLY_MIX_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)
UNROLL = 3  # vectors a thread loads before it computes the first of them


def build(mhc_mult: int):
    mhc, unroll = mhc_mult, UNROLL  # streams a token
    num_tokens, hidden, rows, streams, mixes = stream_types(mhc)
    threads = ROW_THREADS
    warps = threads // WARP

    @T.prim_func
    def pre_apply_mix_bwd(o_grad: rows, x: streams, mix: mixes, x_grad: streams, mix_grad: mixes):
        with T.Kernel(num_tokens, threads=threads) as token:
            vec_entry(hidden)
            tid = T.get_thread_binding()
            row_vecs = hidden // VEC
            og = T.alloc_local((unroll, VEC), T.bfloat16)
            xs = T.alloc_local((unroll, mhc, VEC), T.bfloat16)
            xg = T.alloc_local((unroll, mhc, VEC), T.bfloat16)
            mixv = T.alloc_local((mhc,), T.float32)
            acc = T.alloc_local((mhc,), T.float32)
            red = T.alloc_shared((warps, mhc), T.float32)
            for m in T.unroll(mhc):
                acc[m] = 0.0
                mixv[m] = mix[token, m]
            for g in T.serial(T.ceildiv(row_vecs, threads * unroll)):
                for u in T.unroll(unroll):
                    if (g * unroll + u) * threads + tid < row_vecs:
                        load_vec(og, (u,), o_grad, (token, (g * unroll + u) * threads + tid))
                        for m in T.unroll(mhc):
                            load_vec(xs, (u, m), x, (token, m, (g * unroll + u) * threads + tid))
                            load_vec(xg, (u, m), x_grad, (token, m, (g * unroll + u) * threads + tid))
                for u in T.unroll(unroll):
                    if (g * unroll + u) * threads + tid < row_vecs:
                        for m in T.unroll(mhc):
                            for j in T.unroll(VEC):
                                acc[m] = acc[m] + T.cast(og[u, j], T.float32) * T.cast(xs[u, m, j], T.float32)
                                xg[u, m, j] = T.cast(T.cast(xg[u, m, j], T.float32) + mixv[m] * T.cast(og[u, j], T.float32), T.bfloat16)
                            for j in T.vectorized(VEC):
                                x_grad[token, m, ((g * unroll + u) * threads + tid) * VEC + j] = xg[u, m, j]
            block_sum(acc, red, mhc, threads)
            if tid == 0:
                for m in T.unroll(mhc):
                    mix_grad[token, m] = acc[m]

    return pre_apply_mix_bwd
