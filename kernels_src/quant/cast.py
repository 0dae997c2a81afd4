"""Elementwise dtype cast of a contiguous tensor, round to nearest or stochastic.

Each thread takes 16-byte input vectors (a scalar tail handles a last partial
vector). FP8 results saturate (E4M3 at +-448, E5M2 at +-57344). Stochastic rounding (fp32 -> bf16,
fp32 -> e4m3, bf16 -> e4m3) rounds up with probability equal to the value's
fraction of a step, from hashed (index, value) bits.
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from tkaot._quant.kernels import CAST, STOCHASTIC_PAIRS

DECL = CAST  # the declaration this module builds (tkaot/_quant/kernels.py)


NUM_THREADS = 128
VECS_PER_THREAD = 4
_STORAGE = {
    "float32": ("float32", 4),
    "bfloat16": ("bfloat16", 2),
    "float16": ("float16", 2),
    "e4m3": ("float8_e4m3", 1),
    "e5m2": ("float8_e5m2", 1),
}


_FP8 = ("e4m3", "e5m2")


def check_static(in_dtype, out_dtype, stochastic) -> None:
    if in_dtype == out_dtype:
        raise ValueError(f"{DECL.name}: in_dtype and out_dtype are both {in_dtype}")
    if in_dtype in _FP8 and out_dtype in _FP8:
        raise ValueError(f"{DECL.name}: no cast between FP8 formats ({in_dtype} -> {out_dtype})")
    if stochastic and (in_dtype, out_dtype) not in STOCHASTIC_PAIRS:
        raise ValueError(f"{DECL.name}: stochastic rounding supports {list(STOCHASTIC_PAIRS)}, not {(in_dtype, out_dtype)}")


def convert(v, index, in_dtype: str, out_dtype: str, stochastic: bool, dst: str):
    """Element `v` (at flat `index`) cast to `dst`, the storage dtype of out_dtype; the Ascend kernel converts with it too."""
    if in_dtype == "e4m3" and out_dtype == "float32":
        # The hardware widening (through f16) turns E4M3 NaN into the canonical 0x7FFFFFFF; an exact
        # widening keeps the sign and the all-ones mantissa: 0x7FF00000 | sign
        byte = T.Cast("uint32", T.reinterpret(v, "uint8"))
        nan = common.f32_from_bits(((byte & T.uint32(0x80)) << T.uint32(24)) | T.uint32(0x7FF00000))
        return T.if_then_else((byte & T.uint32(0x7F)) == T.uint32(0x7F), nan, T.Cast(dst, v))
    if not stochastic:
        return T.Cast(dst, v)
    f = T.Cast("float32", v)
    rbits = common.hash_u32(T.Cast("uint32", index), common.f32_bits(f))
    if out_dtype == "bfloat16":
        # Adding 16 random bits below bf16's last mantissa bit, then truncating, rounds up with the right odds
        bits = (common.f32_bits(f) + (rbits >> T.uint32(16))) & T.uint32(0xFFFF0000)
        return T.if_then_else(f != f, T.Cast(dst, f), T.Cast(dst, common.f32_from_bits(bits)))
    return T.Cast(dst, common.with_sign_of(common.stochastic_round_magnitude(T.abs(f), rbits, "e4m3"), f))


def build(in_dtype, out_dtype, stochastic):
    check_static(in_dtype, out_dtype, stochastic)
    src, in_bytes = _STORAGE[in_dtype]
    dst, _ = _STORAGE[out_dtype]
    vec = 16 // in_bytes
    block_elems = NUM_THREADS * VECS_PER_THREAD * vec

    n = T.dynamic("n")

    @T.prim_func
    def cast(x: T.Tensor[(n,), src], y: T.Tensor[(n,), dst]):
        with T.Kernel(T.ceildiv(n, block_elems), threads=NUM_THREADS) as block:
            kernel_entry()
            tid = T.get_thread_binding()
            x_reg = T.alloc_local((VECS_PER_THREAD, vec), src)
            y_reg = T.alloc_local((vec,), dst)
            for u in T.unroll(VECS_PER_THREAD):
                base = block * block_elems + (u * NUM_THREADS + tid) * vec
                if base + vec <= n:
                    for j in T.vectorized(vec):
                        x_reg[u, j] = x[base + j]
            for u in T.unroll(VECS_PER_THREAD):
                base = block * block_elems + (u * NUM_THREADS + tid) * vec
                if base + vec <= n:
                    for j in T.unroll(vec):
                        y_reg[j] = convert(x_reg[u, j], base + j, in_dtype, out_dtype, stochastic, dst)
                    for j in T.vectorized(vec):
                        y[base + j] = y_reg[j]
                elif base < n:
                    for j in T.serial(vec):
                        if base + j < n:
                            y[base + j] = convert(x[base + j], base + j, in_dtype, out_dtype, stochastic, dst)

    return cast
