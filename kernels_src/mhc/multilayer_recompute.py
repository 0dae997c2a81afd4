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
A thread keeps one 16-byte vector of every stream in registers through all layers, so hidden size,
token count and layer counts are runtime values; only M is static. It loads the next layer's output vector
and mixes before working on the current layer, so their latency hides behind this layer's arithmetic and
stores instead of stalling the thread once a layer (as TileKernels does through shared memory).
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import MULTILAYER_RECOMPUTE

DECL = MULTILAYER_RECOMPUTE  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
MIN_BLOCKS = 4  # blocks an SM that the registers must allow (16 warps, as before the loads ahead)
VEC = 8  # bf16 elements in 16 bytes


def build(mhc_mult: int):
    m = mhc_mult
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    table_size = T.dynamic("table_size")

    @T.macro
    def apply_pre(weights, layer_input, t, h, res, acc, out):
        for k in T.unroll(VEC):
            acc[k] = T.float32(0)
        for i in T.unroll(m):
            for k in T.unroll(VEC):
                acc[k] = acc[k] + weights[i] * res[i, k]
        for k in T.unroll(VEC):
            out[k] = T.cast(acc[k], T.bfloat16)
        for k in T.vectorized(VEC):
            layer_input[t, h + k] = out[k]

    @T.macro
    def load_pre(pointer_table, layer, t, weights):
        pre = T.make_tensor(pointer_table[layer], (num_tokens, m), T.float32)
        for i in T.unroll(m):
            weights[i] = pre[t, i]

    @T.macro
    def load_post(pointer_table, num_layers, num_post, layer, t, h, lo, post_w, comb_w):
        """Layer `layer`'s output vector, post mix and comb mix."""
        output = T.make_tensor(pointer_table[2 * num_layers + num_post + layer], (num_tokens, hidden), T.bfloat16)
        post = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post + layer], (num_tokens, m), T.float32)
        comb = T.make_tensor(pointer_table[2 * num_layers + 3 * num_post + layer], (num_tokens, m, m), T.float32)
        for k in T.vectorized(VEC):
            lo[k] = output[t, h + k]
        for o in T.unroll(m):
            post_w[o] = post[t, o]
            for i in T.unroll(m):
                comb_w[i, o] = comb[t, i, o]

    @T.prim_func
    def mhc_multilayer_recompute(
        initial_residual: T.Tensor[(num_tokens, m, hidden), T.bfloat16],
        pointer_table: T.Tensor[(table_size,), T.ptr],
        num_layers: T.int32,
        num_post: T.int32,
    ):
        with T.Kernel(T.ceildiv(hidden, VEC * THREADS), num_tokens, threads=THREADS) as (block, t):
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(hidden % VEC == 0)
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            h = (block * THREADS + T.get_thread_binding()) * VEC
            res = T.alloc_local((m, VEC), T.float32)
            mixed = T.alloc_local((m, VEC), T.float32)
            loaded = T.alloc_local((m, VEC), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            out = T.alloc_local((VEC,), T.bfloat16)
            # this layer's inputs, and the next layer's, loaded ahead
            lo = T.alloc_local((VEC,), T.bfloat16)
            weights = T.alloc_local((m,), T.float32)
            post_w = T.alloc_local((m,), T.float32)
            comb_w = T.alloc_local((m, m), T.float32)
            lo_next = T.alloc_local((VEC,), T.bfloat16)
            weights_next = T.alloc_local((m,), T.float32)
            post_next = T.alloc_local((m,), T.float32)
            comb_next = T.alloc_local((m, m), T.float32)
            if h < hidden:
                for i in T.unroll(m):
                    for k in T.vectorized(VEC):
                        loaded[i, k] = initial_residual[t, i, h + k]
                load_pre(pointer_table, 0, t, weights)
                if num_post > 0:
                    load_post(pointer_table, num_layers, num_post, 0, t, h, lo, post_w, comb_w)
                for i in T.unroll(m):
                    for k in T.unroll(VEC):
                        res[i, k] = T.cast(loaded[i, k], T.float32)
                for layer in T.serial(num_post):
                    if layer + 1 < num_post:
                        load_post(pointer_table, num_layers, num_post, layer + 1, t, h, lo_next, post_next, comb_next)
                    if layer + 1 < num_layers:
                        load_pre(pointer_table, layer + 1, t, weights_next)
                    residual = T.make_tensor(pointer_table[2 * num_layers + layer], (num_tokens, m, hidden), T.bfloat16)
                    layer_input = T.make_tensor(pointer_table[num_layers + layer], (num_tokens, hidden), T.bfloat16)
                    apply_pre(weights, layer_input, t, h, res, acc, out)
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            mixed[o, k] = post_w[o] * T.cast(lo[k], T.float32)
                        for i in T.unroll(m):
                            for k in T.unroll(VEC):
                                mixed[o, k] = mixed[o, k] + comb_w[i, o] * res[i, k]
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            loaded[o, k] = T.cast(mixed[o, k], T.bfloat16)
                        for k in T.vectorized(VEC):
                            residual[t, o, h + k] = loaded[o, k]
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            res[o, k] = T.cast(loaded[o, k], T.float32)
                    for k in T.unroll(VEC):
                        lo[k] = lo_next[k]
                    for o in T.unroll(m):
                        weights[o] = weights_next[o]
                        post_w[o] = post_next[o]
                        for i in T.unroll(m):
                            comb_w[i, o] = comb_next[i, o]
                if num_layers > num_post:
                    last_input = T.make_tensor(pointer_table[num_layers + num_post], (num_tokens, hidden), T.bfloat16)
                    apply_pre(weights, last_input, t, h, res, acc, out)

    return mhc_multilayer_recompute
