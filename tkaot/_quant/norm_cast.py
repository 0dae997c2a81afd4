"""tkaot.quant's norm_forward_and_per_token_cast: RMSNorm with its output cast to FP8 per group of 32 columns.

Scale factors follow TileKernels 2.1.0 (tkaot/_fused.py's docstring); the tiling launched is
tkaot._quant.fused.NORM_CAST_TILING, or NORM_CAST_RESIDUAL_TILING when a residual is given, read at each call.
The unquantized formats are norm_forward's.
"""

from __future__ import annotations

import torch

from tkaot import _validate
from tkaot._op import OpKernels, current_stream
from tkaot._quant import fused as _fused
from tkaot._quant.cast_common import _SF_DTYPE, _align, _sf_cols
from tkaot._quant.fused import _BF16, _F32, _FP8, _I32, _IN_DTYPES, _empty_strided, _Fallback, _sf_kind
from tkaot._quant.kernels import NORM_CAST
from tkaot._quant.norm import norm_forward
from tkaot._validate import MAX_I32, fail

__all__ = ["norm_forward_and_per_token_cast"]

_PLAIN_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # unquantized fmt: x's dtype

_NORM_CAST = OpKernels("tkaot.quant.norm_forward_and_per_token_cast", NORM_CAST)
_NORM_CAST_GROUP = 32


def _row_strides(t: torch.Tensor | None) -> tuple[int, int]:
    """(batch, token) strides of a 2-D or 3-D tensor; 0 for size-1 dims and for None."""
    if t is None:
        return 0, 0
    shape, strides = t.shape, t.stride()
    if t.dim() == 2:
        return 0, (strides[0] if shape[0] > 1 else 0)
    return (strides[0] if shape[0] > 1 else 0), (strides[1] if shape[1] > 1 else 0)


def _rows_like(t: torch.Tensor, device: int, dtype: torch.dtype, shape: torch.Size, vec: int) -> tuple[int, int, int]:
    """(address, batch stride, token stride) of a buffer shaped like x whose rows are 16-byte vectors; else _Fallback."""
    t_device, t_dtype, ts, t_shape, ptr = t.get_device(), t.dtype, t.stride(), t.shape, t.data_ptr()
    if t_device != device or t_dtype is not dtype or t_shape != shape or ts[-1] != 1 or ptr % 16:
        raise _Fallback
    if len(ts) == 2:
        bs, rs = 0, (ts[0] if shape[0] > 1 else 0)
    else:
        bs, rs = (ts[0] if shape[0] > 1 else 0), (ts[1] if shape[1] > 1 else 0)
    if (bs | rs) % vec or max(bs, rs) > MAX_I32:
        raise _Fallback
    return ptr, bs, rs


def _alloc_norm_sf(x: torch.Tensor, num_groups: int, sf_kind: str, col_major: bool) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """The sf tensor norm_forward_and_per_token_cast returns, and its (batch, token, group) strides in the kernel's units.

    Row-major: x.shape[:-1] + (groups,), contiguous. Column-major: each batch's (groups, tokens)
    block stored row by row with the token dimension padded to 16 bytes, returned transposed.
    """
    cols, dtype = _sf_cols(num_groups, sf_kind), _SF_DTYPE[sf_kind]
    lead = x.shape[:-1]
    batch, num_tokens = (1, lead[0]) if x.dim() == 2 else lead
    if col_major:
        pitch = _align(num_tokens, 4)
        storage = torch.empty(batch * cols * pitch, dtype=dtype, device=x.device)
        if x.dim() == 2:
            sf = storage.as_strided((num_tokens, cols), (1, pitch))
        else:
            sf = storage.as_strided((batch, num_tokens, cols), (cols * pitch, 1, pitch))
        strides = (cols * pitch, 1, pitch)
    else:
        sf = torch.empty((*lead, cols), dtype=dtype, device=x.device)
        strides = (num_tokens * cols, cols, 1)
    unit = 4 if sf_kind == "ue8m0" else 1  # packed sf is addressed in bytes
    return sf, tuple(s * unit for s in strides)


def norm_forward_and_per_token_cast(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    fmt: str,
    num_per_channels: int,
    residual: torch.Tensor | None = None,
    out_scale: float = 1.0,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    with_out_bf16: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    out_bf16: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
    mega_moe_sf: torch.Tensor | None = None,
    mega_moe_block_m: int = 0,
    with_rstd: bool = False,
):
    """RMSNorm (as tkaot.quant.norm_forward) with its output cast to FP8 E4M3 per group of 32 columns.

    The normalised output y is rounded to x.dtype first, so the result is per_token_cast of
    norm_forward's output: per group, amax = max(|y|, 1e-4); sf = amax / 448 (or its power-of-two
    ceiling with round_sf); stored = e4m3(y / sf).

    Args:
        x: (num_tokens, hidden) or (batch, num_tokens, hidden), bf16 or fp32, on a CUDA device; last
            dimension contiguous, rows 16-byte aligned; hidden a multiple of 32, at most 8192.
        weight: (hidden,) of x's dtype, or None for unit weight.
        eps: added to the mean square before the reciprocal square root.
        fmt, num_per_channels: "e4m3" and 32; ("bf16", None) / ("fp32", None) matching x.dtype give
            norm_forward's unquantized output.
        residual: optional, shaped like x; x + residual is rounded to x's dtype first.
        out_scale: multiplies the weight (fp32).
        use_tma_aligned_col_major_sf: sf column-major, the token dimension padded to 16 bytes.
        round_sf: round each sf up to a power of two.
        use_packed_ue8m0: store sf as exponent bytes, four per int32 (needs round_sf).
        with_out_bf16: also return y in bf16.
        out: optional (data e4m3 shaped like x, sf) buffers; sf row-major, shaped as returned.
        out_bf16: optional buffer for y (needs with_out_bf16).
        residual_out: optional buffer for x + residual (ignored without residual).
        mega_moe_sf, mega_moe_block_m: not supported by tkaot (ValueError when given).
        with_rstd: also return the fp32 reciprocal RMS of each row.

    Returns:
        ((out, out_sf), out_bf16 or None, rstd of shape x.shape[:-1] or None, the normalised input:
        x + residual, or x itself without residual).
    """
    # The hot path reads each tensor property once and accepts only plainly valid, non-empty
    # input with one combined condition per argument; anything else (every invalid input among
    # it, and the unquantized formats) goes through _norm_cast_checked, which raises the detailed error.
    if num_per_channels is None:  # the unquantized formats (norm_forward's output), or an error
        return _norm_cast_checked(
            x, weight, eps, fmt, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
            with_out_bf16, out, out_bf16, residual_out, mega_moe_sf, mega_moe_block_m, with_rstd,
        )  # fmt: skip
    try:
        if (
            fmt != "e4m3" or num_per_channels != _NORM_CAST_GROUP or mega_moe_sf is not None or mega_moe_block_m
            or (use_packed_ue8m0 and not round_sf) or (out_bf16 is not None and not with_out_bf16)
        ):  # fmt: skip
            raise _Fallback
        device, dtype, xs, shape, x_ptr = x.get_device(), x.dtype, x.stride(), x.shape, x.data_ptr()
        spec = _IN_DTYPES.get(dtype)
        if device < 0 or spec is None:
            raise _Fallback
        dtype_name, vec = spec
        ndim = len(xs)
        if ndim == 2:
            (num_tokens, hidden), (x_ts, x_last), batch, x_bs = shape, xs, 1, 0
            dense = x_ts == hidden
        elif ndim == 3:
            (batch, num_tokens, hidden), (x_bs, x_ts, x_last) = shape, xs
            dense = x_ts == hidden and x_bs == num_tokens * hidden
            if batch == 1:
                x_bs = 0
        else:
            raise _Fallback
        if num_tokens == 1:
            x_ts = 0
        if (
            hidden % 32 or not 0 < hidden <= 8192 or not 0 < batch <= 65535 or not 0 < num_tokens <= MAX_I32
            or x_last != 1 or x_ptr % 16 or (x_bs | x_ts) % vec or max(x_bs, x_ts) > MAX_I32
        ):  # fmt: skip
            raise _Fallback
        if weight is None:
            w_ptr = has_weight = 0
        else:
            w_device, w_dtype, ws, wshape, w_ptr = weight.get_device(), weight.dtype, weight.stride(), weight.shape, weight.data_ptr()
            if w_device != device or w_dtype is not dtype or len(ws) != 1 or wshape[0] != hidden or ws[0] != 1 or w_ptr % 16:
                raise _Fallback
            has_weight = 1
        if residual is None:
            residual_out = None
            r_ptr = r_bs = r_ts = ro_ptr = ro_bs = ro_ts = has_residual = 0
        else:
            r_ptr, r_bs, r_ts = _rows_like(residual, device, dtype, shape, vec)
            if residual_out is not None:
                ro_ptr, ro_bs, ro_ts = _rows_like(residual_out, device, dtype, shape, vec)
            has_residual = 1
        if out_bf16 is not None:
            ob_ptr, ob_bs, ob_ts = _rows_like(out_bf16, device, _BF16, shape, vec)

        sf_kind = "ue8m0" if use_packed_ue8m0 else ("pow2" if round_sf else "fp32")
        groups = hidden // _NORM_CAST_GROUP
        cols, sf_dtype, unit = (-(-groups // 4), _I32, 4) if use_packed_ue8m0 else (groups, _F32, 1)
        if out is None:
            pitch = -(-num_tokens // 4) * 4 if use_tma_aligned_col_major_sf else num_tokens
            if cols * pitch * unit > MAX_I32:
                raise _Fallback
        else:
            if type(out) is not tuple or len(out) != 2 or use_tma_aligned_col_major_sf:
                raise _Fallback
            data, out_sf = out
            d_ptr, d_bs, d_ts = _rows_like(data, device, _FP8, shape, vec)
            s_device, s_dtype, ss, sshape, sf_ptr = out_sf.get_device(), out_sf.dtype, out_sf.stride(), out_sf.shape, out_sf.data_ptr()
            if s_device != device or s_dtype is not sf_dtype or len(ss) != ndim or sshape[-1] != cols or (ss[-1] != 1 and cols > 1):
                raise _Fallback
            if ndim == 2:
                sf_bs, sf_ts = 0, (ss[0] * unit if num_tokens > 1 else 0)
                if sshape[0] != num_tokens:
                    raise _Fallback
            else:
                sf_bs, sf_ts = (ss[0] * unit if batch > 1 else 0), (ss[1] * unit if num_tokens > 1 else 0)
                if sshape[0] != batch or sshape[1] != num_tokens:
                    raise _Fallback
            if max(sf_bs, sf_ts, -sf_bs, -sf_ts) > MAX_I32:
                raise _Fallback
            sf_gs = unit
    except Exception:  # _Fallback, or a non-tensor argument: the checked path raises what applies
        return _norm_cast_checked(
            x, weight, eps, fmt, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
            with_out_bf16, out, out_bf16, residual_out, mega_moe_sf, mega_moe_block_m, with_rstd,
        )  # fmt: skip
    # read at each call: benchmarks switch them at run time
    tiling = _fused.NORM_CAST_TILING if residual is None else _fused.NORM_CAST_RESIDUAL_TILING
    launcher = _NORM_CAST.cache.get((device, hidden, dtype_name, sf_kind, tiling))
    if launcher is None:
        launcher = _NORM_CAST.get(device, hidden, dtype_name, sf_kind, tiling, general_tiling=_fused.NORM_CAST_TILING)
    eps, out_scale = float(eps), float(out_scale)

    # New outputs as the checked path allocates them: contiguous, sf as _alloc_norm_sf lays it out;
    # their strides are known, and empty_like keeps a dense x's strides for residual_out.
    x_device = x.device
    if ndim == 2:
        sizes, strides, lead, lead_strides = (num_tokens, hidden), (hidden, 1), (num_tokens,), (1,)
    else:
        sizes, strides = (batch, num_tokens, hidden), (num_tokens * hidden, hidden, 1)
        lead, lead_strides = (batch, num_tokens), (num_tokens, 1)
    new_bs = num_tokens * hidden if batch > 1 else 0
    new_ts = hidden if num_tokens > 1 else 0
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
        ro_ptr = residual_out.data_ptr()
        ro_bs, ro_ts = (x_bs, x_ts) if dense else _row_strides(residual_out)
    if out_bf16 is None:
        if with_out_bf16:
            out_bf16 = _empty_strided(sizes, strides, dtype=_BF16, device=x_device)
            ob_ptr, ob_bs, ob_ts, has_out_bf16 = out_bf16.data_ptr(), new_bs, new_ts, 1
        else:
            ob_ptr = ob_bs = ob_ts = has_out_bf16 = 0
    else:
        has_out_bf16 = 1
    if out is None:
        data = _empty_strided(sizes, strides, dtype=_FP8, device=x_device)
        d_ptr, d_bs, d_ts = data.data_ptr(), new_bs, new_ts
        if use_tma_aligned_col_major_sf:
            # each batch's (groups, tokens) block row by row, tokens padded to 16 bytes
            sf_sizes = (num_tokens, cols) if ndim == 2 else (batch, num_tokens, cols)
            sf_strides = (1, pitch) if ndim == 2 else (cols * pitch, 1, pitch)
            if pitch == num_tokens:
                out_sf = _empty_strided(sf_sizes, sf_strides, dtype=sf_dtype, device=x_device)
            else:
                out_sf = _empty_strided((batch * cols * pitch,), (1,), dtype=sf_dtype, device=x_device).as_strided(sf_sizes, sf_strides)
            sf_bs, sf_ts, sf_gs = cols * pitch * unit, unit, pitch * unit
        else:
            if ndim == 2:
                out_sf = _empty_strided((num_tokens, cols), (cols, 1), dtype=sf_dtype, device=x_device)
            else:
                out_sf = _empty_strided((batch, num_tokens, cols), (num_tokens * cols, cols, 1), dtype=sf_dtype, device=x_device)
            sf_bs, sf_ts, sf_gs = num_tokens * cols * unit, cols * unit, unit
        sf_ptr = out_sf.data_ptr()
    if with_rstd:
        rstd = _empty_strided(lead, lead_strides, dtype=_F32, device=x_device)
        rstd_ptr, has_rstd = rstd.data_ptr(), 1
    else:
        rstd, rstd_ptr, has_rstd = None, 0, 0
    launcher(
        device, current_stream(device),
        x_ptr, w_ptr, r_ptr, ro_ptr, d_ptr, sf_ptr, ob_ptr, rstd_ptr,
        eps, out_scale, has_weight, has_residual, has_rstd, has_out_bf16,
        batch, num_tokens, x_bs, x_ts, r_bs, r_ts, ro_bs, ro_ts, d_bs, d_ts, ob_bs, ob_ts, sf_bs, sf_ts, sf_gs,
    )  # fmt: skip
    return (data, out_sf), out_bf16, rstd, (x if residual is None else residual_out)


def _norm_cast_checked(
    x, weight, eps, fmt, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
    with_out_bf16, out, out_bf16, residual_out, mega_moe_sf, mega_moe_block_m, with_rstd,
):  # fmt: skip
    """norm_forward_and_per_token_cast for any input: each argument validated in turn (the detailed errors), then launched."""
    op = "tkaot.quant.norm_forward_and_per_token_cast"
    if mega_moe_sf is not None or mega_moe_block_m:
        given = "a tensor" if mega_moe_sf is not None else f"mega_moe_block_m={mega_moe_block_m}"
        fail(op, "mega_moe_sf", "None (the mega MoE sf layout is not supported)", given)
    if (fmt, num_per_channels) in (("bf16", None), ("fp32", None)):
        expected = _PLAIN_DTYPES[fmt]
        if isinstance(x, torch.Tensor) and x.dtype != expected:
            fail(op, "fmt", f"the format of x's dtype for an unquantized output ({x.dtype})", repr(fmt))
        if with_out_bf16 or out_bf16 is not None:
            fail(op, "with_out_bf16", "False for an unquantized output", with_out_bf16)
        plain_out = None if out is None else out[0]
        result, rstd, norm_input = norm_forward(x, weight, eps, residual, out_scale, plain_out, residual_out, with_rstd)
        return result, None, rstd, norm_input
    if (fmt, num_per_channels) != ("e4m3", _NORM_CAST_GROUP):
        fail(op, "(fmt, num_per_channels)", "('e4m3', 32), ('bf16', None) or ('fp32', None)", (fmt, num_per_channels))
    sf_kind = _sf_kind(op, round_sf, use_packed_ue8m0)

    device = _validate.check_cuda(op, "x", x)
    spec = _IN_DTYPES.get(x.dtype)
    if spec is None:
        fail(op, "x", "bfloat16 or float32", x.dtype)
    dtype_name, vec = spec
    shape = x.shape
    if x.dim() not in (2, 3):
        fail(op, "x", "2-D (num_tokens, hidden) or 3-D (batch, num_tokens, hidden)", f"shape {tuple(shape)}")
    batch, num_tokens, hidden = (1, *shape) if x.dim() == 2 else shape
    if hidden % _NORM_CAST_GROUP or not 0 < hidden <= 8192:
        fail(op, "x", "of hidden size a multiple of 32 in (0, 8192]", f"shape {tuple(shape)}")
    if batch > 65535 or num_tokens > MAX_I32:
        fail(op, "x", "at most 65535 batches and 2**31-1 tokens", f"shape {tuple(shape)}")
    _validate.check_rows(op, "x", x, vec)
    if weight is not None:
        _validate.check_like(op, "weight", weight, (hidden,), x.dtype, device)
        if weight.stride(0) != 1 or weight.data_ptr() % 16:
            fail(op, "weight", "contiguous and 16-byte aligned", f"stride {weight.stride()} address {weight.data_ptr():#x}")
    if residual is not None:
        _validate.check_like(op, "residual", residual, shape, x.dtype, device)
        _validate.check_rows(op, "residual", residual, vec)
        if residual_out is None:
            residual_out = torch.empty_like(x)
        else:
            _validate.check_like(op, "residual_out", residual_out, shape, x.dtype, device)
            _validate.check_rows(op, "residual_out", residual_out, vec)
    else:
        residual_out = None
    if out_bf16 is not None:
        if not with_out_bf16:
            fail(op, "out_bf16", "None unless with_out_bf16=True", "a tensor")
        _validate.check_like(op, "out_bf16", out_bf16, shape, torch.bfloat16, device)
        _validate.check_rows(op, "out_bf16", out_bf16, vec)
    elif with_out_bf16:
        out_bf16 = torch.empty(shape, dtype=torch.bfloat16, device=x.device)

    num_groups = hidden // _NORM_CAST_GROUP
    if out is None:
        data = torch.empty(shape, dtype=torch.float8_e4m3fn, device=x.device)
        out_sf, sf_strides = _alloc_norm_sf(x, num_groups, sf_kind, bool(use_tma_aligned_col_major_sf))
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"{op}: out must be a (data, sf) pair, got {type(out).__name__}")
        if use_tma_aligned_col_major_sf:
            fail(op, "out", "None with use_tma_aligned_col_major_sf (given sf buffers are row-major)", "a (data, sf) pair")
        data, out_sf = out
        _validate.check_like(op, "out[0]", data, shape, torch.float8_e4m3fn, device)
        _validate.check_rows(op, "out[0]", data, vec)
        sf_dtype, cols = _SF_DTYPE[sf_kind], _sf_cols(num_groups, sf_kind)
        _validate.check_like(op, "out[1]", out_sf, (*shape[:-1], cols), sf_dtype, device)
        if out_sf.stride(-1) != 1 and cols > 1:
            fail(op, "out[1]", "contiguous in its last dimension (row-major sf)", f"strides {out_sf.stride()}")
        unit = 4 if sf_kind == "ue8m0" else 1
        sf_bs, sf_ts = _row_strides(out_sf)
        sf_strides = (sf_bs * unit, sf_ts * unit, unit)
    if any(abs(s) > MAX_I32 for s in sf_strides):
        fail(op, "out[1]", "strided below 2**31", out_sf.stride())
    rstd = torch.empty(shape[:-1], dtype=torch.float32, device=x.device) if with_rstd else None

    if batch * num_tokens:
        tiling = _fused.NORM_CAST_TILING if residual is None else _fused.NORM_CAST_RESIDUAL_TILING
        launcher = _NORM_CAST.get(device, hidden, dtype_name, sf_kind, tiling, general_tiling=_fused.NORM_CAST_TILING)
        launcher(
            device, current_stream(device),
            x.data_ptr(), weight.data_ptr() if weight is not None else 0,
            residual.data_ptr() if residual is not None else 0, residual_out.data_ptr() if residual_out is not None else 0,
            data.data_ptr(), out_sf.data_ptr(), out_bf16.data_ptr() if out_bf16 is not None else 0,
            rstd.data_ptr() if rstd is not None else 0,
            float(eps), float(out_scale),
            int(weight is not None), int(residual is not None), int(rstd is not None), int(out_bf16 is not None),
            batch, num_tokens, *_row_strides(x), *_row_strides(residual), *_row_strides(residual_out),
            *_row_strides(data), *_row_strides(out_bf16), *sf_strides,
        )  # fmt: skip
    return (data, out_sf), out_bf16, rstd, (x if residual is None else residual_out)
