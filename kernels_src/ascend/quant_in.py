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


class RuntimeSfLayout:
    """common.SfLayout with the layout a runtime value (0 row-major, 1 column-major), for the generic kernels.

    The buffer is declared 4-D: its two leading extents are `extents` (runtime dims that must stand alone in some
    extent to be bound) and their strides the layout (bound the same way); entries are at [0, 0, i, j], i * stride
    + j, in either layout, and the last two extents bound the indices of both."""

    def __init__(self, kind: str, layout, k_blocks, extents: tuple):
        self.kind, self.layout, self.k_blocks, self.extents = kind, layout, k_blocks, extents
        self.packed = kind == "ue8m0"
        self.dtype = common.SF_DTYPE[kind]
        self.pad = (common.UE8M0_PACK - k_blocks % common.UE8M0_PACK) % common.UE8M0_PACK if self.packed else 0

    def shape(self, m_blocks):
        bound = m_blocks + self.k_blocks + common.UE8M0_PACK
        return (*self.extents, bound, common.UE8M0_PACK * bound)

    def strides(self, stride):
        return (self.layout, self.layout, stride, 1)

    def index(self, m, k):
        col = self.layout != 0
        if self.packed:
            pack = common.UE8M0_PACK
            return 0, 0, T.if_then_else(col, k // pack, m), T.if_then_else(col, m * pack + k % pack, k)
        return 0, 0, T.if_then_else(col, k, m), T.if_then_else(col, m, k)
