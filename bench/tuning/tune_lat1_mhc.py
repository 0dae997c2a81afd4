"""Candidate bodies of mhc_pre_big_fuse_split (kernels_src/mhc/pre_big_fuse_split.py) for bench/tuning/tune_lat1.py:
the same macros (kernels_src/mhc/pre_big_fuse.py), so the same sums in the same order, with the token's Sinkhorn warp
given more of its SM or less waiting."""

from __future__ import annotations

import tilelang.language as T

from kernels_src.mhc.common import VEC, WARP, tree_sum
from kernels_src.mhc.pre_big_fuse import kernel, load_residual, post_and_comb, pre_mixed_vector, token_entry, token_mixes, token_tiles
from kernels_src.mhc.pre_big_fuse_split import MIN_BLOCKS, THREADS, UNROLL

SINK_BARRIER = 1  # the named barrier the workers wait at where warp 0 only arrives


def _log2(n: int) -> int:
    return n.bit_length() - 1


def _line(value, first, m: int, stride: int) -> list:
    """The values of the M lanes first, first + stride, ... (plain Python: M independent shuffles)."""
    return [T.shfl_sync(value, first + k * stride) for k in range(m)]


def _line_sum(value, first, m: int, stride: int):
    return tree_sum(_line(value, first, m, stride))


def _line_max(value, first, m: int):
    line = _line(value, first, m, 1)
    while len(line) > 1:
        line = [T.max(line[i], line[i + len(line) // 2]) for i in range(len(line) // 2)]
    return line[0]


@T.macro
def post_and_comb_gathered(a, b, t, tid, m: int):
    """pre_big_fuse.post_and_comb with each row or column sum (and the softmax's row max) taken from the M values
    of the line fetched at once, one shuffle a lane of the line (independent of each other), then added in
    tree_sum's order: the order the xor butterfly adds them in, so the same bits, in one shuffle latency a sum
    instead of log2(M) dependent ones. M a power of two (1, 2, 4)."""
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
    total = _line_max(cm, row, m)
    cm = T.exp(cm - total)
    total = _line_sum(cm, row, m, 1)
    cm = cm / total + a.mhc_sinkhorn_eps
    total = _line_sum(cm, col, m, m)
    cm = cm / (total + a.mhc_sinkhorn_eps)
    for _ in T.serial(a.sinkhorn_repeat - 1):
        total = _line_sum(cm, row, m, 1)
        cm = cm / (total + a.mhc_sinkhorn_eps)
        total = _line_sum(cm, col, m, m)
        cm = cm / (total + a.mhc_sinkhorn_eps)
    if tid < mm:
        a.comb_mix[t, tid] = cm


def make_build(alone: bool = False, apply_blocks: int = 4, arrive: bool = False, threads: int = THREADS, gather: bool = False):
    """build(mhc_mult) of a candidate:
    - alone: block 0 of the token only reduces the mixes and runs post mix and Sinkhorn (warp 0; its other warps
      leave at once, so the Sinkhorn warp has its SM to itself), blocks 1..apply_blocks apply the pre mix;
      without it, block 0's warp 0 runs the Sinkhorn beside its block's workers (the shipped form at 4 blocks);
    - arrive: warp 0 of every apply block only arrives at the barrier the workers wait at (named barrier
      SINK_BARRIER), so the Sinkhorn warp never waits for its block's workers;
    - threads: a block's threads (the shipped 256);
    - gather: the Sinkhorn's sums from gathered shuffles (post_and_comb_gathered), not a butterfly."""
    sinkhorn = post_and_comb_gathered if gather else post_and_comb

    def build(mhc_mult: int):
        m = mhc_mult
        workers = threads - WARP
        grid_x = apply_blocks + (1 if alone else 0)
        first = 1 if alone else 0  # the first apply block

        @T.macro
        def apply(a, b, t, tid, part, vectors):
            """The shipped split kernel's apply block (its part of the token's vectors); block part 0 also runs the
            Sinkhorn in warp 0 unless `alone`."""
            worker = tid - WARP
            load_residual(a, b, t, 0, part, worker, vectors, workers, apply_blocks, UNROLL, m)
            token_mixes(a, b, t, tid, m)
            if arrive:
                if tid < WARP:
                    T.sync_warp()
                    T.named_barrier_arrive(SINK_BARRIER, threads)
                else:
                    T.sync_threads(SINK_BARRIER, threads)
            else:
                T.sync_threads()
            if not alone:
                if tid < WARP and part == 0:
                    sinkhorn(a, b, t, tid, m)
            for it in T.serial(T.ceildiv(vectors, workers * apply_blocks * UNROLL)):
                if it > 0:
                    load_residual(a, b, t, it, part, worker, vectors, workers, apply_blocks, UNROLL, m)
                for u in T.unroll(UNROLL):
                    v = (it * UNROLL + u) * workers * apply_blocks + part * workers + worker
                    if 0 <= worker and v < vectors:
                        pre_mixed_vector(a, b, t, u, v, m)

        @T.macro
        def body(a, num_tokens):
            with T.Kernel(grid_x, num_tokens, threads=threads) as (bx, t):
                token_entry(a.hidden, MIN_BLOCKS)
                tid = T.get_thread_binding()
                b = token_tiles(m, UNROLL)
                vectors = a.hidden // VEC
                if alone:
                    if bx == 0:
                        if tid < WARP:
                            token_mixes(a, b, t, tid, m)
                            T.sync_warp()
                            sinkhorn(a, b, t, tid, m)
                    else:
                        apply(a, b, t, tid, bx - first, vectors)
                else:
                    apply(a, b, t, tid, bx, vectors)

        return kernel(m, body)

    return build
