"""Declarations of the kernels behind tkaot.mhc (tkaot/_decl.py): Manifold-Constrained Hyper-Connections.

Every mHC kernel is specialised on the expansion rate `mhc` only (4 in DeepSeek's models): the token count,
the hidden size and the Sinkhorn repeat count are runtime values, so one variant serves every model of one
expansion rate. Activations are bf16 and mixes fp32, as in TileKernels, so there is no dtype axis.
"""

from __future__ import annotations

from tkaot._decl import Axis, KernelDecl

_M = "tkaot.mhc."
MAX_MHC = 8  # the widest expansion any kernel is written for (registers per thread grow as mhc**2)
MHC = Axis("mhc", int, check=lambda m: 1 <= m <= MAX_MHC, rule=f"an expansion rate in [1, {MAX_MHC}]")
ROWS = ("num_tokens", "hidden")

# ---- expand, pre-apply mix, post: streaming over (num_tokens, mhc, hidden) bf16 rows

EXPAND_FWD = KernelDecl(
    name="mhc_expand_fwd", source="kernels_src.mhc.expand_fwd", axes=(MHC,),
    params=("x", "o"), dims=ROWS, ops=(_M + "expand_to_mhc_fwd",),
)  # fmt: skip
EXPAND_BWD = KernelDecl(
    name="mhc_expand_bwd", source="kernels_src.mhc.expand_bwd", axes=(MHC,),
    params=("o_grad", "x_grad"), dims=ROWS, ops=(_M + "expand_to_mhc_bwd",),
)  # fmt: skip
PRE_APPLY_MIX_FWD = KernelDecl(
    name="mhc_pre_apply_mix_fwd", source="kernels_src.mhc.pre_apply_mix_fwd", axes=(MHC,),
    params=("x", "mix", "o"), dims=ROWS, ops=(_M + "mhc_pre_apply_mix_fwd",),
)  # fmt: skip
PRE_APPLY_MIX_BWD = KernelDecl(
    name="mhc_pre_apply_mix_bwd", source="kernels_src.mhc.pre_apply_mix_bwd", axes=(MHC,),
    params=("o_grad", "x", "mix", "x_grad", "mix_grad"), dims=ROWS, ops=(_M + "mhc_pre_apply_mix_bwd",),
)  # fmt: skip
POST_FWD = KernelDecl(
    name="mhc_post_fwd", source="kernels_src.mhc.post_fwd", axes=(MHC,),
    params=("comb_res_mix", "residual", "post_layer_mix", "x", "out"), dims=ROWS, ops=(_M + "mhc_post_fwd",),
)  # fmt: skip
POST_BWD = KernelDecl(
    name="mhc_post_bwd", source="kernels_src.mhc.post_bwd", axes=(MHC,),
    params=(
        "d_o", "comb_res_mix", "residual", "post_layer_mix", "x", "d_comb_res_mix", "d_residual", "d_post_layer_mix", "d_x",
    ),
    dims=ROWS, ops=(_M + "mhc_post_bwd",),
)  # fmt: skip

# ---- mixes: (num_tokens, mhc * (mhc + 2)) fp32 rows

SPLIT_MIXES_FWD = KernelDecl(
    name="mhc_split_mixes_fwd", source="kernels_src.mhc.split_mixes_fwd", axes=(MHC,),
    params=(
        "input_mixes", "mhc_scale", "mhc_base", "pre_layer_mix", "post_layer_mix", "comb_res_mix",
        "mhc_post_mult_value", "mhc_pre_eps",
    ),
    dims=("num_tokens",), ops=(_M + "mhc_pre_split_mixes_fwd",),
)  # fmt: skip
# Two launches, as the parameter gradients sum over every token: per-block partial sums, then their sum
SPLIT_MIXES_BWD = KernelDecl(
    name="mhc_split_mixes_bwd", source="kernels_src.mhc.split_mixes_bwd", axes=(MHC,),
    params=(
        "pre_layer_mix_grad", "post_layer_mix_grad", "comb_res_mix_grad", "input_mixes", "post_layer_mix", "mhc_scale",
        "mhc_base", "input_mixes_grad", "partials", "mhc_post_mult_value",
    ),
    dims=("num_tokens", "num_partials"), ops=(_M + "mhc_pre_split_mixes_bwd",),
)  # fmt: skip
SPLIT_MIXES_BWD_REDUCE = KernelDecl(
    name="mhc_split_mixes_bwd_reduce", source="kernels_src.mhc.split_mixes_bwd_reduce", axes=(MHC,),
    params=("partials", "mhc_scale_grad", "mhc_base_grad"), dims=("num_partials",), ops=(_M + "mhc_pre_split_mixes_bwd",),
)  # fmt: skip

# ---- Sinkhorn normalisation of (num_tokens, mhc, mhc) fp32 matrices; `repeat` is a runtime value

SINKHORN_FWD = KernelDecl(
    name="mhc_sinkhorn_fwd", source="kernels_src.mhc.sinkhorn_fwd", axes=(MHC,),
    params=("comb_res_mix", "comb_res_mix_out", "repeat", "eps"), dims=("num_tokens",), ops=(_M + "mhc_sinkhorn_fwd",),
)  # fmt: skip


def sinkhorn_record_row(mhc: int) -> int:
    """fp32 words of one step record of the Sinkhorn backward's scratch: the matrix and its sums, padded to 16 bytes."""
    return -(-(mhc * mhc + mhc) // 4) * 4


# The backward replays the forward, keeping every step's matrix and sums in `scratch`,
# (repeat, 2, num_tokens, sinkhorn_record_row(mhc)) fp32, allocated by the op
SINKHORN_BWD = KernelDecl(
    name="mhc_sinkhorn_bwd", source="kernels_src.mhc.sinkhorn_bwd", axes=(MHC,),
    params=("grad_output", "x", "grad_input", "scratch", "eps"), dims=("num_tokens", "repeat"), ops=(_M + "mhc_sinkhorn_bwd",),
)  # fmt: skip

KERNELS = (
    EXPAND_FWD, EXPAND_BWD, PRE_APPLY_MIX_FWD, PRE_APPLY_MIX_BWD, SPLIT_MIXES_FWD, SPLIT_MIXES_BWD, SPLIT_MIXES_BWD_REDUCE,
    SINKHORN_FWD, SINKHORN_BWD, POST_FWD, POST_BWD,
)  # fmt: skip
