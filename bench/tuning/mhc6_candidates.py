"""The candidate kernels of bench/tuning/tune_mhc6.py (issue 16, round 6): builders that stand in for a shipped
kernel module's `build` while a candidate is built, each with the shipped kernel's signature (so the op's own
validation and argument packing launch it) and, where a candidate is right, its output bytes.

- sinkhorn_rows: Sinkhorn backward with one thread a matrix row (kernels_src/mhc/sinkhorn_bwd.py keeps one
  element a lane): a row's sums are added in registers, a column's by xor shuffles over the token's mhc threads,
  both in tree_sum's order, so every sum and quotient has the shipped kernel's bits. With `fdiv`, the lines that
  divide by one denominator share its refined reciprocal (kernels_src/fused/division.py's fast path of IEEE
  division: the quotient CUDA's division gives when its range check passes) when every operand's exponent lies
  in [-60, 60]; otherwise they take IEEE division. One check and one branch a line, not one a quotient
  (tests/test_tuning_division.py checks the quotients against IEEE division).
- merge_groups: the norm-weight merge backward with `groups` sets of `cols` threads on the same columns, each
  loading `rows` rows at once (a chunk is groups * rows rows, all in flight together); the products of every
  group but the first go through shared memory, and the first group adds all of them to the column sum in row
  order, as the shipped kernel does, so normw_grad keeps its bytes.
- big_fuse_split: the pre big fuse with `blocks` blocks a token, each of `threads` threads: every block reduces
  the token's mixes (the same sums), block 0's warp 0 runs the Sinkhorn and writes post_mix and comb_mix, and
  the warps past the first apply the pre mix to their share of the hidden vectors; the first residual loads
  are issued before the mixes are reduced, so a decode token waits for memory about once, not once a chunk.
"""

import functools

import tilelang.language as T

from kernels_src.fused.division import DIV_NORMAL
from kernels_src.mhc.common import WARP, tree_sum
from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import sinkhorn_record_row as record_row

# ---- division: the fast path of IEEE fp32 division, a refined reciprocal shared by a line's quotients

FDIV_SOURCE = (
    DIV_NORMAL
    + """
__device__ __forceinline__ float tkaot_rcp_refined(float b) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    return __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
}
__device__ __forceinline__ float tkaot_quotient(float a, float b, float r) {
    float q = __fmul_rn(a, r);
    return __fmaf_rn(__fmaf_rn(-b, q, a), r, q);
}
__device__ __forceinline__ int tkaot_div_in_range(float a) {
    return ((__float_as_uint(a) >> 23) & 0xffu) - 67u <= 120u;
}
"""
)  # in range: a biased exponent in [67, 187], |a| in [2^-60, 2^61): every quotient, remainder and reciprocal normal


def _in_range(a):
    return T.call_extern("int32", "tkaot_div_in_range", a)


@T.macro
def divide_line(out, o, nums, n0, count: int, d, r, ok, fdiv: bool):
    """out[o + j] = nums[n0 + j] / d for j < count: IEEE division, or with fdiv its fast path on a reciprocal
    refined once (r, ok: (1,) float32 and int32 locals of the caller) when every operand is in range."""
    if fdiv:
        ok[0] = _in_range(d)
        for j in T.unroll(count):
            ok[0] = ok[0] & _in_range(nums[n0 + j])
        if ok[0] != 0:
            r[0] = T.call_extern("float32", "tkaot_rcp_refined", d)
            for j in T.unroll(count):
                out[o + j] = T.call_extern("float32", "tkaot_quotient", nums[n0 + j], d, r[0])
        else:
            for j in T.unroll(count):
                out[o + j] = nums[n0 + j] / d
    else:
        for j in T.unroll(count):
            out[o + j] = nums[n0 + j] / d


def _mul(a, b):
    return T.call_extern("float32", "__fmul_rn", a, b)


# ---- Sinkhorn backward, one thread a matrix row

SINKHORN_SHARED_RECORDS = 38  # as the shipped kernel: every record of up to 20 repeats in shared memory
SINKHORN_UNROLLED_REPEAT = 20


def sinkhorn_rows(mhc_mult: int, threads: int, fdiv: bool, unrolled_repeat: int = SINKHORN_UNROLLED_REPEAT):
    """The Sinkhorn backward prim_func (kernels_src/mhc/sinkhorn_bwd.py's signature) with one thread a row."""
    mhc = mhc_mult
    mm = mhc * mhc
    assert mhc & (mhc - 1) == 0 and mhc <= WARP, "a token's rows on a power-of-two group of lanes"
    per_block = threads // mhc
    records_n = SINKHORN_SHARED_RECORDS
    num_tokens = T.dynamic("num_tokens")
    repeat = T.dynamic("repeat")

    @T.macro
    def col_sum(out, vals):
        """out[k] = the sum of vals[k] over the token's mhc threads (its rows), in tree_sum's order."""
        for k in T.unroll(mhc):
            out[k] = vals[k]
        for s in T.unroll((mhc - 1).bit_length()):
            for k in T.unroll(mhc):
                out[k] = out[k] + T.shfl_xor(out[k], (mhc // 2) >> s)

    @T.macro
    def keep(records, denoms, scratch, m, d, r, half: int, tid, token, i, live):
        """m (this thread's row) becomes record (r, half), r >= 1, and d[0] its line's denominator (the row's; for
        a column record, column i's)."""
        if 2 * r - 2 + half < records_n:
            for k in T.vectorized(mhc):
                records[2 * r - 2 + half, tid, k] = m[k]
            denoms[2 * r - 2 + half, tid] = d[0]
        elif live:
            for k in T.vectorized(mhc):
                scratch[r, half, token, i * mhc + k] = m[k]
            scratch[r, half, token, mm + i] = d[0]

    @T.macro
    def fetch(records, denoms, scratch, m, d, r, half: int, tid, slot, token, i, live):
        """m = this thread's row of record (r, half); d = the row's denominator (half 0) or every column's (1)."""
        for k in T.unroll(mhc):
            m[k] = T.float32(0)
            d[k] = T.float32(1)
        if 2 * r - 2 + half < records_n:
            for k in T.vectorized(mhc):
                m[k] = records[2 * r - 2 + half, tid, k]
            if half == 0:
                d[0] = denoms[2 * r - 2 + half, tid]
            else:
                for k in T.vectorized(mhc):
                    d[k] = denoms[2 * r - 2 + half, slot * mhc + k]
        elif live:
            for k in T.vectorized(mhc):
                m[k] = scratch[r, half, token, i * mhc + k]
            if half == 0:
                d[0] = scratch[r, half, token, mm + i]
            else:
                for k in T.vectorized(mhc):
                    d[k] = scratch[r, half, token, mm + k]

    @T.macro
    def normalise_row(m, d, r, ok):
        divide_line(m, 0, m, 0, mhc, d[0], r, ok, fdiv)

    @T.macro
    def normalise_cols(m, dc, r, ok):
        for k in T.unroll(mhc):
            divide_line(m, k, m, k, 1, dc[k], r, ok, fdiv)

    @T.macro
    def back_row(g, m, d, t, prod, r, ok):
        """g = the gradient at the input m of the row normalisation with denominator d[0]."""
        for k in T.unroll(mhc):
            prod[k] = _mul(g[k], m[k])
        t[0] = tree_sum([prod[k] for k in range(mhc)])
        divide_line(t, 0, t, 0, 1, d[0], r, ok, fdiv)
        for k in T.unroll(mhc):
            g[k] = g[k] - t[0]
        divide_line(g, 0, g, 0, mhc, d[0], r, ok, fdiv)

    @T.macro
    def back_cols(g, m, d, t, prod, r, ok):
        """g = the gradient at the input m of the column normalisation with denominators d[0:mhc]."""
        for k in T.unroll(mhc):
            prod[k] = _mul(g[k], m[k])
        col_sum(t, prod)
        for k in T.unroll(mhc):
            divide_line(t, k, t, k, 1, d[k], r, ok, fdiv)
            g[k] = g[k] - t[k]
            divide_line(g, k, g, k, 1, d[k], r, ok, fdiv)

    @T.macro
    def steps(steps_loop, repeat, records, denoms, scratch, p, d0, m, d, dc, g, t, prod, r, ok, tid, slot, token, i, live,
              eps):  # fmt: skip
        """The forward replay from the first column normalisation's output in m, then the steps back."""
        for step in steps_loop(1, repeat):
            d[0] = tree_sum([m[k] for k in range(mhc)]) + eps
            keep(records, denoms, scratch, m, d, step, 0, tid, token, i, live)
            normalise_row(m, d, r, ok)
            col_sum(dc, m)
            for k in T.unroll(mhc):
                dc[k] = dc[k] + eps
            d[0] = dc[0]
            for k in T.unroll(mhc):
                if i == k:
                    d[0] = dc[k]
            keep(records, denoms, scratch, m, d, step, 1, tid, token, i, live)
            normalise_cols(m, dc, r, ok)
        for back in steps_loop(repeat):
            if back == repeat - 1:
                for k in T.unroll(mhc):
                    m[k] = p[k] + eps  # the first column normalisation's input
                    d[k] = d0[k]
            else:
                fetch(records, denoms, scratch, m, d, repeat - 1 - back, 1, tid, slot, token, i, live)
            back_cols(g, m, d, t, prod, r, ok)
            if back < repeat - 1:
                fetch(records, denoms, scratch, m, d, repeat - 1 - back, 0, tid, slot, token, i, live)
                back_row(g, m, d, t, prod, r, ok)

    def unrolled(start, stop=None):
        return T.unroll(start, stop, explicit=True)

    @T.prim_func
    def sinkhorn_bwd(
        grad_output: T.Tensor[(num_tokens, mm), T.float32],
        x: T.Tensor[(num_tokens, mm), T.float32],
        grad_input: T.Tensor[(num_tokens, mm), T.float32],
        scratch: T.Tensor[(repeat, 2, num_tokens, record_row(mhc)), T.float32],
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, per_block), threads=threads) as block:
            kernel_entry(FDIV_SOURCE if fdiv else "")
            tid = T.get_thread_binding()
            i = tid % mhc  # this thread's row of token `token`
            slot = tid // mhc
            token = block * per_block + slot
            live = token < num_tokens
            records = T.alloc_shared((records_n, threads, mhc), T.float32)
            denoms = T.alloc_shared((records_n, threads), T.float32)
            p = T.alloc_local((mhc,), T.float32)  # the softmax output
            d0 = T.alloc_local((mhc,), T.float32)  # the first column normalisation's denominators
            m = T.alloc_local((mhc,), T.float32)
            d = T.alloc_local((mhc,), T.float32)  # a row's denominator (d[0]) or the columns'
            dc = T.alloc_local((mhc,), T.float32)
            g = T.alloc_local((mhc,), T.float32)
            t = T.alloc_local((mhc,), T.float32)
            prod = T.alloc_local((mhc,), T.float32)
            r = T.alloc_local((1,), T.float32)
            ok = T.alloc_local((1,), T.int32)

            # Every thread takes part in the shuffles; threads past the tokens work on zeros
            for k in T.unroll(mhc):
                m[k] = T.float32(0)
                g[k] = T.float32(0)
            if live:
                for k in T.vectorized(mhc):
                    m[k] = x[token, i * mhc + k]
                for k in T.vectorized(mhc):
                    g[k] = grad_output[token, i * mhc + k]
            d[0] = tree_sum_max([m[k] for k in range(mhc)])
            for k in T.unroll(mhc):
                m[k] = T.exp(m[k] - d[0])
            d[0] = tree_sum([m[k] for k in range(mhc)])
            divide_line(p, 0, m, 0, mhc, d[0], r, ok, fdiv)
            for k in T.unroll(mhc):
                m[k] = p[k] + eps
            col_sum(d0, m)
            for k in T.unroll(mhc):
                d0[k] = d0[k] + eps
            normalise_cols(m, d0, r, ok)
            if unrolled_repeat and repeat == unrolled_repeat:
                steps(unrolled, unrolled_repeat, records, denoms, scratch, p, d0, m, d, dc, g, t, prod, r, ok, tid, slot,
                      token, i, live, eps)  # fmt: skip
            else:
                steps(T.serial, repeat, records, denoms, scratch, p, d0, m, d, dc, g, t, prod, r, ok, tid, slot, token, i,
                      live, eps)  # fmt: skip
            for k in T.unroll(mhc):
                prod[k] = _mul(g[k], p[k])
            t[0] = tree_sum([prod[k] for k in range(mhc)])
            for k in T.unroll(mhc):
                g[k] = (g[k] - t[0]) * p[k]
            if live:
                for k in T.vectorized(mhc):
                    grad_input[token, i * mhc + k] = g[k]

    return sinkhorn_bwd


def tree_sum_max(values: list):
    """The maximum of `values` in tree_sum's order (a butterfly's: the first half against the second, pairwise)."""
    n = len(values)
    if n == 1:
        return values[0]
    half = n // 2
    return tree_sum_max([T.max(values[j], values[j + half]) for j in range(half)])


def sinkhorn_rows_build(threads: int, fdiv: bool):
    """A stand-in for kernels_src.mhc.sinkhorn_bwd.build."""
    return functools.partial(sinkhorn_rows, threads=threads, fdiv=fdiv)


# ---- norm-weight merge backward, groups of threads on the same columns


def merge_groups(dtype: str, groups: int, rows: int, cols: int):
    """The norm-weight merge backward prim_func (kernels_src/mhc/normw_merge_bwd.py's signature): blocks of
    groups * cols threads, `cols` columns a block; group j loads rows j * rows .. of each chunk of groups * rows."""
    assert dtype == "float32"
    threads = groups * cols
    chunk_rows = groups * rows
    m = T.dynamic("m")
    n = T.dynamic("n")

    @T.prim_func
    def mhc_normw_merge_bwd(
        fn: T.Tensor[(m, n), T.float32],
        normw: T.Tensor[(n,), T.float32],
        out_fn_grad: T.Tensor[(m, n), T.float32],
        fn_grad: T.Tensor[(m, n), T.float32],
        normw_grad: T.Tensor[(n,), T.float32],
    ):
        with T.Kernel(T.ceildiv(n, cols), threads=threads) as block:
            kernel_entry()
            tid = T.get_thread_binding()
            group = tid // cols
            c = tid % cols
            k = block * cols + c
            w = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            f = T.alloc_local((rows,), T.float32)
            g = T.alloc_local((rows,), T.float32)
            acc = T.alloc_local((rows,), T.float32)
            shared_g = T.alloc_shared((groups, rows, cols), T.float32)
            shared_f = T.alloc_shared((groups, rows, cols), T.float32)
            w = T.float32(0)
            if k < n:
                w = normw[k]
            total = T.float32(0)
            for chunk in T.serial(T.ceildiv(m, chunk_rows)):
                for r in T.unroll(rows):
                    if k < n and chunk * chunk_rows + group * rows + r < m:
                        g[r] = out_fn_grad[chunk * chunk_rows + group * rows + r, k]
                        f[r] = fn[chunk * chunk_rows + group * rows + r, k]
                        acc[r] = fn_grad[chunk * chunk_rows + group * rows + r, k]
                for r in T.unroll(rows):
                    if k < n and chunk * chunk_rows + group * rows + r < m:
                        fn_grad[chunk * chunk_rows + group * rows + r, k] = acc[r] + g[r] * w
                        if group > 0:
                            shared_g[group, r, c] = g[r]
                            shared_f[group, r, c] = f[r]
                T.sync_threads()
                # the column sum in row order: the first group's rows from its registers, the others' from shared
                if group == 0 and k < n:
                    for r in T.unroll(rows):
                        if chunk * chunk_rows + r < m:
                            total = total + g[r] * f[r]
                    for j in T.unroll(1, groups):
                        for r in T.unroll(rows):
                            if chunk * chunk_rows + j * rows + r < m:
                                total = total + shared_g[j, r, c] * shared_f[j, r, c]
                T.sync_threads()
            if group == 0 and k < n:
                normw_grad[k] = normw_grad[k] + total

    return mhc_normw_merge_bwd


def merge_groups_build(groups: int, rows: int, cols: int):
    """A stand-in for kernels_src.mhc.normw_merge_bwd.build."""
    return functools.partial(merge_groups, groups=groups, rows=rows, cols=cols)


# ---- pre big fuse, a token's hidden vectors over several blocks

BIG_FUSE_VEC = 8  # bf16 elements in 16 bytes
BIG_FUSE_SPLITS = 16  # split partials loaded before they are added, as the shipped kernel


def big_fuse_split(mhc_mult: int, threads: int, blocks: int, unroll: int = 1):
    """The pre big fuse prim_func (kernels_src/mhc/pre_big_fuse.py's signature, sums and order) on `blocks` blocks
    a token of `threads` threads, each worker `unroll` vectors in flight; registers capped as the shipped kernel's
    (1024 threads an SM: 64)."""
    m = mhc_mult
    mm = m * m
    mix_count = m * (m + 2)
    vec, splits = BIG_FUSE_VEC, BIG_FUSE_SPLITS
    workers = threads - WARP  # warps 1.. of every block
    log_m = m.bit_length() - 1
    num_tokens = T.dynamic("num_tokens")
    n_splits = T.dynamic("n_splits")
    hidden = T.dynamic("hidden")

    @T.macro
    def load_residual(xv, residual, t, it, part, worker, vectors):
        for u in T.unroll(unroll):
            if 0 <= worker and (it * unroll + u) * workers * blocks + part * workers + worker < vectors:
                for i in T.unroll(m):
                    for k in T.vectorized(vec):
                        xv[u, i, k] = residual[t, i, ((it * unroll + u) * workers * blocks + part * workers + worker) * vec + k]

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
        with T.Kernel(blocks, num_tokens, threads=threads) as (part, t):
            kernel_entry()
            T.assume(hidden % vec == 0)
            T.annotate_min_blocks_per_sm(max(1, 1024 // threads))
            tid = T.get_thread_binding()
            mixes = T.alloc_shared((mix_count,), T.float32)
            pre = T.alloc_shared((m,), T.float32)
            squares = T.alloc_var(T.float32)
            mix = T.alloc_var(T.float32)
            cm = T.alloc_var(T.float32)
            total = T.alloc_var(T.float32)
            xv = T.alloc_local((unroll, m, vec), T.bfloat16)
            acc = T.alloc_local((vec,), T.float32)
            out = T.alloc_local((vec,), T.bfloat16)
            sq_part = T.alloc_local((splits,), T.float32)
            mix_part = T.alloc_local((splits,), T.float32)
            vectors = hidden // vec
            worker = tid - WARP

            # the first residual vectors are in flight while warp 0 reduces the mixes
            load_residual(xv, residual, t, 0, part, worker, vectors)

            if tid < mix_count:
                squares = T.float32(0)
                mix = T.float32(0)
                for chunk in T.serial(T.ceildiv(n_splits, splits)):
                    for u in T.unroll(splits):
                        if chunk * splits + u < n_splits:
                            sq_part[u] = gemm_out_sqrsum[chunk * splits + u, t]
                            mix_part[u] = gemm_out_mul[chunk * splits + u, t, tid]
                    for u in T.unroll(splits):
                        if chunk * splits + u < n_splits:
                            squares = squares + sq_part[u]
                    for u in T.unroll(splits):
                        if chunk * splits + u < n_splits:
                            mix = mix + mix_part[u]
                mix = mix * T.rsqrt(squares / T.cast(m * hidden, T.float32) + rms_eps)
                mixes[tid] = mix
                if tid < m:
                    pre[tid] = T.sigmoid(mix * mhc_scale[0] + mhc_base[tid]) + mhc_pre_eps
            T.sync_threads()

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

            for it in T.serial(T.ceildiv(vectors, workers * blocks * unroll)):
                if it > 0:
                    load_residual(xv, residual, t, it, part, worker, vectors)
                for u in T.unroll(unroll):
                    v = (it * unroll + u) * workers * blocks + part * workers + worker
                    if 0 <= worker and v < vectors:
                        for k in T.unroll(vec):
                            acc[k] = T.float32(0)
                        for i in T.unroll(m):
                            for k in T.unroll(vec):
                                acc[k] = acc[k] + pre[i] * T.cast(xv[u, i, k], T.float32)
                        for k in T.unroll(vec):
                            out[k] = T.cast(acc[k], T.bfloat16)
                        for k in T.vectorized(vec):
                            layer_input[t, v * vec + k] = out[k]

    return mhc_pre_big_fuse


def big_fuse_split_build(threads: int, blocks: int, unroll: int = 1):
    """A stand-in for kernels_src.mhc.pre_big_fuse.build."""
    return functools.partial(big_fuse_split, threads=threads, blocks=blocks, unroll=unroll)
