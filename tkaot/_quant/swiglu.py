"""tkaot.quant's SwiGLU ops: swiglu_forward, and swiglu_forward_and_per_token_cast (+ per-token FP8 cast).

Scale factors follow TileKernels 2.1.0 (tkaot/_fused.py's docstring); the tiling launched is
tkaot._quant.fused.SWIGLU_TILING, or SWIGLU_CLAMP_TILING when clamp_value is given, read at each call.
"""

from __future__ import annotations

import math

import torch

from tkaot import _validate
from tkaot._op import OpKernels, current_stream
from tkaot._quant import fused as _fused
from tkaot._quant.cast_common import _alloc_sf, _ceil_div
from tkaot._quant.fused import _BF16, _F32, _FP8, _I32, _I64, _IN_DTYPES, _empty_strided, _Fallback, _sf_kind
from tkaot._quant.kernels import SWIGLU
from tkaot._validate import MAX_I32, fail

__all__ = ["swiglu_forward", "swiglu_forward_and_per_token_cast"]

# Rows of an expert's segment start at a multiple of this (TileKernels' default token alignment)
TOKEN_ALIGNMENT = 128

_OUT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "e4m3": torch.float8_e4m3fn}
_SWIGLU_MAX_HIDDEN = {torch.bfloat16: 32768, torch.float32: 18432}


_SWIGLU = OpKernels("tkaot.quant.swiglu_forward_and_per_token_cast", SWIGLU)


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


def _optional_float(op: str, name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a float or None, got {type(value).__name__}")
    return float(value)


def _swiglu(
    op: str,
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int | None,
    psum_num_tokens_per_expert: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    routed_scaling_factor: float | None,
    use_tma_aligned_col_major_sf: bool,
    round_sf: bool,
    use_packed_ue8m0: bool,
    clamp_value: float | None,
    clamped_count: torch.Tensor | None,
):
    # The hot path reads each tensor property once and accepts only plainly valid, non-empty
    # input with one combined condition per argument; anything else (every invalid input among
    # it) goes through _swiglu_checked, which raises the detailed error.
    try:
        device, dtype, xs, shape, x_ptr = x.get_device(), x.dtype, x.stride(), x.shape, x.data_ptr()
        spec = _IN_DTYPES.get(dtype)
        if device < 0 or spec is None or len(xs) != 2:
            raise _Fallback
        dtype_name, vec = spec
        num_rows, width = shape
        hidden = width >> 1
        x_s = xs[0] if num_rows > 1 else 0
        if (
            width & 1 or hidden % 256 or not 0 < hidden <= _SWIGLU_MAX_HIDDEN[dtype] or not 0 < num_rows <= MAX_I32 // 2
            or xs[1] != 1 or x_ptr % 16 or x_s % vec or x_s > MAX_I32
        ):  # fmt: skip
            raise _Fallback
        if fmt == "e4m3":
            # an int group only: the launcher cache would take 128.0 for 128
            if type(num_per_channels) is not int or (num_per_channels != 128 and num_per_channels != 32):
                raise _Fallback
            key_fmt, group, out_dtype = "e4m3", num_per_channels, _FP8
            if use_packed_ue8m0:
                if not round_sf:
                    raise _Fallback
                sf_kind = "ue8m0"
            else:
                sf_kind = "pow2" if round_sf else "fp32"
        elif num_per_channels is None and (fmt == "bf16" or fmt == "fp32"):
            key_fmt, out_dtype = ("bf16", _BF16) if fmt == "bf16" else ("fp32", _F32)
            group, sf_kind = 0, "none"
        else:
            raise _Fallback

        psum = psum_num_tokens_per_expert
        if psum is None:
            num_experts = search_steps = psum_ptr = 0
        else:
            p_device, p_dtype, ps, pshape, psum_ptr = psum.get_device(), psum.dtype, psum.stride(), psum.shape, psum.data_ptr()
            if p_device != device or p_dtype is not _I32 or len(ps) != 1:
                raise _Fallback
            num_experts = pshape[0]
            if num_experts > 1 and ps[0] != 1:
                raise _Fallback
            search_steps = num_experts.bit_length()
            if not num_experts:
                psum_ptr = 0
        if topk_weights is None:
            w_ptr = weights_stride = has_weights = 0
            if routed_scaling_factor is not None:
                raise _Fallback
            scale = 1.0
        else:
            w_device, w_dtype, ws, wshape, w_ptr = (
                topk_weights.get_device(), topk_weights.dtype, topk_weights.stride(), topk_weights.shape, topk_weights.data_ptr(),
            )  # fmt: skip
            if w_device != device or w_dtype is not _F32 or len(ws) != 1 or wshape[0] != num_rows:
                raise _Fallback
            weights_stride = ws[0] if num_rows > 1 else 0
            has_weights = 1
            if routed_scaling_factor is None:
                scale = 1.0
            elif type(routed_scaling_factor) is float or type(routed_scaling_factor) is int:
                scale = float(routed_scaling_factor)
            else:
                raise _Fallback
        if clamp_value is None:
            clamp, has_clamp = 0.0, 0
            if clamped_count is not None:
                raise _Fallback
        elif type(clamp_value) is float or type(clamp_value) is int:
            clamp, has_clamp = float(clamp_value), 1
            if not clamp > 0.0:  # zero, negative or NaN: the checked path decides
                raise _Fallback
        else:
            raise _Fallback
        if clamped_count is None:
            count_ptr = count_clamp = 0
        else:
            c_device, c_dtype, cs, cshape, count_ptr = (
                clamped_count.get_device(), clamped_count.dtype, clamped_count.stride(), clamped_count.shape, clamped_count.data_ptr(),
            )  # fmt: skip
            if c_device != device or c_dtype is not _I64 or len(cs) != 1 or cshape[0] != 4 or cs[0] != 1:
                raise _Fallback
            if num_rows * -(-hidden // 32) > MAX_I32:
                raise _Fallback
            count_clamp = 1
    except Exception:  # _Fallback, or a non-tensor argument: the checked path raises what applies
        return _swiglu_checked(op, x, fmt, num_per_channels, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor,
                               use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, clamp_value, clamped_count)  # fmt: skip
    tiling = _fused.SWIGLU_CLAMP_TILING if has_clamp else _fused.SWIGLU_TILING  # read at each call: benchmarks switch it
    launcher = _SWIGLU.cache.get((device, hidden, dtype_name, key_fmt, group, sf_kind, tiling))
    if launcher is None:
        launcher = _SWIGLU.get(device, hidden, dtype_name, key_fmt, group, sf_kind, tiling, general_tiling=_fused.SWIGLU_TILING)

    # Outputs as the checked path allocates them: out contiguous, sf as alloc_token_sf lays it out
    x_device = x.device
    out = _empty_strided((num_rows, hidden), (hidden, 1), dtype=out_dtype, device=x_device)
    if group:
        groups = hidden // group
        if sf_kind == "ue8m0":
            cols, sf_dtype, unit = -(-groups // 4), _I32, 4
        else:
            cols, sf_dtype, unit = groups, _F32, 1
        if use_tma_aligned_col_major_sf:
            padded = -(-num_rows // 4) * 4
            if padded == num_rows:
                out_sf = _empty_strided((num_rows, cols), (1, padded), dtype=sf_dtype, device=x_device)
            else:
                storage = _empty_strided((cols * padded,), (1,), dtype=sf_dtype, device=x_device)
                out_sf = storage.as_strided((num_rows, cols), (1, padded))
            sf_token_stride, sf_group_stride = unit, padded * unit
        else:
            out_sf = _empty_strided((num_rows, cols), (cols, 1), dtype=sf_dtype, device=x_device)
            sf_token_stride, sf_group_stride = cols * unit, unit
        sf_ptr = out_sf.data_ptr()
    else:
        sf_ptr = sf_token_stride = sf_group_stride = 0
    launcher(
        device, current_stream(device),
        x_ptr, out.data_ptr(), sf_ptr, psum_ptr, w_ptr, count_ptr,
        1 if num_experts else 0, TOKEN_ALIGNMENT, search_steps, has_weights, scale, has_clamp, clamp, count_clamp,
        num_rows, num_experts, x_s, weights_stride, sf_token_stride, sf_group_stride,
    )  # fmt: skip
    return (out, out_sf) if group else out


def _swiglu_checked(
    op: str,
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int | None,
    psum_num_tokens_per_expert: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    routed_scaling_factor: float | None,
    use_tma_aligned_col_major_sf: bool,
    round_sf: bool,
    use_packed_ue8m0: bool,
    clamp_value: float | None,
    clamped_count: torch.Tensor | None,
):
    """_swiglu for any input: each argument validated in turn (the detailed errors), then launched."""
    device = _validate.check_cuda(op, "x", x)
    spec = _IN_DTYPES.get(x.dtype)
    if spec is None:
        fail(op, "x", "bfloat16 or float32", x.dtype)
    dtype_name, vec = spec
    if x.dim() != 2 or x.shape[1] % 2:
        fail(op, "x", "2-D (num_tokens, 2 * hidden): gate and up halves", f"shape {tuple(x.shape)}")
    num_rows, hidden = x.shape[0], x.shape[1] // 2
    max_hidden = _SWIGLU_MAX_HIDDEN[x.dtype]
    if hidden % 256 or not 0 < hidden <= max_hidden:
        fail(op, "x", f"of width 2 * hidden with hidden a multiple of 256 in (0, {max_hidden}]", f"shape {tuple(x.shape)}")
    _validate.check_rows(op, "x", x, vec)
    if num_rows > MAX_I32 // 2:
        fail(op, "x", "below 2**30 rows", f"shape {tuple(x.shape)}")

    if (fmt, num_per_channels) not in (("e4m3", 128), ("e4m3", 32), ("bf16", None), ("fp32", None)):
        fail(op, "(fmt, num_per_channels)", "('e4m3', 128), ('e4m3', 32), ('bf16', None) or ('fp32', None)", (fmt, num_per_channels))
    quantized = fmt == "e4m3"
    sf_kind = _sf_kind(op, round_sf, use_packed_ue8m0) if quantized else "none"
    group = num_per_channels or 0

    num_experts = search_steps = 0
    if psum_num_tokens_per_expert is not None:
        psum = psum_num_tokens_per_expert
        _validate.check_cuda(op, "psum_num_tokens_per_expert", psum, device)
        if psum.dtype != torch.int32:
            fail(op, "psum_num_tokens_per_expert", "torch.int32", psum.dtype)
        if psum.dim() != 1 or (psum.shape[0] > 1 and psum.stride(0) != 1):
            actual = f"shape {tuple(psum.shape)} strides {psum.stride()}"
            fail(op, "psum_num_tokens_per_expert", "1-D (num_experts,) and contiguous", actual)
        num_experts = psum.shape[0]
        search_steps = num_experts.bit_length()
    weights_stride = 0
    if topk_weights is not None:
        _validate.check_like(op, "topk_weights", topk_weights, (num_rows,), torch.float32, device)
        weights_stride = topk_weights.stride(0) if num_rows > 1 else 0
    routed_scaling_factor = _optional_float(op, "routed_scaling_factor", routed_scaling_factor)
    if routed_scaling_factor is not None and topk_weights is None:
        fail(op, "routed_scaling_factor", "None without topk_weights (it scales them)", routed_scaling_factor)
    clamp_value = _optional_float(op, "clamp_value", clamp_value)
    if clamp_value is not None and not (clamp_value >= 0.0 and math.copysign(1.0, clamp_value) > 0):
        # The kernels clamp with min / max: an interval [-clamp_value, clamp_value] that is empty has no such form
        fail(op, "clamp_value", "a non-negative number (not NaN or -0.0)", clamp_value)
    if clamped_count is not None:
        if clamp_value is None:
            fail(op, "clamped_count", "None without clamp_value (it counts clamped elements)", "a tensor")
        _validate.check_like(op, "clamped_count", clamped_count, (4,), torch.int64, device)
        if clamped_count.stride(0) != 1:
            fail(op, "clamped_count", "contiguous", f"strides {clamped_count.stride()}")
        if num_rows * _ceil_div(hidden, 32) > MAX_I32:
            fail(op, "x", "small enough for int32 clamp counts (num_tokens * hidden / 32 < 2**31)", f"shape {tuple(x.shape)}")

    out = torch.empty((num_rows, hidden), dtype=_OUT_DTYPES[fmt], device=x.device)
    out_sf = None
    sf_strides = (0, 0)
    if quantized:
        out_sf, *sf_strides = alloc_token_sf(num_rows, hidden // group, sf_kind, bool(use_tma_aligned_col_major_sf), x.device)
    if num_rows:
        tiling = _fused.SWIGLU_TILING if clamp_value is None else _fused.SWIGLU_CLAMP_TILING
        launcher = _SWIGLU.get(device, hidden, dtype_name, fmt, group, sf_kind, tiling, general_tiling=_fused.SWIGLU_TILING)
        launcher(
            device, current_stream(device),
            x.data_ptr(), out.data_ptr(), out_sf.data_ptr() if quantized else 0,
            psum_num_tokens_per_expert.data_ptr() if num_experts else 0,
            topk_weights.data_ptr() if topk_weights is not None else 0,
            clamped_count.data_ptr() if clamped_count is not None else 0,
            int(num_experts > 0), TOKEN_ALIGNMENT, search_steps,
            int(topk_weights is not None), 1.0 if routed_scaling_factor is None else routed_scaling_factor,
            int(clamp_value is not None), 0.0 if clamp_value is None else clamp_value, int(clamped_count is not None),
            num_rows, num_experts, x.stride(0) if num_rows > 1 else 0, weights_stride, *sf_strides,
        )  # fmt: skip
    return (out, out_sf) if quantized else out


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
            last dimension contiguous, rows 16-byte aligned; hidden a multiple of 256.
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
    op = "tkaot.quant.swiglu_forward"
    if fmt not in ("bf16", "fp32"):
        fail(op, "fmt", "'bf16' or 'fp32'", repr(fmt))
    return _swiglu(op, x, fmt, None, psum_num_tokens_per_expert, topk_weights, routed_scaling_factor, False, False, False,
                   clamp_value, clamped_count)  # fmt: skip


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
    return _swiglu("tkaot.quant.swiglu_forward_and_per_token_cast", x, fmt, num_per_channels, psum_num_tokens_per_expert,
                   topk_weights, routed_scaling_factor, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                   clamp_value, clamped_count)  # fmt: skip
