"""mHC multi-layer recompute: rebuild the residual streams and layer inputs of consecutive layers from the
first residual, the saved mixes and the layer outputs (activation recomputation for the backward pass).

Layer l reads pre_mix[l] (tokens, M), and, for l < num_post, layer_output[l] (tokens, hidden) bf16,
post_mix[l] (tokens, M) and comb_mix[l] (tokens, M, M), all fp32 but the outputs, and writes
  layer_input[l][t, h] = bf16(sum over i of pre[l][t, i] * res[i, h])             (in stream order from zero)
  residual[l][t, o, h] = bf16(post[l][t, o] * out[l][t, h] + sum over i of comb[l][t, i, o] * res[i, h])
after which res = residual[l] (as rounded to bf16); res starts as initial_residual. num_post is
num_layers or num_layers - 1 (then the last layer only gets its layer_input).

The per-layer tensors come as one device table of int64 addresses, built per call by the op:
pre_mix[0..L), layer_input[0..L), residual[0..P), layer_output[0..P), post_mix[0..P), comb_mix[0..P).
A block is one token's run of THREADS * VEC columns; a thread keeps one 16-byte vector of every stream in
registers through all layers, so hidden size, token count and layer counts are runtime values; only M is static.
A layer's new residual is made one stream at a time (VEC fp32 accumulators, not M * VEC), so the registers fit
MIN_BLOCKS blocks an SM.

What a layer reads is staged in shared memory by cp.async, `stages - 1` layers ahead of the layer that uses it:
the thread's own vector of the layer output, and the token's M * (M + 2) mixes (pre, post, comb; one fp32 each
for the block's first threads). A layer's loads are then in flight while the layers before it are computed and
stored, and hold no registers, where a load at the layer's start (and the mixes' loads between its stores, which
the compiler may not move above stores that might alias them) left each layer waiting on memory two or three
times. One barrier a layer, after the wait for its group: every thread's mixes have landed, and every thread is
done with the slot the next stage overwrites. Out-of-range threads (hidden not a multiple of THREADS * VEC) run
the loop for its barriers, with their vector loads and stores left out.
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._mhc.kernels import MULTILAYER_RECOMPUTE

DECL = MULTILAYER_RECOMPUTE  # the declaration this module builds (tkaot/_mhc/kernels.py)

# The kernel's barriers are its own (one a layer, see above): a thread reads back only the output vectors it
# staged itself; the mixes are read after the layer's barrier. TileLang's inserted barriers are left out.
PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}

THREADS = 128
VEC = 8  # bf16 elements in 16 bytes
# Blocks an SM the registers must allow (80 registers a thread at 6). Register-only kernel (loads at each layer's
# start), H200, 8192 x 4 x 7168, 4 layers: 6 blocks 985.0 us, uncapped 1049, all streams together 1042, the next
# layer's output read ahead into registers 1315 (6 blocks) / 972.7 (5 blocks); TileKernels 816.9
MIN_BLOCKS = 6
# Shared-memory slots a block cycles through: layers staged ahead = STAGES - 1 (2 KiB of output and the mixes a slot).
# Two layers ahead: a layer's loads were issued two layers' compute and stores earlier, so most of their latency is
# behind them (one layer ahead, as TileKernels stages, is tuning candidate "stages2")
STAGES = 3


def build(mhc_mult: int, min_blocks: int = MIN_BLOCKS, stages: int = STAGES, threads: int = THREADS):
    m = mhc_mult
    mixes = m * (m + 2)  # a slot's fp32 mixes: pre [0, m), post [m, 2m), comb (i, o) at 2m + i * m + o
    assert mixes <= threads and stages >= 2
    ahead = stages - 1
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    table_size = T.dynamic("table_size")

    @T.macro
    def stage(n, t, tid, h, pointer_table, num_layers, num_post, staged_out, staged_mix):
        """Layer n's output vector and mixes into slot n % stages, one commit group (empty past the last layer)."""
        slot = n % stages
        if n < num_layers:
            pre = T.make_tensor(pointer_table[n], (num_tokens, m), T.float32)
            if tid < m:
                T.ptx_cp_async(T.access_ptr(staged_mix[slot, tid], "w", 1), T.access_ptr(pre[t, tid], "r", 1), 1)
            if n < num_post:
                output = T.make_tensor(pointer_table[2 * num_layers + num_post + n], (num_tokens, hidden), T.bfloat16)
                post = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post + n], (num_tokens, m), T.float32)
                comb = T.make_tensor(pointer_table[2 * num_layers + 3 * num_post + n], (num_tokens, m * m), T.float32)
                if h < hidden:
                    T.ptx_cp_async(T.access_ptr(staged_out[slot, tid * VEC], "w", VEC), T.access_ptr(output[t, h], "r", VEC), VEC)
                if tid >= m and tid < 2 * m:
                    T.ptx_cp_async(T.access_ptr(staged_mix[slot, tid], "w", 1), T.access_ptr(post[t, tid - m], "r", 1), 1)
                if tid >= 2 * m and tid < mixes:
                    T.ptx_cp_async(T.access_ptr(staged_mix[slot, tid], "w", 1), T.access_ptr(comb[t, tid - 2 * m], "r", 1), 1)
        T.ptx_commit_group()

    @T.prim_func
    def mhc_multilayer_recompute(
        initial_residual: T.Tensor[(num_tokens, m, hidden), T.bfloat16],
        pointer_table: T.Tensor[(table_size,), T.ptr],
        num_layers: T.int32,
        num_post: T.int32,
    ):
        with T.Kernel(T.ceildiv(hidden, VEC * threads), num_tokens, threads=threads) as (block, t):
            kernel_entry()
            T.assume(hidden % VEC == 0)
            if min_blocks:
                T.annotate_min_blocks_per_sm(min_blocks)
            tid = T.get_thread_binding()
            h = (block * threads + tid) * VEC
            staged_out = T.alloc_shared((stages, threads * VEC), T.bfloat16)
            staged_mix = T.alloc_shared((stages, mixes), T.float32)
            res = T.alloc_local((m, VEC), T.float32)
            mixed = T.alloc_local((VEC,), T.float32)
            loaded = T.alloc_local((m, VEC), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            out = T.alloc_local((VEC,), T.bfloat16)
            lo = T.alloc_local((VEC,), T.bfloat16)
            for n in T.unroll(ahead):
                stage(n, t, tid, h, pointer_table, num_layers, num_post, staged_out, staged_mix)
            if h < hidden:
                for i in T.unroll(m):
                    for k in T.vectorized(VEC):
                        loaded[i, k] = initial_residual[t, i, h + k]
                for i in T.unroll(m):
                    for k in T.unroll(VEC):
                        res[i, k] = T.cast(loaded[i, k], T.float32)
            for layer in T.serial(num_layers):
                slot = layer % stages
                T.ptx_wait_group(ahead - 1)  # this layer's group has landed (the thread's own copies)
                T.sync_threads()  # everyone's: the mixes; and the slot staged next is no longer read
                stage(layer + ahead, t, tid, h, pointer_table, num_layers, num_post, staged_out, staged_mix)
                if h < hidden:
                    layer_input = T.make_tensor(pointer_table[num_layers + layer], (num_tokens, hidden), T.bfloat16)
                    for k in T.unroll(VEC):
                        acc[k] = T.float32(0)
                    for i in T.unroll(m):
                        for k in T.unroll(VEC):
                            acc[k] = acc[k] + staged_mix[slot, i] * res[i, k]
                    for k in T.unroll(VEC):
                        out[k] = T.cast(acc[k], T.bfloat16)
                    for k in T.vectorized(VEC):
                        layer_input[t, h + k] = out[k]
                    if layer < num_post:
                        residual = T.make_tensor(pointer_table[2 * num_layers + layer], (num_tokens, m, hidden), T.bfloat16)
                        for k in T.vectorized(VEC):
                            lo[k] = staged_out[slot, tid * VEC + k]
                        for o in T.unroll(m):
                            for k in T.unroll(VEC):
                                mixed[k] = staged_mix[slot, m + o] * T.cast(lo[k], T.float32)
                            for i in T.unroll(m):
                                for k in T.unroll(VEC):
                                    mixed[k] = mixed[k] + staged_mix[slot, 2 * m + i * m + o] * res[i, k]
                            for k in T.unroll(VEC):
                                loaded[o, k] = T.cast(mixed[k], T.bfloat16)
                            for k in T.vectorized(VEC):
                                residual[t, o, h + k] = loaded[o, k]
                        for o in T.unroll(m):
                            for k in T.unroll(VEC):
                                res[o, k] = T.cast(loaded[o, k], T.float32)
            T.ptx_wait_group(0)  # no copy outlives the block (the groups past the last layer are empty)

    return mhc_multilayer_recompute
