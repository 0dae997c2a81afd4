"""Per-token cast to FP8 E4M3 or FP4 E2M1 with one scale factor per `group` channels of a row.

One pass over the input: a CTA takes a few tokens by one segment of their row
(see tiling.RowTiling); each thread holds its 16-byte input vectors (fewer bytes
when a group or an input scale block is smaller) in registers and casts them as
per_token_vectors.cast_vectors does: all loads issued before any math; the lanes
that share a group reduce its amax with warp shuffles, then each lane scales,
rounds and stores its own elements and one lane stores the group's scale factor
(with tiling.one_scale, lane i of a group forms the scale of the group's vector i
and the others fetch it with a shuffle). Addresses are constant offsets plus a
multiple of the row stride, and one cubin serves every token count.

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

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common, fp4_words
from kernels_src.quant.per_token_vectors import VectorCast, cast_vectors, fp4_words_fit, vector_elems
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
    if tiling is None:
        if fp4_path_applies(in_dtype, fmt, group, sf, mode, stochastic):
            tiling = TILING_E2M1_BF16
        else:
            tiling = TILING_E2M1 if fmt == "e2m1" else TILING
    vec = vector_elems(in_dtype, in_block, group, tiling.vec_bytes)
    vecs_per_row = hidden // vec
    if vecs_per_row % tiling.cols:
        tiling = replace(tiling, rows=tiling.rows * tiling.cols, cols=1)
    num_threads, rows, cols = tiling.threads, tiling.rows, tiling.cols
    tpr = tiling.threads_per_row(vecs_per_row, group // vec)
    slots = num_threads // tpr
    segs = vecs_per_row // (tpr * cols)
    rows_per_cta = slots * rows
    # tiling.fp4: eight bf16 values to one word of codes by the fp4_words helpers (amax and cast), and a CTA whose
    # tokens are all in range checking none (one CTA-uniform branch; registers capped at 64)
    full_tiles = 65536 // (64 * num_threads) if tiling.fp4 else 0  # CTAs an SM must hold: 64 registers a thread
    if tiling.fp4 and not fp4_words_fit(in_dtype, fmt, vec, mode, stochastic):
        raise ValueError(f"{DECL.name}: tiling {tiling} casts bf16 to e2m1 in 8-element vectors with mode=cast, stochastic=false")
    c = VectorCast(
        in_dtype=in_dtype, in_block=in_block, in_sf=in_sf, fmt=fmt, group=group, sf=sf, sf_layout=sf_layout, mode=mode,
        stochastic=stochastic, hidden=hidden, vec=vec, count=rows * cols, one_scale=tiling.one_scale, fp4_helpers=tiling.fp4,
    )  # fmt: skip

    num_tokens = T.dynamic("num_tokens")
    x_stride = T.dynamic("x_stride")
    sf_stride = T.dynamic("sf_stride")
    in_sf_stride = T.dynamic("in_sf_stride")
    bm = c.block[0]
    in_sf_rows = num_tokens if bm == 1 else (num_tokens + bm - 1) // bm

    def cta(guarded: bool):
        """The body of one CTA; guarded=False: every token of the CTA is in range, so no token is checked."""

        def in_range(token):
            return token < num_tokens if guarded else True

        def placed(first_row, first_vec):
            """Where the thread's vector u lies: row u // cols, column u % cols of its rows x cols vectors."""
            return lambda u: (first_row + u // cols * slots, (first_vec + u % cols * tpr) * vec)

        @T.macro
        def body(x, x_sf, out, out_sf):
            tid = T.get_thread_binding()
            first_row, first_vec = tiling.origin(T.get_block_binding(0), T.get_block_binding(1), tid, tpr, segs)
            cast_vectors(c, x, x_sf, out, out_sf, tid, placed(first_row, first_vec), in_range)

        return body

    cta_guarded, cta_full = cta(True), cta(False)

    @T.prim_func
    def per_token_cast(
        x: T.StridedTensor[(num_tokens, hidden // c.per_storage), (x_stride, 1), c.storage],
        x_sf: T.StridedTensor[c.sf_in.shape(in_sf_rows), (in_sf_stride, 1), c.sf_in.dtype],
        out: T.Tensor[(num_tokens, c.out_cols), c.out_storage],
        out_sf: T.StridedTensor[c.sf_out.shape(num_tokens), (sf_stride, 1), c.sf_out.dtype],
    ):
        with T.Kernel(*tiling.grid(T.ceildiv(num_tokens, rows_per_cta), segs), threads=num_threads) as (gx, gy):
            kernel_entry(fp4_words.DEVICE_HELPERS if tiling.fp4 else "")  # kernels_src/pdl.py: before any memory access
            T.assume(x_stride % (16 // c.storage_bytes) == 0)
            if full_tiles:
                T.annotate_min_blocks_per_sm(full_tiles)
                if (tiling.block(gx, gy, segs)[0] + 1) * rows_per_cta <= num_tokens:
                    cta_full(x, x_sf, out, out_sf)
                else:
                    cta_guarded(x, x_sf, out, out_sf)
            else:
                cta_guarded(x, x_sf, out, out_sf)

    return per_token_cast
