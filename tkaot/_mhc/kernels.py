"""Declarations of the kernels behind tkaot.mhc (tkaot/_decl.py): Manifold-Constrained Hyper-Connections.

The expansion rate (`mhc_mult`, 4 in DeepSeek's models) is a static axis only where a kernel keeps an
(mhc_mult x ...) tile in registers (expand, pre-apply mix, split mixes, Sinkhorn and post all do), and the only
one but for the pre-apply mix backward's tiling; hidden size, token count, split count, Sinkhorn repeats,
partial-row count (`num_sms`) and layer count are runtime values, so one cubin serves every GPU of an arch and
every model of one expansion rate. Activations are bf16 and mixes fp32, as in TileKernels.
"""

from __future__ import annotations

from tkaot._decl import Axis, declarer, tiling_axis

_declare = declarer("mhc_", "tkaot.mhc.")

# Partial sums of the head-mix backward are reduced by a butterfly over one block: a power of two up to its width
HEAD_MIX_BWD_THREADS = 128
# Sinkhorn on one warp, one matrix element a lane
MAX_BIG_FUSE_MULT = 4
MAX_RECOMPUTE_MULT = 8


def _power_of_two(limit: int) -> Axis:
    return Axis(
        "mhc_mult", int, check=lambda m: 1 <= m <= limit and m & (m - 1) == 0,
        rule=f"a power of two in [1, {limit}]",
    )  # fmt: skip


# ---- mhc_head_compute_mix_fwd / _bwd (tkaot/_mhc/head_mix.py)

HEAD_MIX_FWD = _declare(
    "mhc.head_mix_fwd", (Axis("dtype", str, choices=("float32",)),),
    ("input_mix", "mhc_scale", "mhc_base", "output_mix", "mhc_pre_eps"), ("num_tokens", "mhc_mult"), ("mhc_head_compute_mix_fwd",),
)  # fmt: skip

HEAD_MIX_BWD = _declare(
    "mhc.head_mix_bwd", (Axis("dtype", str, choices=("float32",)),),
    ("output_mix_grad", "input_mix", "mhc_scale", "mhc_base", "input_mix_grad", "mhc_scale_grad_partial", "mhc_base_grad_partial",
        "token_block_size"),
    ("num_tokens", "mhc_mult", "num_sms"), ("mhc_head_compute_mix_bwd",),
)  # fmt: skip

# ---- mhc_fn_normw_merge_fwd / _bwd, mhc_reduce_partials_and_rmsnorm_fwd / _bwd (tkaot/_mhc/norm_fn.py)

NORMW_MERGE_FWD = _declare(
    "mhc.normw_merge_fwd", (Axis("dtype", str, choices=("float32",)),), ("fn", "normw", "out_fn"), ("m", "n"),
    ("mhc_fn_normw_merge_fwd",),
)  # fmt: skip

NORMW_MERGE_BWD = _declare(
    "mhc.normw_merge_bwd", (Axis("dtype", str, choices=("float32",)),), ("fn", "normw", "out_fn_grad", "fn_grad", "normw_grad"),
    ("m", "n"), ("mhc_fn_normw_merge_bwd",),
)  # fmt: skip

REDUCE_PARTIALS_FWD = _declare(
    "mhc.reduce_partials_fwd", (Axis("dtype", str, choices=("float32",)),),
    ("out_mul_splitted", "sqrsum_splitted", "out_mul", "sqrsum", "out", "rms_group_size", "rms_eps"),
    ("n_splits", "num_tokens", "n_rms_group", "mhc_mult3"), ("mhc_reduce_partials_and_rmsnorm_fwd",),
)  # fmt: skip

REDUCE_PARTIALS_BWD = _declare(
    "mhc.reduce_partials_bwd", (Axis("dtype", str, choices=("float32",)),),
    ("out_grad", "out_mul", "sqrsum", "out_mul_grad", "sqrsum_grad", "rms_group_size", "rms_eps", "rms_eps_sum"),
    ("num_tokens", "n_rms_group", "mhc_mult3"), ("mhc_reduce_partials_and_rmsnorm_bwd",),
)  # fmt: skip

# ---- mhc_pre_big_fuse_fwd (tkaot/_mhc/big_fuse.py)

PRE_BIG_FUSE = _declare(
    "mhc.pre_big_fuse", (_power_of_two(MAX_BIG_FUSE_MULT),),
    ("gemm_out_mul", "gemm_out_sqrsum", "mhc_scale", "mhc_base", "residual", "post_mix", "comb_mix", "layer_input", "rms_eps",
        "mhc_pre_eps", "mhc_sinkhorn_eps", "mhc_post_mult_value", "sinkhorn_repeat"),
    ("n_splits", "num_tokens", "hidden"), ("mhc_pre_big_fuse_fwd",),
)  # fmt: skip
# The same step on several blocks a token, for few tokens (the op chooses by token count; tkaot/_mhc/big_fuse.py)
PRE_BIG_FUSE_SPLIT = _declare(
    "mhc.pre_big_fuse_split", PRE_BIG_FUSE.axes, PRE_BIG_FUSE.params, PRE_BIG_FUSE.dims, ("mhc_pre_big_fuse_fwd",),
)  # fmt: skip

# ---- mhc_multilayer_recompute (tkaot/_mhc/recompute.py)

MULTILAYER_RECOMPUTE = _declare(
    "mhc.multilayer_recompute",
    (Axis("mhc_mult", int, check=lambda m: 1 <= m <= MAX_RECOMPUTE_MULT, rule=f"in [1, {MAX_RECOMPUTE_MULT}]"),),
    ("initial_residual", "pointer_table", "num_layers", "num_post"), ("num_tokens", "hidden", "table_size"),
    ("mhc_multilayer_recompute",),
)  # fmt: skip


def recompute_mix_piece(mhc_mult: int) -> int:
    """fp32 elements one cp.async of the recompute kernel moves of a mix row (M fp32): 4 (16 bytes) where the row is
    made of such pieces, else 1; the op asks the mix tensors' addresses to be multiples of its bytes (4 * this)."""
    return 4 if mhc_mult % 4 == 0 else 1


_M = "tkaot.mhc."
MAX_MHC = 8  # the widest expansion these kernels are written for (registers per thread grow as mhc_mult**2)
MHC = Axis("mhc_mult", int, check=lambda m: 1 <= m <= MAX_MHC, rule=f"an expansion rate in [1, {MAX_MHC}]")
ROWS = ("num_tokens", "hidden")

# ---- expand, pre-apply mix, post (tkaot/_mhc/expand.py, pre_apply_mix.py, post.py): streaming over
# (num_tokens, mhc_mult, hidden) bf16 rows

EXPAND_FWD = _declare("mhc.expand_fwd", (MHC,), ("x", "o"), ROWS, ("expand_to_mhc_fwd",))  # fmt: skip
EXPAND_BWD = _declare("mhc.expand_bwd", (MHC,), ("o_grad", "x_grad"), ROWS, ("expand_to_mhc_bwd",))  # fmt: skip
PRE_APPLY_MIX_FWD = _declare("mhc.pre_apply_mix_fwd", (MHC,), ("x", "mix", "o"), ROWS, ("mhc_pre_apply_mix_fwd",))  # fmt: skip
# Pre-apply mix backward (kernels_src/mhc/pre_apply_mix_bwd.py, "u<vectors>": the loads of that many of a thread's
# 16-byte vectors issued before the first is computed). u3 (151 registers, 3 blocks an SM) on the H200 at 8192 tokens
# x 4 streams against TileKernels (bench/results/2026-12-03-H200-s20-bench-at-e36d45b.log): 353.87 / 355.19 µs at
# hidden 7168, 202.31 / 205.52 at 4096, 128.68 / 127.63 at 2560, 58.95 / 52.91 at 1024; u1 (75 registers, 6 blocks an
# SM) 361.34 at 7168 (f014b86:bench/results/2026-12-03-H200-s20-tune_ceiling1.log). As the op launches them
# (bench/results/2026-12-03-H200-s21-bench-pamnarrow-at-551a9d4.log): u3 356.70 / 357.31 at 7168, 203.27 / 205.09 at
# 4096; u1 127.93 / 128.24 at 2560, 52.23 / 53.01 at 1024
PRE_APPLY_MIX_BWD_TILINGS = {"default": "u3", "narrow": "u1"}
PRE_APPLY_MIX_BWD_NARROW_HIDDEN = 4096  # below it the op takes u1: u3 ran 1.114x TileKernels at 1024, 1.008x at 2560


def pre_apply_mix_bwd_tiling(hidden: int) -> str:
    """The tiling the pre-apply mix backward takes for rows of `hidden` (the op, the model shape sets and the tests
    ask here; both values are read at the call, so a tuning harness can move them)."""
    return PRE_APPLY_MIX_BWD_TILINGS["narrow" if hidden < PRE_APPLY_MIX_BWD_NARROW_HIDDEN else "default"]


PRE_APPLY_MIX_BWD = _declare(
    "mhc.pre_apply_mix_bwd", (MHC, tiling_axis(PRE_APPLY_MIX_BWD_TILINGS)), ("o_grad", "x", "mix", "x_grad", "mix_grad"), ROWS,
    ("mhc_pre_apply_mix_bwd",), tilings=PRE_APPLY_MIX_BWD_TILINGS,
)  # fmt: skip
POST_FWD = _declare(
    "mhc.post_fwd", (MHC,), ("comb_res_mix", "residual", "post_layer_mix", "x", "out"), ROWS, ("mhc_post_fwd",),
)  # fmt: skip
POST_BWD = _declare(
    "mhc.post_bwd", (MHC,),
    ("d_o", "comb_res_mix", "residual", "post_layer_mix", "x", "d_comb_res_mix", "d_residual", "d_post_layer_mix", "d_x"), ROWS,
    ("mhc_post_bwd",),
)  # fmt: skip

# ---- split mixes (tkaot/_mhc/split_mixes.py): (num_tokens, mhc_mult * (mhc_mult + 2)) fp32 rows

SPLIT_MIXES_FWD = _declare(
    "mhc.split_mixes_fwd", (MHC,),
    ("input_mixes", "mhc_scale", "mhc_base", "pre_layer_mix", "post_layer_mix", "comb_res_mix", "mhc_post_mult_value", "mhc_pre_eps"),
    ("num_tokens",), ("mhc_pre_split_mixes_fwd",),
)  # fmt: skip
# Two launches, as the parameter gradients sum over every token: per-block partial sums, then their sum
SPLIT_MIXES_BWD = _declare(
    "mhc.split_mixes_bwd", (MHC,),
    ("pre_layer_mix_grad", "post_layer_mix_grad", "comb_res_mix_grad", "input_mixes", "post_layer_mix", "mhc_scale", "mhc_base",
        "input_mixes_grad", "partials", "mhc_post_mult_value"),
    ("num_tokens", "num_partials"), ("mhc_pre_split_mixes_bwd",),
)  # fmt: skip
SPLIT_MIXES_BWD_REDUCE = _declare(
    "mhc.split_mixes_bwd_reduce", (MHC,), ("partials", "mhc_scale_grad", "mhc_base_grad"), ("num_partials",),
    ("mhc_pre_split_mixes_bwd",),
)  # fmt: skip

# ---- Sinkhorn (tkaot/_mhc/sinkhorn.py) of (num_tokens, mhc_mult, mhc_mult) fp32 matrices; `repeat` at run time

SINKHORN_FWD = _declare(
    "mhc.sinkhorn_fwd", (MHC,), ("comb_res_mix", "comb_res_mix_out", "repeat", "eps"), ("num_tokens",), ("mhc_sinkhorn_fwd",),
)  # fmt: skip


def sinkhorn_record_row(mhc_mult: int) -> int:
    """fp32 words of one step record of the Sinkhorn backward's scratch: the matrix and its sums, padded to 16 bytes."""
    return -(-(mhc_mult * mhc_mult + mhc_mult) // 4) * 4


# The backward replays the forward, keeping every step's matrix and sums in `scratch`,
# (repeat, 2, num_tokens, sinkhorn_record_row(mhc_mult)) fp32, allocated by the op (the CUDA kernel for
# mhc_mult <= 5 keeps the steps of up to 20 repeats in shared memory instead)
SINKHORN_BWD = _declare(
    "mhc.sinkhorn_bwd", (MHC,), ("grad_output", "x", "grad_input", "scratch", "eps"), ("num_tokens", "repeat"), ("mhc_sinkhorn_bwd",),
)  # fmt: skip

KERNELS = (
    HEAD_MIX_FWD, HEAD_MIX_BWD, NORMW_MERGE_FWD, NORMW_MERGE_BWD, REDUCE_PARTIALS_FWD, REDUCE_PARTIALS_BWD,
    PRE_BIG_FUSE, PRE_BIG_FUSE_SPLIT, MULTILAYER_RECOMPUTE,
    EXPAND_FWD, EXPAND_BWD, PRE_APPLY_MIX_FWD, PRE_APPLY_MIX_BWD, SPLIT_MIXES_FWD, SPLIT_MIXES_BWD, SPLIT_MIXES_BWD_REDUCE,
    SINKHORN_FWD, SINKHORN_BWD, POST_FWD, POST_BWD,
)  # fmt: skip
