"""The generic per-token cast: per_token_cast with the row width `hidden` a runtime value.

It serves the calls whose specialised per_token_cast variant is not built, and writes the
same bytes: every element, group amax, scale factor and rounding comes from the same
expressions (common.py, fp4_words.py) applied to the same vectors (their width depends on
the dtypes, the group and the input block, never on hidden). Only which thread does what
differs, and none of it depends on the order of a reduction (a maximum).

The tiling does not depend on hidden: a CTA of 128 threads holds two row slots of
SEG_THREADS threads; each thread takes one vector of a row segment for ROWS tokens spaced
two apart. The grid's x runs along the row segments (consecutive CTAs cover one band of
rows, as a flat copy would) and y, then z, down the token blocks, so no thread divides by
a runtime value. A row's last segment may reach past its end: those threads load zeros,
join the shuffles (hidden is a multiple of the group and segments start on group
boundaries, so a group's lanes are all in the row or all past it) and store nothing.
"""

import math

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant import common, fp4_words
from kernels_src.quant.per_token_cast import STORAGE, check_static
from tkaot._quant.kernels import PER_TOKEN_CAST_GENERIC

DECL = PER_TOKEN_CAST_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

THREADS = 128
SEG_THREADS = 64  # threads a row segment: a row of 8192 bf16 values is 16 segments, of 7168 14
ROWS = 4  # tokens a thread (the specialised tilings' 4, so as many loads in flight)
GRID_YZ = 65535  # the most CTAs a grid's y (and z) dimension holds


def build(in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic):
    quantized_in = in_dtype in ("e4m3", "e2m1")
    bm, bk = common.block_shape(in_block) if quantized_in else (1, group)
    # The specialised kernel's combination rules, at the narrowest row they allow
    check_static(math.lcm(64, group, bk), in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic)
    storage, storage_bytes, per_storage = STORAGE[in_dtype]
    vec = min(16 // storage_bytes * per_storage, group, bk)  # elements a vector: as in the specialised kernel
    regs = vec // per_storage
    lanes = group // vec  # consecutive lanes sharing a group
    slots = THREADS // SEG_THREADS
    rows_per_cta = slots * ROWS
    seg_cols = SEG_THREADS * vec
    fp4_out = fmt == "e2m1"
    # Lane i of a group forms the scale factor of the group's vector i and the others fetch it by shuffle (as the
    # specialised e2m1 tilings do); the word helpers cast bf16 to E2M1 eight values a call
    one_scale = fp4_out and ROWS <= lanes and mode in ("cast", "sf_only")
    fp4_helpers = fp4_out and in_dtype == "bfloat16" and vec == 8 and mode == "cast" and not stochastic
    word_codes = 8 if vec % 8 == 0 else 4  # FP4 output goes out as uint32 (8 codes) or uint16 (4) words
    out_vec = vec // word_codes if fp4_out else vec
    out_storage = ("uint32" if word_codes == 8 else "uint16") if fp4_out else "float8_e4m3"
    # TileKernels keeps 1/sf in bf16 for bf16 inputs with power-of-two scales
    inv_bf16 = in_dtype == "bfloat16" and sf in ("pow2", "ue8m0") and mode == "precomputed_sf"

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    x_stride = T.dynamic("x_stride")
    sf_stride = T.dynamic("sf_stride")
    in_sf_stride = T.dynamic("in_sf_stride")
    num_groups = hidden // group
    segs = T.ceildiv(hidden, seg_cols)
    token_blocks = T.ceildiv(num_tokens, rows_per_cta)
    out_cols = hidden // word_codes if fp4_out else hidden
    sf_out = common.SfLayout(sf, sf_layout, num_groups)
    sf_in = common.SfLayout.from_input(in_sf if quantized_in else "fp32", hidden // bk if quantized_in else 1)
    in_sf_rows = num_tokens if bm == 1 else T.ceildiv(num_tokens, bm)

    def decode(reg, u, j):
        if in_dtype == "e2m1":
            return common.e2m1_value(T.Cast("uint32", reg[u, j // 2]) >> T.uint32(4 * (j % 2)))
        return T.Cast("float32", reg[u, j])

    def quantized_value(v):
        """The fp32 value v rounds to in fmt."""
        if fp4_out:
            return common.e2m1_value(common.e2m1_code(v))
        return T.Cast("float32", common.to_e4m3(v))

    @T.macro
    def store_sf(out_sf, token, g, stored):
        """Store group g's scale factor; the last group's also zeroes the unused bytes of a packed UE8M0 word."""
        out_sf[sf_out.index(token, g)] = stored
        if sf_out.packed:
            if g == num_groups - 1:
                for p in T.unroll(common.UE8M0_PACK - 1):
                    if num_groups % common.UE8M0_PACK != 0 and num_groups % common.UE8M0_PACK + p < common.UE8M0_PACK:
                        out_sf[sf_out.index(token, num_groups + p)] = T.uint8(0)

    @T.prim_func
    def per_token_cast_generic(
        # Packed E2M1 rows are declared `hidden` bytes wide, twice their width: a dim must stand alone in some
        # extent to be bound, and nothing reads x's extent (addresses go by x_stride, every access is in the row)
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), storage],
        x_sf: T.StridedTensor[sf_in.shape(in_sf_rows), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, out_cols), out_storage],
        out_sf: T.StridedTensor[sf_out.shape(num_tokens), (sf_stride, 1), sf_out.dtype],
    ):
        with T.Kernel(segs, T.min(token_blocks, GRID_YZ), T.ceildiv(token_blocks, GRID_YZ), threads=THREADS) as (bx, by, bz):
            T.import_source(PDL_SOURCE + (fp4_words.DEVICE_HELPERS if fp4_helpers else ""))  # one import a kernel
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(x_stride % (16 // storage_bytes) == 0)
            tid = T.get_thread_binding()
            T.assume(hidden % 64 == 0)  # as declared (per_token_cast's hidden axis): the output rows vectorize
            first_row = (bz * GRID_YZ + by) * rows_per_cta + tid // SEG_THREADS
            col = (bx * SEG_THREADS + tid % SEG_THREADS) * vec  # this thread's vector, in every one of its rows
            in_row = col + vec <= hidden  # the vector is in the row: all of it, or none (hidden is a multiple of vec)
            x_reg = T.alloc_local((ROWS, regs), storage)
            xf = T.alloc_local((vec,), "float32")
            o_reg = T.alloc_local((out_vec,), out_storage)
            back = T.alloc_local((vec,), storage)
            amax = T.alloc_local((ROWS,), "float32")
            in_scale = T.alloc_local((ROWS,), "float32")
            group_inv = T.alloc_local((ROWS,), "float32")
            inv = T.alloc_var("float32")
            factor = T.alloc_var("float32")

            # Issue every load first so they are in flight together; vector u is in token first_row + u * slots
            for u in T.unroll(ROWS):
                token = first_row + u * slots
                if token < num_tokens and in_row:
                    for j in T.vectorized(regs):
                        x_reg[u, j] = x[token, col // per_storage + j]
                    if quantized_in:
                        in_scale[u] = common.decode_sf(x_sf[sf_in.index(token // bm, col // bk)], sf_in.kind)
                else:
                    for j in T.vectorized(regs):
                        x_reg[u, j] = T.Cast(storage, 0)
                    in_scale[u] = T.float32(0)

            if mode != "precomputed_sf":
                for u in T.unroll(ROWS):
                    if fp4_helpers:
                        amax[u] = fp4_words.absmax8(T.address_of(x_reg[u, 0]))
                    else:
                        amax[u] = T.float32(0)
                        for j in T.unroll(vec):
                            amax[u] = T.max(amax[u], T.abs(decode(x_reg, u, j)))
                    if quantized_in:
                        amax[u] = amax[u] * in_scale[u]
                # Every lane takes part in the shuffles (no divergence); groups are aligned runs of lanes
                for u in T.unroll(ROWS):
                    for s in T.unroll(lanes.bit_length() - 1):
                        amax[u] = T.max(amax[u], T.shfl_xor(amax[u], lanes >> (s + 1)))

            if one_scale:
                # Lane i of each group (i < ROWS) forms the scale of the group's vector in row i
                mine = tid % lanes
                picked = T.alloc_var("float32")
                picked = amax[0]
                for u in T.unroll(ROWS - 1):
                    picked = T.if_then_else(mine == u + 1, amax[u + 1], picked)
                stored, inv_value = common.scale_factor(picked, fmt, sf)
                inv = inv_value
                for u in T.unroll(ROWS):
                    group_inv[u] = T.shfl_sync(inv, u, lanes)
                token = first_row + mine * slots
                if mine < ROWS and token < num_tokens and in_row:
                    store_sf(out_sf, token, col // group, stored)

            for u in T.unroll(ROWS):
                token = first_row + u * slots
                if token < num_tokens and in_row:
                    if mode == "precomputed_sf":
                        inv = T.float32(1.0) / common.decode_sf(out_sf[sf_out.index(token, col // group)], sf)
                        if inv_bf16:
                            inv = T.Cast("float32", T.Cast("bfloat16", inv))
                    elif mode == "round_trip":
                        stored, inv_value = common.scale_factor(amax[u], fmt, sf)
                        inv = inv_value
                        for j in T.unroll(vec):
                            xf[j] = decode(x_reg, u, j) * inv
                        for j in T.unroll(vec):
                            back[j] = T.Cast(storage, quantized_value(xf[j]) * common.decode_sf(stored, sf))
                        for j in T.vectorized(vec):
                            x[token, col + j] = back[j]
                    elif one_scale:
                        inv = group_inv[u]
                    else:
                        stored, inv_value = common.scale_factor(amax[u], fmt, sf)
                        inv = inv_value
                        if tid % lanes == 0:
                            store_sf(out_sf, token, col // group, stored)
                    if fp4_helpers:
                        o_reg[0] = fp4_words.e2m1x8(T.address_of(x_reg[u, 0]), inv)
                        out[token, col // word_codes] = o_reg[0]
                    elif mode in ("cast", "precomputed_sf"):
                        factor = inv
                        if quantized_in:
                            factor = in_scale[u] * inv
                        for j in T.unroll(vec):
                            xf[j] = decode(x_reg, u, j) * factor
                        if stochastic:
                            for j in T.unroll(vec):
                                # the element's index in the row-major tensor, mod 2**32 (as the specialised kernel's)
                                where = T.Cast("uint32", token) * T.Cast("uint32", hidden) + T.Cast("uint32", col + j)
                                rbits = common.hash_u32(where, common.f32_bits(xf[j]))
                                xf[j] = common.with_sign_of(common.stochastic_round_magnitude(T.abs(xf[j]), rbits, fmt), xf[j])
                        if fp4_out:
                            for w in T.unroll(out_vec):
                                o_reg[w] = common.pack_e2m1(
                                    [common.e2m1_code(xf[w * word_codes + n]) for n in range(word_codes)], out_storage
                                )
                        else:
                            for j in T.vectorized(out_vec):
                                o_reg[j] = common.to_e4m3(xf[j])
                        for j in T.vectorized(out_vec):
                            out[token, col // (word_codes if fp4_out else 1) + j] = o_reg[j]

    return per_token_cast_generic
