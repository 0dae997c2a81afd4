"""SwiGLU forward, optionally with the per-token FP8 cast fused: out = silu(gate) * up * weight.

x rows are [gate | up], each `hidden` wide. A row is spread over `row_threads`
threads (whole warps); thread `lane` owns 16-byte vectors of gate and the up
vectors of the same columns, so the row is read once with 16-byte loads:
vectors `v * row_threads + lane`, or with "contig" the adjacent vectors
`lane * iters + v`, so a thread's vectors in one group (a "chunk") share one
amax, one scale factor and one store. For an FP8 output the absolute maximum
of each group of `group` outputs is reduced with warp shuffles among the
group's lanes; the scale factor follows kernels_src/quant/common.py.

Blocks stride over rows, so a block accumulates the clamp counts of many rows
and adds them to clamped_count once (the element count, clamped_count[3], is
added once from num_rows or the expert segments). The `tiling` axis picks how
many blocks are resident per SM (the register cap given to the compiler, and
the grid, so every block is resident in one wave), rows a block, how many rows
a thread loads before it computes any, whether the lean instruction sequence is
used and how it is guarded, and how many vectors of one row a thread owns at
least; TILINGS says what each name means.

The lean sequence divides silu's g / (1 + exp(-g)) without the per-element
branch of IEEE division: reciprocal, one Newton step, quotient and one
remainder correction, the instructions CUDA's division runs on its fast path,
so every quotient is the correctly rounded one while operands and results stay
normal and the Newton step lands on the correctly rounded reciprocal. Which
gates may take it is decided per vector or chunk: "full" tests every gate
(lean_exact, proven for every bf16 gate in tests/test_fused_build.py), "bits"
tests the bf16 bit patterns at once (tkaot_gates_ok / tkaot_gates_ok2, checked
for every bf16 gate on the GPU). A vector holding any other gate, and every
fp32 input, takes IEEE division. With "words", bf16 values are widened from
their 32-bit words (kernels_src/fused/bf16.py) and the row index is computed
once a row; with "lean_sf", the "fp32" scale factor and its inverse take the
same lean division (kernels_src/fused/division.py). FP8 values are converted
two at a time.

MoE options are runtime values: expert
segments from psum_num_tokens_per_expert (rows in the alignment padding between
segments are skipped, left unwritten), per-row weights times
routed_scaling_factor, clamping with counts.
"""

from dataclasses import dataclass, replace

import tilelang.language as T

from kernels_src.fused.bf16 import BF16_AT
from kernels_src.fused.division import DIV_NORMAL, lean_e4m3_scale_factor
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant.common import amax_floor, scale_factor, to_e4m3
from tkaot._quant.kernels import SWIGLU

DECL = SWIGLU  # the declaration this module builds (tkaot/_quant/kernels.py)
MAX_HIDDEN_FP32 = 18432


@dataclass(frozen=True)
class Tiling:
    threads_per_sm: int | None  # resident threads per SM the register cap aims at; None: no cap, a grid of THREADS_PER_SM
    rows: int  # rows a thread loads before computing, at most
    lean: bool = False  # branch-free exact division, FP8 conversion two values at a time
    vecs: int = 1  # vectors of each half a thread owns in one row, at least (fewer threads a row), where hidden allows
    check: str = "full"  # when a vector may take the lean division: "full" (lean_exact per gate), "bits" (gates_ok per vector)
    all_lanes_sf: bool = False  # every lane of a group stores its (equal) scale factor: no branch
    words: bool = False  # the row index computed once a row, bf16 gates/ups widened from their 32-bit words
    lean_sf: bool = False  # the "fp32" scale factor by tkaot_div_normal below LEAN_SF_LIMIT (no IEEE branch)
    contig: bool = False  # a thread's vectors are adjacent columns, one amax, sf and store per group ("chunk")
    per_chunk: bool = False  # one gate check and one weight multiply per chunk, the weight read late
    block_rows: int | None = None  # rows a block (else as many as fit 256 threads)
    pdl: bool = False  # launched with programmatic dependent launch (kernels_src/pdl.py)
    gated_counts: bool = False  # clamp counts taken only when the caller asks for them (count_clamp)
    minmax_clamp: bool = False  # the clamp by NaN-propagating min / max (3 instructions, not 6; for clamp_value >= 0)


# H200 tuning (bench/results/tuning): at 8192x4096 -> e4m3/128, base 34.2 µs, lean 31.3, bits 29.8, bits2v5 29.2,
# bits2v5w 26.9 (TileKernels 27.2-27.4 in those runs); runs 12-17 (2026-12-01, TileKernels 27.1-27.9):
# words + lean_sf 24.7, + contig 23.7-24.1, + per_chunk 23.4-23.7, + one row a block at 1152 threads an
# SM (wscc2v9b1) 23.3-23.5. Tried and dropped: more rows a thread (r2, r4), bulk and per-line L2 prefetch
# of the next rows (again on wscc: 25.5), 1024-thread blocks of 4 rows, 4 vectors a thread (contig too:
# 26.5, fewer instructions but less issue), the next row's loads issued before the current row is
# computed in a second register slot (25.7-27.8), 1536-2048 threads an SM (spills), one-row blocks at
# 1280 threads an SM or 3-row blocks (23.6-23.7; run 18). Runs 21-24 (PDL, "g"): wscc2v9b1g 22.8-23.5; with
# routing weights and a clamp (no counts asked) 30.8-31.4 (TileKernels 30.5-30.9), 28.0-28.6 with the clamp
# counts taken only when asked ("k", wscc2v9b1gk; plain 23.4-23.6). Runs 27-29 (session 5): the clamp itself cost
# 3.5 µs in gk (if_then_else: 6 instructions an element pair); by min / max ("m", wscc2v9b1gkm, shipped for calls with
# a clamp) 25.3-25.8 with weights and a clamp, 24.2-24.3 with a clamp alone (TileKernels 30.4-31.0, 28.3-29.0). Tried
# and removed: the routing weight read with the row instead of when it is computed (within 0.3 µs), 8, 10 or 12 x 128
# threads an SM (no faster; 12 spills on the FP8 path).
TILINGS = {
    "base": Tiling(None, 1),
    "lean": Tiling(2048, 1, lean=True),
    "bits2v5w": Tiling(1280, 1, lean=True, vecs=2, check="bits", all_lanes_sf=True),
    "wsc2v5": Tiling(1280, 1, lean=True, vecs=2, check="bits", all_lanes_sf=True, words=True, lean_sf=True, contig=True),
    "wscc2v4": Tiling(1024, 1, lean=True, vecs=2, check="bits", all_lanes_sf=True, words=True, lean_sf=True, contig=True, per_chunk=True),
    "wscc2v9b1": Tiling(
        1152, 1, lean=True, vecs=2, check="bits", all_lanes_sf=True, words=True, lean_sf=True, contig=True, per_chunk=True, block_rows=1
    ),
    "wscc2v9b1g": Tiling(
        1152,
        1,
        lean=True,
        vecs=2,
        check="bits",
        all_lanes_sf=True,
        words=True,
        lean_sf=True,
        contig=True,
        per_chunk=True,
        block_rows=1,
        pdl=True,
    ),
    "wscc2v9b1gk": Tiling(
        1152,
        1,
        lean=True,
        vecs=2,
        check="bits",
        all_lanes_sf=True,
        words=True,
        lean_sf=True,
        contig=True,
        per_chunk=True,
        block_rows=1,
        pdl=True,
        gated_counts=True,
    ),
}
TILINGS["wscc2v9b1gkm"] = replace(TILINGS["wscc2v9b1gk"], minmax_clamp=True)
DEFAULT_TILING = "base"


MAX_ROW_THREADS = 256
MAX_VECS = 4
# Enough blocks to fill an H200 (132 SMs) at full occupancy; further rows are strided over
NUM_SMS = 132
THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32


# tkaot_div_normal (kernels_src/fused/division.py), its zero-sign-exact form tkaot_div_gate, the per-vector
# gate check of the "bits" tilings and tkaot_bf16_at (kernels_src/fused/bf16.py)
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


def lean_exact(g, den):
    """Whether tkaot_div_normal(g, den) is IEEE g / den, for den = 1 + exp(-g) (checked for every bf16 gate).

    g in [2**-60, 3e38] or [-64, -2**-60] keeps operands, reciprocal and quotient normal; a den whose
    mantissa is all ones is the one case where the Newton step may miss the correctly rounded reciprocal.
    """
    mag = T.abs(g)
    in_range = (mag >= T.float32(2.0**-60)) & (g > T.float32(-64.0)) & (g < T.float32(3.0e38))
    return in_range & ((T.reinterpret(den, "uint32") & T.uint32(0x7FFFFF)) != T.uint32(0x7FFFFF))


# The "bits" check admits a vector when every gate is a bf16 value above -87.5 (bit pattern 0xC2AF;
# below it 1 + exp(-g) nears 2**126 and rcp.approx.ftz flushes the reciprocal) and at most `limit`:
# FLT_MAX (so not +inf or NaN), or the clamp value, so a clamped gate, which need not be a bf16 value,
# takes IEEE division. tests/gpu/test_fused_gpu.py checks tkaot_div_gate against IEEE division for
# every bf16 gate on the GPU (the hardware's expf and rcp.approx decide it).
FLT_MAX = 3.4028234663852886e38


_OUT_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "e4m3": "float8_e4m3"}


def check_static(hidden: int, dtype: str, fmt: str, group: int, sf: str, tiling: str = DEFAULT_TILING) -> None:
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


def row_tiling(hidden: int, dtype: str, vecs: int = 1, block_rows: int | None = None) -> tuple[int, int, int, int]:
    """(elements per vector, threads per row, vectors per thread, rows per block).

    Whole warps per row, no idle lanes; up to 256 threads a row, or up to 1024
    when that would leave a thread more than MAX_VECS vectors of each half.
    A thread owns at least `vecs` vectors of each half where the row has enough
    whole warps for that, else as many as with vecs = 1. A block holds `block_rows`
    rows, or as many as fit MAX_ROW_THREADS threads.
    """
    vec = 16 // (2 if dtype == "bfloat16" else 4)
    num_vecs = hidden // vec  # a multiple of 32, since hidden is a multiple of 256

    def fits(i, max_threads):
        return num_vecs % i == 0 and (num_vecs // i) % 32 == 0 and num_vecs // i <= max_threads

    iters = next((i for i in range(vecs, MAX_VECS + 1) if fits(i, MAX_ROW_THREADS)), 0) if vecs > 1 else 0
    if not iters:
        for max_threads in (MAX_ROW_THREADS, 1024):
            iters = next(i for i in range(1, num_vecs + 1) if fits(i, max_threads))
            if iters <= MAX_VECS:
                break
    row_threads = num_vecs // iters
    return vec, row_threads, iters, block_rows or max(1, MAX_ROW_THREADS // row_threads)


def residency(hidden: int, dtype: str, name: str) -> tuple[int | None, int]:
    """(blocks per SM the compiler must fit, or None; rows each thread loads before computing)."""
    _, row_threads, iters, rows_per_block = row_tiling(hidden, dtype, TILINGS[name].vecs, TILINGS[name].block_rows)
    target, rows = TILINGS[name].threads_per_sm, TILINGS[name].rows
    threads = row_threads * rows_per_block
    # More rows per thread only while a thread holds at most MAX_VECS vectors of each half
    rows = max(1, min(rows, MAX_VECS // iters))
    # At most MAX_BLOCKS_PER_SM resident (small rows in one-row blocks), so the grid stays one wave
    return (None if target is None else max(1, min(target // threads, MAX_BLOCKS_PER_SM))), rows


def build(hidden: int, dtype: str, fmt: str, group: int, sf: str, tiling: str = DEFAULT_TILING):
    check_static(hidden, dtype, fmt, group, sf)
    min_blocks, row_iters = residency(hidden, dtype, tiling)
    vec, row_threads, iters, rows_per_block = row_tiling(hidden, dtype, TILINGS[tiling].vecs, TILINGS[tiling].block_rows)
    threads = row_threads * rows_per_block
    num_warps = threads // 32
    max_blocks = NUM_SMS * (min_blocks or THREADS_PER_SM // threads)
    lean = TILINGS[tiling].lean
    gated_counts = TILINGS[tiling].gated_counts
    lean_div = lean and dtype == "bfloat16"  # lean_exact is checked for every bf16 gate, not for fp32 ones
    check = TILINGS[tiling].check if lean_div else "none"
    checked = check != "none"
    divide = "tkaot_div_gate" if check == "bits" else "tkaot_div_normal"
    out_dtype = _OUT_DTYPES[fmt]
    quantized = fmt == "e4m3"
    # "contig": a thread's vectors are adjacent columns, and the `chunk` of them in one group share one
    # amax, scale factor and store; otherwise vector v of a thread is v * row_threads + lane, one a group
    group_vecs = group // vec if quantized else 1
    contig = TILINGS[tiling].contig and quantized and (group_vecs % iters == 0 or iters % group_vecs == 0)
    chunk = min(iters, group_vecs) if contig else 1
    group_lanes = group_vecs // chunk
    num_groups = hidden // group if quantized else 1
    num_words = -(-num_groups // 4)
    packed = sf == "ue8m0"
    words = TILINGS[tiling].words and dtype == "bfloat16"
    lean_sf = TILINGS[tiling].lean_sf and quantized and sf == "fp32"

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
    per_chunk = TILINGS[tiling].per_chunk and chunk <= 2
    minmax_clamp = TILINGS[tiling].minmax_clamp and lean
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
            if min_blocks is not None:
                T.annotate_min_blocks_per_sm(min_blocks)
            pdl = TILINGS[tiling].pdl
            if lean or pdl:
                T.import_source((_DEVICE_HELPERS if lean else "") + (PDL_SOURCE if pdl else ""))
            if pdl:
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
            if checked:
                exact = T.alloc_var(T.int32)
            for k in T.unroll(3):
                counts[k] = 0
            if check == "bits":
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
                            if per_chunk and checked:
                                # One check for the chunk's gates (1 or 2 vectors)
                                if check == "bits":
                                    exact = T.call_extern("int32", gates_ok, T.address_of(gate[r, c * chunk, 0]), limit)
                                else:
                                    exact = 1
                            for k in T.unroll(chunk):
                                v = c * chunk + k
                                if not per_chunk:
                                    if check == "bits":
                                        # 0xC2AF: -87.5, the gate floor; limit: the clamp, so a clamped gate falls back
                                        exact = T.call_extern("int32", "tkaot_gates_ok", T.address_of(gate[r, v, 0]), limit)
                                    elif checked:
                                        exact = 1
                                for j in T.unroll(vec):
                                    if words:
                                        g = T.call_extern("float32", "tkaot_bf16_at", T.address_of(gate[r, v, 0]), j)
                                        u = T.call_extern("float32", "tkaot_bf16_at", T.address_of(up[r, v, 0]), j)
                                    else:
                                        g = T.cast(gate[r, v, j], T.float32)
                                        u = T.cast(up[r, v, j], T.float32)
                                    if has_clamp != 0:
                                        if gated_counts:
                                            if count_clamp != 0:
                                                add_clamp_counts(counts, g, u, clamp_value)
                                        else:
                                            add_clamp_counts(counts, g, u, clamp_value)
                                        if minmax_clamp:
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
                                        val[k * vec + j] = T.call_extern("float32", divide, g, den) * u
                                        if check == "full":
                                            exact = exact & T.if_then_else(lean_exact(g, den), 1, 0)
                                    else:
                                        val[k * vec + j] = g / (T.float32(1.0) + T.exp(-g)) * u
                                if not per_chunk:
                                    if checked and exact == 0:
                                        ieee_silu(gate, up, val, r, v, k, has_clamp, clamp_value)
                                    # Multiplying by a weight of 1 is exact, so rows without weights skip it
                                    if has_weights != 0:
                                        for j in T.unroll(vec):
                                            val[k * vec + j] = val[k * vec + j] * weight[r]
                            if per_chunk:
                                if checked and exact == 0:
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
                                if lean:
                                    # Vectorized, the cast becomes one cvt per two values (same rounding, satfinite)
                                    for j in T.vectorized(chunk * vec):
                                        val[j] = val[j] * inv
                                    for j in T.vectorized(chunk * vec):
                                        res[j] = T.cast(val[j], out_dtype)
                                else:
                                    for j in T.unroll(chunk * vec):
                                        res[j] = to_e4m3(val[j] * inv)
                                if TILINGS[tiling].all_lanes_sf or lane % group_lanes == 0:
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
