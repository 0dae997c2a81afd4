"""tkaot.quant's SwiGLU ops: swiglu_forward, and swiglu_forward_and_per_token_cast (+ per-token FP8 cast).

Each op's inputs are declared once, as a Signature (tkaot/_validate.py): its checker is both the fast path
and the detailed error. Scale factors follow TileKernels 2.1.0 (tkaot/_quant/fused.py's docstring); the
tiling launched is tkaot._quant.fused.SWIGLU_TILING, or SWIGLU_CLAMP_TILING when clamp_value is given,
read at each call.
"""

from __future__ import annotations

import math

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._op import OpKernels, current_stream
from tkaot._quant import fused as _fused
from tkaot._quant.cast_common import SF_KIND, SF_PACKED_RULE, _alloc_sf
from tkaot._quant.fused import _F32, _I32, _empty_strided
from tkaot._quant.kernels import SWIGLU
from tkaot._validate import MAX_I32, Let, Rule, Signature, Tensor, lazy_checker

__all__ = ["swiglu_forward", "swiglu_forward_and_per_token_cast"]

# Rows of an expert's segment start at a multiple of this (TileKernels' default token alignment)
TOKEN_ALIGNMENT = 128

# (fmt, num_per_channels) -> (the kernel's fmt, its group, the output dtype)
_FORMATS = {
    ("e4m3", 128): ("e4m3", 128, torch.float8_e4m3fn), ("e4m3", 32): ("e4m3", 32, torch.float8_e4m3fn),
    ("bf16", None): ("bf16", 0, torch.bfloat16), ("fp32", None): ("fp32", 0, torch.float32),
}  # fmt: skip
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}

_SHAPE = "f'shape {tuple(h_x)}'"
_X_SHAPE = "2-D (num_tokens, 2 * hidden): gate and up halves"
_MAX_HIDDEN = "(32768 if t_x is _dt_bfloat16 else 18432)"  # the kernels' register budget
_FLOAT_OR_NONE = "{0} is None or type({0}) is float or type({0}) is int or (isinstance({0}, _REAL) and type({0}) is not bool)"
_TENSORS = (
    Tensor("x", (torch.bfloat16, torch.float32), (("num_tokens", "width"),), what=_X_SHAPE),
    Tensor("psum_num_tokens_per_expert", (torch.int32,), (("num_experts",),), layout="contiguous", optional=True),
    Tensor("topk_weights", (torch.float32,), (("num_tokens",),), layout="any", optional=True),
    Tensor("clamped_count", (torch.int64,), ((4,),), layout="contiguous", optional=True),
)
_X_RULES = (
    Rule("x", "not width & 1", _X_SHAPE, _SHAPE, after="x.shape"),
    Let("hidden", "width >> 1", after="x.shape"),
    Rule("x", f"hidden % 64 == 0 and 0 < hidden <= {_MAX_HIDDEN}",
         f"of width 2 * hidden with hidden a multiple of 64 in (0, {{{_MAX_HIDDEN}}}]", _SHAPE, after="x.shape"),
    Rule("x", f"num_tokens <= {MAX_I32 // 2}", "below 2**30 rows", _SHAPE, after="x.shape"),
)  # fmt: skip
_OPTION_RULES = (
    Let("search_steps", "num_experts.bit_length()", after="psum_num_tokens_per_expert"),
    Let("weights_stride", "s_topk_weights[0] if num_tokens > 1 else 0", after="topk_weights"),
    Let("has_weights", "1", after="topk_weights"),
    Let("has_count", "1", after="clamped_count"),
    Rule("clamped_count", "clamp_value is not None", "None without clamp_value (it counts clamped elements)",
         actual="'a tensor'", after="clamped_count"),
    Rule("x", f"num_tokens * ((hidden + 31) >> 5) <= {MAX_I32}",
         "small enough for int32 clamp counts (num_tokens * hidden / 32 < 2**31)", _SHAPE, after="clamped_count"),
    Rule("routed_scaling_factor", _FLOAT_OR_NONE.format("routed_scaling_factor"), "a float or None", error="TypeError"),
    Rule("routed_scaling_factor", "routed_scaling_factor is None or topk_weights is not None",
         "None without topk_weights (it scales them)"),
    Rule("clamp_value", _FLOAT_OR_NONE.format("clamp_value"), "a float or None", error="TypeError"),
    # The kernels clamp with min / max: an interval [-clamp_value, clamp_value] that is empty has no such form
    Rule("clamp_value", "clamp_value is None or clamp_value > 0 or (clamp_value == 0 and _copysign(1.0, clamp_value) > 0)",
         "a non-negative number (not NaN or -0.0)"),
)  # fmt: skip
# What the launch reads: device, sizes, the format, the sf kind, then pointers and strides
_RETURNS = (
    "device", "num_tokens", "hidden", "t_x", "spec", "sf_kind", "num_experts", "search_steps",
    "p_x", "p_psum_num_tokens_per_expert", "p_topk_weights", "p_clamped_count", "s_x[0] if num_tokens > 1 else 0", "weights_stride",
    "has_weights", "has_count",
)  # fmt: skip
_ENV = {"_FORMATS": _FORMATS, "_REAL": (int, float), "_copysign": math.copysign}
_DEFAULTS = {"num_experts": 0, "search_steps": 0, "weights_stride": 0, "has_weights": 0, "has_count": 0}

FORWARD = Signature(
    "tkaot.quant.swiglu_forward",
    tensors=_TENSORS,
    rules=(
        Rule("fmt", "fmt == 'bf16' or fmt == 'fp32'", "'bf16' or 'fp32'", actual="repr(fmt)", after="x"),
        Let("spec", "_FORMATS[(fmt, None)]", after="x"),
        Let("sf_kind", "'none'", after="x"),
        *_X_RULES,
        *_OPTION_RULES,
    ),
    scalars=("fmt", "routed_scaling_factor", "clamp_value"),
    defaults=_DEFAULTS,
    env=_ENV,
    returns=_RETURNS,
)
CAST = Signature(
    "tkaot.quant.swiglu_forward_and_per_token_cast",
    tensors=_TENSORS,
    rules=(
        Let("spec", "_FORMATS.get((fmt, num_per_channels))", after="x"),
        Rule("(fmt, num_per_channels)", "spec is not None", "('e4m3', 128), ('e4m3', 32), ('bf16', None) or ('fp32', None)",
             actual="(fmt, num_per_channels)", after="x"),
        # the sf-kind rule for a quantized format
        SF_PACKED_RULE.replace(check=f"not spec[1] or {SF_PACKED_RULE.check}", after="x"),
        SF_KIND.replace(value=f"({SF_KIND.value}) if spec[1] else 'none'", after="x"),
        *_X_RULES,
        Rule("x", "not spec[1] or hidden % spec[1] == 0", "of width 2 * hidden with hidden a multiple of num_per_channels",
             "f'shape {tuple(h_x)} with num_per_channels={num_per_channels}'", after="x"),
        *_OPTION_RULES,
    ),
    scalars=("fmt", "num_per_channels", "round_sf", "use_packed_ue8m0", "routed_scaling_factor", "clamp_value"),
    defaults=_DEFAULTS,
    env=_ENV,
    returns=_RETURNS,
)  # fmt: skip


_check_forward = lazy_checker(FORWARD, globals(), "_check_forward")


_check_cast = lazy_checker(CAST, globals(), "_check_cast")


_SWIGLU = OpKernels(CAST.op, SWIGLU)


def alloc_token_sf(num_rows: int, num_groups: int, sf_kind: str, col_major: bool, device) -> tuple[torch.Tensor, int, int]:
    """The per-token sf tensor as returned to the user, and the (token, group) strides the kernel writes it with.

    fp32 sf: (num_rows, num_groups) float32. Packed UE8M0: (num_rows, ceil(num_groups / 4)) int32,
    strides then in bytes (token, word), a byte per group within its word. Column-major: token
    stride 1 (4 bytes packed), the token dimension padded to a multiple of 4 elements (16 bytes).
    """
    sf = _alloc_sf(num_rows, num_groups, sf_kind, "col" if col_major else "row", device)
    token_stride, group_stride = sf.stride()
    if sf_kind == "ue8m0":  # packed sf is addressed in bytes
        token_stride, group_stride = token_stride * 4, group_stride * 4
    return sf, token_stride, group_stride


def _swiglu(checked: tuple, x: torch.Tensor, routed_scaling_factor, clamp_value, col_major_sf: bool):
    """Launch on what a Signature's checker returned; returns out, or (out, sf) for a quantized format."""
    (device, num_tokens, hidden, dtype, spec, sf_kind, num_experts, search_steps,
     x_ptr, psum_ptr, w_ptr, count_ptr, x_s, weights_stride, has_weights, has_count) = checked  # fmt: skip
    key_fmt, group, out_dtype = spec
    if num_tokens:
        tiling = _fused.SWIGLU_TILING if clamp_value is None else _fused.SWIGLU_CLAMP_TILING  # read at each call
        launcher = _SWIGLU.cache.get((device, hidden, dtype, key_fmt, group, sf_kind, tiling))
        if launcher is None:
            general = _fused.SWIGLU_TILING
            launcher = _SWIGLU.get(device, hidden, _DTYPE_NAMES[dtype], key_fmt, group, sf_kind, tiling, general_tiling=general)
            _SWIGLU.cache[(device, hidden, dtype, key_fmt, group, sf_kind, tiling)] = launcher

    # out contiguous; sf as alloc_token_sf lays it out (written inline: its strides are known)
    x_device = x.device
    out = _empty_strided((num_tokens, hidden), (hidden, 1), dtype=out_dtype, device=x_device)
    if group:
        groups = hidden // group
        if sf_kind == "ue8m0":
            cols, sf_dtype, unit = -(-groups // 4), _I32, 4
        else:
            cols, sf_dtype, unit = groups, _F32, 1
        if col_major_sf:
            padded = -(-num_tokens // 4) * 4
            if padded == num_tokens:
                out_sf = _empty_strided((num_tokens, cols), (1, padded), dtype=sf_dtype, device=x_device)
            else:
                storage = _empty_strided((cols * padded,), (1,), dtype=sf_dtype, device=x_device)
                out_sf = storage.as_strided((num_tokens, cols), (1, padded))
            sf_token_stride, sf_group_stride = unit, padded * unit
        else:
            out_sf = _empty_strided((num_tokens, cols), (cols, 1), dtype=sf_dtype, device=x_device)
            sf_token_stride, sf_group_stride = cols * unit, unit
        sf_ptr = out_sf.data_ptr()
    else:
        sf_ptr = sf_token_stride = sf_group_stride = 0
    if num_tokens:
        launcher(
            device, current_stream(device),
            x_ptr, out.data_ptr(), sf_ptr, psum_ptr if num_experts else 0, w_ptr, count_ptr,
            1 if num_experts else 0, TOKEN_ALIGNMENT, search_steps,
            has_weights, 1.0 if routed_scaling_factor is None else float(routed_scaling_factor),
            0 if clamp_value is None else 1, 0.0 if clamp_value is None else float(clamp_value), has_count,
            num_tokens, num_experts, x_s, weights_stride, sf_token_stride, sf_group_stride,
        )  # fmt: skip
    return (out, out_sf) if group else out


def swiglu_forward(
    x: torch.Tensor,
    fmt: str,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    clamp_value: float | None = None,
    clamped_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """SwiGLU: silu(gate) * up (* topk_weights * routed_scaling_factor), output in bf16 or fp32.

    Args:
        x: (num_tokens, 2 * hidden), bf16 or fp32, on a CUDA device: gate columns first, then up;
            last dimension contiguous, rows 16-byte aligned; hidden a multiple of 64 (widths that are not
            multiples of 256 run on the generic kernel, kernels_src/fused/swiglu_generic.py).
        fmt: "bf16" or "fp32", the output dtype.
        psum_num_tokens_per_expert: optional int32 (num_experts,): expert e owns rows
            [align(psum[e-1], 128), psum[e]) (psum[-1] = 0). Only those rows are computed and
            counted; the others of the output are left unwritten.
        topk_weights: optional fp32 (num_tokens,) per-row weights.
        routed_scaling_factor: optional scalar multiplied into topk_weights (needs them).
        clamp_value: optional, non-negative (not NaN or -0.0; TileKernels takes any float); gate is clamped
            to at most clamp_value, up to [-clamp_value, clamp_value].
        clamped_count: optional int64 (4,) (needs clamp_value), added to in place: gate elements
            above clamp_value, up elements above it, up elements below -clamp_value, and the number
            of elements of the computed rows.

    Everything is computed in fp32: silu(g) = g / (1 + exp(-g)). Returns (num_tokens, hidden).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_swiglu_forward(x, fmt, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value, clamped_count)
    checked = _check_forward(x, psum_num_tokens_per_expert, topk_weights, clamped_count, fmt, routed_scaling_factor, clamp_value)
    return _swiglu(checked, x, routed_scaling_factor, clamp_value, False)


def swiglu_forward_and_per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    routed_scaling_factor: float | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    clamp_value: float | None = None,
    clamped_count: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """swiglu_forward with its fp32 output cast to FP8 E4M3 per group of num_per_channels columns.

    Args:
        x, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, clamp_value,
            clamped_count: as for swiglu_forward.
        fmt, num_per_channels: "e4m3" with 128 or 32; ("bf16", None) and ("fp32", None) give
            swiglu_forward's unquantized output (returned alone).
        use_tma_aligned_col_major_sf: return the sf column-major, the token dimension padded to 16 bytes.
        round_sf: round each sf up to a power of two.
        use_packed_ue8m0: store sf as exponent bytes, four per int32 (needs round_sf).

    For each group: amax = max(|v|, 1e-4); sf = amax / 448 (or its power-of-two ceiling);
    stored = e4m3(v / sf). Returns (out e4m3 (num_tokens, hidden), sf (num_tokens, hidden /
    num_per_channels) fp32 or (num_tokens, ceil(hidden / num_per_channels / 4)) int32).
    A NaN output does not enter its group's amax (the other values set the sf) and is stored as NaN.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_swiglu_forward_and_per_token_cast(
            x, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, use_tma_aligned_col_major_sf,
            round_sf, use_packed_ue8m0, clamp_value, clamped_count
        )  # fmt: skip
    checked = _check_cast(
        x, psum_num_tokens_per_expert, topk_weights, clamped_count, fmt, num_per_channels, round_sf, use_packed_ue8m0,
        routed_scaling_factor, clamp_value,
    )  # fmt: skip
    return _swiglu(checked, x, routed_scaling_factor, clamp_value, use_tma_aligned_col_major_sf)


def _fake_out(new, x, fmt, num_per_channels, col_major_sf, use_packed_ue8m0):
    """SwiGLU's outputs, allocated through `new` (tracing, tkaot/_compile.py): out, or (out, sf) for a quantized format."""
    num_tokens, hidden = x.shape[0], x.shape[1] // 2
    _, group, out_dtype = _FORMATS[(fmt, num_per_channels)]
    out = new.empty((num_tokens, hidden), out_dtype, x.device)
    if not group:
        return out
    groups = hidden // group
    cols, sf_dtype = (-(-groups // 4), _I32) if use_packed_ue8m0 else (groups, _F32)
    if col_major_sf:
        sf = new.empty_strided((num_tokens, cols), (1, -(-num_tokens // 4) * 4), sf_dtype, x.device)
    else:
        sf = new.empty((num_tokens, cols), sf_dtype, x.device)
    return out, sf


def _fake_forward(new, x, fmt, psum_num_tokens_per_expert=None, topk_weights=None, routed_scaling_factor=None, clamp_value=None,
                  clamped_count=None):  # fmt: skip
    return _fake_out(new, x, fmt, None, False, False)


def _fake_cast(
    new, x, fmt, num_per_channels, psum_num_tokens_per_expert=None, topk_weights=None, routed_scaling_factor=None,
    use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False, clamp_value=None, clamped_count=None,
):  # fmt: skip
    return _fake_out(new, x, fmt, num_per_channels, use_tma_aligned_col_major_sf, use_packed_ue8m0)


_traced_swiglu_forward = traced(swiglu_forward, _fake_forward, mutates=("clamped_count",))
_traced_swiglu_forward_and_per_token_cast = traced(swiglu_forward_and_per_token_cast, _fake_cast, mutates=("clamped_count",), outputs=2)
