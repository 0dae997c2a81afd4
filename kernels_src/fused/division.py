"""CUDA source shared by the fused kernels: the fast path of IEEE fp32 division.

tkaot_div_normal(a, b): reciprocal estimate, one Newton step, quotient and one remainder correction,
the instructions CUDA's division runs on its fast path; correctly rounded while no operand or
intermediate leaves the normal range (where it is used, tests/test_fused_build.py checks the
operands it admits). Kernels prepend it to their own helpers for T.import_source.
"""

DIV_NORMAL = """
__device__ __forceinline__ float tkaot_div_normal(float a, float b) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    r = __fmaf_rn(r, __fmaf_rn(-b, r, 1.0f), r);
    float q = __fmul_rn(a, r);
    return __fmaf_rn(__fmaf_rn(-b, q, a), r, q);
}
"""
