"""RMSNorm backward, pass 1, for the calls with a residual gradient: the specialised kernel
(kernels_src/norm/rmsnorm_backward.py) with a body that takes the residual gradient as given.

The calls without one keep rmsnorm_backward's variant, byte for byte; the op launches this kernel where a residual
gradient is given and it is built. It writes rmsnorm_backward's bytes: the same vectors a thread, the same products
and sums in the same order, the same fused multiply-adds. Two changes to the body:
- x * rstd and the (weighted, scaled) gradient are held in fp32 registers from the dot product to the stores, rather
  than the staged bf16 / fp32 vectors held and both products computed again (the same products, so the same values);
- the row's warp-sum barrier is one of each row slot's threads (bar.sync 1 + slot), not the block's, so a block's row
  slots need not wait for each other (where a block holds more than one).
(H200, 8192 x 7168, µs, rmsnorm_backward / this / TileKernels: bf16 weight 122.91 / 118.70 / 117.76; bf16 no weight
117.41 / 113.74 / 112.59; fp32 weight 226.64 / 225.87 / 227.18. Also timed, no faster: holding the gradient only,
refilling each residual vector's stage slot at once, evict-first stores, L2 hints on the copies, the residual gradient
read directly into registers.)
"""

import tilelang.language as T

from kernels_src.norm.rmsnorm_backward import NUM_THREADS, STAGED_TENSORS, STAGES, StaticTiling, _fma, _mul, rmsnorm_backward_kernel
from kernels_src.norm.rmsnorm_backward import PASS_CONFIGS as PASS_CONFIGS
from tkaot._quant.kernels import RMSNORM_BACKWARD_RESIDUAL

DECL = RMSNORM_BACKWARD_RESIDUAL


def build(hidden: int, dtype: str):
    return rmsnorm_backward_kernel(StaticTiling(hidden, dtype), dtype, static_body=residual_body)


def residual_body(tiling, dtype: str, num_tokens, num_blocks):
    """The body over a StaticTiling, as a macro of the kernel's parameters and its block (has_residual taken as 1)."""
    hidden, vec, vecs_per_thread = tiling.hidden, tiling.vec, tiling.vectors
    row_threads, slots = tiling.row_threads, tiling.slots
    stages, region = STAGES, tiling.stage_elems

    def token_of(it, block, sub):
        return (it * num_blocks + block) * slots + sub

    def staged(stage, tensor, sub, col):
        """Flat index of a vector's first element in the staging buffer: (stage, tensor, row slot, column)."""
        return (stage * STAGED_TENSORS + tensor) * region + sub * hidden + col

    @T.macro
    def row_dot(acc, warp_sums, half, sub, lane):
        """acc[0], a thread's share of the row's dot product, becomes the row's in every thread of the row (the warp
        sums in the half of warp_sums of the row's parity, as rmsnorm_backward's row_dot)."""
        for i in T.unroll(tiling.lanes.bit_length() - 1):
            acc[0] += T.shfl_xor(acc[0], tiling.lanes >> (i + 1))
        if tiling.row_warps > 1:
            if lane % 32 == 0:
                warp_sums[tiling.warp_at(half, sub, lane // 32)] = acc[0]
            if slots > 1:
                T.sync_threads(sub + 1, row_threads)  # each slot's warp sums are its own
            else:
                T.sync_threads()
            acc[0] = 0.0
            for w in T.unroll(tiling.row_warps):
                acc[0] += warp_sums[tiling.warp_at(half, sub, w)]

    @T.macro
    def stage_row(src, stage_buf, tensor, stage, sub, token, lane):
        # The thread's own vectors of row `token` (zeros past the last token) into its slot of the stage
        for v in T.unroll(vecs_per_thread):
            col = (v * row_threads + lane) * vec
            if tiling.in_row(v, col):
                T.ptx_cp_async(
                    T.access_ptr(stage_buf[staged(stage, tensor, sub, col)], "w", vec),
                    T.access_ptr(src[T.min(token, num_tokens - 1), col], "r", vec),
                    vec,
                    token < num_tokens,
                )

    @T.macro
    def store_held(dst, head, dw, lane):
        for v in T.unroll(vecs_per_thread):
            col = (v * row_threads + lane) * vec
            if tiling.in_row(v, col):
                for j in T.vectorized(vec):
                    dst[head[0], col + j] = dw[v, j]

    @T.macro
    def body(out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, has_weight, has_residual, block):
        tid = T.get_thread_binding()
        lane, sub = tiling.lane_and_slot(tid)
        x_in = T.alloc_local((vecs_per_thread, vec), dtype)
        g_in = T.alloc_local((vecs_per_thread, vec), dtype)
        xh_held = T.alloc_local((vecs_per_thread, vec), T.float32)
        gw_held = T.alloc_local((vecs_per_thread, vec), T.float32)
        w_in = T.alloc_local((vec,), dtype)
        w_held = T.alloc_local((vecs_per_thread, vec), dtype)
        dw = T.alloc_local((vecs_per_thread, vec), T.float32)
        r_in = T.alloc_local((vec,), dtype)
        res = T.alloc_local((vec,), dtype)
        acc = T.alloc_local((1,), T.float32)
        stage_buf = T.alloc_shared((stages * STAGED_TENSORS * region,), dtype)
        warp_sums = T.alloc_shared(tiling.warps_shape, T.float32)
        slot_sums = T.alloc_shared(tiling.slots_shape, T.float32)
        r = T.alloc_var(T.float32)
        r_next = T.alloc_var(T.float32)
        xh = T.alloc_var(T.float32)
        g = T.alloc_var(T.float32)
        t = T.alloc_var(T.float32)

        for v in T.unroll(vecs_per_thread):
            for j in T.unroll(vec):
                dw[v, j] = 0.0
        if has_weight != 0:
            for v in T.unroll(vecs_per_thread):
                col = (v * row_threads + lane) * vec
                if tiling.in_row(v, col):
                    for j in T.vectorized(vec):
                        w_in[j] = weight[col + j]
                else:
                    for j in T.unroll(vec):
                        w_in[j] = T.cast(0, dtype)
                for j in T.unroll(vec):
                    w_held[v, j] = w_in[j]

        for s in T.unroll(stages):
            stage_row(x, stage_buf, 0, s, sub, token_of(s, block, sub), lane)
            stage_row(out_grad, stage_buf, 1, s, sub, token_of(s, block, sub), lane)
            stage_row(residual_out_grad, stage_buf, 2, s, sub, token_of(s, block, sub), lane)
            T.ptx_commit_group()
        r_next = 0.0
        if token_of(0, block, sub) < num_tokens:
            r_next = rstd[token_of(0, block, sub)]

        for it in T.serial(T.ceildiv(num_tokens, num_blocks * slots)):
            token = token_of(it, block, sub)
            ahead = token_of(it + stages, block, sub)
            stage = it % stages
            r = r_next
            r_next = 0.0
            if token_of(it + 1, block, sub) < num_tokens:
                r_next = rstd[token_of(it + 1, block, sub)]
            T.ptx_wait_group(stages - 1)
            acc[0] = 0.0
            for v in T.unroll(vecs_per_thread):
                col = (v * row_threads + lane) * vec
                if token < num_tokens and tiling.in_row(v, col):
                    for j in T.vectorized(vec):
                        x_in[v, j] = stage_buf[staged(stage, 0, sub, col) + j]
                    for j in T.vectorized(vec):
                        g_in[v, j] = stage_buf[staged(stage, 1, sub, col) + j]
                else:
                    for j in T.unroll(vec):
                        x_in[v, j] = T.cast(0, dtype)
                        g_in[v, j] = T.cast(0, dtype)
            # x's and out_grad's slots refilled as soon as read; the residual gradient's after the row's stores
            stage_row(x, stage_buf, 0, stage, sub, ahead, lane)
            stage_row(out_grad, stage_buf, 1, stage, sub, ahead, lane)
            for v in T.unroll(vecs_per_thread):
                for j in T.unroll(vec):
                    xh = T.cast(x_in[v, j], T.float32) * r
                    g = T.cast(g_in[v, j], T.float32) * out_scale
                    if has_weight != 0:
                        dw[v, j] = _fma(xh, g, dw[v, j])
                        g = _mul(g, T.cast(w_held[v, j], T.float32))
                    acc[0] = _fma(xh, g, acc[0])
                    xh_held[v, j] = xh
                    gw_held[v, j] = g

            row_dot(acc, warp_sums, it % 2, sub, lane)
            mean = tiling.mean(acc[0])

            for v in T.unroll(vecs_per_thread):
                col = (v * row_threads + lane) * vec
                if token < num_tokens and tiling.in_row(v, col):
                    for j in T.vectorized(vec):
                        r_in[j] = stage_buf[staged(stage, 2, sub, col) + j]
                    for j in T.unroll(vec):
                        t = _fma(-xh_held[v, j], mean, gw_held[v, j])
                        res[j] = T.cast(_fma(t, r, T.cast(r_in[j], T.float32)), dtype)
                    for j in T.vectorized(vec):
                        x_grad[token, col + j] = res[j]
            stage_row(residual_out_grad, stage_buf, 2, stage, sub, ahead, lane)
            T.ptx_commit_group()
        T.ptx_wait_group(0)

        if has_weight != 0:
            if slots == 1:
                store_held(partials, (block,), dw, lane)
            else:
                T.sync_threads()
                store_held(slot_sums, (sub,), dw, lane)
                T.sync_threads()
                for c in T.serial(T.ceildiv(hidden, NUM_THREADS)):
                    col = c * NUM_THREADS + tid
                    if col < hidden:
                        r = slot_sums[0, col]
                        for s in T.unroll(1, slots):
                            r += slot_sums[s, col]
                        partials[block, col] = r

    return body
