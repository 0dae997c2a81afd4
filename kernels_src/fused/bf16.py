"""CUDA source shared by the fused kernels: widening one bf16 value of a register vector to fp32.

tkaot_bf16_at(vec, j): value j of a vector of bf16 values, from its 32-bit word with one shift (even j)
or one mask (odd j); the conversion operator spends a byte permute and a shift on odd j. Exact, as
the conversion is (NaN payloads included). Kernels pass a literal j, so the branch folds away.
"""

BF16_AT = """
__device__ __forceinline__ float tkaot_bf16_at(const void* vec, int j) {
    unsigned w = reinterpret_cast<const unsigned*>(vec)[j >> 1];
    return __uint_as_float((j & 1) ? (w & 0xFFFF0000u) : (w << 16));
}
"""
