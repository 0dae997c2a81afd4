"""CUDA source shared by the fused kernels: the fast path of IEEE fp32 division.

tkaot_div_normal(a, b): reciprocal estimate, one Newton step, quotient and one remainder correction,
the instructions CUDA's division runs on its fast path; correctly rounded while no operand or
intermediate leaves the normal range (where it is used, tests/test_fused_build.py checks the
operands it admits). Kernels prepend it to their own helpers for T.import_source.
"""

import tilelang.language as T

# Below this clamped amax, amax / 448 and 448 / amax by tkaot_div_normal are IEEE quotients for every fp32
# amax (checked for every fp32 mantissa in tests/test_fused_build.py); larger ones take IEEE division.
LEAN_SF_LIMIT = 2.0**125


@T.macro
def lean_e4m3_scale_factor(clamped, sf_out, inv_out):
    """The "fp32" E4M3 scale factor clamped / 448 and its inverse into sf_out[0], inv_out[0], without
    IEEE division's range check and branch below LEAN_SF_LIMIT (clamped: the amax at its floor)."""
    if clamped < T.float32(LEAN_SF_LIMIT):
        sf_out[0] = T.call_extern("float32", "tkaot_div_normal", clamped, T.float32(448.0))
        inv_out[0] = T.call_extern("float32", "tkaot_div_normal", T.float32(448.0), clamped)
    else:
        sf_out[0] = clamped / T.float32(448.0)
        inv_out[0] = T.float32(448.0) / clamped


DIV_NORMAL = """
__device__ __forceinline__ float tkaot_div_normal(float a, float b) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    r = __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
    float q = __fmul_rn(a, r);
    return __fmaf_rn(__fmaf_rn(-b, q, a), r, q);
}
"""
