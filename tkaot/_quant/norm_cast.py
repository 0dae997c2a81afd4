"""tkaot.quant's norm_forward_and_per_token_cast: RMSNorm with its output cast to FP8 per group of 32 columns.

Its inputs are declared once, as a Signature (tkaot/_validate.py): its checker is both the fast path and the
detailed error. Scale factors follow TileKernels 2.1.0 (tkaot/_quant/fused.py's docstring); the tiling launched
is tkaot._quant.fused.NORM_CAST_TILING, or NORM_CAST_RESIDUAL_TILING when a residual is given, read at each call.
The unquantized formats are norm_forward's.
"""

from __future__ import annotations

import numbers

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._op import OpKernels, current_stream
from tkaot._quant import fused as _fused
from tkaot._quant.cast_common import _SF_DTYPE, SF_KIND, SF_PACKED_RULE, _align, _sf_cols
from tkaot._quant.fused import _BF16, _F32, _FP8, _I32, _empty_strided
from tkaot._quant.kernels import NORM_CAST
from tkaot._quant.norm import NORM_INPUTS, REAL_ARGS, norm_forward
from tkaot._validate import MAX_I32, Let, Rule, Signature, Tensor, lazy_checker

__all__ = ["norm_forward_and_per_token_cast"]

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
_PLAIN_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # unquantized fmt: x's dtype


def _sf_strides_fit(shape, strides, unit: int) -> bool:
    """A given sf's strides of its dims longer than 1, in the kernel's units (bytes when packed), are below 2**31."""
    return all(-MAX_I32 <= s * unit <= MAX_I32 for n, s in zip(shape[:-1], strides[:-1]) if n > 1)


_SHAPE = "f'shape {tuple(h_x)}'"
_MEGA = Rule(
    "mega_moe_sf", "mega_moe_sf is None and not mega_moe_block_m", "None (the mega MoE sf layout is not supported)",
    actual="'a tensor' if mega_moe_sf is not None else f'mega_moe_block_m={mega_moe_block_m}'", after="x",
)  # fmt: skip
# A new sf's largest stride, cols * pitch * unit (a batch's sf; the token dimension padded to 4 when column-major),
# is below 2**31 for any hidden below 8192 when num_tokens < 2**23: only larger calls compute it
_NEW_SF_STRIDE = "cols * (((num_tokens + 3) & -4) if use_tma_aligned_col_major_sf else num_tokens) * unit"
SIGNATURE = Signature(
    "tkaot.quant.norm_forward_and_per_token_cast",
    tensors=(
        *NORM_INPUTS,
        Tensor("residual_out", "x", "x", optional=True, only_with="residual"),  # ignored without a residual
        Tensor("out_bf16", (torch.bfloat16,), "x", optional=True),
        Tensor("data", (torch.float8_e4m3fn,), "x", optional=True, label="out[0]"),
        Tensor("sf", (torch.float32, torch.int32), None, layout="any", optional=True, label="out[1]"),
    ),
    defaults={"batch": 1},
    unpack={"out": ("data", "sf")},
    rules=(
        _MEGA,
        Rule("(fmt, num_per_channels)", "fmt == 'e4m3' and num_per_channels == 32", "('e4m3', 32), ('bf16', None) or ('fp32', None)",
             actual="(fmt, num_per_channels)", after="x"),
        Rule("x", "hidden % 32 == 0 and 0 < hidden <= 8192", "of hidden size a multiple of 32 in (0, 8192]", _SHAPE, after="x.shape"),
        Rule("x", f"batch <= 65535 and num_tokens <= {MAX_I32}", "at most 65535 batches and 2**31-1 tokens", _SHAPE, after="x.shape"),
        Rule(SF_PACKED_RULE.name, SF_PACKED_RULE.check, SF_PACKED_RULE.expected, actual=SF_PACKED_RULE.actual, after="x"),
        Let(SF_KIND.name, SF_KIND.value, after="x"),
        Let("unit", "4 if use_packed_ue8m0 else 1", after="x"),  # packed sf is addressed in bytes
        Let("cols", "(hidden + 127) >> 7 if use_packed_ue8m0 else hidden >> 5", after="x"),  # one per group, or 4 groups an int32
        Rule("out[1]", f"num_tokens < 2**23 or sf is not None or {_NEW_SF_STRIDE} <= {MAX_I32}", "strided below 2**31",
             actual=f"f'a batch stride of {{{_NEW_SF_STRIDE}}} (bytes when packed, else elements)'", after="x"),
        Rule("out_bf16", "with_out_bf16", "None unless with_out_bf16=True", actual="'a tensor'", after="out_bf16"),
        Rule("out[1]", "not use_tma_aligned_col_major_sf", "None with use_tma_aligned_col_major_sf (a given sf buffer is row-major)",
             actual="'a tensor'", after="sf"),
        # a given sf: row-major, shaped as returned
        Rule("out[1]", "t_sf is (_dt_int32 if unit == 4 else _dt_float32)", "{'torch.int32' if unit == 4 else 'torch.float32'}",
             actual="t_sf", after="sf"),
        Rule("out[1]", "h_sf == (*h_x[:-1], cols)", "of shape {(*h_x[:-1], cols)}", actual="tuple(h_sf)", after="sf"),
        Rule("out[1]", "cols <= 1 or s_sf[-1] == 1", "contiguous in its last dimension (row-major sf)", actual="f'strides {s_sf}'",
             after="sf"),
        Rule("out[1]", "_sf_strides_fit(h_sf, s_sf, unit)", "strided below 2**31", actual="s_sf", after="sf"),
        *REAL_ARGS,
    ),
    scalars=("fmt", "num_per_channels", "round_sf", "use_packed_ue8m0", "with_out_bf16", "use_tma_aligned_col_major_sf",
             "mega_moe_sf", "mega_moe_block_m", "eps", "out_scale"),
    env={"_sf_strides_fit": _sf_strides_fit, "_Real": numbers.Real},
    returns=("device", "batch", "num_tokens", "hidden", "t_x", "sf_kind", "unit", "cols",
             "p_x", "p_weight", "p_residual", "p_residual_out", "p_out_bf16", "p_data", "p_sf",
             "s_x", "s_residual", "s_residual_out", "s_out_bf16", "s_data", "s_sf"),
)  # fmt: skip
# The unquantized formats: norm_forward's output, with these options checked first
UNQUANTIZED = Signature(
    SIGNATURE.op,
    tensors=(),
    rules=(
        Rule(_MEGA.name, _MEGA.check, _MEGA.expected, _MEGA.actual),
        Rule("fmt", "not isinstance(x, _Tensor) or x.dtype is _PLAIN_DTYPES[fmt]",
             "the format of x's dtype for an unquantized output ({x.dtype})", actual="repr(fmt)"),
        Rule("with_out_bf16", "not with_out_bf16 and out_bf16 is None", "False for an unquantized output"),
    ),
    scalars=("x", "fmt", "with_out_bf16", "out_bf16", "mega_moe_sf", "mega_moe_block_m"),
    env={"_Tensor": torch.Tensor, "_PLAIN_DTYPES": _PLAIN_DTYPES},
    returns=(),
)  # fmt: skip


_check = lazy_checker(SIGNATURE, globals(), "_check")


_NORM_CAST = OpKernels(SIGNATURE.op, NORM_CAST)


def _rows(strides: tuple, batch: int, num_tokens: int) -> tuple[int, int]:
    """(batch, token) strides of a 2-D or 3-D tensor shaped like x; 0 for a dim of length 1."""
    if len(strides) == 2:
        return 0, (strides[0] if num_tokens > 1 else 0)
    return (strides[0] if batch > 1 else 0), (strides[1] if num_tokens > 1 else 0)


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
        out: optional (data e4m3 shaped like x, sf) buffers, either of them None (then allocated); a given sf is
            row-major, shaped as returned.
        out_bf16: optional buffer for y (needs with_out_bf16).
        residual_out: optional buffer for x + residual (ignored without residual).
        mega_moe_sf, mega_moe_block_m: not supported by tkaot (ValueError when given).
        with_rstd: also return the fp32 reciprocal RMS of each row.

    Returns:
        ((out, out_sf), out_bf16 or None, rstd of shape x.shape[:-1] or None, the normalised input:
        x + residual, or x itself without residual).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_norm_forward_and_per_token_cast(
            x, weight, eps, fmt, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
            with_out_bf16, out, out_bf16, residual_out, mega_moe_sf, mega_moe_block_m, with_rstd
        )  # fmt: skip
    if num_per_channels is None and (fmt == "bf16" or fmt == "fp32"):
        UNQUANTIZED.checker()(x, fmt, with_out_bf16, out_bf16, mega_moe_sf, mega_moe_block_m)
        plain_out = None if out is None else out[0]
        result, rstd, norm_input = norm_forward(x, weight, eps, residual, out_scale, plain_out, residual_out, with_rstd)
        return result, None, rstd, norm_input
    (device, batch, num_tokens, hidden, dtype, sf_kind, unit, cols,
     x_ptr, w_ptr, r_ptr, ro_ptr, ob_ptr, d_ptr, sf_ptr, xs, rs, ros, obs, ds, sfs) = _check(
        x, weight, residual, residual_out, out_bf16, out, fmt, num_per_channels, round_sf, use_packed_ue8m0, with_out_bf16,
        use_tma_aligned_col_major_sf, mega_moe_sf, mega_moe_block_m, eps, out_scale,
    )  # fmt: skip
    ndim = len(xs)
    x_bs, x_ts = (0, xs[0] if num_tokens > 1 else 0) if ndim == 2 else (xs[0] if batch > 1 else 0, xs[1] if num_tokens > 1 else 0)
    if batch and num_tokens:
        # read at each call: benchmarks switch them at run time
        tiling = _fused.NORM_CAST_TILING if residual is None else _fused.NORM_CAST_RESIDUAL_TILING
        fast_key = (device, hidden, dtype, sf_kind, tiling)
        launcher = _NORM_CAST.cache.get(fast_key)
        if launcher is None:
            launcher = _NORM_CAST.get(device, hidden, _DTYPE_NAMES[dtype], sf_kind, tiling, general_tiling=_fused.NORM_CAST_TILING)
            _NORM_CAST.cache[fast_key] = launcher

    # New outputs contiguous, sf as _alloc_norm_sf lays it out (written inline: their strides are known),
    # and empty_like keeps a dense x's strides for residual_out.
    x_device = x.device
    if ndim == 2:
        sizes, strides, lead, lead_strides = (num_tokens, hidden), (hidden, 1), (num_tokens,), (1,)
    else:
        sizes, strides = (batch, num_tokens, hidden), (num_tokens * hidden, hidden, 1)
        lead, lead_strides = (batch, num_tokens), (num_tokens, 1)
    new_bs = num_tokens * hidden if batch > 1 else 0
    new_ts = hidden if num_tokens > 1 else 0
    if residual is None:
        residual_out = None
        r_bs = r_ts = ro_bs = ro_ts = 0
    else:
        r_bs, r_ts = _rows(rs, batch, num_tokens)
        if residual_out is None:
            residual_out = torch.empty_like(x)
            ro_ptr = residual_out.data_ptr()
            dense = xs[-2] == hidden and (ndim == 2 or xs[0] == num_tokens * hidden)
            ro_bs, ro_ts = (x_bs, x_ts) if dense else _rows(residual_out.stride(), batch, num_tokens)
        else:
            ro_bs, ro_ts = _rows(ros, batch, num_tokens)
    if out_bf16 is not None:
        ob_bs, ob_ts = _rows(obs, batch, num_tokens)
    elif with_out_bf16:
        out_bf16 = _empty_strided(sizes, strides, dtype=_BF16, device=x_device)
        ob_ptr, ob_bs, ob_ts = out_bf16.data_ptr(), new_bs, new_ts
    else:
        ob_bs = ob_ts = 0
    # out: (data, sf), either of them None (allocated here)
    data, out_sf = (None, None) if out is None else out
    if data is None:
        data = _empty_strided(sizes, strides, dtype=_FP8, device=x_device)
        d_ptr, d_bs, d_ts = data.data_ptr(), new_bs, new_ts
    else:
        d_bs, d_ts = _rows(ds, batch, num_tokens)
    if out_sf is None:
        sf_dtype = _I32 if unit == 4 else _F32
        if use_tma_aligned_col_major_sf:
            pitch = (num_tokens + 3) & -4
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
    else:
        sf_bs, sf_ts = _rows(sfs, batch, num_tokens)
        sf_bs, sf_ts, sf_gs = sf_bs * unit, sf_ts * unit, unit
    if with_rstd:
        rstd = _empty_strided(lead, lead_strides, dtype=_F32, device=x_device)
        rstd_ptr, has_rstd = rstd.data_ptr(), 1
    else:
        rstd, rstd_ptr, has_rstd = None, 0, 0
    if batch and num_tokens:
        launcher(
            device, current_stream(device),
            x_ptr, w_ptr, r_ptr, ro_ptr, d_ptr, sf_ptr, ob_ptr, rstd_ptr,
            float(eps), float(out_scale), 0 if weight is None else 1, 0 if residual is None else 1, has_rstd,
            0 if out_bf16 is None else 1,
            batch, num_tokens, x_bs, x_ts, r_bs, r_ts, ro_bs, ro_ts, d_bs, d_ts, ob_bs, ob_ts, sf_bs, sf_ts, sf_gs,
        )  # fmt: skip
    return (data, out_sf), out_bf16, rstd, (x if residual is None else residual_out)


def _fake(
    new, x, weight, eps, fmt, num_per_channels, residual=None, out_scale=1.0, use_tma_aligned_col_major_sf=False, round_sf=False,
    use_packed_ue8m0=False, with_out_bf16=False, out=None, out_bf16=None, residual_out=None, mega_moe_sf=None, mega_moe_block_m=0,
    with_rstd=False,
):  # fmt: skip
    """norm_forward_and_per_token_cast's outputs, allocated through `new` (tracing, tkaot/_compile.py)."""
    device, lead = x.device, x.shape[:-1]
    residual_out = None if residual is None else new.empty_like(x) if residual_out is None else residual_out
    rstd = new.empty(lead, _F32, device) if with_rstd else None
    data, sf = (None, None) if out is None else out
    norm_input = x if residual is None else residual_out
    if num_per_channels is None and (fmt == "bf16" or fmt == "fp32"):
        return (new.empty_like(x) if data is None else data), None, rstd, norm_input
    if data is None:
        data = new.empty(x.shape, _FP8, device)
    if with_out_bf16 and out_bf16 is None:
        out_bf16 = new.empty(x.shape, _BF16, device)
    if sf is None:
        cols, dtype = ((x.shape[-1] + 127) >> 7, _I32) if use_packed_ue8m0 else (x.shape[-1] >> 5, _F32)
        if use_tma_aligned_col_major_sf:
            pitch = (lead[-1] + 3) & -4
            strides = (1, pitch) if x.dim() == 2 else (cols * pitch, 1, pitch)
            sf = new.empty_strided((*lead, cols), strides, dtype, device)
        else:
            sf = new.empty((*lead, cols), dtype, device)
    return (data, sf), out_bf16, rstd, norm_input


_traced_norm_forward_and_per_token_cast = traced(
    norm_forward_and_per_token_cast, _fake, mutates=("out", "out_bf16", "residual_out"), outputs=5
)
