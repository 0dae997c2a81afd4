"""The Engram gate as an autograd function: EngramGateFn (and engram_gate = EngramGateFn.apply), called as TileKernels'
tile_kernels.modeling.engram.

Forward: fused_weight, then engram_gate_fwd saving dot / gate_score / rstd_x / rstd_k; backward: engram_gate_bwd, then
grad_w_reduce into the weights' gradients. CUDA tensors run tkaot's kernels; tensors elsewhere run the pure-torch
references of the same ops (tkaot.reference.engram), in float64 when the inputs are float64, so the layer can be
checked with torch.autograd.gradcheck on a CPU.
"""

from __future__ import annotations

import torch

__all__ = ["EngramGateFn", "engram_gate"]


def _ops(t: torch.Tensor):
    """The namespace the layer runs on for tensors like t: tkaot.engram's kernels on CUDA, else the references."""
    if t.is_cuda:
        import tkaot.engram

        return tkaot.engram
    from tkaot.reference import engram

    return engram


def _reduce(ops, grad_w_partial, weight_hidden, weight_embed, grad_wh, grad_we):
    """grad_w_reduce; the references return the updated gradients, which are copied into place."""
    updated = ops.grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_wh, grad_we)
    if updated is not None:
        grad_wh.copy_(updated[0])
        grad_we.copy_(updated[1])


class EngramGateFn(torch.autograd.Function):
    """out = hidden_states + sigmoid(signed_sqrt(dot(RMSNorm(x, wh), RMSNorm(k, we)) / sqrt(hidden))) * v.

    Args:
        hidden_states: (*, hc_mult, hidden) bf16 (on a CPU also float32 / float64).
        kv: (*, (hc_mult + 1) * hidden), the keys of the hc_mult heads then v, same dtype.
        weight_hidden, weight_embed: (hc_mult, hidden), the two RMSNorm weights.
        clamp_value: the lower clamp of |d| under the signed square root; eps: RMSNorm epsilon.
        image_token_mask: optional bool tensor over the tokens; True tokens pass through.

    Returns:
        output, shaped and typed like hidden_states.

    A weight with a `main_grad` attribute (an fp32 gradient buffer) has its gradient added to it in place, and
    None is returned for it; otherwise its gradient is returned (fp32 on CUDA).
    """

    @staticmethod
    def forward(ctx, hidden_states, kv, weight_hidden, weight_embed, clamp_value, eps, image_token_mask):
        shape = hidden_states.shape
        hc_mult, hidden = shape[-2], shape[-1]
        x = hidden_states.reshape(-1, hc_mult, hidden)
        kv_rows = kv.reshape(-1, hc_mult + 1, hidden)
        mask = None if image_token_mask is None else image_token_mask.reshape(-1)
        ops = _ops(x)
        weight_fused = ops.fused_weight(weight_hidden, weight_embed)
        output, dot, gate_score, rstd_x, rstd_k = ops.engram_gate_fwd(
            x, kv_rows, weight_fused, eps, clamp_value, save_for_backward=True, image_token_mask=mask
        )
        ctx.save_for_backward(x, kv_rows, weight_hidden, weight_embed, weight_fused, dot, gate_score, rstd_x, rstd_k, mask)
        ctx.clamp_value, ctx.shape, ctx.kv_shape = clamp_value, shape, kv.shape
        return output.view(shape)

    @staticmethod
    def backward(ctx, grad_output):
        x, kv_rows, weight_hidden, weight_embed, weight_fused, dot, gate_score, rstd_x, rstd_k, mask = ctx.saved_tensors
        ops = _ops(x)
        grad_out = grad_output.reshape(x.shape).to(x.dtype)
        grad_x, grad_kv, grad_w_partial = ops.engram_gate_bwd(
            grad_out, x, kv_rows, weight_fused, dot, gate_score, rstd_x, rstd_k, ctx.clamp_value, image_token_mask=mask
        )
        main_wh = getattr(weight_hidden, "main_grad", None)
        main_we = getattr(weight_embed, "main_grad", None)
        grad_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        grad_wh = main_wh if main_wh is not None else torch.zeros_like(weight_hidden, dtype=grad_dtype)
        grad_we = main_we if main_we is not None else torch.zeros_like(weight_embed, dtype=grad_dtype)
        _reduce(ops, grad_w_partial, weight_hidden, weight_embed, grad_wh, grad_we)
        return (
            grad_x.view(ctx.shape),
            grad_kv.view(ctx.kv_shape),
            None if main_wh is not None else grad_wh,
            None if main_we is not None else grad_we,
            None,
            None,
            None,
        )


engram_gate = EngramGateFn.apply
