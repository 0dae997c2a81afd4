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
token count and layer counts are runtime values; only M is static. A layer's new residual is made one stream
at a time (VEC fp32 accumulators, not M * VEC), so the registers fit MIN_BLOCKS blocks an SM: more warps to
wait on memory.

Its stores go through tkaot_store16, one 128-bit st.global: the table's addresses are generic pointers, and nvcc
splits a 16-byte store through one into four 32-bit ones (a kernel parameter's is one STG.E.128); the stores are
five sixths of the kernel's bytes. H200 (session 12, same run, identical to TileKernels): 892.8 us against 991.1
with the split stores; TileKernels 821.4.
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._mhc.kernels import MULTILAYER_RECOMPUTE

DECL = MULTILAYER_RECOMPUTE  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
VEC = 8  # bf16 elements in 16 bytes
# Blocks an SM the registers must allow (80 registers a thread at 6). H200, 8192 x 4 x 7168, 4 layers: 989 us, against
# 1049 uncapped (101 registers) and 1042 for all streams made together (128 registers; with the next layer's inputs
# loaded ahead 1053, uncapped 1185, 5 blocks 1443)
MIN_BLOCKS = 6
# The next layer's output read before this layer's stores (they may alias it, so the compiler cannot move it there).
# H200 (session 11, identical to TileKernels): off 985.0 us; ahead at 6 blocks 1315.0, at 5 blocks 972.7 (1 %,
# one run: not shipped); before 1029.7; TileKernels 816.9. With the 128-bit stores (session 12): ahead at 5 blocks 907.2,
# off 892.8. Again 2026-12-03 (899.5 us, TileKernels 825.4; bench/results/2026-12-03-H200-s17-tune_recomp9.log,
# bench/tuning/tune_recomp9.py as of 615c48e): MIN_BLOCKS 5 / 7 / 8 925.4 / 934.2 / 1079.8, 64 threads 898.5, 256
# threads 924.3, ahead at 5 blocks 918.6, 64 threads ahead (TileKernels' block) 917.7, without PDL 899.7: no gain
OUTPUT_AHEAD = False

# dst[0:16 bytes] = src's 16 bytes, one global store (dst: a global address; both 16-byte aligned). The memory
# clobber keeps every other access on its side of it, as a plain store through a generic pointer would be kept.
STORE16_SOURCE = """
__device__ __forceinline__ int tkaot_store16(void* dst, const void* src) {
    uint4 v = *(const uint4*)src;
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                 :: "l"(__cvta_generic_to_global(dst)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
    return 0;
}
"""


def build(mhc_mult: int, min_blocks: int = MIN_BLOCKS, output_ahead: bool = OUTPUT_AHEAD):
    m = mhc_mult
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    table_size = T.dynamic("table_size")

    @T.macro
    def store16(dst, di, src, si):
        """The 16 bytes at src[*si] to dst[*di] (index tuples: a macro takes them as they are)"""
        T.call_extern("int32", "tkaot_store16", T.address_of(dst[di]), T.address_of(src[si]))

    @T.macro
    def pre_tiles():
        """apply_pre's registers: the fp32 sum, its bf16 rounding and the token's pre weights."""
        acc = T.alloc_local((VEC,), T.float32)
        out = T.alloc_local((VEC,), T.bfloat16)
        weights = T.alloc_local((m,), T.float32)
        return acc, out, weights

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
        store16(layer_input, (t, h), out, (0,))

    @T.prim_func
    def mhc_multilayer_recompute(
        initial_residual: T.Tensor[(num_tokens, m, hidden), T.bfloat16],
        pointer_table: T.Tensor[(table_size,), T.ptr],
        num_layers: T.int32,
        num_post: T.int32,
    ):
        with T.Kernel(T.ceildiv(hidden, VEC * THREADS), num_tokens, threads=THREADS) as (block, t):
            T.import_source(STORE16_SOURCE + PDL_SOURCE)
            pdl_entry()
            T.assume(hidden % VEC == 0)
            if min_blocks:
                T.annotate_min_blocks_per_sm(min_blocks)
            h = (block * THREADS + T.get_thread_binding()) * VEC
            res = T.alloc_local((m, VEC), T.float32)
            mixed = T.alloc_local((VEC,), T.float32)
            loaded = T.alloc_local((m, VEC), T.bfloat16)
            lo = T.alloc_local((VEC,), T.bfloat16)
            lo_next = T.alloc_local((VEC,), T.bfloat16)
            pre_bufs = pre_tiles()
            if h < hidden:
                for i in T.unroll(m):
                    for k in T.vectorized(VEC):
                        loaded[i, k] = initial_residual[t, i, h + k]
                for i in T.unroll(m):
                    for k in T.unroll(VEC):
                        res[i, k] = T.cast(loaded[i, k], T.float32)
                if output_ahead and num_post > 0:
                    first_output = T.make_tensor(pointer_table[2 * num_layers + num_post], (num_tokens, hidden), T.bfloat16)
                    for k in T.vectorized(VEC):
                        lo[k] = first_output[t, h + k]
                for layer in T.serial(num_post):
                    # this layer's output, or with output_ahead the next one's
                    output = T.make_tensor(
                        pointer_table[2 * num_layers + num_post + layer + int(output_ahead)], (num_tokens, hidden), T.bfloat16
                    )
                    post = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post + layer], (num_tokens, m), T.float32)
                    comb = T.make_tensor(pointer_table[2 * num_layers + 3 * num_post + layer], (num_tokens, m, m), T.float32)
                    residual = T.make_tensor(pointer_table[2 * num_layers + layer], (num_tokens, m, hidden), T.bfloat16)
                    if output_ahead:
                        if layer + 1 < num_post:
                            for k in T.vectorized(VEC):
                                lo_next[k] = output[t, h + k]
                    else:
                        for k in T.vectorized(VEC):
                            lo[k] = output[t, h + k]
                    pre = T.make_tensor(pointer_table[layer], (num_tokens, m), T.float32)
                    layer_input = T.make_tensor(pointer_table[num_layers + layer], (num_tokens, hidden), T.bfloat16)
                    apply_pre(pre, layer_input, t, h, res, *pre_bufs)
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            mixed[k] = post[t, o] * T.cast(lo[k], T.float32)
                        for i in T.unroll(m):
                            for k in T.unroll(VEC):
                                mixed[k] = mixed[k] + comb[t, i, o] * res[i, k]
                        for k in T.unroll(VEC):
                            loaded[o, k] = T.cast(mixed[k], T.bfloat16)
                        store16(residual, (t, o, h), loaded, (o, 0))
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            res[o, k] = T.cast(loaded[o, k], T.float32)
                    if output_ahead:
                        for k in T.unroll(VEC):
                            lo[k] = lo_next[k]
                if num_layers > num_post:
                    last_pre = T.make_tensor(pointer_table[num_post], (num_tokens, m), T.float32)
                    last_input = T.make_tensor(pointer_table[num_layers + num_post], (num_tokens, hidden), T.bfloat16)
                    apply_pre(last_pre, last_input, t, h, res, *pre_bufs)

    return mhc_multilayer_recompute
