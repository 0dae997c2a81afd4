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

For bf16 input, silu's g / (1 + exp(-g)) is divided without the per-element
branch of IEEE division: reciprocal, one Newton step, quotient and one
remainder correction, the instructions CUDA's division runs on its fast path,
so every quotient is the correctly rounded one while operands and results stay
normal and the Newton step lands on the correctly rounded reciprocal. A chunk
takes it when its bf16 gate bit patterns pass tkaot_gates_ok / tkaot_gates_ok2
(checked for every bf16 gate on the GPU); a chunk holding any other gate, and
every fp32 input, takes IEEE division. bf16 values are widened from their
32-bit words (kernels_src/fused/bf16.py), the "fp32" scale factor and its
inverse take the same lean division (kernels_src/fused/division.py), and FP8
values are converted two at a time. The kernel waits for the grid before it at
entry (programmatic dependent launch, kernels_src/pdl.py).

MoE options are runtime values: expert
segments from psum_num_tokens_per_expert (rows in the alignment padding between
segments are skipped, left unwritten), per-row weights times
routed_scaling_factor, clamping with counts.
"""

from dataclasses import dataclass

import tilelang.language as T

from kernels_src.fused.bf16 import BF16_AT
from kernels_src.fused.division import DIV_NORMAL, lean_e4m3_scale_factor
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant.common import amax_floor, scale_factor
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


# tkaot_div_normal (kernels_src/fused/division.py), its zero-sign-exact form tkaot_div_gate, the clamp by
# min / max, the per-vector gate check and tkaot_bf16_at (kernels_src/fused/bf16.py)
_DEVICE_HELPERS = (
    DIV_NORMAL
    + """__device__ __forceinline__ float tkaot_min_nan(float a, float b) {
    float r;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float tkaot_max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float tkaot_div_gate(float a, float b) {
    // tkaot_div_normal with the remainder taken as b * q - a: the same quotient wherever it is not
    // zero, and a zero quotient keeps the sign of a (-0 / 2 is -0)
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    r = __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
    float q = __fmul_rn(a, r);
    return __fmaf_rn(-__fmaf_rn(b, q, -a), r, q);
}
__device__ __forceinline__ int tkaot_gates_verdict(unsigned u, unsigned s, float limit) {
    // u, s: the pairwise unsigned and signed 16-bit maxima of a vector's gate words; the largest
    // unsigned pattern is the most negative gate (or -inf, -NaN), the largest signed one the largest gate
    unsigned most_negative = max(u & 0xFFFFu, u >> 16);
    int largest = max((int)(short)(s & 0xFFFFu), ((int)s) >> 16);
    return most_negative < 0xC2AFu && __int_as_float(largest << 16) <= limit;
}
__device__ __forceinline__ void tkaot_max16x2(unsigned& u, unsigned& s, unsigned a, unsigned b) {
    asm("max.u16x2 %0, %1, %2;" : "=r"(u) : "r"(a), "r"(b));
    asm("max.s16x2 %0, %1, %2;" : "=r"(s) : "r"(a), "r"(b));
}
__device__ __forceinline__ void tkaot_max16x2_acc(unsigned& u, unsigned& s, unsigned u1, unsigned s1) {
    asm("max.u16x2 %0, %1, %2;" : "=r"(u) : "r"(u), "r"(u1));
    asm("max.s16x2 %0, %1, %2;" : "=r"(s) : "r"(s), "r"(s1));
}
__device__ __forceinline__ int tkaot_gates_ok(const void* gate, float limit) {
    // Eight bf16 gates, as four pairs of 16-bit patterns
    const unsigned* w = reinterpret_cast<const unsigned*>(gate);
    unsigned u, s, u23, s23;
    tkaot_max16x2(u, s, w[0], w[1]);
    tkaot_max16x2(u23, s23, w[2], w[3]);
    tkaot_max16x2_acc(u, s, u23, s23);
    return tkaot_gates_verdict(u, s, limit);
}
__device__ __forceinline__ int tkaot_gates_ok2(const void* gate, float limit) {
    // Sixteen bf16 gates (two adjacent vectors) at once
    const unsigned* w = reinterpret_cast<const unsigned*>(gate);
    unsigned u, s, u1, s1, u2, s2, u3, s3;
    tkaot_max16x2(u, s, w[0], w[1]);
    tkaot_max16x2(u1, s1, w[2], w[3]);
    tkaot_max16x2(u2, s2, w[4], w[5]);
    tkaot_max16x2(u3, s3, w[6], w[7]);
    tkaot_max16x2_acc(u, s, u1, s1);
    tkaot_max16x2_acc(u2, s2, u3, s3);
    tkaot_max16x2_acc(u, s, u2, s2);
    return tkaot_gates_verdict(u, s, limit);
}
"""
    + BF16_AT
)


# The gate check admits a vector when every gate is a bf16 value above -87.5 (bit pattern 0xC2AF;
# below it 1 + exp(-g) nears 2**126 and rcp.approx.ftz flushes the reciprocal) and at most `limit`:
# FLT_MAX (so not +inf or NaN), or the clamp value, so a clamped gate, which need not be a bf16 value,
# takes IEEE division. tests/gpu/test_fused_gpu.py checks tkaot_div_gate against IEEE division for
# every bf16 gate on the GPU (the hardware's expf and rcp.approx decide it).
FLT_MAX = 3.4028234663852886e38


_OUT_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "e4m3": "float8_e4m3"}


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
    clamp_tiling = TILINGS[tiling].clamp
    lean_div = dtype == "bfloat16"  # the gate check reads bf16 bit patterns; fp32 gates take IEEE division
    out_dtype = _OUT_DTYPES[fmt]
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
    words = dtype == "bfloat16"
    lean_sf = quantized and sf == "fp32"

    num_rows = T.dynamic("num_rows")
    num_experts = T.dynamic("num_experts")
    x_stride = T.dynamic("x_stride")
    weights_stride = T.dynamic("topk_weights_stride")
    sf_stride, sf_group_stride = T.dynamic("sf_stride"), T.dynamic("sf_group_stride")
    if packed:
        sf_shape, sf_strides, sf_dtype = (num_rows, num_words, 4), (sf_stride, sf_group_stride, 1), "uint8"
    else:
        sf_shape, sf_strides, sf_dtype = (num_rows, num_groups), (sf_stride, sf_group_stride), "float32"
    grid = T.min(T.ceildiv(num_rows, rows_per_block), max_blocks)

    # "per_chunk": the gate check and the weight per chunk (the weight read when the row is computed)
    per_chunk = chunk <= 2
    gates_ok = "tkaot_gates_ok2" if chunk == 2 else "tkaot_gates_ok"

    @T.macro
    def add_clamp_counts(counts, g, u, clamp_value):
        # Gate elements above the clamp, up elements above it and below its negative
        counts[0] += T.if_then_else(g > clamp_value, 1, 0)
        counts[1] += T.if_then_else(u > clamp_value, 1, 0)
        counts[2] += T.if_then_else(u < -clamp_value, 1, 0)

    @T.macro
    def ieee_silu(gate, up, val, r, v, k, has_clamp, clamp_value):
        # Vector v of row slot r recomputed with IEEE division into val[k * vec:] (values only: the clamp
        # counts are taken)
        for j in T.unroll(vec):
            g = T.cast(gate[r, v, j], T.float32)
            u = T.cast(up[r, v, j], T.float32)
            clamped_u = T.if_then_else(u > clamp_value, clamp_value, T.if_then_else(u < -clamp_value, -clamp_value, u))
            g = T.if_then_else(has_clamp != 0 and g > clamp_value, clamp_value, g)
            u = T.if_then_else(has_clamp != 0, clamped_u, u)
            val[k * vec + j] = g / (T.float32(1.0) + T.exp(-g)) * u

    def vector_col(v, lane):
        # The first column of the thread's vector v in its row
        return (lane * iters + v) * vec if contig else (v * row_threads + lane) * vec

    @T.prim_func
    def swiglu(
        x: T.StridedTensor[(num_rows, 2 * hidden), (x_stride, 1), dtype],
        out: T.Tensor[(num_rows, hidden), out_dtype],
        out_sf: T.StridedTensor[sf_shape, sf_strides, sf_dtype],
        psum_num_tokens_per_expert: T.Tensor[(num_experts,), T.int32],
        topk_weights: T.StridedTensor[(num_rows,), (weights_stride,), T.float32],
        clamped_count: T.Tensor[(4,), T.int64],
        has_psum: T.int32,
        alignment: T.int32,
        search_steps: T.int32,
        has_weights: T.int32,
        routed_scaling_factor: T.float32,
        has_clamp: T.int32,
        clamp_value: T.float32,
        count_clamp: T.int32,
    ):
        with T.Kernel(grid, threads=threads) as block:
            T.annotate_min_blocks_per_sm(min_blocks)
            T.import_source(_DEVICE_HELPERS + PDL_SOURCE)
            pdl_entry()
            T.assume(x_stride % vec == 0)
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
            counts = T.alloc_local((3,), T.int32)
            count_sums = T.alloc_shared((3, num_warps), T.int32)
            lo = T.alloc_var(T.int32)
            hi = T.alloc_var(T.int32)
            begin = T.alloc_var(T.int32)
            amax = T.alloc_var(T.float32)
            g = T.alloc_var(T.float32)
            u = T.alloc_var(T.float32)
            if lean_div:
                exact = T.alloc_var(T.int32)
            for k in T.unroll(3):
                counts[k] = 0
            if lean_div:
                limit = T.alloc_var(T.float32, init=T.float32(FLT_MAX))
                if has_clamp != 0:
                    limit = T.min(clamp_value, T.float32(FLT_MAX))

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
                    if has_psum != 0 and valid[r] != 0:
                        # The row's expert: the first e with psum[e] > row; valid past the aligned end of e - 1
                        lo = 0
                        hi = num_experts
                        for _ in T.serial(search_steps):
                            if lo < hi:
                                if psum_num_tokens_per_expert[(lo + hi) // 2] <= row:
                                    lo = (lo + hi) // 2 + 1
                                else:
                                    hi = (lo + hi) // 2
                        begin = 0
                        if lo > 0 and lo < num_experts:
                            begin = T.ceildiv(psum_num_tokens_per_expert[lo - 1], alignment) * alignment
                        valid[r] = T.if_then_else(lo < num_experts and row >= begin, 1, 0)
                    if valid[r] != 0:
                        T.assume(row < num_rows)
                        if words:
                            T.assume(row >= 0)
                        if not per_chunk:
                            weight[r] = 1.0
                            if has_weights != 0:
                                weight[r] = topk_weights[row] * routed_scaling_factor
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
                                for j in T.unroll(vec):
                                    if words:
                                        g = T.call_extern("float32", "tkaot_bf16_at", T.address_of(gate[r, v, 0]), j)
                                        u = T.call_extern("float32", "tkaot_bf16_at", T.address_of(up[r, v, 0]), j)
                                    else:
                                        g = T.cast(gate[r, v, j], T.float32)
                                        u = T.cast(up[r, v, j], T.float32)
                                    if has_clamp != 0:
                                        if clamp_tiling:
                                            if count_clamp != 0:
                                                add_clamp_counts(counts, g, u, clamp_value)
                                        else:
                                            add_clamp_counts(counts, g, u, clamp_value)
                                        if clamp_tiling:
                                            g = T.call_extern("float32", "tkaot_min_nan", g, clamp_value)
                                            u = T.call_extern("float32", "tkaot_min_nan", u, clamp_value)
                                            u = T.call_extern("float32", "tkaot_max_nan", u, -clamp_value)
                                        else:
                                            g = T.if_then_else(g > clamp_value, clamp_value, g)
                                            u = T.if_then_else(
                                                u > clamp_value, clamp_value, T.if_then_else(u < -clamp_value, -clamp_value, u)
                                            )
                                    if lean_div:
                                        den = T.float32(1.0) + T.exp(-g)
                                        val[k * vec + j] = T.call_extern("float32", "tkaot_div_gate", g, den) * u
                                    else:
                                        val[k * vec + j] = g / (T.float32(1.0) + T.exp(-g)) * u
                                if not per_chunk:
                                    if lean_div and exact == 0:
                                        ieee_silu(gate, up, val, r, v, k, has_clamp, clamp_value)
                                    # Multiplying by a weight of 1 is exact, so rows without weights skip it
                                    if has_weights != 0:
                                        for j in T.unroll(vec):
                                            val[k * vec + j] = val[k * vec + j] * weight[r]
                            if per_chunk:
                                if lean_div and exact == 0:
                                    for k in T.unroll(chunk):
                                        ieee_silu(gate, up, val, r, c * chunk + k, k, has_clamp, clamp_value)
                                if has_weights != 0:
                                    # The row's weight read here, off the load path of rows without weights
                                    row_weight = topk_weights[row] * routed_scaling_factor
                                    for j in T.unroll(chunk * vec):
                                        val[j] = val[j] * row_weight
                            col = vector_col(c * chunk, lane)
                            if quantized:
                                amax = T.abs(val[0])
                                for j in T.unroll(1, chunk * vec):
                                    amax = T.max(amax, T.abs(val[j]))
                                for i in T.unroll(group_lanes.bit_length() - 1):
                                    amax = T.max(amax, T.shfl_xor(amax, 1 << i))
                                if lean_sf:
                                    # The "fp32" scale factor without IEEE division's range check and branch
                                    lean_e4m3_scale_factor(T.max(amax, T.float32(amax_floor("e4m3", sf))), sf_lean, inv_lean)
                                    stored, inv = sf_lean[0], inv_lean[0]
                                else:
                                    stored, inv = scale_factor(amax, "e4m3", sf)
                                # Vectorized, the cast becomes one cvt per two values (same rounding, satfinite)
                                for j in T.vectorized(chunk * vec):
                                    val[j] = val[j] * inv
                                for j in T.vectorized(chunk * vec):
                                    res[j] = T.cast(val[j], out_dtype)
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
                # Clamp counts: warp sums, then block sums, one atomic add each; the element count
                # (clamped_count[3]) is the computed rows times hidden, added once by block 0
                for k in T.unroll(3):
                    for r in T.unroll(5):
                        counts[k] += T.shfl_xor(counts[k], 1 << r)
                if tid % 32 == 0:
                    for k in T.unroll(3):
                        count_sums[k, tid // 32] = counts[k]
                T.sync_threads()
                if tid < 3:
                    total = T.alloc_var(T.int32, init=0)
                    for w in T.unroll(num_warps):
                        total += count_sums[tid, w]
                    T.atomic_add(clamped_count[tid], T.cast(total, T.int64))
                if tid == 3 and block == 0:
                    computed = T.alloc_var(T.int64, init=T.cast(num_rows, T.int64))
                    if has_psum != 0:
                        # The rows of expert e: [align(psum[e - 1]), min(psum[e], num_rows)), as load_row admits them
                        computed = T.int64(0)
                        seg_begin = T.alloc_var(T.int32, init=0)
                        for e in T.serial(num_experts):
                            seg_end = T.min(psum_num_tokens_per_expert[e], num_rows)
                            computed += T.cast(T.max(seg_end - seg_begin, 0), T.int64)
                            seg_begin = T.ceildiv(psum_num_tokens_per_expert[e], alignment) * alignment
                    T.atomic_add(clamped_count[3], computed * T.int64(hidden))

    return swiglu
