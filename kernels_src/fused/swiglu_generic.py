"""The generic SwiGLU forward: swiglu with the row width `hidden` and the FP8 group `group` runtime values.

It serves the calls whose specialised swiglu variant is not built, or cannot be (the specialised tilings
spread a row over whole warps: hidden a multiple of 256; this kernel takes any multiple of 64), and writes the
bytes the specialised variant would: each value, group amax, scale factor and rounding is computed by the
same macros (swiglu_math.py), and only which thread holds which vectors differs, which changes no value (an
amax is a maximum; either division gives the correctly rounded quotient).

The tiling does not depend on hidden: a row is cut into chunks of CHUNK adjacent 16-byte vectors of gate
(and the up vectors of the same columns), and the threads of the grid take the chunks of all rows in
order, thread after thread, striding by the whole grid, so every lane works whatever the row width. A
chunk is at most one group (32 columns at the least), so a group's chunks are held by adjacent lanes,
aligned within their warp (hidden is a multiple of the group), and its amax is reduced with shuffles among
them: every lane of a warp runs the shuffles, those holding no row (past the last, or in the alignment
padding between expert segments) with an amax of zero and nothing to store.
"""

import tilelang.language as T

from kernels_src.fused import swiglu_args
from kernels_src.fused import swiglu_math as m
from kernels_src.fused.swiglu import MAX_HIDDEN_FP32, NUM_SMS, TILINGS, check_static
from kernels_src.fused.swiglu_math import OUT_DTYPES, Arith
from tkaot._quant.kernels import SWIGLU_GENERIC

DECL = SWIGLU_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

THREADS = 128
# 8 blocks an SM: 64 registers a thread, as the specialised tilings of 256-thread rows (at 9, the bf16 variants spill)
MIN_BLOCKS = 8
CHUNK = 4  # vectors of each half a thread computes at once: 32 bf16 or 16 fp32 columns
MAX_GROUP = 128  # the op's groups are 32 or 128 columns


def build(dtype: str, fmt: str, sf: str, tiling: str):
    quantized = fmt == "e4m3"
    # The specialised kernel's combination rules, at the widest row an fp32 input allows
    check_static(MAX_HIDDEN_FP32, dtype, fmt, MAX_GROUP if quantized else 0, sf)
    a = Arith(dtype, TILINGS[tiling].clamp)
    lean_div, vec = a.lean_div, a.vec
    cols = CHUNK * vec
    out_dtype = OUT_DTYPES[fmt]
    packed = sf == "ue8m0"
    lean_sf = quantized and sf == "fp32"
    max_blocks = NUM_SMS * MIN_BLOCKS
    num_warps = THREADS // 32
    max_group_lanes = MAX_GROUP // cols

    dims = swiglu_args.forward_dims()
    num_rows, num_experts, x_stride, _, sf_stride, sf_group_stride = dims
    hidden, group = T.dynamic("hidden"), T.dynamic("group")
    # The scale factors are addressed by their strides alone: fp32 [row, group, 0], packed UE8M0 bytes
    # [row, word, byte]. The extents only bind hidden and group (a dim must stand alone in some extent) and
    # bound no index: a group or word index is below hidden, a byte index below 4 <= group.
    sf_dtype = "uint8" if packed else "float32"
    chunks_per_row = hidden // cols
    num_chunks = T.cast(num_rows, "int64") * chunks_per_row
    grid = T.cast(T.min(T.ceildiv(num_chunks, THREADS), max_blocks), "int32")

    def vector_col(chunk, v):
        # The first column of the thread's vector v. Unquantized, the two lanes of a pair (chunks 2k and 2k + 1, of
        # one row and one step: a row has an even count of chunks, a step an even count of threads) interleave their
        # vectors over the pair's 2 * cols columns, so each load and store of a pair is one whole 32-byte sector (a
        # thread's own adjacent vectors put a lane's 16 bytes 64 bytes from the next lane's: half a sector each).
        # Quantized, a chunk stays a thread's adjacent vectors: the group amax takes whole chunks
        if quantized:
            return chunk * cols + v * vec
        return (chunk >> 1) * (2 * cols) + (2 * v + (chunk & 1)) * vec

    @T.macro
    def swiglu_generic(x, out, out_sf, psum_num_tokens_per_expert, topk_weights, clamped_count, moe, count_clamp):
        with T.Kernel(grid, threads=THREADS) as block:
            m.forward_entry(MIN_BLOCKS, x_stride, vec)
            T.assume(hidden % 64 == 0)  # as the op checks: whole chunks, and whole groups
            T.assume(hidden > 0)
            tid = T.get_thread_binding()
            gate = T.alloc_local((1, CHUNK, vec), dtype)
            up = T.alloc_local((1, CHUNK, vec), dtype)
            valid = T.alloc_local((1,), T.int32)
            if lean_sf:
                sf_lean = T.alloc_local((1,), T.float32)
                inv_lean = T.alloc_local((1,), T.float32)
            val = T.alloc_local((cols,), T.float32)
            res = T.alloc_local((cols,), out_dtype)
            counts, count_sums, lo, hi, begin, amax, g, u, exact, limit = m.thread_state(a, num_warps, moe.has_clamp, moe.clamp_value)
            if quantized:
                T.assume(group >= 32)  # 32 or 128 (the op's formats)
            group_shift = T.alloc_var(T.int32, init=T.if_then_else(group > 32, 7, 5))  # log2(group)

            # The thread's chunk: chunk `at_chunk` of row `at_row`; it moves on by the grid's threads each step
            step = grid * THREADS
            step_rows = T.alloc_var(T.int32, init=step // chunks_per_row)
            step_chunks = T.alloc_var(T.int32, init=step % chunks_per_row)
            # As many steps in every thread (the shuffles need whole warps): the last may hold no row
            num_steps = T.alloc_var(T.int32, init=T.cast(T.truncdiv(num_chunks + step - 1, T.cast(step, "int64")), "int32"))
            first = block * THREADS + tid
            at_row = T.alloc_var(T.int32, init=first // chunks_per_row)
            at_chunk = T.alloc_var(T.int32, init=first % chunks_per_row)
            for _ in T.serial(num_steps):
                row, chunk = at_row, at_chunk  # values, not the variables: indices in them vectorize
                valid[0] = T.if_then_else(row < num_rows, 1, 0)
                if moe.has_psum != 0 and valid[0] != 0:
                    m.segment_check(psum_num_tokens_per_expert, row, valid, 0, num_experts, moe.search_steps, moe.alignment, lo, hi, begin)
                T.assume(chunk >= 0)
                T.assume(chunk < chunks_per_row)
                if not quantized:
                    T.assume((chunk >> 1) * (2 * cols) + 2 * cols <= hidden)  # a pair's chunks are in one row
                if valid[0] != 0:
                    T.assume(row < num_rows)
                    T.assume(row >= 0)
                    for v in T.unroll(CHUNK):
                        for j in T.vectorized(vec):
                            gate[0, v, j] = x[row, vector_col(chunk, v) + j]
                        for j in T.vectorized(vec):
                            up[0, v, j] = x[row, hidden + vector_col(chunk, v) + j]
                    for v in T.unroll(CHUNK):
                        if lean_div:
                            # 0xC2AF: -87.5, the gate floor; limit: the clamp, so a clamped gate falls back
                            exact = T.call_extern("int32", "tkaot_gates_ok", T.address_of(gate[0, v, 0]), limit)
                        m.vector_values(a, gate, up, val, 0, v, v, g, u, counts, moe.has_clamp, moe.clamp_value, count_clamp)
                        if lean_div and exact == 0:
                            m.ieee_silu(a, gate, up, val, 0, v, v, moe.has_clamp, moe.clamp_value)
                    if moe.has_weights != 0:
                        row_weight = topk_weights[row] * moe.routed_scaling_factor
                        for j in T.unroll(cols):
                            val[j] = val[j] * row_weight
                if quantized:
                    amax = T.float32(0)
                    if valid[0] != 0:
                        m.values_amax(val, cols, amax)
                    # Every lane shuffles (a group's lanes are all valid or all not; `group` is the same in every lane)
                    for i in T.unroll(max_group_lanes.bit_length() - 1):
                        if (cols << i) < group:
                            amax = T.max(amax, T.shfl_xor(amax, 1 << i))
                if valid[0] != 0:
                    T.assume(row < num_rows)
                    T.assume(row >= 0)
                    if quantized:
                        stored, inv = m.group_scale(amax, sf, sf_lean if lean_sf else None, inv_lean if lean_sf else None)
                        m.scale_and_round(val, res, inv, cols, out_dtype)
                        # Every lane of a group stores its (equal) scale factor: no branch
                        gi = (chunk * cols) >> group_shift
                        if packed:
                            out_sf[row, gi >> 2, gi & 3] = stored
                            if gi == (hidden >> group_shift) - 1:
                                # The last group also zeroes the unused bytes of its word
                                for p in T.unroll(1, 4):
                                    if p > (gi & 3):
                                        out_sf[row, gi >> 2, p] = T.uint8(0)
                        else:
                            out_sf[row, gi, 0] = stored
                    else:
                        for j in T.unroll(cols):
                            res[j] = T.cast(val[j], out_dtype)
                    if quantized:
                        for j in T.vectorized(cols):
                            out[row, chunk * cols + j] = res[j]
                    else:
                        for v in T.unroll(CHUNK):
                            for j in T.vectorized(vec):
                                out[row, vector_col(chunk, v) + j] = res[v * vec + j]
                at_chunk = at_chunk + step_chunks
                at_row = at_row + step_rows
                if at_chunk >= chunks_per_row:
                    at_chunk = at_chunk - chunks_per_row
                    at_row = at_row + 1

            if count_clamp != 0:
                m.add_counts(
                    counts, count_sums, clamped_count, psum_num_tokens_per_expert, tid, block, num_warps, moe.has_psum, num_rows,
                    num_experts, moe.alignment, T.cast(hidden, T.int64),
                )  # fmt: skip

    sf_t = T.StridedTensor[(num_rows, hidden, group), (sf_stride, sf_group_stride, 1), sf_dtype]
    return swiglu_args.forward("swiglu_generic", dims, hidden, dtype, out_dtype, sf_t, swiglu_generic)
