"""tkaot.quant's SwiGLU backward ops: swiglu_backward, and swiglu_backward_and_per_token_cast (+ per-token FP8 cast
of the input gradient), on the swiglu_backward kernel.

Both ops' inputs are declared once, as a Signature (tkaot/_validate.py). Scale factors and their layouts follow
the forward ops (tkaot/_quant/swiglu.py, tkaot/_quant/fused.py's docstring); expert segments use the same token
alignment (128).
"""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._op import OpKernels, current_stream
from tkaot._quant.cast_common import SF_KIND, SF_PACKED_RULE, new_sf, sf_kind
from tkaot._quant.kernels import SWIGLU_BACKWARD
from tkaot._quant.swiglu import TOKEN_ALIGNMENT, alloc_token_sf
from tkaot._validate import MAX_I32, Let, Rule, Signature, Tensor, lazy_checker

__all__ = ["swiglu_backward", "swiglu_backward_and_per_token_cast"]

_BF16, _F32, _FP8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
# fmt -> (x_grad's dtype, the kernel's fmt)
_OUT = {"bf16": _BF16, "fp32": _F32, "e4m3": _BF16}
_NAMES = {_BF16: "bfloat16", _F32: "float32", _FP8: "e4m3"}
_FLOAT_OR_NONE = "{0} is None or type({0}) is float or type({0}) is int or (isinstance({0}, _REAL) and type({0}) is not bool)"
_SHAPE = "f'shape {tuple(h_x)}'"


def _signature(op: str, quantized: bool) -> Signature:
    """The inputs of both ops: swiglu_backward (quantized=False: fmt bf16 or fp32, act_x_grad of x's dtype, no x_sf)
    and swiglu_backward_and_per_token_cast."""
    fmts = ("e4m3", "bf16", "fp32") if quantized else ("bf16", "fp32")
    fmt_text = ", ".join(map(repr, fmts[:-1])) + f" or {fmts[-1]!r}"
    return Signature(
        op,
        tensors=(
            Tensor("x", (_BF16, _F32, _FP8), (("num_rows", "width"), ("batch", "seq", "width")), layout="contiguous", align=16,
                   what="2-D (num_tokens, 2 * hidden) or 3-D (batch, num_tokens, 2 * hidden): gate and up halves"),
            Tensor("x_sf", (_F32,), (("num_rows", "in_groups"),), layout="contiguous", optional=True, label="x[1] (sf)"),
            Tensor("act_x_grad", (_BF16, _F32), None, layout="contiguous", align=16),
            Tensor("psum_num_tokens_per_expert", (torch.int32,), (("num_experts",),), layout="contiguous", optional=True),
            Tensor("topk_weights", (_F32,), (("num_rows",),), layout="contiguous", optional=True),
        ),
        scalars=("fmt", "num_per_channels", "round_sf", "use_packed_ue8m0", "routed_scaling_factor", "clamp_value"),
        rules=(
            Let("num_rows", "num_rows if len(h_x) == 2 else batch * seq", after="x.shape"),
            Rule("x", "not width & 1 and width >> 1 and (width >> 1) % 64 == 0",
                 "of width 2 * hidden with hidden a positive multiple of 64", _SHAPE, after="x.shape"),
            Let("hidden", "width >> 1", after="x.shape"),
            Rule("x", f"num_rows * width <= {MAX_I32}", "of fewer than 2**31 elements", _SHAPE, after="x.shape"),
            Rule("fmt", f"fmt in {fmts}", fmt_text, actual="repr(fmt)", after="x"),
            Rule("num_per_channels", "fmt != 'e4m3' or num_per_channels in (32, 128)", "32 or 128 for fmt='e4m3'", after="x"),
            Rule("x", "(t_x is _dt_float8_e4m3fn) == (fmt == 'e4m3')",
                 "an (E4M3 data, fp32 sf) pair for fmt='e4m3' and a bf16 or fp32 tensor otherwise", actual="t_x", after="x"),
            Rule("x", "fmt != 'e4m3' or hidden % num_per_channels == 0", "of hidden size a multiple of num_per_channels",
                 _SHAPE, after="x"),
            Rule("x[1] (sf)", "fmt != 'e4m3' or x_sf is not None", "an fp32 tensor for fmt='e4m3'", actual="None", after="x"),
            Rule("x[1] (sf)", "in_groups == 2 * hidden // num_per_channels",
                 "of shape ({num_rows}, {2 * hidden // num_per_channels}): one fp32 sf per group of x",
                 actual="tuple(h_x_sf)", after="x_sf"),
            Rule("act_x_grad", "act_x_grad.numel() == num_rows * hidden and len(h_act_x_grad) and h_act_x_grad[-1] == hidden",
                 "of {num_rows} rows of hidden size {hidden} (x's rows)", actual="f'shape {tuple(h_act_x_grad)}'",
                 after="act_x_grad"),
            Rule("act_x_grad", "True" if quantized else "t_act_x_grad is t_x", "of x's dtype", actual="t_act_x_grad", after="act_x_grad"),
            SF_PACKED_RULE.replace(check=f"fmt != 'e4m3' or {SF_PACKED_RULE.check}"),
            SF_KIND.replace(value=f"({SF_KIND.value}) if fmt == 'e4m3' else 'none'"),
            Rule("routed_scaling_factor", _FLOAT_OR_NONE.format("routed_scaling_factor"), "a float or None", error="TypeError"),
            Rule("routed_scaling_factor", "routed_scaling_factor is None or topk_weights is not None",
                 "None without topk_weights (it scales them)"),
            Rule("clamp_value", _FLOAT_OR_NONE.format("clamp_value"), "a float or None", error="TypeError"),
        ),
        defaults={"batch": 1, "seq": 0, "in_groups": 0, "num_experts": 0},
        env={"_REAL": (int, float)},
        returns=(
            "device", "num_rows", "hidden", "num_experts", "sf_kind", "t_x", "t_act_x_grad",
            "p_x", "p_x_sf", "p_act_x_grad", "p_psum_num_tokens_per_expert", "p_topk_weights",
        ),
        )  # fmt: skip


SIGNATURE = _signature("tkaot.quant.swiglu_backward", False)
CAST_SIGNATURE = _signature("tkaot.quant.swiglu_backward_and_per_token_cast", True)
_CHECKS = {}
_CHECKS[False] = lazy_checker(SIGNATURE, _CHECKS, False)
_CHECKS[True] = lazy_checker(CAST_SIGNATURE, _CHECKS, True)

_KERNEL = OpKernels(CAST_SIGNATURE.op, SWIGLU_BACKWARD)


def _backward(x, x_sf, act_x_grad, fmt, num_per_channels, psum, topk_weights, routed_scaling_factor,
              use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute, quantized) -> tuple:  # fmt: skip
    """Check, allocate, launch; the result tuple in TileKernels' field order."""
    (device, num_rows, hidden, num_experts, sf_kind, x_dtype, grad_dtype,
     x_ptr, x_sf_ptr, grad_ptr, psum_ptr, weights_ptr) = _CHECKS[quantized](
        x, x_sf, act_x_grad, psum, topk_weights, fmt, num_per_channels, round_sf, use_packed_ue8m0,
        routed_scaling_factor, clamp_value,
    )  # fmt: skip
    where = x.device
    out_dtype = _OUT[fmt]
    group = num_per_channels if fmt == "e4m3" else 0
    x_grad = torch.empty((num_rows, 2 * hidden), dtype=out_dtype, device=where)
    act_out = torch.empty((num_rows, hidden), dtype=out_dtype, device=where) if do_recompute else None
    weight_grad = torch.empty((num_rows,), dtype=_F32, device=where) if topk_weights is not None else None
    if group:
        x_grad_fp8 = torch.empty((num_rows, 2 * hidden), dtype=_FP8, device=where)
        x_grad_sf, sf_stride, sf_group_stride = alloc_token_sf(num_rows, 2 * hidden // group, sf_kind, use_tma_aligned_col_major_sf, where)
    else:
        x_grad_fp8 = x_grad_sf = None
        sf_stride = sf_group_stride = 0
    if num_rows:
        launcher = _KERNEL.get(device, _NAMES[x_dtype], _NAMES[grad_dtype], fmt, group, sf_kind)
        launcher(
            device, current_stream(device),
            x_ptr, x_sf_ptr, grad_ptr, weights_ptr, psum_ptr, x_grad.data_ptr(),
            0 if x_grad_fp8 is None else x_grad_fp8.data_ptr(), 0 if x_grad_sf is None else x_grad_sf.data_ptr(),
            0 if weight_grad is None else weight_grad.data_ptr(), 0 if act_out is None else act_out.data_ptr(),
            0 if psum is None else 1, TOKEN_ALIGNMENT, num_experts.bit_length(), 0 if topk_weights is None else 1,
            1.0 if routed_scaling_factor is None else float(routed_scaling_factor),
            0 if clamp_value is None else 1, 0.0 if clamp_value is None else float(clamp_value), 1 if do_recompute else 0,
            num_rows, hidden, num_experts, 2 * hidden // group if group else 0, sf_stride, sf_group_stride,
        )  # fmt: skip
    result = [x_grad]
    if group:
        result.append((x_grad_fp8, x_grad_sf))
    if weight_grad is not None:
        result.append(weight_grad)
    if do_recompute:
        result.append(act_out)
    return tuple(result)


def swiglu_backward(
    x: torch.Tensor,
    act_x_grad: torch.Tensor,
    fmt: str,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    clamp_value: float | None = None,
    do_recompute: bool = False,
) -> tuple:
    """Gradient of swiglu_forward with respect to x (and to topk_weights), without quantization.

    With g, u the gate and up halves of a row (clamped as the forward clamps them, when clamp_value is
    given), s = 1 / (1 + exp(-g)), dy = act_x_grad and w = topk_weights * routed_scaling_factor (1 without
    weights), in fp32:
        x_grad = [dy * w * s * u * (1 + g * (1 - s)) | dy * w * s * g], 0 where the forward clamped;
        weight_grad = sum(dy * silu(g) * u) * routed_scaling_factor;  act_out = silu(g) * u * w.

    Args:
        x: (num_tokens, 2 * hidden) or (batch, num_tokens, 2 * hidden), bf16 or fp32, contiguous, on a CUDA
            device; hidden a multiple of 64.
        act_x_grad: the forward output's gradient, of x's dtype, contiguous, hidden wide (x's rows).
        fmt: "bf16" or "fp32", the dtype of x_grad and act_out.
        psum_num_tokens_per_expert: optional int32 (num_experts,) prefix sums of tokens per expert: expert e
            owns rows [align(psum[e-1], 128), psum[e]); a row in [psum[e-1], align(psum[e-1], 128)) is
            padding and gets zeros in every output. Padding rows of x and act_x_grad must be 0.
        topk_weights: optional fp32 (rows,) contiguous routing weights; weight_grad is returned with them.
        routed_scaling_factor: optional scalar multiplying topk_weights (needs them) and weight_grad.
        clamp_value: optional; the forward clamped gate to at most it and up to [-it, it].
        do_recompute: also return act_out, the forward's output.

    Returns:
        (x_grad (rows, 2 * hidden), weight_grad (rows,) fp32 when topk_weights is given, act_out (rows,
        hidden) when do_recompute), in that order.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_swiglu_backward(
            x, act_x_grad, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, do_recompute
        )
    return _backward(x, None, act_x_grad, fmt, None, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                     False, False, False, clamp_value, do_recompute, False)  # fmt: skip


def swiglu_backward_and_per_token_cast(
    x: tuple[torch.Tensor, torch.Tensor],
    act_x_grad: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    clamp_value: float | None = None,
    do_recompute: bool = False,
) -> tuple:
    """swiglu_backward of an FP8 input, with x_grad also cast to E4M3 per group of num_per_channels columns.

    Args:
        x: for fmt "e4m3", an (E4M3 data (rows, 2 * hidden), fp32 sf (rows, 2 * hidden / num_per_channels))
            pair, contiguous, decoded as data * sf; for fmt "bf16" / "fp32" a bf16 or fp32 tensor as for
            swiglu_backward (num_per_channels is then ignored).
        act_x_grad: bf16 or fp32, contiguous, hidden wide (x's rows).
        fmt: "e4m3" (x_grad in bf16 plus its E4M3 cast), or "bf16" / "fp32" (no cast).
        num_per_channels: 32 or 128 for "e4m3": the group of x's sf and of the cast's.
        psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, do_recompute: as for
            swiglu_backward.
        use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0: the cast's sf layout and kind, as for
            swiglu_forward_and_per_token_cast.

    Returns:
        (x_grad, (x_grad_fp8, x_grad_fp8_sf) for "e4m3", weight_grad with topk_weights, act_out with
        do_recompute), in that order; the cast is of x_grad's fp32 values, before rounding to bf16.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_swiglu_backward_and_per_token_cast(
            x, act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
            use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, do_recompute,
        )  # fmt: skip
    quantized_input = fmt == "e4m3"
    if quantized_input:
        if not (isinstance(x, (tuple, list)) and len(x) == 2):
            raise TypeError(
                f"tkaot.quant.swiglu_backward_and_per_token_cast: x must be a (data, sf) pair for fmt='e4m3', got {type(x).__name__}"
            )
        x, x_sf = x
    else:
        x_sf = None
    return _backward(x, x_sf, act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights,
                     routed_scaling_factor, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value,
                     do_recompute, True)  # fmt: skip


# ---- tracing (tkaot/_compile.py): each op's outputs, allocated through `new`


def _fake_backward(new, x, fmt, num_per_channels, topk_weights, col_major_sf, round_sf, use_packed_ue8m0, do_recompute) -> tuple:
    """_backward's result, allocated through `new` (x: the data tensor)."""
    num_rows = x.shape[0] if x.dim() == 2 else x.shape[0] * x.shape[1]
    hidden, where = x.shape[-1] // 2, x.device
    out_dtype = _OUT[fmt]
    result = [new.empty((num_rows, 2 * hidden), out_dtype, where)]
    if fmt == "e4m3":
        kind = sf_kind(round_sf, use_packed_ue8m0)
        groups = 2 * hidden // num_per_channels
        result.append((new.empty((num_rows, 2 * hidden), _FP8, where), new_sf(new, num_rows, groups, kind, col_major_sf, where)))
    if topk_weights is not None:
        result.append(new.empty((num_rows,), _F32, where))
    if do_recompute:
        result.append(new.empty((num_rows, hidden), out_dtype, where))
    return tuple(result)


def _fake(new, x, act_x_grad, fmt, psum_num_tokens_per_expert=None, topk_weights=None, routed_scaling_factor=None, clamp_value=None,
          do_recompute=False):  # fmt: skip
    return _fake_backward(new, x, fmt, None, topk_weights, False, False, False, do_recompute)


def _fake_cast(
    new, x, act_x_grad, fmt, num_per_channels, psum_num_tokens_per_expert=None, topk_weights=None, routed_scaling_factor=None,
    use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False, clamp_value=None, do_recompute=False,
):  # fmt: skip
    data = x if isinstance(x, torch.Tensor) else x[0]  # the (data, sf) pair of fmt "e4m3"
    return _fake_backward(
        new, data, fmt, num_per_channels, topk_weights, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, do_recompute
    )


_traced_swiglu_backward = traced(swiglu_backward, _fake, outputs=3)
_traced_swiglu_backward_and_per_token_cast = traced(swiglu_backward_and_per_token_cast, _fake_cast, outputs=5, kinds={"x": "tensors"})
