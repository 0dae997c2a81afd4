"""mhc_pre_apply_mix backward, one block of ROW_THREADS a token: x_grad[t, m, :] += mix[t, m] * o_grad[t, :] (in
place: fp32 fused multiply-add on the bf16 value, rounded once), and mix_grad[t, m] = sum over h of o_grad[t, h] *
x[t, m, h] (fp32; each thread sums its vectors in walk order, then the block adds the threads' sums in
kernels_src/mhc/common.py block_sum's order).

Each thread walks the row's 16-byte vectors ROW_THREADS apart. Two tilings ("u<vectors>", tkaot/_mhc/kernels.py
PRE_APPLY_MIX_BWD_TILINGS), the same sums in the same order: u1 takes one vector at a time (kernels_src/mhc/common.py
token_row_kernel; 75 registers, 6 blocks an H200 SM), u3 issues the loads of 3 vectors (o_grad, x and x_grad of each
stream) before the first is computed and stored, three times the bytes in flight (151 registers, 3 blocks an SM).
H200, 8192 x 4 x 7168, one run (branch ceiling1's bench/tuning/tune_ceiling1.py): u3 355.4 µs, u1 361.3, TileKernels 357.7; 2 vectors
358.0, 2 tokens a block 357.5, a cp.async ring 354.5 but a different mix_grad order. The op's choice by width:
tkaot/_mhc/pre_apply_mix.py (at hidden 1024, one vector a thread: u3 59.4 µs, u1 52.4,
TileKernels 53.4; bench/RESULTS.md, twentieth session).
"""

import tilelang.language as T

from kernels_src.mhc.common import ROW_THREADS, VEC, WARP, block_sum, load_vec, stream_types, token_row_kernel, vec_entry
from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD

DECL = PRE_APPLY_MIX_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)


def parse_tiling(tiling: str) -> int:
    """The vectors a thread loads before it computes the first of them: "u<vectors>"."""
    if tiling[:1] != "u" or not tiling[1:].isdigit() or int(tiling[1:]) < 1:
        raise ValueError(f"{DECL.name}: tiling {tiling!r} is not u<vectors>")
    return int(tiling[1:])


def build(mhc_mult: int, tiling: str):
    unroll = parse_tiling(tiling)
    return build_one_vector(mhc_mult) if unroll == 1 else build_unrolled(mhc_mult, unroll)


def build_one_vector(mhc_mult: int):
    """u1: a vector at a time, through token_row_kernel."""
    mhc = mhc_mult  # streams a token
    num_tokens, hidden, rows, streams, mixes = stream_types(mhc)

    @T.macro
    def tiles():
        og = T.alloc_local((VEC,), T.bfloat16)
        xs = T.alloc_local((mhc, VEC), T.bfloat16)
        xg = T.alloc_local((mhc, VEC), T.bfloat16)
        mixes = T.alloc_local((mhc,), T.float32)
        acc = T.alloc_local((mhc,), T.float32)
        return og, xs, xg, mixes, acc

    @T.macro
    def start(og, xs, xg, mixes, acc, o_grad, x, mix, x_grad, mix_grad, token):
        for m in T.unroll(mhc):
            mixes[m] = mix[token, m]
            acc[m] = 0.0

    @T.macro
    def visit(og, xs, xg, mixes, acc, o_grad, x, mix, x_grad, mix_grad, token, col: T.Ref):
        load_vec(og, (), o_grad, (token, col))
        for m in T.unroll(mhc):
            load_vec(xs, (m,), x, (token, m, col))
            load_vec(xg, (m,), x_grad, (token, m, col))
        for m in T.unroll(mhc):
            for j in T.unroll(VEC):
                acc[m] = acc[m] + T.cast(og[j], T.float32) * T.cast(xs[m, j], T.float32)
                xg[m, j] = T.cast(T.cast(xg[m, j], T.float32) + mixes[m] * T.cast(og[j], T.float32), T.bfloat16)
            for j in T.vectorized(VEC):
                x_grad[token, m, col * VEC + j] = xg[m, j]

    @T.macro
    def finish(og, xs, xg, mixes, acc, o_grad, x, mix, x_grad, mix_grad, token):
        for m in T.unroll(mhc):
            mix_grad[token, m] = acc[m]

    @T.prim_func
    def pre_apply_mix_bwd(o_grad: rows, x: streams, mix: mixes, x_grad: streams, mix_grad: mixes):
        token_row_kernel(num_tokens, hidden, mhc, tiles, start, visit, finish, (o_grad, x, mix, x_grad, mix_grad))

    return pre_apply_mix_bwd


def build_unrolled(mhc_mult: int, unroll: int):
    """u<unroll>: the loads of `unroll` vectors a thread, then their sums and stores."""
    mhc = mhc_mult  # streams a token
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
