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


FIELD = 3  # bits of a block side's log2 in block_sides' words


class Side:
    """One side of a block: a size (int), or a runtime log2 of it (the generic kernel's); the arithmetic the
    kernel does with it, so both read alike."""

    def __init__(self, size=None, shift=None):
        self.size, self.shift = size, shift

    @property
    def extent(self):
        return self.size if self.shift is None else 1 << self.shift

    def div(self, x):
        return x // self.size if self.shift is None else x >> self.shift

    def mul(self, x):
        return x * self.size if self.shift is None else x << self.shift

    def over(self, inner: "Side"):
        """How many of `inner` this side holds."""
        if self.shift is None and inner.shift is None:
            return self.size // inner.size
        return 1 << (self.log2 - inner.log2)

    @property
    def log2(self):
        return self.size.bit_length() - 1 if self.shift is None else self.shift


def block_sides(choices: tuple[str, ...], index):
    """(rows, columns) Sides of the block choices[index], index a runtime value: each side's log2 (at most 7) is a
    3-bit field of a constant word, picked by the index (no branch)."""
    if len(choices) * FIELD > 32:
        raise ValueError(f"{len(choices)} block choices do not fit a word of {FIELD}-bit fields")
    words = [0, 0]
    for n, text in enumerate(choices):
        for side, size in enumerate(common.block_shape(text)):
            words[side] |= (size.bit_length() - 1) << (FIELD * n)
    mask = (1 << FIELD) - 1
    return tuple(Side(shift=T.Cast("int32", (T.uint32(w) >> T.Cast("uint32", FIELD * index)) & T.uint32(mask))) for w in words)
