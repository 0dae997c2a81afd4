"""tkaot.mhc: the norm-weight merge of mHC's mixing projection, and the split-K reduction + RMSNorm of its mixes
(forward and backward of each)."""

from __future__ import annotations

import torch

from tkaot._compile import allocates_nothing, compiler, is_dynamo_compiling, traced
from tkaot._mhc.common import MAX_I24, f32, float_rule, int_rules, like
from tkaot._mhc.kernels import NORMW_MERGE_BWD, NORMW_MERGE_FWD, REDUCE_PARTIALS_BWD, REDUCE_PARTIALS_FWD
from tkaot._op import OpKernels, current_stream, op_parts
from tkaot._validate import Rule, Signature

__all__ = [
    "mhc_fn_normw_merge_fwd", "mhc_fn_normw_merge_bwd", "mhc_reduce_partials_and_rmsnorm_fwd",
    "mhc_reduce_partials_and_rmsnorm_bwd",
]  # fmt: skip

_FN = ("m", "n")
_ROWS_LIMIT = Rule("fn", "m <= 65535", "of at most 65535 rows", actual="f'shape {tuple(h_fn)}'", after="fn")

MERGE_FWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_fn_normw_merge_fwd",
    tensors=(f32("fn", _FN, what="2-D (mhc_mult3, mhc_hidden)"), f32("normw", ("n",)), like("out_fn", "fn")),
    dims=_FN,
    rules=(_ROWS_LIMIT,),
)

MERGE_BWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_fn_normw_merge_bwd",
    tensors=(
        f32("fn", _FN, what="2-D (mhc_mult3, mhc_hidden)"),
        f32("normw", ("n",)),
        like("out_fn_grad", "fn"),
        like("fn_grad", "fn"),
        like("normw_grad", "normw"),
    ),
    dims=_FN,
)

_RMS_SCALARS = (*int_rules("rms_group_size", "1", str(MAX_I24)), float_rule("rms_eps"))
_TOKEN_MIXES = Rule("out", "num_tokens * mhc_mult3 <= _MAX_I32", "of fewer than 2**31 elements", actual="f'shape {tuple(h_out)}'")

REDUCE_FWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_reduce_partials_and_rmsnorm_fwd",
    tensors=(
        f32(
            "out_mul_splitted",
            ("n_splits", "num_tokens", "n_rms_group", "mhc_mult3"),
            what="4-D (n_splits, num_tokens, n_rms_group, mhc_mult3)",
        ),
        f32("sqrsum_splitted", ("n_splits", "num_tokens", "n_rms_group")),
        f32("out_mul", ("num_tokens", "n_rms_group", "mhc_mult3")),
        f32("sqrsum", ("num_tokens", "n_rms_group")),
        f32("out", ("num_tokens", "mhc_mult3")),
    ),
    scalars=("rms_group_size", "rms_eps", "n_splits"),
    dims=("num_tokens", "n_rms_group", "mhc_mult3"),
    rules=(_TOKEN_MIXES, *_RMS_SCALARS, *int_rules("n_splits", "1", "_MAX_I32")),
)

REDUCE_BWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_reduce_partials_and_rmsnorm_bwd",
    tensors=(
        f32("out_grad", ("num_tokens", "mhc_mult3"), what="2-D (num_tokens, mhc_mult3)"),
        f32("out_mul", ("num_tokens", "n_rms_group", "mhc_mult3")),
        f32("sqrsum", ("num_tokens", "n_rms_group")),
        like("out_mul_grad", "out_mul"),
        like("sqrsum_grad", "sqrsum"),
    ),
    scalars=("rms_group_size", "rms_eps"),
    dims=("num_tokens", "n_rms_group", "mhc_mult3"),
    rules=(
        Rule("out_mul", "num_tokens * n_rms_group <= _MAX_I32", "of fewer than 2**31 rows", actual="f'shape {tuple(h_out_mul)}'"),
        *_RMS_SCALARS,
    ),
)

((_check_merge_fwd, _MERGE_FWD), (_check_merge_bwd, _MERGE_BWD),
 (_check_reduce_fwd, _REDUCE_FWD), (_check_reduce_bwd, _REDUCE_BWD)) = op_parts(
    globals(), (MERGE_FWD_SIGNATURE, NORMW_MERGE_FWD), (MERGE_BWD_SIGNATURE, NORMW_MERGE_BWD),
    (REDUCE_FWD_SIGNATURE, REDUCE_PARTIALS_FWD), (REDUCE_BWD_SIGNATURE, REDUCE_PARTIALS_BWD),
)  # fmt: skip


def _launcher(kernels: OpKernels, device: int):
    launcher = kernels.cache.get(device)
    if launcher is None:
        launcher = kernels.cache[device] = kernels.get(device, "float32")
    return launcher


def mhc_fn_normw_merge_fwd(fn: torch.Tensor, normw: torch.Tensor, out_fn: torch.Tensor) -> None:
    """out_fn = fn * normw (the RMSNorm weight folded into each row of the mixing projection), in place.

    Args:
        fn: (mhc_mult3, mhc_hidden) float32, contiguous, on a CUDA device; at most 65535 rows.
        normw: (mhc_hidden,) float32. out_fn: like fn, the output buffer.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_fn_normw_merge_fwd(fn, normw, out_fn)
    device, m, n, fn_ptr, w_ptr, out_ptr = _check_merge_fwd(fn, normw, out_fn)
    if m and n:
        _launcher(_MERGE_FWD, device)(device, current_stream(device), fn_ptr, w_ptr, out_ptr, m, n)


def mhc_fn_normw_merge_bwd(
    fn: torch.Tensor, normw: torch.Tensor, out_fn_grad: torch.Tensor, fn_grad: torch.Tensor, normw_grad: torch.Tensor
) -> None:
    """Accumulate the gradients of mhc_fn_normw_merge_fwd, as TileKernels does (+=, not =):
    fn_grad += out_fn_grad * normw; normw_grad += sum over rows of out_fn_grad * fn (summed in row order).

    Args:
        fn, out_fn_grad, fn_grad: (mhc_mult3, mhc_hidden) float32, contiguous.
        normw, normw_grad: (mhc_hidden,) float32.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad)
    device, m, n, fn_ptr, w_ptr, grad_ptr, fn_grad_ptr, w_grad_ptr = _check_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad)
    if n:
        _launcher(_MERGE_BWD, device)(device, current_stream(device), fn_ptr, w_ptr, grad_ptr, fn_grad_ptr, w_grad_ptr, m, n)


def mhc_reduce_partials_and_rmsnorm_fwd(
    out_mul_splitted: torch.Tensor,
    sqrsum_splitted: torch.Tensor,
    out_mul: torch.Tensor,
    sqrsum: torch.Tensor,
    out: torch.Tensor,
    rms_group_size: int,
    rms_eps: float,
    n_splits: int,
) -> None:
    """Sum split-K partials of the mixes and their squared sums, then RMS-normalise (in place).

    out_mul = sum over splits of out_mul_splitted, sqrsum = sum over splits of sqrsum_splitted (split
    order, from zero); out[t, j] = sum over groups k of out_mul[t, k, j] * rsqrt(sqrsum[t, k] /
    rms_group_size + rms_eps).

    Args:
        out_mul_splitted: (n_splits, num_tokens, n_rms_group, mhc_mult3) float32, contiguous.
        sqrsum_splitted: (n_splits, num_tokens, n_rms_group) float32.
        out_mul, sqrsum, out: output buffers, (num_tokens, n_rms_group, mhc_mult3),
            (num_tokens, n_rms_group), (num_tokens, mhc_mult3) float32.
        rms_group_size: elements each squared sum covers, 1 .. 2**24.
        rms_eps: added to the mean square.
        n_splits: the partials' leading dimension (checked against it; any count, one cubin).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_reduce_partials_and_rmsnorm_fwd(
            out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, out, rms_group_size, rms_eps, n_splits,
        )  # fmt: skip
    device, num_tokens, n_rms_group, mhc_mult3, split_ptr, sq_split_ptr, mul_ptr, sq_ptr, out_ptr = _check_reduce_fwd(
        out_mul_splitted, sqrsum_splitted, out_mul, sqrsum, out, rms_group_size, rms_eps, n_splits
    )
    if num_tokens and mhc_mult3:
        _launcher(_REDUCE_FWD, device)(
            device, current_stream(device),
            split_ptr, sq_split_ptr, mul_ptr, sq_ptr, out_ptr, float(rms_group_size), rms_eps,
            n_splits, num_tokens, n_rms_group, mhc_mult3,
        )  # fmt: skip


def mhc_reduce_partials_and_rmsnorm_bwd(
    out_grad: torch.Tensor,
    out_mul: torch.Tensor,
    sqrsum: torch.Tensor,
    out_mul_grad: torch.Tensor,
    sqrsum_grad: torch.Tensor,
    rms_group_size: int,
    rms_eps: float,
) -> None:
    """The gradient of mhc_reduce_partials_and_rmsnorm_fwd's out, written in place.

    With r = rsqrt(sqrsum / rms_group_size + rms_eps): out_mul_grad[t, k, j] = out_grad[t, j] * r[t, k];
    sqrsum_grad[t, k] = -(sum over j of out_grad[t, j] * out_mul[t, k, j]) * r / (sqrsum + rms_eps *
    rms_group_size) / 2.

    Args:
        out_grad: (num_tokens, mhc_mult3) float32, contiguous.
        out_mul, sqrsum: the forward's (num_tokens, n_rms_group, mhc_mult3), (num_tokens, n_rms_group).
        out_mul_grad, sqrsum_grad: output buffers shaped like out_mul and sqrsum.
        rms_group_size, rms_eps: the forward's.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_reduce_partials_and_rmsnorm_bwd(out_grad, out_mul, sqrsum, out_mul_grad, sqrsum_grad, rms_group_size, rms_eps)
    device, num_tokens, n_rms_group, mhc_mult3, grad_ptr, mul_ptr, sq_ptr, mul_grad_ptr, sq_grad_ptr = _check_reduce_bwd(
        out_grad, out_mul, sqrsum, out_mul_grad, sqrsum_grad, rms_group_size, rms_eps
    )
    if num_tokens and n_rms_group:
        _launcher(_REDUCE_BWD, device)(
            device, current_stream(device),
            grad_ptr, mul_ptr, sq_ptr, mul_grad_ptr, sq_grad_ptr, float(rms_group_size), rms_eps,
            rms_eps * rms_group_size,  # rounded to float32 once, from double, as TileKernels' constant is
            num_tokens, n_rms_group, mhc_mult3,
        )  # fmt: skip


_traced_mhc_fn_normw_merge_fwd = traced(mhc_fn_normw_merge_fwd, allocates_nothing, mutates=("out_fn",), outputs=0)
_traced_mhc_fn_normw_merge_bwd = traced(mhc_fn_normw_merge_bwd, allocates_nothing, mutates=("fn_grad", "normw_grad"), outputs=0)
_traced_mhc_reduce_partials_and_rmsnorm_fwd = traced(
    mhc_reduce_partials_and_rmsnorm_fwd, allocates_nothing, mutates=("out_mul", "sqrsum", "out"), outputs=0
)
_traced_mhc_reduce_partials_and_rmsnorm_bwd = traced(
    mhc_reduce_partials_and_rmsnorm_bwd, allocates_nothing, mutates=("out_mul_grad", "sqrsum_grad"), outputs=0
)
