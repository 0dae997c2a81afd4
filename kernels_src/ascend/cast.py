"""Elementwise dtype cast for Ascend, round to nearest or stochastic, of a contiguous tensor of n elements.

A block copies `BLOCK` elements into the Unified Buffer, converts them in a SIMT region and copies them back
(the last block's copies stop at n). The conversions are the CUDA kernel's (kernels_src/quant/cast.py): FP8
results saturate (E4M3 at +-448, E5M2 at +-57344); E4M3 NaN widens to fp32 with its sign and an all-ones
mantissa; stochastic rounding (fp32 -> bf16, fp32 -> e4m3, bf16 -> e4m3) takes its bits from the same hash
of (element index, value), so it rounds each element the way the CUDA kernel does.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import refuse
from kernels_src.quant import common
from tkaot._quant.kernels import CAST, STOCHASTIC_PAIRS

DECL = CAST
REQUIRES: dict[str, int] = {}
BLOCK = 8192  # elements a block
THREADS = 256
_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_FP8 = ("e4m3", "e5m2")


def unsupported(in_dtype, out_dtype, stochastic) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if in_dtype == out_dtype or (in_dtype in _FP8 and out_dtype in _FP8):
        return f"no cast from {in_dtype} to {out_dtype}"
    if stochastic and (in_dtype, out_dtype) not in STOCHASTIC_PAIRS:
        return f"stochastic rounding of {in_dtype} -> {out_dtype}"
    return None


def build(in_dtype: str, out_dtype: str, stochastic: bool):
    refuse(DECL, unsupported(in_dtype, out_dtype, stochastic))
    src, dst = _DTYPE[in_dtype], _DTYPE[out_dtype]
    n = T.dynamic("n")

    def convert(v, index):
        if in_dtype == "e4m3" and out_dtype == "float32":
            # exact widening of NaN: the sign kept, the mantissa all ones (0x7FF00000 | sign)
            byte = T.Cast("uint32", T.reinterpret(v, "uint8"))
            nan = common.f32_from_bits(((byte & T.uint32(0x80)) << T.uint32(24)) | T.uint32(0x7FF00000))
            return T.if_then_else((byte & T.uint32(0x7F)) == T.uint32(0x7F), nan, T.Cast(dst, v))
        if not stochastic:
            return T.Cast(dst, v)
        f = T.Cast("float32", v)
        rbits = common.hash_u32(T.Cast("uint32", index), common.f32_bits(f))
        if out_dtype == "bfloat16":
            # 16 random bits added below bf16's last mantissa bit, then truncated: up with the right odds
            bits = (common.f32_bits(f) + (rbits >> T.uint32(16))) & T.uint32(0xFFFF0000)
            return T.if_then_else(f != f, T.Cast(dst, f), T.Cast(dst, common.f32_from_bits(bits)))
        return T.Cast(dst, common.with_sign_of(common.stochastic_round_magnitude(T.abs(f), rbits, "e4m3"), f))

    @T.prim_func
    def cast(x: T.Tensor[(n,), src], y: T.Tensor[(n,), dst]):
        with T.Kernel(T.ceildiv(n, BLOCK)) as block:
            first = block * BLOCK
            x_ub = T.alloc_shared((BLOCK,), src)
            y_ub = T.alloc_shared((BLOCK,), dst)
            T.copy(x[first : first + BLOCK], x_ub)
            with T.SimtVF(threads=THREADS):
                for j in T.Parallel(BLOCK):
                    y_ub[j] = convert(x_ub[j], first + j)
            T.copy(y_ub, y[first : first + BLOCK])

    return cast
