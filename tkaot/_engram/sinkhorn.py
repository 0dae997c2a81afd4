"""tkaot.engram's Sinkhorn ops: the momentum update feeding the normalisation, and the row-normalisation step, its
column reduction and the final matrix.

One Sinkhorn iteration over a matrix M (num_rows, head_dim) with scales r (rows) and c (columns), the iterate being
r[:, None] * M * c[None, :]: engram_sinkhorn_step normalises every row of the iterate (r /= row norm + eps) and returns
per-CTA column sums of squares of the result; engram_sinkhorn_step_reduce adds them up; the caller updates c from
them; engram_sinkhorn_finalize writes alpha times the row-normalised iterate.
"""

from __future__ import annotations

import torch

from tkaot._compile import allocates_nothing, compiler, is_dynamo_compiling, traced
from tkaot._engram import device as _device
from tkaot._engram import kernels  # the shipped tilings, read at every call
from tkaot._engram.kernels import SINKHORN_FINALIZE, SINKHORN_HEAD_DIMS, SINKHORN_MOMENTUM, SINKHORN_STEP, SINKHORN_STEP_REDUCE
from tkaot._op import current_stream, op_parts
from tkaot._validate import Rule, Signature, Tensor

__all__ = ["engram_sinkhorn_finalize", "engram_sinkhorn_momentum_update", "engram_sinkhorn_step", "engram_sinkhorn_step_reduce"]

_F32 = torch.float32
PARTIALS_PER_SM = 3  # engram_sinkhorn_step's CTAs (and column partials) an SM, as TileKernels
_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def _f32(name: str, shape) -> Tensor:
    return Tensor(name, (_F32,), shape, layout="contiguous")


_MATRIX = (
    Tensor("matrix", (_F32,), (("num_rows", "head_dim"),), layout="contiguous", align=16),
    _f32("row_scale", (("num_rows",),)),
    _f32("col_scale", (("head_dim",),)),
)
_HEAD_DIM = Rule(
    "matrix", "head_dim % 256 == 0 and 256 <= head_dim <= 8192", f"of head_dim {SINKHORN_HEAD_DIMS}",
    actual="f'shape {tuple(h_matrix)}'", after="matrix",
)  # fmt: skip
_ROWS = Rule("matrix", "num_rows * head_dim <= _MAX_I32", "below 2**31 elements", actual="f'shape {tuple(h_matrix)}'", after="matrix")

MOMENTUM_SIGNATURE = Signature(
    "tkaot.engram.engram_sinkhorn_momentum_update",
    tensors=(
        Tensor("grad", (torch.bfloat16, _F32), None, layout="contiguous", align=16),
        Tensor("momentum_buffer", (torch.bfloat16, _F32), None, layout="contiguous", align=16),
    ),
    dims=("numel",),
    rules=(
        Rule("grad", "h_grad.numel() % 8 == 0 and h_grad.numel() <= _MAX_I32", "of a multiple of 8 elements, below 2**31",
             actual="f'{h_grad.numel()} elements'", after="grad"),
        Rule("momentum_buffer", "h_momentum_buffer.numel() == h_grad.numel()", "of {h_grad.numel()} elements like grad",
             actual="f'{h_momentum_buffer.numel()} elements'", after="momentum_buffer"),
    ),
    returns=("device", "h_grad.numel()", "t_grad", "t_momentum_buffer", "p_grad", "p_momentum_buffer"),
)  # fmt: skip

STEP_SIGNATURE = Signature("tkaot.engram.engram_sinkhorn_step", tensors=_MATRIX, dims=("num_rows", "head_dim"), rules=(_HEAD_DIM, _ROWS))
REDUCE_SIGNATURE = Signature(
    "tkaot.engram.engram_sinkhorn_step_reduce",
    tensors=(_f32("col_sumsq_partial", (("num_partials", "head_dim"),)), _f32("col_sumsq", (("head_dim",),))),
    dims=("num_partials", "head_dim"),
    rules=(
        Rule(
            "col_sumsq_partial",
            "num_partials * head_dim <= _MAX_I32",
            "below 2**31 elements",
            actual="f'shape {tuple(h_col_sumsq_partial)}'",
        ),
    ),  # fmt: skip
)
FINALIZE_SIGNATURE = Signature(
    "tkaot.engram.engram_sinkhorn_finalize",
    tensors=(*_MATRIX, Tensor("out", (_F32,), "matrix", layout="contiguous", optional=True)),
    dims=("num_rows", "head_dim"),
    rules=(_HEAD_DIM, _ROWS),
)

(_check_momentum, _MOMENTUM), (_check_step, _STEP), (_check_reduce, _REDUCE), (_check_finalize, _FINALIZE) = op_parts(
    globals(), (MOMENTUM_SIGNATURE, SINKHORN_MOMENTUM), (STEP_SIGNATURE, SINKHORN_STEP),
    (REDUCE_SIGNATURE, SINKHORN_STEP_REDUCE), (FINALIZE_SIGNATURE, SINKHORN_FINALIZE),
)  # fmt: skip


def engram_sinkhorn_momentum_update(
    grad: torch.Tensor,
    momentum_buffer: torch.Tensor,
    beta1: float,
    nesterov: bool = True,
) -> torch.Tensor:
    """Update the momentum in place and return the fp32 input of the Sinkhorn normalisation.

    momentum = fma(momentum, beta1, (1 - beta1) * grad) in fp32, stored in momentum_buffer's dtype;
    the result is fma(grad, 1 - beta1, beta1 * momentum) with nesterov, else momentum (both from the
    fp32 momentum, before it is rounded to the buffer's dtype).

    Args:
        grad: bf16 or float32, contiguous, any shape; its element count a multiple of 8.
        momentum_buffer: bf16 or float32, contiguous, as many elements as grad; updated in place.
        beta1: the momentum decay; nesterov: return the Nesterov look-ahead.

    Returns:
        float32, momentum_buffer's shape.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_engram_sinkhorn_momentum_update(grad, momentum_buffer, beta1, nesterov)
    device, numel, grad_dtype, momentum_dtype, grad_ptr, momentum_ptr = _check_momentum(grad, momentum_buffer)
    sinkhorn_input = torch.empty_like(momentum_buffer, dtype=_F32)
    if numel:
        launcher = _MOMENTUM.get(device, _NAMES[grad_dtype], _NAMES[momentum_dtype], kernels.SINKHORN_MOMENTUM_TILINGS["default"])
        beta1 = float(beta1)
        launcher(
            device, current_stream(device),
            grad_ptr, momentum_ptr, sinkhorn_input.data_ptr(), beta1, 1.0 - beta1, 1 if nesterov else 0, numel,
        )  # fmt: skip
    return sinkhorn_input


def engram_sinkhorn_step(
    matrix: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise every row of the iterate row_scale[:, None] * matrix * col_scale (row_scale updated in place).

    For each row, n = the iterate row's L2 norm; row_norm = n and row_scale *= 1 / (n + eps).

    Args:
        matrix: (num_rows, head_dim) float32, contiguous; head_dim a multiple of 256 in [256, 8192].
        row_scale: (num_rows,) float32, updated in place; col_scale: (head_dim,) float32.
        eps: added to each row norm.

    Returns:
        (row_norm (num_rows,), col_sumsq_partial (3 x number of SMs, head_dim)), float32: partial p holds the
        column sums of squares of the normalised rows of CTA p's rows (engram_sinkhorn_step_reduce sums them).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_engram_sinkhorn_step(matrix, row_scale, col_scale, eps)
    device, num_rows, head_dim, matrix_ptr, row_ptr, col_ptr = _check_step(matrix, row_scale, col_scale)
    num_partials = PARTIALS_PER_SM * _device.sm_count(device)
    row_norm = torch.empty_like(row_scale)
    col_sumsq_partial = matrix.new_empty((num_partials, head_dim))
    launcher = _STEP.get(device, head_dim)
    launcher(
        device, current_stream(device),
        matrix_ptr, row_ptr, col_ptr, row_norm.data_ptr(), col_sumsq_partial.data_ptr(), float(eps), num_rows, num_partials,
    )  # fmt: skip
    return row_norm, col_sumsq_partial


def engram_sinkhorn_step_reduce(col_sumsq_partial: torch.Tensor, col_sumsq: torch.Tensor) -> None:
    """col_sumsq = the partials summed in order (partial 0 first), in place.

    Args:
        col_sumsq_partial: (num_partials, head_dim) float32, contiguous.
        col_sumsq: (head_dim,) float32, contiguous; overwritten.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_engram_sinkhorn_step_reduce(col_sumsq_partial, col_sumsq)
    device, num_partials, head_dim, partial_ptr, out_ptr = _check_reduce(col_sumsq_partial, col_sumsq)
    if head_dim:
        launcher = _REDUCE.get(device, "float32", kernels.SINKHORN_STEP_REDUCE_TILINGS["default"])
        launcher(device, current_stream(device), partial_ptr, out_ptr, num_partials, head_dim)
    return None


def engram_sinkhorn_finalize(
    matrix: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    eps: float,
    alpha: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """alpha times the row-normalised iterate: out[i] = alpha * y / (||y|| + eps), y = row_scale[i] * matrix[i] * col_scale.

    Args:
        matrix, row_scale, col_scale, eps: as engram_sinkhorn_step's (row_scale is not changed).
        alpha: the final scale.
        out: optional float32 buffer shaped like matrix, contiguous.

    Returns:
        out (or a new tensor), (num_rows, head_dim) float32.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_engram_sinkhorn_finalize(matrix, row_scale, col_scale, eps, alpha, out)
    device, num_rows, head_dim, matrix_ptr, row_ptr, col_ptr, out_ptr = _check_finalize(matrix, row_scale, col_scale, out)
    if out is None:
        out = torch.empty_like(matrix)
        out_ptr = out.data_ptr()
    if num_rows:
        launcher = _FINALIZE.get(device, head_dim)
        launcher(device, current_stream(device), matrix_ptr, row_ptr, col_ptr, out_ptr, float(eps), float(alpha), num_rows)
    return out


def _fake_momentum(new, grad, momentum_buffer, beta1, nesterov=True):
    """engram_sinkhorn_momentum_update's output (tracing, tkaot/_compile.py)."""
    return new.empty(momentum_buffer.shape, _F32, momentum_buffer.device)


def _fake_step(new, matrix, row_scale, col_scale, eps):
    """engram_sinkhorn_step's outputs; col_sumsq_partial has PARTIALS_PER_SM rows per SM of the device, as the op's."""
    num_partials = PARTIALS_PER_SM * _device.sm_count(matrix.get_device())
    return new.empty_like(row_scale), new.empty((num_partials, matrix.shape[1]), _F32, matrix.device)


def _fake_finalize(new, matrix, row_scale, col_scale, eps, alpha, out=None):
    """engram_sinkhorn_finalize's output: out itself when given."""
    return new.empty_like(matrix) if out is None else out


_traced_engram_sinkhorn_momentum_update = traced(engram_sinkhorn_momentum_update, _fake_momentum, mutates=("momentum_buffer",))
_traced_engram_sinkhorn_step = traced(engram_sinkhorn_step, _fake_step, mutates=("row_scale",), outputs=2)
_traced_engram_sinkhorn_step_reduce = traced(engram_sinkhorn_step_reduce, allocates_nothing, mutates=("col_sumsq",), outputs=0)
_traced_engram_sinkhorn_finalize = traced(engram_sinkhorn_finalize, _fake_finalize, mutates=("out",))
