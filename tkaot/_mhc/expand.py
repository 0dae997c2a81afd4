"""tkaot.mhc.expand_to_mhc_fwd / _bwd: copy each token's hidden row into its mhc streams, and the backward sum."""

from __future__ import annotations

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._mhc.common import BF16, current_stream, elements_rule, hidden_rule, launcher, mhc_rule
from tkaot._mhc.kernels import EXPAND_BWD, EXPAND_FWD
from tkaot._op import op_parts
from tkaot._validate import Signature, Tensor

__all__ = ["expand_to_mhc_bwd", "expand_to_mhc_fwd"]

_ROW = (("num_tokens", "hidden"),)
_STREAMS = (("num_tokens", "mhc", "hidden"),)


def _signature(op: str, row: str, streams: str) -> Signature:
    """(row: (num_tokens, hidden), streams: (num_tokens, mhc, hidden)), bf16, contiguous, 16-byte aligned."""
    tensors = {
        row: Tensor(row, (BF16,), _ROW, layout="contiguous", align=16),
        streams: Tensor(streams, (BF16,), _STREAMS, layout="contiguous", align=16),
    }
    first, second = (row, streams) if op.endswith("fwd") else (streams, row)
    return Signature(
        f"tkaot.mhc.{op}",
        tensors=(tensors[first], tensors[second]),
        dims=("num_tokens", "hidden", "mhc"),
        rules=(mhc_rule(streams), hidden_rule(row), elements_rule(row, "num_tokens * hidden")),
    )


FWD_SIGNATURE = _signature("expand_to_mhc_fwd", "x", "o")
BWD_SIGNATURE = _signature("expand_to_mhc_bwd", "x_grad", "o_grad")
(_check_fwd, _FWD), (_check_bwd, _BWD) = op_parts(globals(), (FWD_SIGNATURE, EXPAND_FWD), (BWD_SIGNATURE, EXPAND_BWD))


def expand_to_mhc_fwd(x, o):
    """Write each token's row into all of its mhc streams: o[t, m, :] = x[t, :].

    Args:
        x: (num_tokens, hidden) bf16, contiguous, on a CUDA device; hidden a multiple of 8.
        o: (num_tokens, mhc, hidden) bf16, contiguous, written in place; mhc in [1, 8].

    Returns None.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_expand_to_mhc_fwd(x, o)
    device, num_tokens, hidden, mhc, x_ptr, o_ptr = _check_fwd(x, o)
    if num_tokens and hidden:
        launcher(_FWD, device, mhc)(device, current_stream(device), x_ptr, o_ptr, num_tokens, hidden)


def expand_to_mhc_bwd(o_grad, x_grad):
    """The gradient of expand_to_mhc_fwd: x_grad[t, :] = sum over m of o_grad[t, m, :], in fp32 in stream order,
    rounded once to bf16.

    Args:
        o_grad: (num_tokens, mhc, hidden) bf16, contiguous, on a CUDA device; mhc in [1, 8].
        x_grad: (num_tokens, hidden) bf16, contiguous, written in place (not accumulated into); hidden a
            multiple of 8.

    Returns None.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:
        return _traced_expand_to_mhc_bwd(o_grad, x_grad)
    device, num_tokens, hidden, mhc, og_ptr, xg_ptr = _check_bwd(o_grad, x_grad)
    if num_tokens and hidden:
        launcher(_BWD, device, mhc)(device, current_stream(device), og_ptr, xg_ptr, num_tokens, hidden)


# ---- traced forms (tkaot/_compile.py): both write their last argument and allocate nothing


def _fake_in_place(new, *args):
    return None


_traced_expand_to_mhc_fwd = traced(expand_to_mhc_fwd, _fake_in_place, mutates=("o",), outputs=0, kinds={"x": "tensor", "o": "tensor"})
_traced_expand_to_mhc_bwd = traced(
    expand_to_mhc_bwd, _fake_in_place, mutates=("x_grad",), outputs=0, kinds={"o_grad": "tensor", "x_grad": "tensor"}
)
