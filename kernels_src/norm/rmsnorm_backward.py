"""RMSNorm backward, pass 1: x_grad of each row, and each block's fp32 share of the weight gradient.

With xhat = x * rstd, g = out_grad * out_scale and gw = g * weight (g without a weight):
    x_grad = (gw - xhat * (sum(xhat * gw) / hidden)) * rstd  (+ residual_out_grad)
    weight_grad = sum over rows of xhat * g
A row is spread over `row_threads` threads (tkaot/_quant/kernels.py: norm_backward_tiling; a block of 256
threads holds several rows when they are short); each thread holds whole 16-byte vectors of x and out_grad
in registers in their own dtype, so both are read once (the weight is read again for each row, from L1);
the row's dot product is reduced with warp shuffles, then across warps through shared memory. The grid is a fixed
number of blocks (num_blocks, chosen by the op) that stride over the rows, so a thread owns the same
columns in every row it visits and accumulates their weight gradient in registers; at the end a block
adds its row slots in a fixed order and writes one partial row, partials[block, :]. Pass 2
(kernels_src/norm/weight_grad_reduce.py) adds the partials in a fixed order: the result does not
depend on timing. Tokens, blocks, strides, out_scale and whether there is a weight or a residual
gradient are runtime values.
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._quant.kernels import NORM_BACKWARD_THREADS, RMSNORM_BACKWARD, norm_backward_tiling

DECL = RMSNORM_BACKWARD  # the declaration this module builds (tkaot/_quant/kernels.py)

NUM_THREADS = NORM_BACKWARD_THREADS
MIN_BLOCKS_PER_SM = 2  # caps registers at 128 a thread (no spills but fp32 rows of 8192: a few bytes)


def build(hidden: int, dtype: str):
    vec, row_threads, vecs_per_thread = norm_backward_tiling(hidden, dtype)
    slots = NUM_THREADS // row_threads
    lanes = min(row_threads, 32)
    row_warps = row_threads // lanes
    exact = hidden % (vec * row_threads) == 0  # every thread's vectors are in range

    num_tokens = T.dynamic("num_tokens")
    num_blocks = T.dynamic("num_blocks")
    og_stride, x_stride, rg_stride = T.dynamic("out_grad_stride"), T.dynamic("x_stride"), T.dynamic("residual_out_grad_stride")

    @T.macro
    def load_weight(weight, w_in, col):
        # Read again for each row (from L1): registers go to x, out_grad and the weight gradient
        if exact or col < hidden:
            for j in T.vectorized(vec):
                w_in[j] = weight[col + j]
        else:
            for j in T.unroll(vec):
                w_in[j] = T.cast(0, dtype)

    @T.prim_func
    def rmsnorm_backward(
        out_grad: T.StridedTensor[(num_tokens, hidden), (og_stride, 1), dtype],
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), dtype],
        weight: T.Tensor[(hidden,), dtype],
        rstd: T.Tensor[(num_tokens,), T.float32],
        residual_out_grad: T.StridedTensor[(num_tokens, hidden), (rg_stride, 1), dtype],
        x_grad: T.Tensor[(num_tokens, hidden), dtype],
        partials: T.Tensor[(num_blocks, hidden), T.float32],
        out_scale: T.float32,
        has_weight: T.int32,
        has_residual: T.int32,
    ):
        with T.Kernel(num_blocks, threads=NUM_THREADS) as block:
            T.annotate_min_blocks_per_sm(MIN_BLOCKS_PER_SM)
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            # Callers guarantee 16-byte aligned rows, so every vector access is one 16-byte access
            T.assume(og_stride % vec == 0)
            T.assume(x_stride % vec == 0)
            T.assume(rg_stride % vec == 0)
            tid = T.get_thread_binding()
            lane = tid % row_threads
            sub = tid // row_threads
            x_in = T.alloc_local((vecs_per_thread, vec), dtype)
            g_in = T.alloc_local((vecs_per_thread, vec), dtype)
            w_in = T.alloc_local((vec,), dtype)
            dw = T.alloc_local((vecs_per_thread, vec), T.float32)
            r_in = T.alloc_local((vec,), dtype)
            res = T.alloc_local((vec,), dtype)
            acc = T.alloc_local((1,), T.float32)
            warp_sums = T.alloc_shared((slots, row_warps), T.float32)
            slot_sums = T.alloc_shared((slots, hidden), T.float32)
            r = T.alloc_var(T.float32)
            xh = T.alloc_var(T.float32)
            g = T.alloc_var(T.float32)

            for v in T.unroll(vecs_per_thread):
                for j in T.unroll(vec):
                    dw[v, j] = 0.0

            for it in T.serial(T.ceildiv(num_tokens, num_blocks * slots)):
                token = (it * num_blocks + block) * slots + sub
                r = 0.0
                if token < num_tokens:
                    r = rstd[token]
                acc[0] = 0.0
                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if token < num_tokens and (exact or col < hidden):
                        for j in T.vectorized(vec):
                            x_in[v, j] = x[token, col + j]
                        for j in T.vectorized(vec):
                            g_in[v, j] = out_grad[token, col + j]
                    else:
                        for j in T.unroll(vec):
                            x_in[v, j] = T.cast(0, dtype)
                            g_in[v, j] = T.cast(0, dtype)
                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if has_weight != 0:
                        load_weight(weight, w_in, col)
                    for j in T.unroll(vec):
                        xh = T.cast(x_in[v, j], T.float32) * r
                        g = T.cast(g_in[v, j], T.float32) * out_scale
                        if has_weight != 0:
                            dw[v, j] += xh * g
                            g = g * T.cast(w_in[j], T.float32)
                        acc[0] += xh * g

                # The row's dot product in every thread of the row (shuffles, then warps through shared memory)
                for i in T.unroll(lanes.bit_length() - 1):
                    acc[0] += T.shfl_xor(acc[0], lanes >> (i + 1))
                if row_warps > 1:
                    if lane % 32 == 0:
                        warp_sums[sub, lane // 32] = acc[0]
                    T.sync_threads()
                    acc[0] = 0.0
                    for w in T.unroll(row_warps):
                        acc[0] += warp_sums[sub, w]
                    T.sync_threads()  # read before the next row writes warp_sums
                mean = acc[0] / T.float32(hidden)

                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if token < num_tokens and (exact or col < hidden):
                        if has_residual != 0:
                            for j in T.vectorized(vec):
                                r_in[j] = residual_out_grad[token, col + j]
                        if has_weight != 0:
                            load_weight(weight, w_in, col)
                        for j in T.unroll(vec):
                            xh = T.cast(x_in[v, j], T.float32) * r
                            g = T.cast(g_in[v, j], T.float32) * out_scale
                            if has_weight != 0:
                                g = g * T.cast(w_in[j], T.float32)
                            if has_residual != 0:
                                res[j] = T.cast((g - xh * mean) * r + T.cast(r_in[j], T.float32), dtype)
                            else:
                                res[j] = T.cast((g - xh * mean) * r, dtype)
                        for j in T.vectorized(vec):
                            x_grad[token, col + j] = res[j]

            if has_weight != 0:
                # The block's row slots added in slot order, one partial row a block
                if slots == 1:
                    for v in T.unroll(vecs_per_thread):
                        col = (v * row_threads + lane) * vec
                        if exact or col < hidden:
                            for j in T.vectorized(vec):
                                partials[block, col + j] = dw[v, j]
                else:
                    for v in T.unroll(vecs_per_thread):
                        col = (v * row_threads + lane) * vec
                        if exact or col < hidden:
                            for j in T.vectorized(vec):
                                slot_sums[sub, col + j] = dw[v, j]
                    T.sync_threads()
                    for c in T.serial(T.ceildiv(hidden, NUM_THREADS)):
                        col = c * NUM_THREADS + tid
                        if col < hidden:
                            r = slot_sums[0, col]
                            for s in T.unroll(1, slots):
                                r += slot_sums[s, col]
                            partials[block, col] = r

    return rmsnorm_backward
