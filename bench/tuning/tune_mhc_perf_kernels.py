"""Candidate kernels for bench/tuning/tune_mhc_perf.py that are not module-constant changes: builders patched over
a kernel module's own while a candidate is built. They keep the shipped kernels' arithmetic and order (bytes the
same); only the schedule differs. The winners move into kernels_src, the losers stay here with their numbers."""

import tilelang.language as T

from kernels_src.mhc.common import WARP
from kernels_src.mhc.sinkhorn_bwd import SHARED_RECORDS, _add, _mul
from kernels_src.mhc.sinkhorn_lanes import lane_layout, lane_reduce
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import sinkhorn_record_row as record_row

SINKHORN_BWD_THREADS = 128


def sinkhorn_bwd_sums_first(mhc_mult: int):
    """Sinkhorn backward, one element a lane, as shipped, but each backward round fetches both step inputs and
    sums them over their lines before the gradient arrives: the chain through the steps is then the products'
    shuffles and the two divisions only (TileKernels keeps the sums themselves in shared memory)."""
    mhc = mhc_mult
    num_tokens = T.dynamic("num_tokens")
    repeat = T.dynamic("repeat")
    mm = mhc * mhc
    row_words = record_row(mhc)
    group, per_block = lane_layout(mhc, SINKHORN_BWD_THREADS)

    @T.macro
    def keep(records, scratch, m, r, half: int, tid, token, e, live):
        if 2 * r - 2 + half < SHARED_RECORDS:
            records[2 * r - 2 + half, tid] = m[0]
        elif live:
            scratch[r, half, token, e] = m[0]

    @T.macro
    def fetch(records, scratch, m, r, half: int, tid, token, e, live):
        m[0] = T.float32(0)
        if 2 * r - 2 + half < SHARED_RECORDS:
            m[0] = records[2 * r - 2 + half, tid]
        elif live:
            m[0] = scratch[r, half, token, e]

    @T.macro
    def back_through(g, m, s, t, prod, first_lane, stride: int, eps):
        """As the shipped one, with s (the sum of m over the line) already made."""
        prod[0] = _mul(g[0], m[0])
        lane_reduce(t, prod[0], first_lane, mhc, stride, _add)
        t[0] = t[0] / (s[0] + eps)
        g[0] = (g[0] - t[0]) / (s[0] + eps)

    @T.prim_func
    def sinkhorn_bwd(
        grad_output: T.Tensor[(num_tokens, mm), T.float32],
        x: T.Tensor[(num_tokens, mm), T.float32],
        grad_input: T.Tensor[(num_tokens, mm), T.float32],
        scratch: T.Tensor[(repeat, 2, num_tokens, row_words), T.float32],
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, per_block), threads=SINKHORN_BWD_THREADS) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()
            tid = T.get_thread_binding()
            e = tid % group
            token = block * per_block + tid // group
            live = token < num_tokens and e < mm
            first = tid % WARP - e
            row = first + e // mhc * mhc
            col = first + e % mhc
            records = T.alloc_shared((SHARED_RECORDS, SINKHORN_BWD_THREADS), T.float32)
            p = T.alloc_local((1,), T.float32)
            m = T.alloc_local((1,), T.float32)
            mr = T.alloc_local((1,), T.float32)  # the row step's input
            g = T.alloc_local((1,), T.float32)
            prod = T.alloc_local((1,), T.float32)
            s = T.alloc_local((1,), T.float32)
            sr = T.alloc_local((1,), T.float32)
            t = T.alloc_local((1,), T.float32)

            m[0] = T.float32(0)
            g[0] = T.float32(0)
            if live:
                m[0] = x[token, e]
                g[0] = grad_output[token, e]
            lane_reduce(s, m[0], row, mhc, 1, T.max)
            m[0] = T.exp(m[0] - s[0])
            lane_reduce(s, m[0], row, mhc, 1, _add)
            p[0] = m[0] / s[0]
            m[0] = p[0] + eps
            lane_reduce(s, m[0], col, mhc, mhc, _add)
            m[0] = m[0] / (s[0] + eps)
            for r in T.serial(1, repeat):
                keep(records, scratch, m, r, 0, tid, token, e, live)
                lane_reduce(s, m[0], row, mhc, 1, _add)
                m[0] = m[0] / (s[0] + eps)
                keep(records, scratch, m, r, 1, tid, token, e, live)
                lane_reduce(s, m[0], col, mhc, mhc, _add)
                m[0] = m[0] / (s[0] + eps)

            for back in T.serial(repeat):
                mr[0] = T.float32(0)
                if back == repeat - 1:
                    m[0] = p[0] + eps
                else:
                    fetch(records, scratch, m, repeat - 1 - back, 1, tid, token, e, live)
                    fetch(records, scratch, mr, repeat - 1 - back, 0, tid, token, e, live)
                lane_reduce(s, m[0], col, mhc, mhc, _add)
                lane_reduce(sr, mr[0], row, mhc, 1, _add)
                back_through(g, m, s, t, prod, col, mhc, eps)
                if back < repeat - 1:
                    back_through(g, mr, sr, t, prod, row, 1, eps)
            prod[0] = _mul(g[0], p[0])
            lane_reduce(t, prod[0], row, mhc, 1, _add)
            g[0] = (g[0] - t[0]) * p[0]
            if live:
                grad_input[token, e] = g[0]

    return sinkhorn_bwd


RECOMPUTE_THREADS = 128
RECOMPUTE_VEC = 8
RECOMPUTE_MIN_BLOCKS = 0  # blocks an SM the registers must allow (0: no cap)


def multilayer_by_stream(mhc_mult: int):
    """mhc_multilayer_recompute as shipped, but a layer's new residual made one stream at a time (8 fp32
    accumulators, not M * 8: the shipped kernel holds 128 registers, 4 blocks of 128 an SM, 16 warps to wait
    on memory; TileKernels' runs more); registers capped for RECOMPUTE_MIN_BLOCKS blocks an SM if set."""
    m = mhc_mult
    VEC = RECOMPUTE_VEC
    THREADS = RECOMPUTE_THREADS
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    table_size = T.dynamic("table_size")

    @T.macro
    def apply_pre(pre, layer_input, t, h, res, acc, out, weights):
        for i in T.unroll(m):
            weights[i] = pre[t, i]
        for k in T.unroll(VEC):
            acc[k] = T.float32(0)
        for i in T.unroll(m):
            for k in T.unroll(VEC):
                acc[k] = acc[k] + weights[i] * res[i, k]
        for k in T.unroll(VEC):
            out[k] = T.cast(acc[k], T.bfloat16)
        for k in T.vectorized(VEC):
            layer_input[t, h + k] = out[k]

    @T.prim_func
    def mhc_multilayer_recompute(
        initial_residual: T.Tensor[(num_tokens, m, hidden), T.bfloat16],
        pointer_table: T.Tensor[(table_size,), T.ptr],
        num_layers: T.int32,
        num_post: T.int32,
    ):
        with T.Kernel(T.ceildiv(hidden, VEC * THREADS), num_tokens, threads=THREADS) as (block, t):
            T.import_source(PDL_SOURCE)
            pdl_entry()
            T.assume(hidden % VEC == 0)
            if RECOMPUTE_MIN_BLOCKS:
                T.annotate_min_blocks_per_sm(RECOMPUTE_MIN_BLOCKS)
            h = (block * THREADS + T.get_thread_binding()) * VEC
            res = T.alloc_local((m, VEC), T.float32)
            mixed = T.alloc_local((VEC,), T.float32)
            loaded = T.alloc_local((m, VEC), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            out = T.alloc_local((VEC,), T.bfloat16)
            lo = T.alloc_local((VEC,), T.bfloat16)
            weights = T.alloc_local((m,), T.float32)
            if h < hidden:
                for i in T.unroll(m):
                    for k in T.vectorized(VEC):
                        loaded[i, k] = initial_residual[t, i, h + k]
                for i in T.unroll(m):
                    for k in T.unroll(VEC):
                        res[i, k] = T.cast(loaded[i, k], T.float32)
                for layer in T.serial(num_post):
                    output = T.make_tensor(pointer_table[2 * num_layers + num_post + layer], (num_tokens, hidden), T.bfloat16)
                    post = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post + layer], (num_tokens, m), T.float32)
                    comb = T.make_tensor(pointer_table[2 * num_layers + 3 * num_post + layer], (num_tokens, m, m), T.float32)
                    residual = T.make_tensor(pointer_table[2 * num_layers + layer], (num_tokens, m, hidden), T.bfloat16)
                    for k in T.vectorized(VEC):
                        lo[k] = output[t, h + k]
                    pre = T.make_tensor(pointer_table[layer], (num_tokens, m), T.float32)
                    layer_input = T.make_tensor(pointer_table[num_layers + layer], (num_tokens, hidden), T.bfloat16)
                    apply_pre(pre, layer_input, t, h, res, acc, out, weights)
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            mixed[k] = post[t, o] * T.cast(lo[k], T.float32)
                        for i in T.unroll(m):
                            for k in T.unroll(VEC):
                                mixed[k] = mixed[k] + comb[t, i, o] * res[i, k]
                        for k in T.unroll(VEC):
                            loaded[o, k] = T.cast(mixed[k], T.bfloat16)
                        for k in T.vectorized(VEC):
                            residual[t, o, h + k] = loaded[o, k]
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            res[o, k] = T.cast(loaded[o, k], T.float32)
                if num_layers > num_post:
                    last_pre = T.make_tensor(pointer_table[num_post], (num_tokens, m), T.float32)
                    last_input = T.make_tensor(pointer_table[num_layers + num_post], (num_tokens, hidden), T.bfloat16)
                    apply_pre(last_pre, last_input, t, h, res, acc, out, weights)

    return mhc_multilayer_recompute
