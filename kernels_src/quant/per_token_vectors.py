"""A thread's vectors of a per-token cast, from load to store: written once for per_token_cast and
per_token_cast_generic, so the two write the same bytes.

A thread holds `count` vectors of `vec` elements, each inside one group and one input scale
block. The kernel's tiling says only where they lie: vector u is at (token, col) = at(u), and it
is read and written where in_range(token). Everything else is here: all loads issued before any
math, the group amax (the lanes sharing a group reduce it with warp shuffles), the scale factor
(with one_scale, lane i of a group forms the scale of the group's vector i and the others fetch it
with a shuffle), scaling, rounding, and the stores of values and scale factors. The group and the
sf layout may be runtime values (the generic kernel's): the lanes sharing a group are then a runtime
power of two, their shuffles taken under a branch the same in every lane.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import tilelang.language as T

from kernels_src.quant import common, fp4_words
from kernels_src.quant.encode import store_encoded

GROUPS = (16, 32, 64, 128)  # the groups a cast takes (per_token_cast's group axis)
# in_dtype -> (storage dtype, bytes per storage element, elements per storage element)
STORAGE = {"bfloat16": ("bfloat16", 2, 1), "float32": ("float32", 4, 1), "e4m3": ("float8_e4m3", 1, 1), "e2m1": ("uint8", 1, 2)}


def vector_elems(in_dtype: str, in_block: str, group: int, vec_bytes: int = 16) -> int:
    """Elements a thread vector: vec_bytes of input at most, inside one group and one input scale block."""
    _, storage_bytes, per_storage = STORAGE[in_dtype]
    bk = common.block_shape(in_block)[1] if in_dtype in ("e4m3", "e2m1") else group
    return min(vec_bytes // storage_bytes * per_storage, group, bk)


def fp4_words_fit(in_dtype: str, fmt: str, vec: int, mode: str, stochastic: bool) -> bool:
    """Whether the fp4_words helpers can cast these vectors: bf16 to E2M1 eight values a vector, rounded to nearest."""
    return fmt == "e2m1" and in_dtype == "bfloat16" and vec == 8 and mode == "cast" and not stochastic


@dataclass(frozen=True)
class VectorCast:
    """The op's static axes and how the kernel's tiling casts them (`hidden` may be a runtime dim)."""

    in_dtype: str
    in_block: str
    in_sf: str
    fmt: str
    group: object  # an int, or a runtime dim (a power of two in GROUPS)
    sf: str
    sf_layout: object  # "row" / "col", or a runtime dim (0 / 1) with a runtime group (common.RuntimeSfLayout)
    mode: str
    stochastic: bool
    hidden: object  # the row width: an int, or the generic kernel's runtime dim
    vec: int  # elements a vector (vector_elems)
    count: int  # vectors a thread
    one_scale: bool  # the tiling has lane i of a group form the scale factor of the group's vector i, where it can
    fp4_helpers: bool  # bf16 -> E2M1 eight values a call by the fp4_words helpers (fp4_words_fit)
    # A runtime group's lanes, log2 and count in a row, and the runtime sf layout's steps, as the kernel holds them
    # (in_kernel): opaque values to the compiler's simplifier, which takes seconds a kernel over expressions of them
    held: tuple | None = None

    def in_kernel(self, lanes, shift, groups, steps) -> VectorCast:
        """This cast with a runtime group's lanes, log2 and groups a row, and the sf layout's (m, k) steps, held in
        the kernel's variables (set to self.lanes, self.group_shift, self.num_groups and self.sf_out.steps())."""
        return dataclasses.replace(self, held=(lanes, shift, groups, steps))

    @property
    def quantized_in(self) -> bool:
        return self.in_dtype in ("e4m3", "e2m1")

    @property
    def block(self) -> tuple[int, int]:
        """The input scale block (rows, columns); (1, group) for an unquantized input."""
        return common.block_shape(self.in_block) if self.quantized_in else (1, self.group)

    @cached_property
    def sf_in(self) -> common.SfLayout:
        return common.SfLayout.from_input(
            self.in_sf if self.quantized_in else "fp32", self.hidden // self.block[1] if self.quantized_in else 1
        )

    @property
    def runtime_group(self) -> bool:
        return not isinstance(self.group, int)

    @cached_property
    def group_shift(self):
        """log2 of a runtime group."""
        return self.held[1] if self.held else T.call_pure_extern("int32", "__ffs", self.group) - 1

    def group_of(self, col):
        """The group of column col."""
        return T.shift_right(col, self.group_shift) if self.runtime_group else col // self.group

    @cached_property
    def sf_out(self) -> common.SfLayout:
        # a runtime row width may end in a partial group, which has its own scale factor
        if self.runtime_group:
            groups = self.held[2] if self.held else T.shift_right(self.hidden + self.group - 1, self.group_shift)
            return common.RuntimeSfLayout(self.sf, groups, (self.group, self.sf_layout), self.hidden, self.held and self.held[3])
        groups = self.hidden // self.group if isinstance(self.hidden, int) else (self.hidden + self.group - 1) // self.group
        return common.SfLayout(self.sf, self.sf_layout, groups)

    @property
    def num_groups(self):
        return self.sf_out.k_blocks

    @property
    def storage(self) -> str:
        return STORAGE[self.in_dtype][0]

    @property
    def storage_bytes(self) -> int:
        return STORAGE[self.in_dtype][1]

    @property
    def per_storage(self) -> int:
        return STORAGE[self.in_dtype][2]

    @property
    def regs(self) -> int:
        """Storage elements a vector."""
        return self.vec // self.per_storage

    @property
    def lanes(self):
        """Consecutive lanes sharing a group (a power of two)."""
        if self.held:
            return self.held[0]
        return T.shift_right(self.group, self.vec.bit_length() - 1) if self.runtime_group else self.group // self.vec

    @property
    def most_lanes(self) -> int:
        """The most lanes a group may take."""
        return max(GROUPS) // self.vec if self.runtime_group else self.lanes

    def lane_in_group(self, tid):
        return T.bitwise_and(tid, self.lanes - 1) if self.runtime_group else tid % self.lanes

    @property
    def shares_scale(self):
        """Lane i of a group forms the scale factor of the group's vector i and the others fetch it by shuffle (with a
        runtime group, an expression: whether the group's lanes are enough)."""
        return self.one_scale and self.mode in ("cast", "sf_only") and self.count <= self.lanes

    @property
    def fp4_out(self) -> bool:
        return self.fmt == "e2m1"

    @property
    def word_codes(self) -> int:
        """FP4 output goes out as whole words of packed codes: uint32 (8 codes), or uint16 for 4-element vectors."""
        return 8 if self.vec % 8 == 0 else 4

    @property
    def out_vec(self) -> int:
        return self.vec // self.word_codes if self.fp4_out else self.vec

    @property
    def out_storage(self) -> str:
        return ("uint32" if self.word_codes == 8 else "uint16") if self.fp4_out else "float8_e4m3"

    @property
    def out_cols(self):
        return self.hidden // self.word_codes if self.fp4_out else self.hidden

    @property
    def inv_bf16(self) -> bool:
        """TileKernels keeps 1/sf in bf16 for bf16 inputs with power-of-two scales."""
        return self.in_dtype == "bfloat16" and self.sf in ("pow2", "ue8m0") and self.mode == "precomputed_sf"


def decode(c: VectorCast, reg, u, j):
    """The fp32 value of element j of vector u (not yet times its input scale)."""
    if c.in_dtype == "e2m1":
        return common.e2m1_value(T.Cast("uint32", reg[u, j // 2]) >> T.uint32(4 * (j % 2)))
    return T.Cast("float32", reg[u, j])


def quantized_value(c: VectorCast, v):
    """The fp32 value v rounds to in c.fmt."""
    if c.fp4_out:
        return common.e2m1_value(common.e2m1_code(v))
    return T.Cast("float32", common.to_e4m3(v))


def element_index(c: VectorCast, token, col, j):
    """Element (token, col + j)'s index in the row-major tensor, mod 2**32: the seed of its stochastic rounding
    (with a static hidden, the int32 arithmetic the specialised cubins were built with)."""
    if isinstance(c.hidden, int):
        return T.Cast("uint32", token * c.hidden + col + j)
    return T.Cast("uint32", token) * T.Cast("uint32", c.hidden) + T.Cast("uint32", col + j)


@T.macro
def store_sf(c: VectorCast, out_sf, token, col, stored):
    """Store the scale factor of the group at column col; the last group's also zeroes the unused bytes of its
    packed UE8M0 word (how many is known when hidden is; otherwise each is checked)."""
    out_sf[c.sf_out.index(token, c.group_of(col))] = stored
    if isinstance(c.num_groups, int):
        if c.sf_out.pad > 0:
            if col // c.group == c.num_groups - 1:
                for p in T.unroll(c.sf_out.pad):
                    out_sf[c.sf_out.index(token, c.num_groups + p)] = T.uint8(0)
    elif c.sf_out.packed:
        if c.group_of(col) == c.num_groups - 1:
            for p in T.unroll(common.UE8M0_PACK - 1):
                if c.num_groups % common.UE8M0_PACK != 0 and c.num_groups % common.UE8M0_PACK + p < common.UE8M0_PACK:
                    out_sf[c.sf_out.index(token, c.num_groups + p)] = T.uint8(0)


@T.macro
def cast_vectors(c: VectorCast, x, x_sf, out, out_sf, tid, at, in_range, group_in_range=None):
    """Cast this thread's vectors (see the module's docstring): x -> out and out_sf, by c.mode.

    group_in_range(token): whether the scale factor of the thread's group for `token` is stored, where a group may
    reach past the row's end (the generic kernel's partial last group, whose lanes past the end load zeros); by
    default in_range, the thread's own vector's."""
    x_reg = T.alloc_local((c.count, c.regs), c.storage)
    xf = T.alloc_local((c.vec,), "float32")
    o_reg = T.alloc_local((c.out_vec,), c.out_storage)
    back = T.alloc_local((c.vec,), c.storage)
    amax = T.alloc_local((c.count,), "float32")
    in_scale = T.alloc_local((c.count,), "float32")
    group_inv = T.alloc_local((c.count,), "float32")
    inv = T.alloc_var("float32")
    factor = T.alloc_var("float32")

    # Issue every load first so they are in flight together
    for u in T.unroll(c.count):
        token, col = at(u)
        if in_range(token):
            for j in T.vectorized(c.regs):
                x_reg[u, j] = x[token, col // c.per_storage + j]
            if c.quantized_in:
                in_scale[u] = common.decode_sf(x_sf[c.sf_in.index(token // c.block[0], col // c.block[1])], c.sf_in.kind)
        else:
            for j in T.vectorized(c.regs):
                x_reg[u, j] = T.Cast(c.storage, 0)
            in_scale[u] = T.float32(0)

    if c.mode != "precomputed_sf":
        for u in T.unroll(c.count):
            if c.fp4_helpers:
                amax[u] = fp4_words.absmax8(T.address_of(x_reg[u, 0]))
            else:
                amax[u] = T.float32(0)
                for j in T.unroll(c.vec):
                    amax[u] = T.max(amax[u], T.abs(decode(c, x_reg, u, j)))
            if c.quantized_in:
                amax[u] = amax[u] * in_scale[u]
        # Every lane takes part in the shuffles (no divergence); groups are aligned runs of lanes. A runtime group
        # takes the shuffles of the most lanes it may have that are within its lanes, in the same order
        for u in T.unroll(c.count):
            for s in T.unroll(c.most_lanes.bit_length() - 1):
                if c.runtime_group:
                    if (c.most_lanes >> (s + 1)) < c.lanes:
                        amax[u] = T.max(amax[u], T.shfl_xor(amax[u], c.most_lanes >> (s + 1)))
                else:
                    amax[u] = T.max(amax[u], T.shfl_xor(amax[u], c.lanes >> (s + 1)))

    if c.shares_scale:
        # Lane i of each group (i < count) forms the scale of the group's vector i
        mine = c.lane_in_group(tid)
        picked = T.alloc_var("float32")
        picked = amax[0]
        for u in T.unroll(c.count - 1):
            picked = T.if_then_else(mine == u + 1, amax[u + 1], picked)
        stored, inv_value = common.scale_factor(picked, c.fmt, c.sf)
        inv = inv_value
        for u in T.unroll(c.count):
            group_inv[u] = T.shfl_sync(inv, u, c.lanes)
        token, col = at(mine)
        if mine < c.count and (in_range if group_in_range is None else group_in_range)(token):
            store_sf(c, out_sf, token, col, stored)

    for u in T.unroll(c.count):
        token, col = at(u)
        if in_range(token):
            if c.mode == "precomputed_sf":
                inv = T.float32(1.0) / common.decode_sf(out_sf[c.sf_out.index(token, c.group_of(col))], c.sf)
                if c.inv_bf16:
                    inv = T.Cast("float32", T.Cast("bfloat16", inv))
            elif c.mode == "round_trip":
                stored, inv_value = common.scale_factor(amax[u], c.fmt, c.sf)
                inv = inv_value
                for j in T.unroll(c.vec):
                    xf[j] = decode(c, x_reg, u, j) * inv
                for j in T.unroll(c.vec):
                    back[j] = T.Cast(c.storage, quantized_value(c, xf[j]) * common.decode_sf(stored, c.sf))
                for j in T.vectorized(c.vec):
                    x[token, col + j] = back[j]
            elif c.shares_scale:
                inv = group_inv[u]
            else:
                stored, inv_value = common.scale_factor(amax[u], c.fmt, c.sf)
                inv = inv_value
                if c.lane_in_group(tid) == 0:
                    store_sf(c, out_sf, token, col, stored)
            if c.fp4_helpers:
                o_reg[0] = fp4_words.e2m1x8(T.address_of(x_reg[u, 0]), inv)
                out[token, col // c.word_codes] = o_reg[0]
            elif c.mode in ("cast", "precomputed_sf"):
                factor = inv
                if c.quantized_in:
                    factor = in_scale[u] * inv
                for j in T.unroll(c.vec):
                    xf[j] = decode(c, x_reg, u, j) * factor
                if c.stochastic:
                    for j in T.unroll(c.vec):
                        rbits = common.hash_u32(element_index(c, token, col, j), common.f32_bits(xf[j]))
                        xf[j] = common.with_sign_of(common.stochastic_round_magnitude(T.abs(xf[j]), rbits, c.fmt), xf[j])
                store_encoded(xf, o_reg, out, token, col)
