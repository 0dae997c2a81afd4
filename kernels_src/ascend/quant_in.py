"""Pieces the Ascend cast kernels share: how a tile of (possibly quantized) input is stored and decoded."""

from tilelang.ascend import language as T

from kernels_src.quant import common

# in_dtype -> (storage dtype, elements a storage element): packed E2M1 holds two codes a byte, the
# lower-indexed element in the low nibble
STORAGE = {"bfloat16": ("bfloat16", 1), "float32": ("float32", 1), "e4m3": ("float8_e4m3fn", 1), "e2m1": ("uint8", 2)}
BYTES = {"bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1}


def decode(in_dtype: str, tile, i, c):
    """Element c of row i of a tile of in_dtype input, in fp32 (not yet times any input scale)."""
    if in_dtype == "e2m1":
        return common.e2m1_value(T.Cast("uint32", tile[i, c // 2]) >> T.Cast("uint32", 4 * (c % 2)))
    return T.Cast("float32", tile[i, c])
