"""RMSNorm forward: out = round(x') * rstd * weight * out_scale, x' = round(x + residual).

One row is spread over `row_threads` threads, each holding whole 16-byte
vectors in registers, so the row is read once and written once. Each thread
sums its squares in two fused multiply-add chains (even and odd elements), and
rows are split and reduced (warp shuffles, then across warps through shared
memory) as TileKernels does, so rstd and the output match it bit for bit.
Tokens and batch are dynamic; `eps` and `out_scale` are runtime scalars.
"""

import tilelang.language as T

from kernels_src.norm.row_sum import NUM_THREADS, StaticSplit
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._quant.kernels import RMSNORM

DECL = RMSNORM  # the declaration this module builds (tkaot/_quant/kernels.py)


@T.macro
def load_sum(x_reg, r_reg, v, x_row, res_row, address: str, with_residual: bool, vec: int):
    """x_reg[v, :] = the thread's vector v of x, plus residual's (through r_reg) where given: rounded to x's dtype
    once, as TileKernels does. `address` names the rows' indexing (row_sum.py ThreadRow): "at", or "read_at"."""
    for j in T.vectorized(vec):
        x_reg[v, j] = x_row.buffer[getattr(x_row, address)(v, j)]
    if with_residual:
        for j in T.vectorized(vec):
            r_reg[j] = res_row.buffer[getattr(res_row, address)(v, j)]
        for j in T.vectorized(vec):
            x_reg[v, j] = x_reg[v, j] + r_reg[j]


def build(hidden: int, dtype: str, with_weight: bool, with_residual: bool, with_rstd: bool):
    return rmsnorm_kernel(StaticSplit(hidden, dtype), dtype, with_weight, with_residual, with_rstd)


def rmsnorm_kernel(split, dtype: str, with_weight: bool, with_residual: bool, with_rstd: bool):
    """The kernel over a row split (kernels_src/norm/row_sum.py): a static one, or one computed from a runtime
    hidden (kernels_src/norm/rmsnorm_generic.py). Every thread sums the same elements in the same order either way."""
    hidden, vec, vecs_per_thread = split.hidden, split.vec, split.vectors

    num_tokens = T.dynamic("num_tokens")
    batch = T.dynamic("batch")
    x_stride, x_bstride = T.dynamic("x_stride"), T.dynamic("x_batch_stride")
    out_stride, out_bstride = T.dynamic("out_stride"), T.dynamic("out_batch_stride")
    res_stride, res_bstride = T.dynamic("residual_stride"), T.dynamic("residual_batch_stride")
    rout_stride, rout_bstride = T.dynamic("residual_out_stride"), T.dynamic("residual_out_batch_stride")
    rows = (batch, num_tokens, hidden)

    @T.prim_func
    def rmsnorm(
        x: T.StridedTensor[rows, (x_bstride, x_stride, 1), dtype],
        weight: T.Tensor[(hidden,), dtype],
        residual: T.StridedTensor[rows, (res_bstride, res_stride, 1), dtype],
        out: T.StridedTensor[rows, (out_bstride, out_stride, 1), dtype],
        residual_out: T.StridedTensor[rows, (rout_bstride, rout_stride, 1), dtype],
        rstd: T.Tensor[(batch, num_tokens), T.float32],
        eps: T.float32,
        out_scale: T.float32,
    ):
        with T.Kernel(split.grid(num_tokens), batch, threads=NUM_THREADS) as (block, b):
            T.import_source(split.helpers + PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            # Callers guarantee 16-byte aligned rows, so every vector access is one 16-byte access
            T.assume(x_stride % vec == 0)
            T.assume(x_bstride % vec == 0)
            T.assume(out_stride % vec == 0)
            T.assume(out_bstride % vec == 0)
            if with_residual:
                T.assume(res_stride % vec == 0)
                T.assume(res_bstride % vec == 0)
                T.assume(rout_stride % vec == 0)
                T.assume(rout_bstride % vec == 0)
            tid = T.get_thread_binding()
            split.enter()
            lane = split.lane(tid)
            token = block * split.rows_per_block + split.row(tid)
            x_reg = T.alloc_local((vecs_per_thread, vec), dtype)
            r_reg = T.alloc_local((vec,), dtype)
            w_reg = T.alloc_local((vec,), dtype)
            sums = T.alloc_local((2,), "float32")
            acc = T.alloc_local((1,), "float32")
            warp_sums = T.alloc_shared(split.warp_sums_shape, "float32")

            x_row = split.thread_row(x, b, token, lane, "r")
            res_row = split.thread_row(residual, b, token, lane, "r")
            rout_row = split.thread_row(residual_out, b, token, lane, "w")
            out_row = split.thread_row(out, b, token, lane, "w")
            for v in T.unroll(vecs_per_thread):
                col = (v * split.row_threads + lane) * vec
                if split.loads_unguarded:
                    # A generic split: loaded (clamped into the tensor) whatever the width, zeroed outside the row
                    load_sum(x_reg, r_reg, v, x_row, res_row, "read_at", with_residual, vec)
                if token < num_tokens and split.in_row(col):
                    if not split.loads_unguarded:
                        load_sum(x_reg, r_reg, v, x_row, res_row, "at", with_residual, vec)
                    if with_residual:
                        for j in T.vectorized(vec):
                            rout_row.buffer[rout_row.at(v, j)] = x_reg[v, j]
                else:
                    for j in T.vectorized(vec):
                        x_reg[v, j] = T.cast(0, dtype)
            # The thread's squares in two chains, even and odd elements, then their sum (TileKernels' order)
            sums[0] = 0.0
            sums[1] = 0.0
            for v in T.unroll(vecs_per_thread):
                if split.live(v):  # a generic split's vectors past the count: zeros, which add nothing
                    for j in T.unroll(vec):
                        sums[j % 2] = T.fma(T.cast(x_reg[v, j], "float32"), T.cast(x_reg[v, j], "float32"), sums[j % 2])
            acc[0] = sums[0] + sums[1]

            split.reduce(acc, warp_sums, split.row(tid), lane)
            inv_rms = T.alloc_var("float32", init=T.rsqrt(acc[0] / split.divisor + eps))
            if with_rstd:
                if lane == 0 and token < num_tokens:
                    rstd[b, token] = inv_rms

            for v in T.unroll(vecs_per_thread):
                col = (v * split.row_threads + lane) * vec
                if token < num_tokens and split.in_row(col):
                    if with_weight:
                        for j in T.vectorized(vec):
                            w_reg[j] = weight[col + j]
                        for j in T.vectorized(vec):
                            out_row.buffer[out_row.at(v, j)] = T.cast(
                                T.cast(x_reg[v, j], "float32") * inv_rms * (T.cast(w_reg[j], "float32") * out_scale), dtype
                            )
                    else:
                        for j in T.vectorized(vec):
                            out_row.buffer[out_row.at(v, j)] = T.cast(T.cast(x_reg[v, j], "float32") * inv_rms * out_scale, dtype)

    return rmsnorm
