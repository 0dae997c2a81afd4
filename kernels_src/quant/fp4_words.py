"""FP4 (E2M1) casts of bf16 data a word at a time: eight values in, one uint32 of codes out (per_token_cast, tiling.fp4).

The same rounding as common.e2m1_code (nearest even on E2M1's grid, saturating at 6,
NaN -> 6, the sign taken from the fp32 product), in fewer instructions per value:

- the fp32 add of 1.5 * 2**(22 + s) that rounds a magnitude to its step 0.5 * 2**s
  gets a magic whose mantissa also carries 2 * s (an even count of steps, so ties
  still go to the even code): the sum's low byte is then the code itself, and the
  magic is one multiply-add of the clamped exponent e (s = e - 127):
  e * (2**23 + 2) + (bits(1.5 * 2**22) - 127 * (2**23 + 2));
- two codes meet in a byte by one shift-add, four bytes in a word by three byte
  permutes (PRMT), and the eight signs arrive through sign-replicating byte
  permutes of the products, masked into bit 3 of each nibble;
- bf16 values are unpacked with one shift or mask each (the cast to float of the
  high half costs a permute and a shift).

tests/test_fp4_words.py emulates these helpers bit for bit and checks them
against the reference on every fp32 magnitude up to 6 and on packed words.
"""

import tilelang.language as T

# fp32 bits of the magic for exponent e: e * MAGIC_PER_EXP + MAGIC_BASE (mod 2**32), e = max(e, 127)
MAGIC_PER_EXP = (1 << 23) + 2
MAGIC_BASE = (0x4AC00000 - 127 * MAGIC_PER_EXP) % (1 << 32)

DEVICE_HELPERS = f"""
__device__ __forceinline__ float tkaot_bf16_lo(unsigned w) {{ return __uint_as_float(w << 16); }}
__device__ __forceinline__ float tkaot_bf16_hi(unsigned w) {{ return __uint_as_float(w & 0xFFFF0000u); }}
__device__ __forceinline__ unsigned tkaot_prmt(unsigned a, unsigned b, unsigned selector) {{
    // byte permute; a selector nibble with bit 3 set replicates the sign of the byte it picks
    unsigned r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
    return r;
}}
__device__ __forceinline__ float tkaot_absmax_bf16x8(const void* p) {{
    // the largest magnitude of eight bf16 values (four words, element 2i in the low half of word i), NaN
    // ignored (NaN only when all eight are: the scale factor clamps it to the amax floor, as it does 0)
    const unsigned* w = static_cast<const unsigned*>(p);
    float m = fmaxf(fabsf(tkaot_bf16_lo(w[0])), fabsf(tkaot_bf16_hi(w[0])));
    #pragma unroll
    for (int i = 1; i < 4; ++i) m = fmaxf(fmaxf(m, fabsf(tkaot_bf16_lo(w[i]))), fabsf(tkaot_bf16_hi(w[i])));
    return m;
}}
__device__ __forceinline__ unsigned tkaot_e2m1_step(float x) {{
    // bits of |x| (at most 6, NaN -> 6) plus the magic of its step: the low byte is the magnitude code
    float v = fminf(fabsf(x), 6.0f);
    unsigned e = max(__float_as_uint(v), 0x3F800000u) >> 23;
    return __float_as_uint(__fadd_rn(v, __uint_as_float(e * {MAGIC_PER_EXP:#x}u + {MAGIC_BASE:#x}u)));
}}
__device__ __forceinline__ unsigned tkaot_e2m1x8(const void* p, float factor) {{
    // eight bf16 values times factor (fp32), rounded to E2M1: codes in nibbles, element 0 lowest
    const unsigned* w = static_cast<const unsigned*>(p);
    float f[8];
    unsigned t[4];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {{
        f[2 * i] = __fmul_rn(tkaot_bf16_lo(w[i]), factor);
        f[2 * i + 1] = __fmul_rn(tkaot_bf16_hi(w[i]), factor);
    }}
    #pragma unroll
    for (int i = 0; i < 4; ++i) t[i] = tkaot_e2m1_step(f[2 * i]) + (tkaot_e2m1_step(f[2 * i + 1]) << 4);
    unsigned mag = tkaot_prmt(tkaot_prmt(t[0], t[1], 0x0040u), tkaot_prmt(t[2], t[3], 0x4000u), 0x7610u);
    // 0xB / 0xF: the sign of byte 3 of the first / second operand, i.e. of the fp32 product
    unsigned even = tkaot_prmt(tkaot_prmt(__float_as_uint(f[0]), __float_as_uint(f[2]), 0x00FBu),
                               tkaot_prmt(__float_as_uint(f[4]), __float_as_uint(f[6]), 0xFB00u), 0x7610u);
    unsigned odd = tkaot_prmt(tkaot_prmt(__float_as_uint(f[1]), __float_as_uint(f[3]), 0x00FBu),
                              tkaot_prmt(__float_as_uint(f[5]), __float_as_uint(f[7]), 0xFB00u), 0x7610u);
    return mag | (even & 0x08080808u) | (odd & 0x80808080u);
}}
"""


def absmax8(words_ptr):
    """fp32 amax of the eight bf16 values at `words_ptr` (T.address_of a local vector)."""
    return T.call_extern("float32", "tkaot_absmax_bf16x8", words_ptr)


def e2m1x8(words_ptr, factor):
    """uint32 of the eight E2M1 codes of the bf16 values at `words_ptr` times `factor`."""
    return T.call_extern("uint32", "tkaot_e2m1x8", words_ptr, factor)
