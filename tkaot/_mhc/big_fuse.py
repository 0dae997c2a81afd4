"""tkaot.mhc.mhc_pre_big_fuse_fwd: mHC's pre-layer step in one kernel (the one whose JIT compile serving engines
feel most): mixes from the split-K GEMM partials, RMSNorm, pre / post / comb split, Sinkhorn, pre mix applied."""

from __future__ import annotations

import torch

from tkaot._compile import allocates_nothing, compiler, is_dynamo_compiling, traced
from tkaot._mhc.common import BF16, MAX_I24, f32, float_rule, int_rules
from tkaot._mhc.kernels import MAX_BIG_FUSE_MULT, PRE_BIG_FUSE, PRE_BIG_FUSE_SPLIT
from tkaot._op import OpKernels, current_stream, op_parts
from tkaot._validate import Rule, Signature, Tensor
from tkaot.errors import VariantNotBuilt

__all__ = ["mhc_pre_big_fuse_fwd"]

RATES = tuple(m for m in range(1, MAX_BIG_FUSE_MULT + 1) if PRE_BIG_FUSE.axis("mhc_mult").allows(m))
_VEC = 8  # bf16 elements the kernel moves at once (16 bytes)
_RESIDUAL = "f'shape {tuple(h_residual)}'"
# Up to this many tokens the split kernel (several blocks a token) runs where it is built, else the one-block kernel
# (H200, 4 x 7168, 16 splits, 20 repeats, split / one-block us: 4.89 / 5.34 at 1 token, 5.97 / 6.68 at 32, 6.70 / 7.00
# at 64, 7.80 / 7.63 at 128; 208.24 / 140.92 at 8192: f014b86:bench/results/2026-12-02-H200-s15-tune_mhc7.log)
SPLIT_MAX_TOKENS = 64
_MAX_GRID_Y = 65535  # the split kernel's tokens are its grid's y index
if not 0 <= SPLIT_MAX_TOKENS <= _MAX_GRID_Y:
    raise ValueError(f"SPLIT_MAX_TOKENS={SPLIT_MAX_TOKENS} must be in [0, {_MAX_GRID_Y}] (the split kernel's grid y)")

SIGNATURE = Signature(
    "tkaot.mhc.mhc_pre_big_fuse_fwd",
    tensors=(
        f32("gemm_out_mul", ("n_splits", "num_tokens", "mhc_mult3"), what="3-D (n_splits, num_tokens, mhc_mult * (mhc_mult + 2))"),
        f32("gemm_out_sqrsum", ("n_splits", "num_tokens")),
        f32("mhc_scale", (3,)),
        f32("mhc_base", ("mhc_mult3",)),
        Tensor("residual", (BF16,), (("num_tokens", "mhc_mult", "hidden"),), layout="contiguous", align=16,
               what="3-D (num_tokens, mhc_mult, hidden)"),
        f32("post_mix", ("num_tokens", "mhc_mult")),
        f32("comb_mix", ("num_tokens", "mhc_mult2"), what="2-D (num_tokens, mhc_mult * mhc_mult)"),
        Tensor("layer_input", (BF16,), (("num_tokens", "hidden"),), layout="contiguous", align=16),
    ),
    scalars=("rms_eps", "mhc_pre_eps", "mhc_sinkhorn_eps", "mhc_post_mult_value", "sinkhorn_repeat", "n_splits"),
    dims=("num_tokens", "mhc_mult", "hidden"),
    rules=(
        *int_rules("n_splits", "1", "_MAX_I32", after="gemm_out_mul.shape"),
        Rule("residual", "mhc_mult in _RATES",
             "of mhc_mult (dim 1) one of {_RATES} (the rates this kernel builds for)", actual=_RESIDUAL, after="residual"),
        Rule("residual", f"hidden % {_VEC} == 0 and 0 < mhc_mult * hidden <= {MAX_I24}",
             f"of a hidden size that is a multiple of {_VEC}, with mhc_mult * hidden at most 2**24", actual=_RESIDUAL, after="residual"),
        Rule("gemm_out_mul", "mhc_mult3 == mhc_mult * (mhc_mult + 2)",
             "of last dimension mhc_mult * (mhc_mult + 2) = {mhc_mult * (mhc_mult + 2)}",
             actual="f'shape {tuple(h_gemm_out_mul)}'", after="residual"),
        Rule("comb_mix", "mhc_mult2 == mhc_mult * mhc_mult", "of shape ({num_tokens}, {mhc_mult * mhc_mult})",
             actual="f'shape {tuple(h_comb_mix)}'", after="comb_mix"),
        float_rule("rms_eps"), float_rule("mhc_pre_eps"), float_rule("mhc_sinkhorn_eps"), float_rule("mhc_post_mult_value"),
        *int_rules("sinkhorn_repeat", "0", "_MAX_I32"),
    ),
    env={"_RATES": RATES},
)  # fmt: skip

[(_check, _FUSE)] = op_parts(globals(), (SIGNATURE, PRE_BIG_FUSE))
_SPLIT = OpKernels(SIGNATURE.op, PRE_BIG_FUSE_SPLIT)


def _launcher(device: int, mhc_mult: int, split: bool):
    """The split kernel's launcher where `split` (few tokens) and it is built, else the one-block kernel's."""
    if split:
        try:
            return _SPLIT.get(device, mhc_mult)
        except VariantNotBuilt:
            pass
    return _FUSE.get(device, mhc_mult)


def mhc_pre_big_fuse_fwd(
    gemm_out_mul: torch.Tensor,
    gemm_out_sqrsum: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    residual: torch.Tensor,
    post_mix: torch.Tensor,
    comb_mix: torch.Tensor,
    layer_input: torch.Tensor,
    rms_eps: float,
    mhc_pre_eps: float,
    mhc_sinkhorn_eps: float,
    mhc_post_mult_value: float,
    sinkhorn_repeat: int,
    n_splits: int = 16,
) -> None:
    """mHC's pre-layer step for every token, written into post_mix, comb_mix and layer_input.

    With M = mhc_mult and, per token, the mixes m = (sum over splits of gemm_out_mul) * rsqrt((sum over
    splits of gemm_out_sqrsum) / (M * hidden) + rms_eps):
      post_mix  = sigmoid(m[M:2M] * mhc_scale[1] + mhc_base[M:2M]) * mhc_post_mult_value;
      comb_mix  = Sinkhorn of C = m[2M:] * mhc_scale[2] + mhc_base[2M:] as M x M: softmax over rows plus
                  mhc_sinkhorn_eps, columns divided by (sum + eps), then sinkhorn_repeat - 1 times rows and
                  columns divided by (sum + eps);
      layer_input = bf16(sum over i of pre[i] * residual[:, i]), pre = sigmoid(m[:M] * mhc_scale[0] +
                  mhc_base[:M]) + mhc_pre_eps.

    Args:
        gemm_out_mul: (n_splits, num_tokens, M * (M + 2)) float32, contiguous: split-K partials of the
            residual times the mixing projection.
        gemm_out_sqrsum: (n_splits, num_tokens) float32: split-K partials of the residual's squared sum.
        mhc_scale: (3,) float32. mhc_base: (M * (M + 2),) float32.
        residual: (num_tokens, M, hidden) bf16, contiguous, 16-byte aligned; M 1, 2 or 4 (4 in DeepSeek's
            models), hidden a multiple of 8.
        post_mix: (num_tokens, M) float32 output. comb_mix: (num_tokens, M * M) float32 output.
        layer_input: (num_tokens, hidden) bf16 output, contiguous, 16-byte aligned.
        rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value: as above (float32 in the kernel).
        sinkhorn_repeat: >= 0 (0 and 1 both stop after the first row and column pass).
        n_splits: the partials' leading dimension (checked against it); any count, one cubin.

    Hidden size, token count, split count and Sinkhorn repeats are runtime values: one cubin per M, and for up to
    SPLIT_MAX_TOKENS tokens, where it is built, a second that spreads each token over several blocks (same bytes).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_pre_big_fuse_fwd(
            gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input, rms_eps, mhc_pre_eps,
            mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits,
        )  # fmt: skip
    (device, num_tokens, mhc_mult, hidden, mul_ptr, sq_ptr, scale_ptr, base_ptr, res_ptr, post_ptr, comb_ptr, input_ptr) = _check(
        gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input,
        rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits,
    )  # fmt: skip
    if num_tokens == 0:
        return None
    split = num_tokens <= SPLIT_MAX_TOKENS
    launcher = _FUSE.cache.get((device, mhc_mult, split))
    if launcher is None:
        launcher = _FUSE.cache[device, mhc_mult, split] = _launcher(device, mhc_mult, split)
    launcher(
        device, current_stream(device),
        mul_ptr, sq_ptr, scale_ptr, base_ptr, res_ptr, post_ptr, comb_ptr, input_ptr,
        rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat,
        n_splits, num_tokens, hidden,
    )  # fmt: skip
    return None


_traced_mhc_pre_big_fuse_fwd = traced(mhc_pre_big_fuse_fwd, allocates_nothing, mutates=("post_mix", "comb_mix", "layer_input"), outputs=0)
