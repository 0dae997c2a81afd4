"""Per-token cast to FP8 E4M3 or FP4 E2M1 with one scale factor per `group` channels of a row.

One pass over the input: a CTA takes a few tokens by one segment of their row
(see tiling.RowTiling); each thread holds its 16-byte input vectors (fewer bytes
when a group or an input scale block is smaller) in registers, all loads issued
before any math; the lanes that share a group reduce its amax with warp
shuffles, then each lane scales, rounds and stores its own elements and one lane
stores the group's scale factor (with tiling.one_scale, lane i of a group forms
the scale of the group's vector i and the others fetch it with a shuffle). Addresses are constant offsets plus a multiple
of the row stride, and one cubin serves every token count.

tiling.fp4 casts bf16 -> E2M1 by the word helpers of fp4_words, with no token checks
in CTAs whose tokens are all in range (TILING_E2M1_BF16, where it was timed).

Inputs are bf16 / fp32, or already quantized (E4M3 or packed E2M1) with their
own scale factors in blocks of `in_block` (the decoded input is data * sf).
Modes: "cast" writes values and scale factors, "sf_only" only the scale
factors, "precomputed_sf" reads the scale factors and writes the values,
"round_trip" overwrites the input with its quantized-then-dequantized value.
"""

from dataclasses import replace

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant import common, fp4_words
from kernels_src.quant.encode import store_encoded
from kernels_src.quant.tiling import RowTiling
from tkaot._quant.kernels import PER_TOKEN_CAST

DECL = PER_TOKEN_CAST  # the declaration this module builds (tkaot/_quant/kernels.py)


# threads per CTA, tokens per thread, vectors of a row per thread (the tuning knob; see bench/tuning/tune_quant.py).
# H200, 8192 x 7168 bf16 (bench/tuning/tune_quant.py): e4m3/128 t128r4c1h 43.9 µs (t128r4c1 45.7);
# e2m1/32 t128r4c1s 46.0 µs (t128r4c1 53.3, t128r4c1hs 46.8).
TILING = RowTiling(128, 4, 1, walk="hidden")
TILING_E2M1 = RowTiling(128, 4, 1, one_scale=True)
# H200 (bench/tuning/tune_quant.py): bf16 -> e2m1/32 casts by the fp4_words helpers with unchecked full CTAs,
# t128r4c1sf ("sf3" then): 41.1 µs = 3.75 TB/s with fp32 sf (t128r4c1s 46.4), 40.7 with ue8m0 (46.5); the combinations
# timed and edge-checked there take it (fp4_path_applies), every other e2m1 variant keeps TILING_E2M1.
TILING_E2M1_BF16 = RowTiling(128, 4, 1, one_scale=True, fp4=True)
# in_dtype -> (storage dtype, bytes per storage element, elements per storage element)
STORAGE = {"bfloat16": ("bfloat16", 2, 1), "float32": ("float32", 4, 1), "e4m3": ("float8_e4m3", 1, 1), "e2m1": ("uint8", 1, 2)}


def check_static(hidden, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic) -> None:
    """Raise ValueError for a combination no kernel supports (each axis alone is checked by its declaration)."""
    where = f"{DECL.name}: "
    quantized_in = in_dtype in ("e4m3", "e2m1")
    if quantized_in != (in_block != "none") or quantized_in != (in_sf != "none"):
        raise ValueError(
            where + f"in_block and in_sf go with e4m3/e2m1 inputs only (in_dtype={in_dtype}, in_block={in_block}, in_sf={in_sf})"
        )
    if hidden % group:
        raise ValueError(where + f"hidden={hidden} is not a multiple of group={group}")
    if quantized_in:
        if hidden % common.block_shape(in_block)[1]:
            raise ValueError(where + f"hidden={hidden} is not a multiple of the input block {in_block}")
        if mode != "cast":
            raise ValueError(where + f"mode={mode} takes bf16/fp32 inputs only")
    if mode == "precomputed_sf" and (sf == "ue8m0" or sf_layout == "col"):
        raise ValueError(where + "precomputed_sf reads row-major, unpacked scale factors only (sf=fp32/pow2/e4m3, sf_layout=row)")
    if stochastic and mode in ("sf_only", "round_trip"):
        raise ValueError(where + "stochastic rounding needs mode=cast or precomputed_sf")
    if mode == "round_trip" and (sf == "ue8m0" or sf_layout == "col"):
        raise ValueError(where + "round_trip keeps no scale factors: use sf=fp32/pow2/e4m3, sf_layout=row")


def fp4_path_applies(in_dtype, fmt, group, sf, mode, stochastic) -> bool:
    """Whether the variant takes TILING_E2M1_BF16: a plain bf16 cast to e2m1 in groups of 32, fp32 or UE8M0 sf."""
    return in_dtype == "bfloat16" and fmt == "e2m1" and group == 32 and sf in ("fp32", "ue8m0") and mode == "cast" and not stochastic


def build(hidden, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic, tiling: RowTiling | None = None):
    check_static(hidden, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic)
    storage, storage_bytes, per_storage = STORAGE[in_dtype]
    quantized_in = in_dtype in ("e4m3", "e2m1")
    bm, bk = common.block_shape(in_block) if quantized_in else (1, hidden)
    if tiling is None:
        if fp4_path_applies(in_dtype, fmt, group, sf, mode, stochastic):
            tiling = TILING_E2M1_BF16
        else:
            tiling = TILING_E2M1 if fmt == "e2m1" else TILING
    # Elements per thread vector: vec_bytes (16) at most, inside one group and one input scale block
    vec = min(tiling.vec_bytes // storage_bytes * per_storage, group, bk)
    regs = vec // per_storage  # storage elements per vector
    vecs_per_row = hidden // vec
    lanes = group // vec  # consecutive lanes sharing a group
    if vecs_per_row % tiling.cols:
        tiling = replace(tiling, rows=tiling.rows * tiling.cols, cols=1)
    num_threads, rows, cols = tiling.threads, tiling.rows, tiling.cols
    tpr = tiling.threads_per_row(vecs_per_row, lanes)
    slots = num_threads // tpr
    segs = vecs_per_row // (tpr * cols)
    rows_per_cta = slots * rows
    vecs_per_thread = rows * cols
    # Lane i of a group forms the scale factor of the group's vector i, the others fetch it by shuffle
    one_scale = tiling.one_scale and vecs_per_thread <= lanes and mode in ("cast", "sf_only")
    num_groups = hidden // group
    fp4_out = fmt == "e2m1"
    # FP4 output goes out as whole words of packed codes: uint32 (8 codes), or uint16 for 4-element vectors
    word_codes = 8 if vec % 8 == 0 else 4
    # tiling.fp4: eight bf16 values to one word of codes by the fp4_words helpers (amax and cast), and a CTA whose
    # tokens are all in range checking none (one CTA-uniform branch; registers capped at 64)
    fp4_helpers = tiling.fp4
    full_tiles = 65536 // (64 * num_threads) if tiling.fp4 else 0  # CTAs an SM must hold: 64 registers a thread
    if fp4_helpers and not (fp4_out and in_dtype == "bfloat16" and vec == 8 and mode == "cast" and not stochastic):
        raise ValueError(f"{DECL.name}: tiling {tiling} casts bf16 to e2m1 in 8-element vectors with mode=cast, stochastic=false")
    out_vec = vec // word_codes if fp4_out else vec
    out_storage = ("uint32" if word_codes == 8 else "uint16") if fp4_out else "float8_e4m3"
    out_cols = hidden // word_codes if fp4_out else hidden
    sf_out = common.SfLayout(sf, sf_layout, num_groups)
    sf_in = common.SfLayout.from_input(in_sf if quantized_in else "fp32", hidden // bk)
    # TileKernels keeps 1/sf in bf16 for bf16 inputs with power-of-two scales
    inv_bf16 = in_dtype == "bfloat16" and sf in ("pow2", "ue8m0") and mode == "precomputed_sf"

    num_tokens = T.dynamic("num_tokens")
    x_stride = T.dynamic("x_stride")
    sf_stride = T.dynamic("sf_stride")
    in_sf_stride = T.dynamic("in_sf_stride")
    in_sf_rows = num_tokens if bm == 1 else (num_tokens + bm - 1) // bm

    def decode(reg, u, j):
        if in_dtype == "e2m1":
            return common.e2m1_value(T.Cast("uint32", reg[u, j // 2]) >> T.uint32(4 * (j % 2)))
        return T.Cast("float32", reg[u, j])

    def quantized_value(v):
        """The fp32 value v rounds to in fmt."""
        if fp4_out:
            return common.e2m1_value(common.e2m1_code(v))
        return T.Cast("float32", common.to_e4m3(v))

    def cta(guarded: bool):
        """The body of one CTA; guarded=False: every token of the CTA is in range, so no token is checked."""

        def in_range(token):
            return token < num_tokens if guarded else True

        @T.macro
        def body(x, x_sf, out, out_sf):
            tid = T.get_thread_binding()
            first_row, first_vec = tiling.origin(T.get_block_binding(0), T.get_block_binding(1), tid, tpr, segs)
            x_reg = T.alloc_local((vecs_per_thread, regs), storage)
            xf = T.alloc_local((vec,), "float32")
            o_reg = T.alloc_local((out_vec,), out_storage)
            back = T.alloc_local((vec,), storage)
            amax = T.alloc_local((vecs_per_thread,), "float32")
            in_scale = T.alloc_local((vecs_per_thread,), "float32")
            group_inv = T.alloc_local((vecs_per_thread,), "float32")
            inv = T.alloc_var("float32")
            factor = T.alloc_var("float32")

            # Issue every load first so they are in flight together; vector u is row u // cols, column u % cols
            for u in T.unroll(vecs_per_thread):
                token = first_row + u // cols * slots
                col = (first_vec + u % cols * tpr) * vec
                if in_range(token):
                    for j in T.vectorized(regs):
                        x_reg[u, j] = x[token, col // per_storage + j]
                    if quantized_in:
                        in_scale[u] = common.decode_sf(x_sf[sf_in.index(token // bm, col // bk)], sf_in.kind)
                else:
                    for j in T.vectorized(regs):
                        x_reg[u, j] = T.Cast(storage, 0)
                    in_scale[u] = T.float32(0)

            if mode != "precomputed_sf":
                for u in T.unroll(vecs_per_thread):
                    if fp4_helpers:
                        amax[u] = fp4_words.absmax8(T.address_of(x_reg[u, 0]))
                    else:
                        amax[u] = T.float32(0)
                        for j in T.unroll(vec):
                            amax[u] = T.max(amax[u], T.abs(decode(x_reg, u, j)))
                    if quantized_in:
                        amax[u] = amax[u] * in_scale[u]
                # Every lane takes part in the shuffles (no divergence); groups are aligned runs of lanes
                for u in T.unroll(vecs_per_thread):
                    for s in T.unroll(lanes.bit_length() - 1):
                        amax[u] = T.max(amax[u], T.shfl_xor(amax[u], lanes >> (s + 1)))

            if one_scale:
                # Lane i of each group (i < vecs_per_thread) forms the scale of the group's vector i
                mine = tid % lanes
                picked = T.alloc_var("float32")
                picked = amax[0]
                for u in T.unroll(vecs_per_thread - 1):
                    picked = T.if_then_else(mine == u + 1, amax[u + 1], picked)
                stored, inv_value = common.scale_factor(picked, fmt, sf)
                inv = inv_value
                for u in T.unroll(vecs_per_thread):
                    group_inv[u] = T.shfl_sync(inv, u, lanes)
                token = first_row + mine // cols * slots
                col = (first_vec + mine % cols * tpr) * vec
                if mine < vecs_per_thread and in_range(token):
                    out_sf[sf_out.index(token, col // group)] = stored
                    if sf_out.pad > 0:
                        if col // group == num_groups - 1:
                            for p in T.unroll(sf_out.pad):
                                out_sf[sf_out.index(token, num_groups + p)] = T.uint8(0)

            for u in T.unroll(vecs_per_thread):
                token = first_row + u // cols * slots
                col = (first_vec + u % cols * tpr) * vec
                if in_range(token):
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
                            out_sf[sf_out.index(token, col // group)] = stored
                            if sf_out.pad > 0:
                                if col // group == num_groups - 1:
                                    for p in T.unroll(sf_out.pad):
                                        out_sf[sf_out.index(token, num_groups + p)] = T.uint8(0)
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
                                rbits = common.hash_u32(T.Cast("uint32", token * hidden + col + j), common.f32_bits(xf[j]))
                                xf[j] = common.with_sign_of(common.stochastic_round_magnitude(T.abs(xf[j]), rbits, fmt), xf[j])
                        store_encoded(xf, o_reg, out, token, col)

        return body

    cta_guarded, cta_full = cta(True), cta(False)

    @T.prim_func
    def per_token_cast(
        x: T.StridedTensor[(num_tokens, hidden // per_storage), (x_stride, 1), storage],
        x_sf: T.StridedTensor[sf_in.shape(in_sf_rows), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, out_cols), out_storage],
        out_sf: T.StridedTensor[sf_out.shape(num_tokens), (sf_stride, 1), sf_out.dtype],
    ):
        with T.Kernel(*tiling.grid(T.ceildiv(num_tokens, rows_per_cta), segs), threads=num_threads) as (gx, gy):
            T.import_source(PDL_SOURCE + (fp4_words.DEVICE_HELPERS if fp4_helpers else ""))  # one import a kernel
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(x_stride % (16 // storage_bytes) == 0)
            if full_tiles:
                T.annotate_min_blocks_per_sm(full_tiles)
                if (tiling.block(gx, gy, segs)[0] + 1) * rows_per_cta <= num_tokens:
                    cta_full(x, x_sf, out, out_sf)
                else:
                    cta_guarded(x, x_sf, out, out_sf)
            else:
                cta_guarded(x, x_sf, out, out_sf)

    return per_token_cast
