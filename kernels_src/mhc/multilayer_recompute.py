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

Layer l + 1's inputs are fetched while layer l computes and stores: at the top of layer l each thread copies
its 16 bytes of the next layer's output, and the first threads the token's next pre, post and comb rows, into
shared memory by cp.async, as one commit group; waiting for the group before it (cp.async.wait_group 1) and
one barrier make layer l's own visible. The mixes are triple-buffered, so that barrier is the only one a layer
(buffer l + 1, written in layer l, was last read in layer l - 2, and layer l - 1's barrier lies between); the
output vector is double-buffered, as only the thread that copied it reads it. A mix row is M fp32: copied in
16-byte pieces when M % 4 == 0 (DeepSeek's M = 4: one a row), else one float at a time (cp.async of 4 bytes),
so that one form serves every M; the op asks of the mixes the alignment of those pieces (recompute_mix_piece).

Its stores go through tkaot_store16, one 128-bit st.global: the table's addresses are generic pointers, and nvcc
splits a 16-byte store through one into four 32-bit ones (a kernel parameter's is one STG.E.128); the stores are
five sixths of the kernel's bytes (H200, session 12: 892.8 us against 991.1 split).
H200 (8192 x 4 x 7168, 4 layers, same run, outputs identical to TileKernels'): 820.4 us; TileKernels 818.2; the
kernel before the staging (each layer's output and mixes read from global at the layer) 888.2. Other staged forms
in that run: 64 threads at 12 / 10 blocks an SM 821.2 / 832.3, at 10 with all streams made before storing
(TileKernels' order) 824.5, MIN_BLOCKS 5 / 7 835.4 / 878.4, the output alone staged 881.1, the mixes loaded
once a block without cp.async 1038.8 (f014b86:bench/results/2026-12-03-H200-s18-tune_recomp10.log; the harness is
bench/tuning/tune_recomp10.py as of e37bc1f).
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, asm_function, pdl_entry
from tkaot._mhc.kernels import MULTILAYER_RECOMPUTE, recompute_mix_piece

DECL = MULTILAYER_RECOMPUTE  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = 128
VEC = 8  # bf16 elements in 16 bytes
# Blocks an SM the registers must allow (80 registers a thread at 6). Before the staging, H200: 989 us against 1049
# uncapped; 899.5 against 925.4 / 934.2 at 5 / 7 (f014b86:bench/results/2026-12-03-H200-s17-tune_recomp9.log). Staged, 5 and 7
# lose too (module docstring)
MIN_BLOCKS = 6

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


def _cp_async_function(name: str, cache: str, size: int) -> str:
    """CUDA source of `int name(void* smem, const void* gmem)`: cp.async of `size` bytes global -> shared (generic
    addresses, aligned to the size), caching at `cache` ("cg" or "ca"), in T.call_extern's int-returning form."""
    return (
        f"__device__ __forceinline__ int {name}(void* smem, const void* gmem) {{\n"
        f'    asm volatile("cp.async.{cache}.shared.global [%0], [%1], {size};"\n'
        '                 :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(__cvta_generic_to_global(gmem)) : "memory");\n'
        "    return 0;\n"
        "}\n"
    )


# cp.async of 16 or 4 bytes, its commit and wait, and a barrier, each as an int-returning call (T.call_extern's form)
ASYNC_SOURCE = (
    "\n"
    + _cp_async_function("tkaot_cp_async16", "cg", 16)
    + _cp_async_function("tkaot_cp_async4", "ca", 4)
    + """__device__ __forceinline__ int tkaot_barrier() {
    __syncthreads();
    return 0;
}
"""
    + asm_function("tkaot_cp_async_commit", "cp.async.commit_group")
    + asm_function("tkaot_cp_async_wait1", "cp.async.wait_group 1")
)

MIX_BUFFERS = 3  # one barrier a layer (module docstring)


def build(mhc_mult: int):
    m = mhc_mult
    piece = recompute_mix_piece(m)  # fp32 a mix copy moves (the op checks the mixes' alignment by it)
    per_row = m // piece  # pieces a mix row
    rows = 2 + m  # the staged mixes: pre, post, then comb[i, 0..M) for each input stream i
    mix_copy = "tkaot_cp_async16" if piece == 4 else "tkaot_cp_async4"
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    table_size = T.dynamic("table_size")

    @T.macro
    def store16(dst, di, src, si):
        """The 16 bytes at src[*si] to dst[*di] (index tuples: a macro takes them as they are)"""
        T.call_extern("int32", "tkaot_store16", T.address_of(dst[di]), T.address_of(src[si]))

    @T.macro
    def cp_async(copy, smem, si, gmem, gi):
        T.call_extern("int32", copy, T.address_of(smem[si]), T.address_of(gmem[gi]))

    @T.macro
    def fetch(pointer_table, num_layers, num_post, layer, t, h, tx, out_sm, mix_sm):
        """Start copying layer `layer`'s output vector and mixes into their shared buffers (no commit)."""
        if h < hidden:
            output = T.make_tensor(pointer_table[2 * num_layers + num_post + layer], (num_tokens, hidden), T.bfloat16)
            cp_async("tkaot_cp_async16", out_sm, (layer % 2, tx, 0), output, (t, h))
        pre = T.make_tensor(pointer_table[layer], (num_tokens, m), T.float32)
        post = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post + layer], (num_tokens, m), T.float32)
        comb = T.make_tensor(pointer_table[2 * num_layers + 3 * num_post + layer], (num_tokens, m, m), T.float32)
        buf = layer % MIX_BUFFERS
        row, col = tx // per_row, tx % per_row * piece
        if row == 0:
            cp_async(mix_copy, mix_sm, (buf, 0, col), pre, (t, col))
        elif row == 1:
            cp_async(mix_copy, mix_sm, (buf, 1, col), post, (t, col))
        elif row < rows:
            cp_async(mix_copy, mix_sm, (buf, row, col), comb, (t, row - 2, col))

    @T.macro
    def apply_pre(layer_input, t, h, res, acc, li, weights):
        """layer_input[t, h:h + VEC] from the weights and the streams."""
        for k in T.unroll(VEC):
            acc[k] = T.float32(0)
        for i in T.unroll(m):
            for k in T.unroll(VEC):
                acc[k] = acc[k] + weights[i] * res[i, k]
        for k in T.unroll(VEC):
            li[k] = T.cast(acc[k], T.bfloat16)
        store16(layer_input, (t, h), li, (0,))

    @T.prim_func
    def mhc_multilayer_recompute(
        initial_residual: T.Tensor[(num_tokens, m, hidden), T.bfloat16],
        pointer_table: T.Tensor[(table_size,), T.ptr],
        num_layers: T.int32,
        num_post: T.int32,
    ):
        with T.Kernel(T.ceildiv(hidden, VEC * THREADS), num_tokens, threads=THREADS) as (block, t):
            T.import_source(STORE16_SOURCE + PDL_SOURCE + ASYNC_SOURCE)
            pdl_entry()
            T.assume(hidden % VEC == 0)
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tx = T.get_thread_binding()
            h = (block * THREADS + tx) * VEC
            res = T.alloc_local((m, VEC), T.float32)
            mixed = T.alloc_local((VEC,), T.float32)
            loaded = T.alloc_local((m, VEC), T.bfloat16)
            lo = T.alloc_local((VEC,), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            li = T.alloc_local((VEC,), T.bfloat16)
            weights = T.alloc_local((m,), T.float32)
            out_sm = T.alloc_shared((2, THREADS, VEC), T.bfloat16)
            mix_sm = T.alloc_shared((MIX_BUFFERS, rows, m), T.float32)
            if h < hidden:
                for i in T.unroll(m):
                    for k in T.vectorized(VEC):
                        loaded[i, k] = initial_residual[t, i, h + k]
                for i in T.unroll(m):
                    for k in T.unroll(VEC):
                        res[i, k] = T.cast(loaded[i, k], T.float32)
            if num_post > 0:
                fetch(pointer_table, num_layers, num_post, 0, t, h, tx, out_sm, mix_sm)
                T.call_extern("int32", "tkaot_cp_async_commit")
            # Every thread runs the loop and its barriers; one past the hidden size skips only the work
            for layer in T.serial(num_post):
                # this layer's output addresses read before the barrier, their latency hidden behind it
                residual = T.make_tensor(pointer_table[2 * num_layers + layer], (num_tokens, m, hidden), T.bfloat16)
                layer_input = T.make_tensor(pointer_table[num_layers + layer], (num_tokens, hidden), T.bfloat16)
                if layer + 1 < num_post:
                    fetch(pointer_table, num_layers, num_post, layer + 1, t, h, tx, out_sm, mix_sm)
                T.call_extern("int32", "tkaot_cp_async_commit")  # (empty in the last layer: wait 1 still waits for this one's)
                T.call_extern("int32", "tkaot_cp_async_wait1")
                T.call_extern("int32", "tkaot_barrier")
                if h < hidden:
                    buf = layer % MIX_BUFFERS
                    for k in T.vectorized(VEC):
                        lo[k] = out_sm[layer % 2, tx, k]
                    for i in T.unroll(m):
                        weights[i] = mix_sm[buf, 0, i]
                    apply_pre(layer_input, t, h, res, acc, li, weights)
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            mixed[k] = mix_sm[buf, 1, o] * T.cast(lo[k], T.float32)
                        for i in T.unroll(m):
                            for k in T.unroll(VEC):
                                mixed[k] = mixed[k] + mix_sm[buf, 2 + i, o] * res[i, k]
                        for k in T.unroll(VEC):
                            loaded[o, k] = T.cast(mixed[k], T.bfloat16)
                        store16(residual, (t, o, h), loaded, (o, 0))
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            res[o, k] = T.cast(loaded[o, k], T.float32)
            if num_layers > num_post and h < hidden:
                last_pre = T.make_tensor(pointer_table[num_post], (num_tokens, m), T.float32)
                last_input = T.make_tensor(pointer_table[num_layers + num_post], (num_tokens, hidden), T.bfloat16)
                for i in T.unroll(m):
                    weights[i] = last_pre[t, i]
                apply_pre(last_input, t, h, res, acc, li, weights)

    return mhc_multilayer_recompute
