"""Shared TileLang cast math: scale factors, rounding to FP8/FP4, FP4 packing, random bits.

Every function here builds TIR expressions from TIR expressions (no buffers, no
statements), so any kernel body may call it: the cast kernels of this family and
fused kernels (norm+cast, swiglu+cast) alike. Semantics follow TileKernels 2.1.0:

- amax is clamped from below (`amax_floor`) before a scale is formed, so an
  all-zero group gets a tiny positive scale, never 0 or inf;
- `sf` is the dequantisation factor (decoded = stored value * sf) and `inv` the
  quantisation factor (stored value = round(x * inv));
- scale-factor kinds (`SF_KINDS`): "fp32" (sf = amax / max, inv = max / amax),
  "pow2" (sf rounded up to a power of two, stored as fp32), "ue8m0" (the same
  power of two, stored as its biased exponent byte), "e4m3" (sf rounded to FP8
  E4M3, inv = 1 / that);
- rounding to E4M3 saturates at +-448 (NaN stays NaN); to E2M1 it saturates at
  +-6 and NaN becomes 6; E2M1 codes are 4 bits, sign in bit 3, two per byte with
  the lower-indexed element in the low nibble.

Kept free of module-level TileLang state; importing it only imports tilelang.language.
"""

import tilelang.language as T

FORMAT_MAX = {"e4m3": 448.0, "e2m1": 6.0}
SF_KINDS = ("fp32", "pow2", "ue8m0", "e4m3")

# fp32 bits of 1.5 * 2**22 (numbers near it are 0.5 apart: adding a small value rounds it to a multiple of 0.5)
# and of 1.0
_RNE_HALF_MAGIC_BITS = 0x4AC00000
_ONE_BITS = 0x3F800000


def amax_floor(fmt: str, sf_kind: str) -> float:
    """The smallest amax a scale is formed from (TileKernels' default clamp values)."""
    if sf_kind == "e4m3":
        return FORMAT_MAX[fmt] * 2.0**-9  # keeps amax / max at or above E4M3's smallest subnormal
    return 1e-4 if fmt == "e4m3" else 6.0 * 2.0**-126


def f32_bits(value):
    """The IEEE bits of an fp32 expression, as uint32."""
    return T.reinterpret(value, "uint32")


def f32_from_bits(bits):
    return T.reinterpret(bits, "float32")


def pow2_ceil_biased_exponent(sf):
    """Biased exponent (uint32) of the smallest power of two >= sf, for a positive normal fp32 sf."""
    return ((f32_bits(sf) - T.uint32(1)) >> T.uint32(23)) + T.uint32(1)


def pow2_of_biased_exponent(biased):
    """2 ** (biased - 127) as fp32, for a biased exponent in [1, 254]."""
    return f32_from_bits(T.Cast("uint32", biased) << T.uint32(23))


def scale_factor(amax, fmt: str, sf_kind: str):
    """(stored sf, inv) for a group whose largest magnitude is `amax` (fp32).

    The stored value has the sf buffer's type: fp32 for "fp32" and "pow2",
    uint8 (biased exponent) for "ue8m0", float8_e4m3 for "e4m3". `inv` is fp32.
    """
    fmax = FORMAT_MAX[fmt]
    clamped = T.max(amax, T.float32(amax_floor(fmt, sf_kind)))
    if sf_kind == "fp32":
        return clamped / T.float32(fmax), T.float32(fmax) / clamped
    if sf_kind == "e4m3":
        sf8 = T.Cast("float8_e4m3", clamped / T.float32(fmax))
        return sf8, T.float32(1.0) / T.Cast("float32", sf8)
    # The reciprocal multiply lands in the same power-of-two bin as the division for every fp32 amax
    biased = pow2_ceil_biased_exponent(clamped * T.float32(1.0 / fmax))
    inv = pow2_of_biased_exponent(T.uint32(254) - biased)
    if sf_kind == "ue8m0":
        return T.Cast("uint8", biased), inv
    return pow2_of_biased_exponent(biased), inv


def decode_sf(stored, sf_kind: str):
    """The fp32 dequantisation factor of a stored sf value of the given kind."""
    if sf_kind == "ue8m0":
        return pow2_of_biased_exponent(T.Cast("uint32", stored))
    if sf_kind == "e4m3":
        return T.Cast("float32", stored)
    return stored


def to_e4m3(value):
    """Round an fp32 value to E4M3 (nearest even, saturating at +-448)."""
    return T.Cast("float8_e4m3", value)


def e2m1_code(value):
    """The 4-bit E2M1 code (uint32) of an fp32 value: round to nearest even, saturate at 6, NaN -> 6.

    E2M1 magnitudes are 0, 0.5, 1, 1.5 (step 0.5), 2, 3 (step 1), 4, 6 (step 2):
    the step is 0.5 * 2**s with s = max(exponent, 0). One fp32 add of
    1.5 * 2**(22 + s), a number whose neighbours are exactly one step apart,
    rounds the magnitude to nearest even on the grid and leaves the step count k
    in its low bits; the code is k + 2 * s. The magic's bits are the magnitude's
    exponent field (at least 1.0's) plus a constant, so there is no compare or
    select: seven instructions, identical to a per-range formula for every fp32
    magnitude in [0, 6] (checked exhaustively).
    """
    mag = T.min(T.abs(value), T.float32(6.0))  # fminf: NaN -> 6
    exp_field = T.max(f32_bits(mag) & T.uint32(0x7F800000), T.uint32(_ONE_BITS))
    magic = exp_field + T.uint32(_RNE_HALF_MAGIC_BITS - _ONE_BITS)  # 1.5 * 2**(22 + s)
    code = f32_bits(mag + f32_from_bits(magic)) - magic + ((exp_field >> T.uint32(22)) - T.uint32(_ONE_BITS >> 22))
    return code | ((f32_bits(value) >> T.uint32(28)) & T.uint32(8))


def e2m1_value(code):
    """The fp32 value of a 4-bit E2M1 code (any integer expression; bits above 3 ignored)."""
    c = T.Cast("uint32", code)
    exp = (c >> T.uint32(1)) & T.uint32(3)
    man = c & T.uint32(1)
    normal = f32_from_bits(((exp + T.uint32(126)) << T.uint32(23)) | (man << T.uint32(22)))
    mag = T.if_then_else(exp == T.uint32(0), T.Cast("float32", man) * T.float32(0.5), normal)
    return f32_from_bits(f32_bits(mag) | ((c & T.uint32(8)) << T.uint32(28)))


def pack_e2m1(codes, dtype: str = "uint32"):
    """Pack E2M1 codes (uint32 expressions < 16, first element lowest) into one integer of `dtype`."""
    word = codes[0]
    for n, code in enumerate(codes[1:], start=1):
        word = word + (code << T.uint32(4 * n))  # nibbles do not overlap: + is |, and fuses with the shift (LEA)
    return T.Cast(dtype, word)


def hash_u32(a, b):
    """A well-mixed uint32 from two uint32 inputs (for stochastic rounding bits)."""
    h = a * T.uint32(0x9E3779B1) + b * T.uint32(0x85EBCA77)
    h = h ^ (h >> T.uint32(16))
    h = h * T.uint32(0x7FEB352D)
    h = h ^ (h >> T.uint32(15))
    h = h * T.uint32(0x846CA68B)
    return h ^ (h >> T.uint32(16))


def stochastic_round_magnitude(mag, rbits, fmt: str):
    """Round a non-negative fp32 magnitude to fmt's grid, up with probability equal to its fraction of a step.

    `rbits` is a uniform uint32; its top 24 bits decide. The result is a value
    of fmt's grid (saturated at its max), so a round-to-nearest cast of it is exact.
    """
    mantissa_bits, min_step_exp = (3, -9) if fmt == "e4m3" else (1, -1)
    fmax = FORMAT_MAX[fmt]
    m = T.min(mag, T.float32(fmax))
    exp = T.Cast("int32", f32_bits(m) >> T.uint32(23)) - 127
    step_exp = T.max(exp - mantissa_bits, min_step_exp)
    step = f32_from_bits(T.Cast("uint32", step_exp + 127) << T.uint32(23))
    step_inv = f32_from_bits(T.Cast("uint32", 127 - step_exp) << T.uint32(23))
    scaled = m * step_inv  # exact: a power-of-two scale
    low = T.floor(scaled)
    r = T.Cast("float32", rbits >> T.uint32(8)) * T.float32(2.0**-24)
    up = T.if_then_else(r < scaled - low, T.float32(1.0), T.float32(0.0))
    return T.min((low + up) * step, T.float32(fmax))


def with_sign_of(mag, value):
    """mag (non-negative fp32) with the sign bit of value."""
    return f32_from_bits(f32_bits(mag) | (f32_bits(value) & T.uint32(0x80000000)))


# ---- scale-factor layouts --------------------------------------------------------------------------------------
# A scale-factor grid has one entry per (m block, k block) of the data. Its buffer is
#   "row": (m blocks, k blocks), row-major;         "col": (k blocks, m blocks), i.e. column-major (DeepGEMM's
#   TMA-aligned layout when the m stride is padded to 16 bytes). A "ue8m0" grid packs four k-neighbouring exponent
# bytes into one int32 (lowest k in the lowest byte); kernels address it as bytes, and unused bytes of the last
# int32 of each row (col: of each m) are written as 0. Per-channel grids (k blocks of one channel, per_channel_cast's)
# pack four m-neighbouring bytes instead (`pack_m`, row-major only): (m blocks / 4, k blocks) int32.

IN_BLOCKS = ("none", "1x16", "1x32", "1x64", "1x128", "32x32", "128x128")
IN_SF = ("none", "fp32", "fp32_col", "ue8m0", "ue8m0_col", "e4m3", "e4m3_col")
SF_DTYPE = {"fp32": "float32", "pow2": "float32", "ue8m0": "uint8", "e4m3": "float8_e4m3"}
UE8M0_PACK = 4


def block_shape(text: str) -> tuple[int, int]:
    """'128x128' -> (128, 128)."""
    m, k = text.split("x")
    return int(m), int(k)


def row_sf_type(rows: tuple, width, strides: tuple, packed: bool):
    """The argument type of a scale-factor output with one row of `width` entries per element of `rows` (dims),
    addressed by its strides alone (the row dims' strides, then the group's): packed UE8M0 bytes (*rows, width, 4),
    else fp32 (*rows, width). Nothing reads its extents (a dim must stand alone in some extent to be bound)."""
    if packed:
        return T.StridedTensor[(*rows, width, UE8M0_PACK), (*strides, 1), "uint8"]
    return T.StridedTensor[(*rows, width), strides, "float32"]


@T.macro
def load_or_zero(x_reg, p, x, row, col, num_tokens, vec: int, dtype: str):
    """x_reg[p, :] = x[row, col : col + vec], one vector access; zeros for a row at or past num_tokens."""
    if row < num_tokens:
        for j in T.vectorized(vec):
            x_reg[p, j] = x[row, col + j]
    else:
        for j in T.vectorized(vec):
            x_reg[p, j] = T.Cast(dtype, 0)


def runtime_sf_index(m, k, layout, packed: bool):
    """(i, j): where a 2-D sf buffer holds the scale factor of block (m, k) when its layout is a runtime value
    (`layout` 0 row-major, 1 column-major; packed: UE8M0 bytes, four k blocks a word along the row)."""
    col = layout != 0
    if packed:
        return T.if_then_else(col, k // UE8M0_PACK, m), T.if_then_else(col, m * UE8M0_PACK + k % UE8M0_PACK, k)
    return T.if_then_else(col, k, m), T.if_then_else(col, m, k)


class SfLayout:
    """Where the scale factor of (m block, k block) lives in a kernel's sf buffer (static description)."""

    def __init__(self, kind: str, layout: str, k_blocks: int, pack_m: bool = False):
        self.kind, self.layout, self.k_blocks = kind, layout, k_blocks
        self.packed = kind == "ue8m0"
        self.pack_m = self.packed and pack_m
        self.dtype = SF_DTYPE[kind]
        self.pad = (-k_blocks) % UE8M0_PACK if self.packed and not self.pack_m else 0
        if self.pack_m and layout != "row":
            raise ValueError("scale factors packed along m are row-major")

    @classmethod
    def from_input(cls, in_sf: str, k_blocks: int, pack_m: bool = False) -> "SfLayout":
        """The layout of an input's scale factors, from an IN_SF value (pack_m: of per-channel blocks)."""
        kind, _, col = in_sf.partition("_")
        return cls(kind, "col" if col else "row", k_blocks, pack_m)

    def shape(self, m_blocks):
        if self.pack_m:
            return ((m_blocks + UE8M0_PACK - 1) // UE8M0_PACK, self.k_blocks * UE8M0_PACK)
        if self.packed:
            packs = (self.k_blocks + UE8M0_PACK - 1) // UE8M0_PACK
            return (m_blocks, packs * UE8M0_PACK) if self.layout == "row" else (packs, m_blocks * UE8M0_PACK)
        return (m_blocks, self.k_blocks) if self.layout == "row" else (self.k_blocks, m_blocks)

    def index(self, m, k):
        """Buffer indices of the entry for m block `m` and k block `k`."""
        if self.pack_m:
            return m // UE8M0_PACK, k * UE8M0_PACK + m % UE8M0_PACK
        if self.layout == "row":
            return m, k
        if self.packed:
            return k // UE8M0_PACK, m * UE8M0_PACK + k % UE8M0_PACK
        return k, m


class RuntimeSfLayout(SfLayout):
    """An SfLayout whose layout is a runtime value (0 row-major, 1 column-major: the index of the sf_layout axis's
    choices), for a kernel that takes it at run time. The (m, k) entry lies at m * m_step + k * k_step (packed: the
    k-th byte, (k // 4) * k_step + k % 4), the steps (steps()) being the kernel's values: one expression for either
    layout, where a choice between two indices costs the compiler's simplifier seconds a kernel. Its buffer leads with
    two unit dims whose extents are `binds`, runtime dims named nowhere else (a dim must stand alone in some extent to
    be bound); index() addresses (0, 0, 0, offset)."""

    def __init__(self, kind: str, k_blocks, binds: tuple, k_bound, held_steps: tuple | None = None):
        super().__init__(kind, "row", k_blocks)
        self.binds, self.k_bound, self.held_steps = binds, k_bound, held_steps

    def shape(self, m_blocks):
        # plain extents (k_bound: at least k_blocks), which the kernel's indices are not checked against
        return (*self.binds, m_blocks + self.k_bound, UE8M0_PACK * (m_blocks + self.k_bound))

    def strides(self, stride):
        return (1, 1, stride, 1)

    def steps(self, layout, stride) -> tuple:
        """(m_step, k_step) of the runtime layout, over a (m or k, ...) stride."""
        k_unit = UE8M0_PACK if self.packed else 1
        return T.if_then_else(layout != 0, k_unit, stride), T.if_then_else(layout != 0, stride, k_unit)

    def index(self, m, k):
        m_step, k_step = self.held_steps
        if self.packed:
            return 0, 0, 0, m * m_step + k // UE8M0_PACK * k_step + k % UE8M0_PACK
        return 0, 0, 0, m * m_step + k * k_step
