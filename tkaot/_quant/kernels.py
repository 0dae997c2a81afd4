"""Declarations of the kernels behind tkaot.quant (tkaot/_decl.py): norm, SwiGLU, and the FP8/FP4 casts."""

from __future__ import annotations

from tkaot._decl import Axis, declarer, tiling_axis

_declare = declarer("", "tkaot.quant.")

_Q = "tkaot.quant."
MAX_CAST_HIDDEN = 65536
FLOAT_DTYPES = ("bfloat16", "float32")
# A quantized input's block (rows x columns sharing one sf) and its sf kind and layout; "none" for bf16/fp32 input
IN_BLOCKS = ("none", "1x16", "1x32", "1x64", "1x128", "32x32", "128x128")
# The blocks per_token_cast reads: those, and the other per-block cast blocks; cast_back's add per_channel_cast's
# (m x 1, UE8M0 packed four token blocks a word) (TileKernels takes any block dividing its tile)
TOKEN_IN_BLOCKS = (*IN_BLOCKS, "32x128", "128x32")
CAST_BACK_BLOCKS = (*TOKEN_IN_BLOCKS[1:], "32x1", "128x1")
IN_SF = ("none", "fp32", "fp32_col", "ue8m0", "ue8m0_col", "e4m3", "e4m3_col")
# Output sf kinds: fp32, fp32 powers of two, packed UE8M0 exponent bytes, E4M3
SF_KINDS = ("fp32", "pow2", "ue8m0", "e4m3")
# cast's dtypes (no FP8 to FP8: CUDA converts between the two FP8 formats through no instruction), and the pairs
# it can round stochastically
CAST_DTYPES = ("float32", "bfloat16", "float16", "e4m3", "e5m2")
STOCHASTIC_PAIRS = (("float32", "bfloat16"), ("float32", "e4m3"), ("bfloat16", "e4m3"))
LOSSLESS_OUT_BLOCKS = ("1x16", "1x32", "1x64", "1x128", "32x32", "32x128", "128x32", "128x128")


def _hidden(multiple: int, limit: int) -> Axis:
    return Axis("hidden", int, check=lambda h: 0 < h <= limit and h % multiple == 0, rule=f"a multiple of {multiple} in (0, {limit}]")


_BOOL = (False, True)

RMSNORM = _declare(
    "norm.rmsnorm",
    (_hidden(16, 8192), Axis("dtype", str, choices=FLOAT_DTYPES), Axis("with_weight", bool, choices=_BOOL),
        Axis("with_residual", bool, choices=_BOOL), Axis("with_rstd", bool, choices=_BOOL)),
    ("x", "weight", "residual", "out", "residual_out", "rstd", "eps", "out_scale"),
    ("batch", "num_tokens", "x_batch_stride", "x_stride", "residual_batch_stride", "residual_stride", "out_batch_stride", "out_stride",
        "residual_out_batch_stride", "residual_out_stride"),
    ("norm_forward",),
)  # fmt: skip
# Every row width norm_forward takes, one variant per dtype and flags: the calls whose specialised variant is not built
RMSNORM_GENERIC = RMSNORM.generic("rmsnorm_generic", "kernels_src.norm.rmsnorm_generic", ("hidden",))

# Tilings (kernels_src/fused/norm_cast.py): without a residual, 8 blocks an SM with the weight prefetched into L2;
# with one, a residual-specialised tiling (H200 8192x7168: 102.6-103.1 µs against 106.2-107.6, TileKernels 103.3-104.0)
NORM_CAST_TILINGS = {"default": "lean8nlbwdgw", "residual": "lean6plbwdgwRL"}
NORM_CAST = _declare(
    "fused.norm_cast",
    (_hidden(32, 8192), Axis("dtype", str, choices=FLOAT_DTYPES), Axis("sf", str, choices=SF_KINDS[:3]),
        tiling_axis(NORM_CAST_TILINGS)),
    ("x", "weight", "residual", "residual_out", "out", "out_sf", "out_bf16", "rstd", "eps", "out_scale", "has_weight", "has_residual",
        "has_rstd", "has_out_bf16"),
    ("batch", "num_tokens", "x_batch_stride", "x_stride", "residual_batch_stride", "residual_stride", "residual_out_batch_stride",
        "residual_out_stride", "out_batch_stride", "out_stride", "out_bf16_batch_stride", "out_bf16_stride", "sf_batch_stride",
        "sf_stride", "sf_group_stride"),
    ("norm_forward_and_per_token_cast",), tilings=NORM_CAST_TILINGS,
)  # fmt: skip
# Every row width norm_forward_and_per_token_cast takes, one variant per dtype, sf kind and tiling
NORM_CAST_GENERIC = NORM_CAST.generic("norm_cast_generic", "kernels_src.fused.norm_cast_generic", ("hidden",))

# Tilings (kernels_src/fused/swiglu.py): calls with a clamp_value take the one that clamps with NaN-propagating
# min / max and counts clamped elements only when asked (H200, weights + clamp: 25.6-25.8 µs against 30.8-31.2)
SWIGLU_TILINGS = {"default": "wscc2v9b1g", "clamp": "wscc2v9b1gkm"}
SWIGLU = _declare(
    "fused.swiglu",
    (_hidden(256, 32768), Axis("dtype", str, choices=FLOAT_DTYPES), Axis("fmt", str, choices=("bf16", "fp32", "e4m3")),
        Axis("group", int, choices=(0, 32, 128)), Axis("sf", str, choices=("none", "fp32", "pow2", "ue8m0")),
        tiling_axis(SWIGLU_TILINGS)),
    ("x", "out", "out_sf", "psum_num_tokens_per_expert", "topk_weights", "clamped_count", "has_psum", "alignment", "search_steps",
        "has_weights", "routed_scaling_factor", "has_clamp", "clamp_value", "count_clamp"),
    ("num_rows", "num_experts", "x_stride", "topk_weights_stride", "sf_stride", "sf_group_stride"),
    ("swiglu_forward", "swiglu_forward_and_per_token_cast"), tilings=SWIGLU_TILINGS,
)  # fmt: skip

# Every row width the SwiGLU ops take (a multiple of 64; the specialised tilings need 256) and either group, one
# variant per dtype, format, sf kind and tiling: the calls whose specialised variant is not built (tkaot/_op.py)
SWIGLU_GENERIC = SWIGLU.generic("swiglu_generic", "kernels_src.fused.swiglu_generic", ("hidden", "group"))

PER_TOKEN_CAST = _declare(
    "quant.per_token_cast",
    (_hidden(64, MAX_CAST_HIDDEN), Axis("in_dtype", str, choices=("bfloat16", "float32", "e4m3", "e2m1")),
        Axis("in_block", str, choices=TOKEN_IN_BLOCKS), Axis("in_sf", str, choices=IN_SF), Axis("fmt", str, choices=("e4m3", "e2m1")),
        Axis("group", int, choices=(16, 32, 64, 128)), Axis("sf", str, choices=SF_KINDS),
        Axis("sf_layout", str, choices=("row", "col")), Axis("mode", str, choices=("cast", "sf_only", "precomputed_sf", "round_trip")),
        Axis("stochastic", bool, choices=_BOOL)),
    ("x", "x_sf", "out", "out_sf"), ("num_tokens", "x_stride", "in_sf_stride", "sf_stride"),
    ("per_token_cast", "per_token_cast_with_sf_only", "per_token_cast_with_precomputed_sf", "per_token_cast_and_cast_back"),
    # a row that ends in a partial group (hidden a multiple of 64 only, as TileKernels takes it) is the generic kernel's
    specialisable=lambda v: v["hidden"] % v["group"] == 0,
)  # fmt: skip

# Every row width per_token_cast's options allow, one variant per combination of options: the calls whose
# specialised variant is not built (tkaot/_op.py)
PER_TOKEN_CAST_GENERIC = PER_TOKEN_CAST.generic("per_token_cast_generic", "kernels_src.quant.per_token_cast_generic", ("hidden",))

PER_BLOCK_CAST = _declare(
    "quant.per_block_cast",
    (_hidden(128, MAX_CAST_HIDDEN), Axis("in_dtype", str, choices=FLOAT_DTYPES), Axis("fmt", str, choices=("e4m3", "e2m1")),
        Axis("block_m", int, choices=(32, 128)), Axis("block_k", int, choices=(32, 128)), Axis("sf", str, choices=SF_KINDS[:3]),
        Axis("sf_layout", str, choices=("row", "col")), Axis("mode", str, choices=("cast", "sf_only", "precomputed_sf"))),
    ("x", "out", "out_sf"), ("num_tokens", "sf_stride"),
    ("per_block_cast", "per_block_cast_with_sf_only", "per_block_cast_with_precomputed_sf"),
)  # fmt: skip

# Every row width, block and sf layout per_block_cast takes, one variant per dtype, format, sf kind and mode: the calls
# whose specialised variant is not built (tkaot/_op.py)
PER_BLOCK_CAST_GENERIC = PER_BLOCK_CAST.generic(
    "per_block_cast_generic", "kernels_src.quant.per_block_cast_generic", ("hidden", "block_m", "block_k", "sf_layout")
)

PER_CHANNEL_CAST = _declare(
    "quant.per_channel_cast",
    (_hidden(128, MAX_CAST_HIDDEN), Axis("in_dtype", str, choices=("bfloat16", "float32", "e4m3")),
        Axis("in_block", str, choices=("none", "1x32", "1x128")), Axis("in_sf", str, choices=IN_SF),
        Axis("block_m", int, choices=(32, 128)), Axis("sf", str, choices=SF_KINDS[:3])),
    ("x", "x_sf", "out", "out_sf"), ("num_tokens", "in_sf_stride"), ("per_channel_cast",),
)  # fmt: skip

# Every row width, token block and input scale block per_channel_cast takes, one variant per input dtype, input sf
# and sf kind (tkaot/_op.py's fallback)
PER_CHANNEL_CAST_GENERIC = PER_CHANNEL_CAST.generic(
    "per_channel_cast_generic", "kernels_src.quant.per_channel_cast_generic", ("hidden", "in_block", "block_m")
)

CAST = _declare(
    "quant.cast",
    (Axis("in_dtype", str, choices=CAST_DTYPES), Axis("out_dtype", str, choices=CAST_DTYPES), Axis("stochastic", bool, choices=_BOOL)),
    ("x", "y"), ("n",), ("cast",),
)  # fmt: skip

CAST_BACK = _declare(
    "quant.cast_back",
    (_hidden(64, MAX_CAST_HIDDEN), Axis("in_dtype", str, choices=("e4m3", "e2m1")), Axis("in_block", str, choices=CAST_BACK_BLOCKS),
        Axis("in_sf", str, choices=IN_SF[1:]), Axis("out_dtype", str, choices=FLOAT_DTYPES)),
    ("x", "x_sf", "out"), ("num_tokens", "x_stride", "sf_stride"), ("cast_back", "per_token_cast_back"),
)  # fmt: skip
# Every row width, one variant per combination of options (tkaot/_op.py's fallback)
CAST_BACK_GENERIC = CAST_BACK.generic("cast_back_generic", "kernels_src.quant.cast_back_generic", ("hidden",))

PER_BLOCK_CAST_LOSSLESS = _declare(
    "quant.per_block_cast_lossless",
    (_hidden(128, MAX_CAST_HIDDEN), Axis("in_block", str, choices=IN_BLOCKS[1:]),
        Axis("in_sf", str, choices=("fp32", "fp32_col", "ue8m0", "ue8m0_col")), Axis("out_block", str, choices=LOSSLESS_OUT_BLOCKS),
        Axis("sf", str, choices=("pow2", "ue8m0")), Axis("sf_layout", str, choices=("row", "col"))),
    ("x", "x_sf", "out", "out_sf"), ("num_tokens", "x_stride", "in_sf_stride", "sf_stride"), ("per_block_cast_lossless",),
)  # fmt: skip

# Every row width, input and output block and output sf layout, one variant per input sf and output sf kind
PER_BLOCK_CAST_LOSSLESS_GENERIC = PER_BLOCK_CAST_LOSSLESS.generic(
    "per_block_cast_lossless_generic",
    "kernels_src.quant.per_block_cast_lossless_generic",
    ("hidden", "in_block", "out_block", "sf_layout"),
)

BATCHED_TRANSPOSE_WEIGHT_SF = _declare(
    "quant.batched_transpose_weight_sf", (Axis("block_size", int, choices=(32, 128)),), ("sf", "sf0", "sf1"),
    ("num_groups", "num_sf_n", "num_sf_k"), ("batched_transpose_weight_sf",),
)  # fmt: skip

# ---- Backward (training) kernels: RMSNorm backward and SwiGLU backward (+ per-token FP8 cast).
# Row widths are runtime values where that costs nothing measurable: the variants differ only in dtypes and formats.

# RMSNorm backward, pass 1 (kernels_src/norm/rmsnorm_backward.py): x_grad, and one fp32 partial weight gradient
# a block; pass 2 (kernels_src/norm/weight_grad_reduce.py) sums the partials into weight_grad. Pass 1's tiling is
# here, where the op reads it too (it sizes the grid): a block of 256 threads holds 256 // row_threads rows.
NORM_BACKWARD_THREADS = 256
NORM_BACKWARD_MAX_BLOCKS = 132  # 1 block on each of an H200's 132 SMs (its staged rows take most of the shared memory)
# The most 16-byte vectors a thread holds of a row (but at 256 threads a row: fp32 8192 takes 8): x, out_grad and the
# weight stay in registers (<= 255 a thread at one block an SM), and the rows get as few threads as that allows
# (bf16 7168: 128 threads, 2 rows a block), so more rows are in flight at a time and each row's reduction spans
# fewer warps. 8 spills bf16 8192 (216 bytes at 255 registers). Before: 2 (256 threads a row at 7168, 4 vectors,
# 2 blocks an SM; 109.5 µs on the H200 against TileKernels' 96.7).
NORM_BACKWARD_MAX_VECTORS = 7


def norm_backward_tiling(hidden: int, dtype: str, max_vectors: int = NORM_BACKWARD_MAX_VECTORS) -> tuple[int, int, int]:
    """(elements per 16-byte vector, threads per row, vectors per thread): at most max_vectors vectors a thread
    (while a row takes fewer than 256 threads), a row in 8 to 256 threads."""
    vec = 16 // (2 if dtype == "bfloat16" else 4)
    num_vecs = -(-hidden // vec)
    row_threads = 8
    while row_threads < NORM_BACKWARD_THREADS and -(-num_vecs // row_threads) > max_vectors:
        row_threads *= 2
    return vec, row_threads, -(-num_vecs // row_threads)


# rmsnorm_backward_plain's block (kernels_src/norm/rmsnorm_backward_plain.py): where a row takes 128 threads and at
# most this many vectors a thread (bf16 4096 and 5120), one row slot of 128 threads at 2 blocks an SM (the same rows
# in flight on each SM as two slots a block of 256, each block its own row count with no row checks); wider rows keep
# two slots. H200, 8192 tokens, bf16, µs, two slots / one / TileKernels: 4096 51.04 / 48.40 / 49.07, 5120 64.39 /
# 60.74 / 62.35, 7168 (7 vectors) 91.73 / 94.04 / 91.78 (f014b86:bench/results/2026-12-03-H200-s19-tune_normbwd12.log).
NORM_BACKWARD_PLAIN_ONE_SLOT_VECTORS = 5


def norm_backward_plain_block(hidden: int, dtype: str) -> tuple[int, int]:
    """(threads a block, most blocks a grid) of rmsnorm_backward_plain at this width."""
    _, row_threads, vectors = norm_backward_tiling(hidden, dtype)
    if row_threads == 128 and vectors <= NORM_BACKWARD_PLAIN_ONE_SLOT_VECTORS:
        return 128, 2 * NORM_BACKWARD_MAX_BLOCKS
    return NORM_BACKWARD_THREADS, NORM_BACKWARD_MAX_BLOCKS


RMSNORM_BACKWARD = _declare(
    "norm.rmsnorm_backward", (_hidden(32, 8192), Axis("dtype", str, choices=FLOAT_DTYPES)),
    ("out_grad", "x", "weight", "rstd", "residual_out_grad", "x_grad", "partials", "out_scale", "has_weight", "has_residual"),
    ("num_tokens", "num_blocks", "out_grad_stride", "x_stride", "residual_out_grad_stride"), ("norm_backward",),
)  # fmt: skip
# Every row width norm_backward takes, one variant per dtype: the calls whose specialised variant is not built
RMSNORM_BACKWARD_GENERIC = RMSNORM_BACKWARD.generic("rmsnorm_backward_generic", "kernels_src.norm.rmsnorm_backward_generic", ("hidden",))
# The specialised kernel with a body for the calls with a residual gradient (the op launches it for those where it
# is built, else rmsnorm_backward; kernels_src/norm/rmsnorm_backward_residual.py)
RMSNORM_BACKWARD_RESIDUAL = _declare(
    "norm.rmsnorm_backward_residual", RMSNORM_BACKWARD.axes, RMSNORM_BACKWARD.params, RMSNORM_BACKWARD.dims, ("norm_backward",),
)  # fmt: skip
# The specialised kernel with a body for the calls with neither a weight nor a residual gradient (launched for those
# where it is built; kernels_src/norm/rmsnorm_backward_plain.py)
RMSNORM_BACKWARD_PLAIN = _declare(
    "norm.rmsnorm_backward_plain", RMSNORM_BACKWARD.axes, RMSNORM_BACKWARD.params, RMSNORM_BACKWARD.dims, ("norm_backward",),
)  # fmt: skip
WEIGHT_GRAD_REDUCE = _declare(
    "norm.weight_grad_reduce", (Axis("dtype", str, choices=FLOAT_DTYPES),), ("partials", "weight_grad", "accumulate"),
    ("num_partials", "hidden"), ("norm_backward",),
)  # fmt: skip

# SwiGLU backward; x is bf16 / fp32, or E4M3 with fp32 per-group sf (then the group is the output's too)
SWIGLU_BACKWARD = _declare(
    "fused.swiglu_backward",
    (Axis("x_dtype", str, choices=("bfloat16", "float32", "e4m3")), Axis("grad_dtype", str, choices=FLOAT_DTYPES),
        Axis("fmt", str, choices=("bf16", "fp32", "e4m3")), Axis("group", int, choices=(0, 32, 128)),
        Axis("sf", str, choices=("none", "fp32", "pow2", "ue8m0"))),
    ("x", "x_sf", "act_x_grad", "topk_weights", "psum_num_tokens_per_expert", "x_grad", "x_grad_fp8", "x_grad_sf", "weight_grad",
        "act_out", "has_psum", "alignment", "search_steps", "has_weights", "routed_scaling_factor", "has_clamp", "clamp_value",
        "recompute"),
    ("num_rows", "hidden", "num_experts", "x_sf_stride", "sf_stride", "sf_group_stride"),
    ("swiglu_backward", "swiglu_backward_and_per_token_cast"),
)  # fmt: skip

BACKWARD_KERNELS = (
    RMSNORM_BACKWARD,
    RMSNORM_BACKWARD_GENERIC,
    RMSNORM_BACKWARD_RESIDUAL,
    RMSNORM_BACKWARD_PLAIN,
    WEIGHT_GRAD_REDUCE,
    SWIGLU_BACKWARD,
)
# ---- end of the backward kernels

KERNELS = (
    RMSNORM, RMSNORM_GENERIC, NORM_CAST, NORM_CAST_GENERIC, SWIGLU, SWIGLU_GENERIC, PER_TOKEN_CAST, PER_TOKEN_CAST_GENERIC,
    PER_BLOCK_CAST, PER_BLOCK_CAST_GENERIC, PER_CHANNEL_CAST, PER_CHANNEL_CAST_GENERIC, CAST, CAST_BACK, CAST_BACK_GENERIC,
    PER_BLOCK_CAST_LOSSLESS, PER_BLOCK_CAST_LOSSLESS_GENERIC, BATCHED_TRANSPOSE_WEIGHT_SF,
    *BACKWARD_KERNELS,
)  # fmt: skip
