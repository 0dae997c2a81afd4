"""tkaot.mhc.mhc_post_fwd / _bwd: merge a layer's output back into the mhc residual streams, and the backward."""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._mhc.common import BF16, F32, current_stream, elements_rule, hidden_rule, launcher, mhc_rule
from tkaot._mhc.kernels import POST_BWD, POST_FWD
from tkaot._op import op_parts
from tkaot._validate import Let, Signature, Tensor

__all__ = ["mhc_post_bwd", "mhc_post_fwd"]

_LEAD = ("num_seqs", "num_tokens")
_STREAMS = ((*_LEAD, "mhc", "hidden"),)


def _post_tensors(streams: str) -> tuple:
    """x, residual, post_layer_mix and comb_res_mix, shaped after `streams` (num_seqs, num_tokens, mhc, hidden)."""
    return (
        Tensor("x", (BF16,), ((*_LEAD, "hidden"),), layout="contiguous", align=16),
        Tensor("residual", (BF16,), _STREAMS if streams == "residual" else "d_o", layout="contiguous", align=16),
        Tensor("post_layer_mix", (F32,), ((*_LEAD, "mhc", 1),), layout="contiguous"),
        Tensor("comb_res_mix", (F32,), ((*_LEAD, "mhc", "mhc"),), layout="contiguous"),
    )


_RULES = (Let("rows", "num_seqs * num_tokens"), elements_rule("x", "num_seqs * num_tokens * hidden"))
FWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_post_fwd",
    tensors=(
        Tensor("residual", (BF16,), _STREAMS, layout="contiguous", align=16),
        *(t for t in _post_tensors("residual") if t.name != "residual"),
        Tensor("out", (BF16,), "residual", layout="contiguous", align=16, optional=True),
    ),
    dims=("rows", "hidden", "mhc"),
    rules=(mhc_rule("residual"), hidden_rule("residual"), *_RULES),
)
BWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_post_bwd",
    tensors=(Tensor("d_o", (BF16,), _STREAMS, layout="contiguous", align=16), *_post_tensors("d_o")),
    dims=("rows", "hidden", "mhc"),
    rules=(mhc_rule("d_o"), hidden_rule("d_o"), *_RULES),
)
(_check_fwd, _FWD), (_check_bwd, _BWD) = op_parts(globals(), (FWD_SIGNATURE, POST_FWD), (BWD_SIGNATURE, POST_BWD))


def mhc_post_fwd(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Merge the layer output into the residual streams:
    out[..., o, :] = post_layer_mix[..., o, 0] * x + sum over i of comb_res_mix[..., i, o] * residual[..., i, :]
    in fp32 (the product, then fused multiply-adds in stream order), rounded once to bf16.

    Args:
        x: (num_seqs, num_tokens, hidden) bf16, contiguous, on a CUDA device; hidden a multiple of 8.
        residual: (num_seqs, num_tokens, mhc, hidden) bf16, mhc in [1, 8], contiguous (TileKernels copies a
            non-contiguous one; tkaot refuses it rather than copy silently).
        post_layer_mix: (num_seqs, num_tokens, mhc, 1) fp32, contiguous.
        comb_res_mix: (num_seqs, num_tokens, mhc, mhc) fp32, contiguous.
        out: optional (num_seqs, num_tokens, mhc, hidden) bf16, contiguous, written in place.

    Returns out (a new contiguous tensor when not given).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out)
    device, rows, hidden, mhc, r_ptr, x_ptr, p_ptr, c_ptr, o_ptr = _check_fwd(residual, x, post_layer_mix, comb_res_mix, out)
    if out is None:
        out = torch.empty(residual.shape, dtype=BF16, device=residual.device)
        o_ptr = out.data_ptr()
    if rows and hidden:
        launcher(_FWD, device, mhc)(device, current_stream(device), c_ptr, r_ptr, p_ptr, x_ptr, o_ptr, rows, hidden)
    return out


def mhc_post_bwd(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    d_o: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of mhc_post_fwd's inputs.

    Args:
        x, residual, post_layer_mix, comb_res_mix: the forward's inputs, shaped as there, all contiguous.
        d_o: (num_seqs, num_tokens, mhc, hidden) bf16, the output's gradient, contiguous (TileKernels copies a
            non-contiguous one; tkaot refuses it rather than copy silently).

    Returns new tensors (d_x, d_residual, d_post_layer_mix, d_comb_res_mix), shaped like x, residual,
    post_layer_mix and comb_res_mix: d_residual[i] = sum over o of comb_res_mix[i, o] * d_o[o] and
    d_x = sum over o of post_layer_mix[o] * d_o[o] (fp32 from 0 in stream order, rounded to bf16);
    d_comb_res_mix[i, o] = sum over hidden of residual[i] * d_o[o] and d_post_layer_mix[o] = sum over hidden
    of x * d_o[o] (fp32).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:
        return _traced_mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o)
    device, rows, hidden, mhc, do_ptr, x_ptr, r_ptr, p_ptr, c_ptr = _check_bwd(d_o, x, residual, post_layer_mix, comb_res_mix)
    on = x.device
    d_x = torch.empty(x.shape, dtype=BF16, device=on)
    d_residual = torch.empty(residual.shape, dtype=BF16, device=on)
    if rows and not hidden:  # sums over an empty row
        zeros = torch.zeros(post_layer_mix.shape, dtype=F32, device=on), torch.zeros(comb_res_mix.shape, dtype=F32, device=on)
        return d_x, d_residual, *zeros
    d_post = torch.empty(post_layer_mix.shape, dtype=F32, device=on)
    d_comb = torch.empty(comb_res_mix.shape, dtype=F32, device=on)
    if rows:
        launcher(_BWD, device, mhc)(
            device, current_stream(device), do_ptr, c_ptr, r_ptr, p_ptr, x_ptr,
            d_comb.data_ptr(), d_residual.data_ptr(), d_post.data_ptr(), d_x.data_ptr(), rows, hidden,
        )  # fmt: skip
    return d_x, d_residual, d_post, d_comb


# ---- traced forms (tkaot/_compile.py)


def _fake_fwd(new, x, residual, post_layer_mix, comb_res_mix, out=None):
    return new.empty(residual.shape, BF16, residual.device) if out is None else out


def _fake_bwd(new, x, residual, post_layer_mix, comb_res_mix, d_o):
    return tuple(new.empty(t.shape, t.dtype, t.device) for t in (x, residual, post_layer_mix, comb_res_mix))


_traced_mhc_post_fwd = traced(mhc_post_fwd, _fake_fwd, mutates=("out",), outputs=1)
_traced_mhc_post_bwd = traced(mhc_post_bwd, _fake_bwd, outputs=4)
