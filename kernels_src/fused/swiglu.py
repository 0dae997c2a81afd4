"""SwiGLU forward, optionally with the per-token FP8 cast fused: out = silu(gate) * up * weight.

x rows are [gate | up], each `hidden` wide. A row is spread over `row_threads`
threads (whole warps); thread `lane` owns 16-byte vectors of gate and the up
vectors of the same columns, so the row is read once with 16-byte loads:
vectors `v * row_threads + lane`, or for an FP8 output whose groups allow it
the adjacent vectors `lane * iters + v` ("contig"), so a thread's vectors in one
group (a "chunk") share one amax, one scale factor and one store. For an FP8
output the absolute maximum of each group of `group` outputs is reduced with
warp shuffles among the group's lanes; the scale factor follows
kernels_src/quant/common.py. Each block holds one row; blocks stride over rows,
so a block accumulates the clamp counts of many rows and adds them to
clamped_count once (the element count, clamped_count[3], is added once from
num_rows or the expert segments).

The arithmetic (silu by a lean division for bf16 input, the clamp, scale factors, rounding) is
kernels_src/fused/swiglu_math.py's, shared with the generic kernel (swiglu_generic.py); FP8 values
are converted two at a time. The kernel waits for the grid before it at entry (programmatic
dependent launch, kernels_src/pdl.py).

MoE options are runtime values: expert
segments from psum_num_tokens_per_expert (rows in the alignment padding between
segments are skipped, left unwritten), per-row weights times
routed_scaling_factor, clamping with counts.
"""

from dataclasses import dataclass

import tilelang.language as T

from kernels_src.fused import swiglu_args
from kernels_src.fused import swiglu_math as m
from kernels_src.fused.swiglu_math import OUT_DTYPES, Arith
from kernels_src.quant.common import row_sf_type
from tkaot._quant.kernels import SWIGLU

DECL = SWIGLU  # the declaration this module builds (tkaot/_quant/kernels.py)
MAX_HIDDEN_FP32 = 18432


@dataclass(frozen=True)
class Tiling:
    # For calls with a clamp_value: the clamp by NaN-propagating min / max (3 instructions, not 6; for clamp_value >= 0),
    # and clamp counts taken only when the caller asks for them (count_clamp)
    clamp: bool


# H200, 8192x4096 -> e4m3/128: 22.8-23.5 µs (TileKernels 27.1-27.9; more rows or vectors a thread, other residencies and
# L2 prefetch were slower). With routing weights and a clamp the clamp tiling takes 25.3-25.8 µs against 30.8-31.2.
TILINGS = {DECL.tilings["default"]: Tiling(clamp=False), DECL.tilings["clamp"]: Tiling(clamp=True)}

MAX_ROW_THREADS = 256
MAX_VECS = 4
VECS = 2  # vectors of each half a thread owns in one row, at least, where hidden allows
RESIDENT_THREADS = 1152  # threads an SM the register cap aims at (one row a block)
# Enough blocks to fill an H200 (132 SMs) at that residency; further rows are strided over
NUM_SMS = 132
MAX_BLOCKS_PER_SM = 32


def check_static(hidden: int, dtype: str, fmt: str, group: int, sf: str) -> None:
    """Refuse axis combinations that name no valid output, or need more registers than a thread has."""
    if dtype == "float32" and hidden > MAX_HIDDEN_FP32:
        raise ValueError(f"hidden={hidden} with float32 input is above {MAX_HIDDEN_FP32}")
    if fmt == "e4m3":
        if group == 0 or sf == "none":
            raise ValueError(f"fmt=e4m3 needs group 32 or 128 and an sf kind, got group={group} sf={sf}")
        if hidden % group:
            raise ValueError(f"hidden={hidden} is not a multiple of group={group}")
    elif group != 0 or sf != "none":
        raise ValueError(f"fmt={fmt} takes group=0 and sf=none, got group={group} sf={sf}")


def row_tiling(hidden: int, dtype: str) -> tuple[int, int, int]:
    """(elements per vector, threads per row, vectors per thread); a block holds one row.

    Whole warps per row, no idle lanes; up to 256 threads a row, or up to 1024
    when that would leave a thread more than MAX_VECS vectors of each half.
    A thread owns at least VECS vectors of each half where the row has enough
    whole warps for that, else as few as possible.
    """
    vec = 16 // (2 if dtype == "bfloat16" else 4)
    num_vecs = hidden // vec  # a multiple of 32, since hidden is a multiple of 256

    def fits(i, max_threads):
        return num_vecs % i == 0 and (num_vecs // i) % 32 == 0 and num_vecs // i <= max_threads

    iters = next((i for i in range(VECS, MAX_VECS + 1) if fits(i, MAX_ROW_THREADS)), 0)
    if not iters:
        for max_threads in (MAX_ROW_THREADS, 1024):
            iters = next(i for i in range(1, num_vecs + 1) if fits(i, max_threads))
            if iters <= MAX_VECS:
                break
    return vec, num_vecs // iters, iters


def build(hidden: int, dtype: str, fmt: str, group: int, sf: str, tiling: str):
    check_static(hidden, dtype, fmt, group, sf)
    vec, row_threads, iters = row_tiling(hidden, dtype)
    rows_per_block, row_iters = 1, 1  # one row a block, loaded before it is computed
    threads = row_threads * rows_per_block
    # At most MAX_BLOCKS_PER_SM resident (small rows), so the grid stays one wave
    min_blocks = max(1, min(RESIDENT_THREADS // threads, MAX_BLOCKS_PER_SM))
    num_warps = threads // 32
    max_blocks = NUM_SMS * min_blocks
    a = Arith(dtype, TILINGS[tiling].clamp)
    lean_div, words = a.lean_div, a.words
    out_dtype = OUT_DTYPES[fmt]
    quantized = fmt == "e4m3"
    # "contig": a thread's vectors are adjacent columns, and the `chunk` of them in one group share one
    # amax, scale factor and store; otherwise vector v of a thread is v * row_threads + lane, one a group
    group_vecs = group // vec if quantized else 1
    contig = quantized and (group_vecs % iters == 0 or iters % group_vecs == 0)
    chunk = min(iters, group_vecs) if contig else 1
    group_lanes = group_vecs // chunk
    num_groups = hidden // group if quantized else 1
    num_words = -(-num_groups // 4)
    packed = sf == "ue8m0"
    lean_sf = quantized and sf == "fp32"

    dims = swiglu_args.forward_dims()
    num_rows, num_experts, x_stride, _, sf_stride, sf_group_stride = dims
    grid = T.min(T.ceildiv(num_rows, rows_per_block), max_blocks)

    # "per_chunk": the gate check and the weight per chunk (the weight read when the row is computed)
    per_chunk = chunk <= 2
    gates_ok = "tkaot_gates_ok2" if chunk == 2 else "tkaot_gates_ok"

    def vector_col(v, lane):
        # The first column of the thread's vector v in its row
        return (lane * iters + v) * vec if contig else (v * row_threads + lane) * vec

    @T.macro
    def swiglu(x, out, out_sf, psum_num_tokens_per_expert, topk_weights, clamped_count, moe, count_clamp):
        with T.Kernel(grid, threads=threads) as block:
            m.forward_entry(min_blocks, x_stride, vec)
            tid = T.get_thread_binding()
            lane = tid % row_threads
            sub = tid // row_threads
            gate = T.alloc_local((row_iters, iters, vec), dtype)
            up = T.alloc_local((row_iters, iters, vec), dtype)
            valid = T.alloc_local((row_iters,), T.int32)
            if words:
                row_of = T.alloc_local((row_iters,), T.int32)
            if lean_sf:
                sf_lean = T.alloc_local((1,), T.float32)
                inv_lean = T.alloc_local((1,), T.float32)
            weight = T.alloc_local((row_iters,), T.float32)
            val = T.alloc_local((chunk * vec,), T.float32)
            res = T.alloc_local((chunk * vec,), out_dtype)
            counts, count_sums, lo, hi, begin, amax, g, u, exact, limit = m.thread_state(a, num_warps, moe.has_clamp, moe.clamp_value)

            # A thread loads all of its row_iters rows of an iteration before computing any (row_iters *
            # iters * 2 loads in flight); rows of one iteration are grid blocks apart, so in the last,
            # partial iteration every block has at most one row more than any other
            for it in T.serial(T.ceildiv(num_rows, rows_per_block * row_iters * grid)):
                for r in T.unroll(row_iters):
                    row = ((it * row_iters + r) * grid + block) * rows_per_block + sub
                    if words:
                        row_of[r] = row
                        row = row_of[r]
                    valid[r] = T.if_then_else(row < num_rows, 1, 0)
                    if moe.has_psum != 0 and valid[r] != 0:
                        m.segment_check(
                            psum_num_tokens_per_expert, row, valid, r, num_experts, moe.search_steps, moe.alignment, lo, hi, begin
                        )
                    if valid[r] != 0:
                        T.assume(row < num_rows)
                        if words:
                            T.assume(row >= 0)
                        if not per_chunk:
                            weight[r] = 1.0
                            if moe.has_weights != 0:
                                weight[r] = topk_weights[row] * moe.routed_scaling_factor
                        for v in T.unroll(iters):
                            col = vector_col(v, lane)
                            for j in T.vectorized(vec):
                                gate[r, v, j] = x[row, col + j]
                            for j in T.vectorized(vec):
                                up[r, v, j] = x[row, hidden + col + j]
                for r in T.unroll(row_iters):
                    row = row_of[r] if words else ((it * row_iters + r) * grid + block) * rows_per_block + sub
                    if valid[r] != 0:
                        T.assume(row < num_rows)
                        if words:
                            T.assume(row >= 0)
                        for c in T.unroll(iters // chunk):
                            if per_chunk and lean_div:
                                # One check for the chunk's gates (1 or 2 vectors)
                                exact = T.call_extern("int32", gates_ok, T.address_of(gate[r, c * chunk, 0]), limit)
                            for k in T.unroll(chunk):
                                v = c * chunk + k
                                if not per_chunk and lean_div:
                                    # 0xC2AF: -87.5, the gate floor; limit: the clamp, so a clamped gate falls back
                                    exact = T.call_extern("int32", "tkaot_gates_ok", T.address_of(gate[r, v, 0]), limit)
                                m.vector_values(a, gate, up, val, r, v, k, g, u, counts, moe.has_clamp, moe.clamp_value, count_clamp)
                                if not per_chunk:
                                    if lean_div and exact == 0:
                                        m.ieee_silu(a, gate, up, val, r, v, k, moe.has_clamp, moe.clamp_value)
                                    # Multiplying by a weight of 1 is exact, so rows without weights skip it
                                    if moe.has_weights != 0:
                                        for j in T.unroll(vec):
                                            val[k * vec + j] = val[k * vec + j] * weight[r]
                            if per_chunk:
                                if lean_div and exact == 0:
                                    for k in T.unroll(chunk):
                                        m.ieee_silu(a, gate, up, val, r, c * chunk + k, k, moe.has_clamp, moe.clamp_value)
                                if moe.has_weights != 0:
                                    # The row's weight read here, off the load path of rows without weights
                                    row_weight = topk_weights[row] * moe.routed_scaling_factor
                                    for j in T.unroll(chunk * vec):
                                        val[j] = val[j] * row_weight
                            col = vector_col(c * chunk, lane)
                            if quantized:
                                m.values_amax(val, chunk * vec, amax)
                                for i in T.unroll(group_lanes.bit_length() - 1):
                                    amax = T.max(amax, T.shfl_xor(amax, 1 << i))
                                stored, inv = m.group_scale(amax, sf, sf_lean if lean_sf else None, inv_lean if lean_sf else None)
                                m.scale_and_round(val, res, inv, chunk * vec, out_dtype)
                                # Every lane of a group stores its (equal) scale factor: no branch
                                gi = col // group
                                if packed:
                                    out_sf[row, gi // 4, gi % 4] = stored
                                    if num_groups % 4 != 0 and gi == num_groups - 1:
                                        for p in T.unroll(num_groups % 4, 4):
                                            out_sf[row, num_words - 1, p] = T.uint8(0)
                                else:
                                    out_sf[row, gi] = stored
                            else:
                                for j in T.unroll(vec):
                                    res[j] = T.cast(val[j], out_dtype)
                            for j in T.vectorized(chunk * vec):
                                out[row, col + j] = res[j]

            if count_clamp != 0:
                m.add_counts(
                    counts, count_sums, clamped_count, psum_num_tokens_per_expert, tid, block, num_warps, moe.has_psum, num_rows,
                    num_experts, moe.alignment, T.int64(hidden),
                )  # fmt: skip

    sf_t = row_sf_type((num_rows,), num_words if packed else num_groups, (sf_stride, sf_group_stride), packed)
    return swiglu_args.forward("swiglu", dims, hidden, dtype, out_dtype, sf_t, swiglu)
