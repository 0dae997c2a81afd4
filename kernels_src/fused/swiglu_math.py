"""SwiGLU forward's arithmetic, one copy for the specialised kernel (swiglu.py) and the generic one (swiglu_generic.py),
with the entry and per-thread state both kernels share (forward_entry, thread_state).

Everything that decides an output's bits lives here: a vector's values (the bf16 widening, the clamp in either
tiling's form, the clamp counts, silu by the lean division or IEEE division), a group's amax and scale factor, the
scaling and rounding to the output format, the expert-segment test of a row and the clamp counts' final sums.
The two kernels differ only in which thread holds which vectors, which changes no value (a group's amax is a
maximum, and each quotient is correctly rounded by either division), so both write the same bytes.

For bf16 input, silu's g / (1 + exp(-g)) is divided without the per-element branch of IEEE division:
reciprocal, one Newton step, quotient and one remainder correction, the instructions CUDA's division runs on its
fast path, so every quotient is the correctly rounded one while operands and results stay normal and the Newton
step lands on the correctly rounded reciprocal. A vector takes it when its bf16 gate bit patterns pass
tkaot_gates_ok / tkaot_gates_ok2 (checked for every bf16 gate on the GPU); a vector holding any other gate, and
every fp32 input, takes IEEE division. bf16 values are widened from their 32-bit words (kernels_src/fused/bf16.py),
the "fp32" scale factor and its inverse take the same lean division (kernels_src/fused/division.py).
"""

from dataclasses import dataclass

import tilelang.language as T

from kernels_src.fused.bf16 import BF16_AT
from kernels_src.fused.division import DIV_NORMAL, lean_e4m3_scale_factor
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant.common import amax_floor, scale_factor

OUT_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "e4m3": "float8_e4m3"}

# tkaot_div_normal (kernels_src/fused/division.py), its zero-sign-exact form tkaot_div_gate, the clamp by
# min / max, the per-vector gate check and tkaot_bf16_at (kernels_src/fused/bf16.py)
DEVICE_HELPERS = (
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


@dataclass(frozen=True)
class Arith:
    """How a kernel computes values: from its input dtype and whether its tiling clamps by min / max."""

    dtype: str
    clamp_tiling: bool  # clamp by NaN-propagating min / max (for clamp_value >= 0), count only when asked

    @property
    def vec(self) -> int:
        """Elements of a 16-byte vector of the input."""
        return 16 // (2 if self.dtype == "bfloat16" else 4)

    @property
    def lean_div(self) -> bool:
        """The gate check reads bf16 bit patterns; fp32 gates take IEEE division."""
        return self.dtype == "bfloat16"

    @property
    def words(self) -> bool:
        """bf16 values are widened from their 32-bit words."""
        return self.dtype == "bfloat16"


@T.macro
def forward_entry(min_blocks: int, x_stride, vec: int):
    """Either forward kernel's entry: its launch bound, the device helpers, the wait for the grid before it
    (programmatic dependent launch) and x's rows aligned to whole 16-byte vectors."""
    T.annotate_min_blocks_per_sm(min_blocks)
    T.import_source(DEVICE_HELPERS + PDL_SOURCE)
    pdl_entry()
    T.assume(x_stride % vec == 0)


def thread_state(a: Arith, num_warps: int, has_clamp, clamp_value):
    """The state a thread of either forward kernel keeps: its clamp counts (zeroed) and their warp sums' shared tile,
    the expert search's lo, hi and begin, the group amax, a gate and up value, and for the lean division the gate
    check's verdict and bound (FLT_MAX, or the clamp). A plain function, not a macro: a macro would hand back the
    variables' values, not the variables."""
    counts = T.alloc_local((3,), T.int32)
    count_sums = T.alloc_shared((3, num_warps), T.int32)
    lo = T.alloc_var(T.int32)
    hi = T.alloc_var(T.int32)
    begin = T.alloc_var(T.int32)
    amax = T.alloc_var(T.float32)
    g = T.alloc_var(T.float32)
    u = T.alloc_var(T.float32)
    exact = T.alloc_var(T.int32) if a.lean_div else None
    zero_counts(counts)
    limit = None
    if a.lean_div:
        limit = T.alloc_var(T.float32, init=T.float32(FLT_MAX))
        clamp_limit(limit, has_clamp, clamp_value)
    return counts, count_sums, lo, hi, begin, amax, g, u, exact, limit


@T.macro
def zero_counts(counts):
    for k in T.unroll(3):
        counts[k] = 0


@T.macro
def clamp_limit(limit, has_clamp, clamp_value):
    # limit: a variable (passed as itself, from thread_state)
    if has_clamp != 0:
        limit = T.min(clamp_value, T.float32(FLT_MAX))  # noqa: F841 (the variable is written)


@T.macro
def add_clamp_counts(counts, g, u, clamp_value):
    # Gate elements above the clamp, up elements above it and below its negative
    counts[0] += T.if_then_else(g > clamp_value, 1, 0)
    counts[1] += T.if_then_else(u > clamp_value, 1, 0)
    counts[2] += T.if_then_else(u < -clamp_value, 1, 0)


@T.macro
def vector_values(a: Arith, gate, up, val, r, v, k, g: T.Ref, u: T.Ref, counts, has_clamp, clamp_value, count_clamp):
    """silu(gate) * up of vector v of row slot r into val[k * vec:], clamped (and counted) first when has_clamp;
    for bf16 input by the lean division (a vector the gate check refuses is recomputed by ieee_silu)."""
    for j in T.unroll(a.vec):
        if a.words:
            g = T.call_extern("float32", "tkaot_bf16_at", T.address_of(gate[r, v, 0]), j)
            u = T.call_extern("float32", "tkaot_bf16_at", T.address_of(up[r, v, 0]), j)
        else:
            g = T.cast(gate[r, v, j], T.float32)
            u = T.cast(up[r, v, j], T.float32)
        if has_clamp != 0:
            if a.clamp_tiling:
                if count_clamp != 0:
                    add_clamp_counts(counts, g, u, clamp_value)
            else:
                add_clamp_counts(counts, g, u, clamp_value)
            if a.clamp_tiling:
                g = T.call_extern("float32", "tkaot_min_nan", g, clamp_value)
                u = T.call_extern("float32", "tkaot_min_nan", u, clamp_value)
                u = T.call_extern("float32", "tkaot_max_nan", u, -clamp_value)
            else:
                g = T.if_then_else(g > clamp_value, clamp_value, g)
                u = T.if_then_else(u > clamp_value, clamp_value, T.if_then_else(u < -clamp_value, -clamp_value, u))
        if a.lean_div:
            den = T.float32(1.0) + T.exp(-g)
            val[k * a.vec + j] = T.call_extern("float32", "tkaot_div_gate", g, den) * u
        else:
            val[k * a.vec + j] = g / (T.float32(1.0) + T.exp(-g)) * u


@T.macro
def ieee_silu(a: Arith, gate, up, val, r, v, k, has_clamp, clamp_value):
    # Vector v of row slot r recomputed with IEEE division into val[k * vec:] (values only: the clamp
    # counts are taken)
    for j in T.unroll(a.vec):
        g = T.cast(gate[r, v, j], T.float32)
        u = T.cast(up[r, v, j], T.float32)
        clamped_u = T.if_then_else(u > clamp_value, clamp_value, T.if_then_else(u < -clamp_value, -clamp_value, u))
        g = T.if_then_else(has_clamp != 0 and g > clamp_value, clamp_value, g)
        u = T.if_then_else(has_clamp != 0, clamped_u, u)
        val[k * a.vec + j] = g / (T.float32(1.0) + T.exp(-g)) * u


@T.macro
def values_amax(val, count: int, amax: T.Ref):
    """The largest magnitude of val[:count] (NaNs ignored, as fmaxf does)."""
    amax = T.abs(val[0])
    for j in T.unroll(1, count):
        amax = T.max(amax, T.abs(val[j]))


def group_scale(amax, sf: str, sf_lean, inv_lean):
    """(stored sf, inverse) of a group whose amax is `amax` (reduced over the group): the "fp32" sf by the lean
    division into sf_lean[0], inv_lean[0] (local buffers of one fp32), the others by kernels_src/quant/common.py."""
    if sf == "fp32":
        # The "fp32" scale factor without IEEE division's range check and branch
        lean_e4m3_scale_factor(T.max(amax, T.float32(amax_floor("e4m3", sf))), sf_lean, inv_lean)
        return sf_lean[0], inv_lean[0]
    return scale_factor(amax, "e4m3", sf)


@T.macro
def scale_and_round(val, res, inv, count: int, out_dtype: str):
    # Vectorized, the cast becomes one cvt per two values (same rounding, satfinite)
    for j in T.vectorized(count):
        val[j] = val[j] * inv
    for j in T.vectorized(count):
        res[j] = T.cast(val[j], out_dtype)


@T.macro
def expert_search(psum_num_tokens_per_expert, row, num_experts, search_steps, lo: T.Ref, hi: T.Ref):
    """lo = how many psum entries are <= row (the row's expert: the first e with psum[e] > row), by bisection in
    search_steps rounds (the op passes num_experts.bit_length())."""
    lo = 0
    hi = num_experts
    for _ in T.serial(search_steps):
        if lo < hi:
            if psum_num_tokens_per_expert[(lo + hi) // 2] <= row:
                lo = (lo + hi) // 2 + 1
            else:
                hi = (lo + hi) // 2


@T.macro
def segment_check(psum_num_tokens_per_expert, row, valid, r, num_experts, search_steps, alignment, lo: T.Ref, hi: T.Ref, begin: T.Ref):
    # The row's expert (expert_search); valid past the aligned end of e - 1
    expert_search(psum_num_tokens_per_expert, row, num_experts, search_steps, lo, hi)
    begin = 0
    if lo > 0 and lo < num_experts:
        begin = T.ceildiv(psum_num_tokens_per_expert[lo - 1], alignment) * alignment
    valid[r] = T.if_then_else(lo < num_experts and row >= begin, 1, 0)


@T.macro
def add_counts(counts, count_sums, clamped_count, psum_num_tokens_per_expert, tid, block, num_warps: int, has_psum, num_rows,
               num_experts, alignment, row_elems):  # fmt: skip
    # Clamp counts: warp sums, then block sums, one atomic add each; the element count
    # (clamped_count[3]) is the computed rows times hidden (row_elems, int64), added once by block 0
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
            # The rows of expert e: [align(psum[e - 1]), min(psum[e], num_rows)), as segment_check admits them
            computed = T.int64(0)
            seg_begin = T.alloc_var(T.int32, init=0)
            for e in T.serial(num_experts):
                seg_end = T.min(psum_num_tokens_per_expert[e], num_rows)
                computed += T.cast(T.max(seg_end - seg_begin, 0), T.int64)
                seg_begin = T.ceildiv(psum_num_tokens_per_expert[e], alignment) * alignment
        T.atomic_add(clamped_count[3], computed * row_elems)
