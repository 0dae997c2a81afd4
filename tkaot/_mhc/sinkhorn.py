"""tkaot.mhc.mhc_sinkhorn_fwd / _bwd: Sinkhorn normalisation of each token's (mhc, mhc) residual mix, the repeat
count a runtime value, and the backward."""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._mhc.common import F32, current_stream, float_rule, int_rules, launcher, mhc_rule
from tkaot._mhc.kernels import SINKHORN_BWD, SINKHORN_FWD, sinkhorn_record_row
from tkaot._op import op_parts
from tkaot._validate import Rule, Signature, Tensor

__all__ = ["mhc_sinkhorn_bwd", "mhc_sinkhorn_fwd"]

_MATRICES = (("num_tokens", "mhc", "mhc_cols"),)


def _square(name: str) -> Rule:
    return Rule(name, "mhc_cols == mhc", "(num_tokens, mhc, mhc): square matrices", actual=f"f'shape {{tuple(h_{name})}}'", after=name)


def _matrices(name: str, like: str | None = None) -> Tensor:
    """(num_tokens, mhc, mhc) fp32, contiguous, 16-byte aligned (rows are read as 16-byte vectors)."""
    return Tensor(name, (F32,), like or _MATRICES, layout="contiguous", align=16)


FWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_sinkhorn_fwd",
    tensors=(_matrices("comb_res_mix"), _matrices("comb_res_mix_out", "comb_res_mix")),
    scalars=("repeat", "eps"),
    dims=("num_tokens", "mhc"),
    rules=(_square("comb_res_mix"), mhc_rule("comb_res_mix"), *int_rules("repeat", "0", "_MAX_I32"), float_rule("eps")),
)
BWD_SIGNATURE = Signature(
    "tkaot.mhc.mhc_sinkhorn_bwd",
    tensors=(_matrices("grad_output"), _matrices("x", "grad_output"), _matrices("grad_input", "grad_output")),
    scalars=("repeat", "eps"),
    dims=("num_tokens", "mhc"),
    rules=(_square("grad_output"), mhc_rule("grad_output"), *int_rules("repeat", "1", "_MAX_I32"), float_rule("eps")),
)
(_check_fwd, _FWD), (_check_bwd, _BWD) = op_parts(globals(), (FWD_SIGNATURE, SINKHORN_FWD), (BWD_SIGNATURE, SINKHORN_BWD))


def mhc_sinkhorn_fwd(comb_res_mix, comb_res_mix_out, repeat: int, eps: float):
    """Sinkhorn-normalise each token's matrix towards a doubly stochastic one: a row softmax plus eps, a division
    by the column sums plus eps, then repeat - 1 times a division by the row sums plus eps and by the column
    sums plus eps (fp32; sums in butterfly order, IEEE divisions).

    Args:
        comb_res_mix: (num_tokens, mhc, mhc) fp32, contiguous, on a CUDA device; mhc in [1, 8].
        comb_res_mix_out: like comb_res_mix, written in place (may be comb_res_mix itself).
        repeat: an int >= 0 (0 normalises as 1 does), taken at run time.
        eps: the float added to every sum.

    Returns None.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_sinkhorn_fwd(comb_res_mix, comb_res_mix_out, repeat, eps)
    device, num_tokens, mhc, src, dst = _check_fwd(comb_res_mix, comb_res_mix_out, repeat, eps)
    if num_tokens:
        launcher(_FWD, device, mhc)(device, current_stream(device), src, dst, repeat, eps, num_tokens)


def mhc_sinkhorn_bwd(grad_output, x, grad_input, repeat: int, eps: float):
    """The gradient of mhc_sinkhorn_fwd at its input x, for the same repeat and eps.

    Args:
        grad_output: (num_tokens, mhc, mhc) fp32, contiguous, on a CUDA device: the output's gradient.
        x: like grad_output: the forward's input.
        grad_input: like grad_output, written in place.
        repeat: an int >= 1; eps: a float.

    The forward is replayed from x, its steps kept in a scratch buffer of repeat * 2 * num_tokens * 4 *
    (mhc * mhc + mhc, rounded up to 4) bytes (26 MB at 8192 tokens, mhc 4, 20 repeats), allocated every call; the
    CUDA kernel for mhc <= 5 keeps the steps of up to 20 repeats in shared memory and uses it only beyond.
    Returns None.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:
        return _traced_mhc_sinkhorn_bwd(grad_output, x, grad_input, repeat, eps)
    device, num_tokens, mhc, go, xp, gi = _check_bwd(grad_output, x, grad_input, repeat, eps)
    if num_tokens:
        scratch = torch.empty((repeat, 2, num_tokens, sinkhorn_record_row(mhc)), dtype=F32, device=x.device)
        launcher(_BWD, device, mhc)(device, current_stream(device), go, xp, gi, scratch.data_ptr(), eps, num_tokens, repeat)


# ---- traced forms (tkaot/_compile.py): both write their output buffer and return nothing


def _fake(new, *args):
    return None


_TENSORS = {name: "tensor" for name in ("comb_res_mix", "comb_res_mix_out", "grad_output", "x", "grad_input")}
_traced_mhc_sinkhorn_fwd = traced(mhc_sinkhorn_fwd, _fake, mutates=("comb_res_mix_out",), outputs=0, kinds=_TENSORS)
_traced_mhc_sinkhorn_bwd = traced(mhc_sinkhorn_bwd, _fake, mutates=("grad_input",), outputs=0, kinds=_TENSORS)
