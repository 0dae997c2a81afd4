"""Candidate bodies of mhc_pre_apply_mix_bwd (kernels_src/mhc/pre_apply_mix_bwd.py) for bench/tuning/tune_ceiling1.py.

The shipped kernel's sums in the shipped order, so its bytes: a token's 128 lanes each walk the row's 16-byte
vectors 128 apart (lane l: vectors l, l + 128, ...), each lane's four fp32 dot products added vector by vector,
then the warp butterfly (kernels_src/mhc/common.py block_sum) and the four warps' sums added in warp order; x_grad
one fp32 multiply-add a value on its bf16 value, rounded once. What changes:
- unroll U: a lane issues the loads of U of its vectors (o_grad, x and x_grad of each) before it computes and
  stores the first of them (the shipped walk: one vector's 9 loads, then its stores), so U times the bytes in flight;
- tokens a block: a block of 128 * tokens lanes runs that many tokens (each 128-lane group its own token, its sums
  through its own rows of the shared partials), so fewer, larger blocks (the grid ceil(num_tokens / tokens)).
"""

import tilelang.language as T

from kernels_src.mhc.common import ROW_THREADS, VEC, WARP, load_vec, stream_types, vec_entry


def make_build(unroll: int = 1, tokens: int = 1):
    """build(mhc_mult) of the candidate with `unroll` vectors' loads issued together and `tokens` tokens a block."""

    def build(mhc_mult: int):
        mhc = mhc_mult
        num_tokens, hidden, rows, streams, mixes = stream_types(mhc)
        threads = ROW_THREADS * tokens
        warps = ROW_THREADS // WARP  # a token's warps

        @T.prim_func
        def pre_apply_mix_bwd(o_grad: rows, x: streams, mix: mixes, x_grad: streams, mix_grad: mixes):
            with T.Kernel(T.ceildiv(num_tokens, tokens), threads=threads) as block:
                vec_entry(hidden)
                tid = T.get_thread_binding()
                lane = tid % ROW_THREADS
                group = tid // ROW_THREADS
                token = block * tokens + group
                row_vecs = hidden // VEC
                og = T.alloc_local((unroll, VEC), T.bfloat16)
                xs = T.alloc_local((unroll, mhc, VEC), T.bfloat16)
                xg = T.alloc_local((unroll, mhc, VEC), T.bfloat16)
                mixv = T.alloc_local((mhc,), T.float32)
                acc = T.alloc_local((mhc,), T.float32)
                red = T.alloc_shared((threads // WARP, mhc), T.float32)
                for m in T.unroll(mhc):
                    acc[m] = 0.0
                if token < num_tokens:
                    for m in T.unroll(mhc):
                        mixv[m] = mix[token, m]
                    for g in T.serial(T.ceildiv(row_vecs, ROW_THREADS * unroll)):
                        for u in T.unroll(unroll):
                            if (g * unroll + u) * ROW_THREADS + lane < row_vecs:
                                load_vec(og, (u,), o_grad, (token, (g * unroll + u) * ROW_THREADS + lane))
                                for m in T.unroll(mhc):
                                    load_vec(xs, (u, m), x, (token, m, (g * unroll + u) * ROW_THREADS + lane))
                                    load_vec(xg, (u, m), x_grad, (token, m, (g * unroll + u) * ROW_THREADS + lane))
                        for u in T.unroll(unroll):
                            if (g * unroll + u) * ROW_THREADS + lane < row_vecs:
                                for m in T.unroll(mhc):
                                    for j in T.unroll(VEC):
                                        acc[m] = acc[m] + T.cast(og[u, j], T.float32) * T.cast(xs[u, m, j], T.float32)
                                        xg[u, m, j] = T.cast(
                                            T.cast(xg[u, m, j], T.float32) + mixv[m] * T.cast(og[u, j], T.float32), T.bfloat16
                                        )
                                    for j in T.vectorized(VEC):
                                        x_grad[token, m, ((g * unroll + u) * ROW_THREADS + lane) * VEC + j] = xg[u, m, j]
                for k in T.unroll(mhc):  # block_sum's order: the warp butterfly, then the token's warps in order
                    for i in T.unroll(5):
                        acc[k] += T.shfl_xor(acc[k], 16 >> i)
                if tid % WARP == 0:
                    for k in T.unroll(mhc):
                        red[tid // WARP, k] = acc[k]
                T.sync_threads()
                if lane == 0 and token < num_tokens:
                    for k in T.unroll(mhc):
                        acc[k] = red[group * warps, k]
                        for w in T.unroll(warps - 1):
                            acc[k] += red[group * warps + w + 1, k]
                        mix_grad[token, k] = acc[k]

        return pre_apply_mix_bwd

    return build


@T.macro
def _cp(dst, src):
    """16 bytes from global src to shared dst by cp.async (both element accesses)."""
    T.ptx_cp_async(T.access_ptr(dst, "w", VEC), T.access_ptr(src, "r", VEC), VEC)


def make_ring_build(stages: int):
    """build(mhc_mult) of the candidate "r<stages>": each lane stages its own vectors (o_grad, then x and x_grad of
    each stream: 1 + 2 * mhc 16-byte copies a vector) by cp.async into a private ring of `stages` slots in shared
    memory, `stages - 1` vectors ahead of the one it computes (one commit group a vector, empty past the row's end,
    so the wait count is fixed); the vector computed from its slot (LDS.128) exactly as the shipped walk, x_grad
    stored from registers. A lane reads only the slots it wrote, so no barrier. 128 lanes a token, one token a block:
    the shipped sums in the shipped order. Shared: stages * (1 + 2 * mhc) * 128 * 16 bytes."""

    def build(mhc_mult: int):
        mhc = mhc_mult
        num_tokens, hidden, rows, streams, mixes = stream_types(mhc)
        threads = ROW_THREADS
        parts = 1 + 2 * mhc  # o_grad, x[0..mhc), x_grad[0..mhc)

        @T.prim_func
        def pre_apply_mix_bwd(o_grad: rows, x: streams, mix: mixes, x_grad: streams, mix_grad: mixes):
            with T.Kernel(num_tokens, threads=threads) as token:
                vec_entry(hidden)
                tid = T.get_thread_binding()
                row_vecs = hidden // VEC
                steps = T.ceildiv(row_vecs, threads)
                ring = T.alloc_shared((stages, parts, threads, VEC), T.bfloat16)
                og = T.alloc_local((VEC,), T.bfloat16)
                xs = T.alloc_local((mhc, VEC), T.bfloat16)
                xg = T.alloc_local((mhc, VEC), T.bfloat16)
                mixv = T.alloc_local((mhc,), T.float32)
                acc = T.alloc_local((mhc,), T.float32)
                red = T.alloc_shared((threads // WARP, mhc), T.float32)
                for m in T.unroll(mhc):
                    mixv[m] = mix[token, m]
                    acc[m] = 0.0
                for p in T.unroll(stages - 1):  # the prologue: vectors 0 .. stages - 2
                    if p * threads + tid < row_vecs:
                        _cp(ring[p, 0, tid, 0], o_grad[token, (p * threads + tid) * VEC])
                        for m in T.unroll(mhc):
                            _cp(ring[p, 1 + m, tid, 0], x[token, m, (p * threads + tid) * VEC])
                            _cp(ring[p, 1 + mhc + m, tid, 0], x_grad[token, m, (p * threads + tid) * VEC])
                    T.ptx_commit_group()
                for step in T.serial(steps):
                    ahead = step + stages - 1
                    if ahead * threads + tid < row_vecs:
                        _cp(ring[ahead % stages, 0, tid, 0], o_grad[token, (ahead * threads + tid) * VEC])
                        for m in T.unroll(mhc):
                            _cp(ring[ahead % stages, 1 + m, tid, 0], x[token, m, (ahead * threads + tid) * VEC])
                            _cp(ring[ahead % stages, 1 + mhc + m, tid, 0], x_grad[token, m, (ahead * threads + tid) * VEC])
                    T.ptx_commit_group()
                    T.ptx_wait_group(stages - 1)
                    if step * threads + tid < row_vecs:
                        for j in T.vectorized(VEC):
                            og[j] = ring[step % stages, 0, tid, j]
                        for m in T.unroll(mhc):
                            for j in T.vectorized(VEC):
                                xs[m, j] = ring[step % stages, 1 + m, tid, j]
                            for j in T.vectorized(VEC):
                                xg[m, j] = ring[step % stages, 1 + mhc + m, tid, j]
                        for m in T.unroll(mhc):
                            for j in T.unroll(VEC):
                                acc[m] = acc[m] + T.cast(og[j], T.float32) * T.cast(xs[m, j], T.float32)
                                xg[m, j] = T.cast(T.cast(xg[m, j], T.float32) + mixv[m] * T.cast(og[j], T.float32), T.bfloat16)
                            for j in T.vectorized(VEC):
                                x_grad[token, m, (step * threads + tid) * VEC + j] = xg[m, j]
                for k in T.unroll(mhc):  # block_sum's order
                    for i in T.unroll(5):
                        acc[k] += T.shfl_xor(acc[k], 16 >> i)
                if tid % WARP == 0:
                    for k in T.unroll(mhc):
                        red[tid // WARP, k] = acc[k]
                T.sync_threads()
                if tid == 0:
                    for k in T.unroll(mhc):
                        acc[k] = red[0, k]
                        for w in T.unroll(threads // WARP - 1):
                            acc[k] += red[w + 1, k]
                        mix_grad[token, k] = acc[k]

        return pre_apply_mix_bwd

    return build
