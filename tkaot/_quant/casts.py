"""tkaot.quant's FP8/FP4 casts, with TileKernels 2.1.0's names, arguments, defaults and returns.

Formats: "e4m3" data is torch.float8_e4m3fn; "e2m1" data is torch.int8 holding two
FP4 codes a byte (first element in the low nibble), so its last dimension is half
the logical one. Scale factors (sf) are dequantisation factors, decoded = data * sf:
fp32; fp32 powers of two (round_sf); packed UE8M0 exponent bytes, four to an int32
(round_sf + use_packed_ue8m0); or E4M3 (use_e4m3_sf). With
use_tma_aligned_col_major_sf the sf tensor is a column-major view whose token
stride is padded to 16 bytes (DeepGEMM's layout).

Each op validates its arguments completely (ValueError/TypeError naming the
argument) before it allocates or launches anything.
"""

from __future__ import annotations

import torch

from tkaot._op import OpKernels, current_stream
from tkaot._quant.cast_common import (
    _FMT_DTYPE,
    _IN_BLOCKS,
    _IN_NAMES,
    _SF_DTYPE,
    _SF_ITEM_BYTES,
    _alloc_sf,
    _ceil_div,
    _check_block,
    _check_contiguous_input,
    _check_fmt,
    _check_given_outputs,
    _quantized_input,
    _sf_cols,
    _sf_kernel_stride,
    _sf_kind,
    block_rules,
    data_tensor,
    pair,
    pair_tensors,
    sf_dtype_rule,
    sf_kind_rules,
    sf_rules,
    sf_tensor,
)
from tkaot._quant.kernels import CAST, CAST_BACK, PER_BLOCK_CAST, PER_CHANNEL_CAST, PER_TOKEN_CAST
from tkaot._validate import MAX_I32, Let, Rule, Signature, check_cuda, fail, lazy_checker

__all__ = [
    "cast",
    "cast_back",
    "per_block_cast",
    "per_block_cast_with_precomputed_sf",
    "per_block_cast_with_sf_only",
    "per_channel_cast",
    "per_token_cast_and_cast_back",
    "per_token_cast",
    "per_token_cast_back",
    "per_token_cast_with_precomputed_sf",
    "per_token_cast_with_sf_only",
    "unpack_from_e2m1fn_x2",
]

_GROUPS = (16, 32, 64, 128)

_PER_TOKEN = {op: OpKernels(op, PER_TOKEN_CAST) for op in PER_TOKEN_CAST.ops}
_PER_BLOCK = {op: OpKernels(op, PER_BLOCK_CAST) for op in PER_BLOCK_CAST.ops}
_PER_CHANNEL = OpKernels("tkaot.quant.per_channel_cast", PER_CHANNEL_CAST)
_CAST = OpKernels("tkaot.quant.cast", CAST)
_CAST_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float8_e4m3fn: "e4m3"}
_CAST_BACK = {op: OpKernels(op, CAST_BACK) for op in CAST_BACK.ops}


# ---- per-token casts and cast backs: inputs declared once (tkaot._validate), one checker each ------------------------

# What every per-token checker returns, by name: each signature binds these, and _per_token unpacks them in this order
_PT_RETURNS = (
    "device", "num_tokens", "hidden", "groups", "out_cols", "kind", "layout", "x_ptr", "x_stride", "in_sf_ptr", "in_sf_stride",
    "in_dtype", "in_block", "in_sf", "sf_stride",
)  # fmt: skip
_PT_SCALARS = ("fmt", "num_per_channels", "x_block_size", "use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0", "use_e4m3_sf")
_X, _X_RULES = data_tensor("x", "x", (torch.bfloat16, torch.float32))
_X_LETS = (
    Let("num_tokens", "h_x[0]", after="x"),
    Let("hidden", "h_x[1]", after="x"),
    Rule("x", "num_tokens * hidden // 4 <= _MAX_I32", "fewer than 2**33 elements", actual="f'shape {tuple(h_x)}'", after="x"),
)
# per_token_cast's hot path: x alone, with every rule that reads a per-call value (the rest hold for a plan's key)
PER_TOKEN_X = Signature(
    "tkaot.quant.per_token_cast", tensors=(_X,), rules=(*_X_RULES, *_X_LETS),
    returns=("device", "t_x", "num_tokens", "hidden", "p_x", "s_x[0]"),
)  # fmt: skip
# a mode's caller tensors after the input: (name, label) of its sf tensor, label of its data buffer
_GIVEN_SF = {"cast": ("out_sf", "out[1]"), "sf_only": ("out_sf", "out_sf"), "precomputed_sf": ("sf", "sf")}
_GIVEN_DATA = {"cast": "out[0]", "precomputed_sf": "out"}


def _per_token_signature(op: str, mode: str, quantized: bool) -> Signature:
    """A per-token cast's inputs: x (quantized: its (data, sf) pair), then the caller's tensors of the mode."""
    if quantized:
        inputs, rules = pair_tensors("block", block_rules("x_block_size", "block", _IN_BLOCKS, "x_data", given=True))
        first, last = "x_data", "x_sf"
        rules += (
            Let("x_ptr", "p_x_data", after=last), Let("x_stride", "s_x_data[0]", after=last),
            Let("in_sf_ptr", "p_x_sf", after=last), Let("in_sf_stride", "x_sf_stride", after=last),
        )  # fmt: skip
    else:
        inputs, first, last = (_X,), "x", "x"
        rules = (
            *_X_RULES, *_X_LETS[:2],
            Rule("x_block_size", "x_block_size is None", "None for a bf16/fp32 input", actual="repr(x_block_size)", after="x"),
            Let("x_ptr", "p_x", after="x"), Let("x_stride", "s_x[0]", after="x"), Let("in_sf_ptr", "0", after="x"),
            Let("in_sf_stride", "0", after="x"), Let("in_dtype", "'bfloat16' if t_x is torch.bfloat16 else 'float32'", after="x"),
            Let("in_block", "'none'", after="x"), Let("in_sf", "'none'", after="x"),
        )  # fmt: skip
    limit = "f'shape {tuple(h_" + first + ")}'"
    rules += (
        Rule("fmt", "fmt in ('e4m3', 'e2m1')", "'e4m3' or 'e2m1'", actual="repr(fmt)", after=last),
        Rule("num_per_channels", f"num_per_channels in {_GROUPS!r}", f"one of {list(_GROUPS)}", actual="repr(num_per_channels)",
             after=last),
        *sf_kind_rules(last),
        Let("layout", "'col' if use_tma_aligned_col_major_sf else 'row'", after=last),
        Rule("x", "hidden % 64 == 0 and hidden % num_per_channels == 0",
             "a multiple of 64 and of num_per_channels={num_per_channels} channels wide", actual="f'{hidden} channels'", after=last),
        Rule("x", "num_tokens * hidden // 4 <= _MAX_I32", "fewer than 2**33 elements", actual=limit, after=last),
        Let("groups", "hidden // num_per_channels", after=last),
        Let("out_dtype", "torch.int8 if fmt == 'e2m1' else torch.float8_e4m3fn", after=last),
        Let("out_cols", "hidden // 2 if fmt == 'e2m1' else hidden", after=last),
        Let("sf_dtype", "_SF_DTYPE[kind]", after=last),
        Let("sf_cols", "-(-groups // 4) if kind == 'ue8m0' else groups", after=last),
    )  # fmt: skip
    given: tuple = ()
    if mode == "precomputed_sf":
        rules += (Rule("sf", "layout == 'row' and kind != 'ue8m0'",
                       "row-major and unpacked (use_tma_aligned_col_major_sf and use_packed_ue8m0 False)",
                       actual="f'layout {layout}, kind {kind}'", after=last),)  # fmt: skip
    if mode in _GIVEN_SF:
        n, label = _GIVEN_SF[mode]
        given += (sf_tensor(n, label, optional=mode != "precomputed_sf"),)
        layout = "'row'" if mode == "precomputed_sf" else "layout"
        rules += (sf_dtype_rule(n, label), *sf_rules(n, label, "num_tokens", "sf_cols", layout, "kind"))
        rules += (Let("sf_stride", f"{n}_stride", after=n),)
    if mode in _GIVEN_DATA:
        label = _GIVEN_DATA[mode]
        data, data_rules = data_tensor("out_x", label, "out_dtype", optional=True)
        given += (data,)
        rules += (*data_rules, Rule(label, "tuple(h_out_x) == (num_tokens, out_cols) and (num_tokens <= 1 or s_out_x[0] == out_cols)",
                                    "contiguous of shape {(num_tokens, out_cols)}", actual="f'shape {tuple(h_out_x)}, strides {s_out_x}'",
                                    after="out_x"))  # fmt: skip
    return Signature(
        op, tensors=(*inputs, *given), rules=rules, scalars=_PT_SCALARS, defaults={"sf_stride": 0}, env={"_SF_DTYPE": _SF_DTYPE},
        returns=_PT_RETURNS,
    )  # fmt: skip


_MODES = dict(zip(PER_TOKEN_CAST.ops, ("cast", "sf_only", "precomputed_sf", "round_trip")))
PER_TOKEN_SIGNATURES = {op: _per_token_signature(op, mode, False) for op, mode in _MODES.items()}
# a (data, sf) pair: per_token_cast's input; the other per-token ops refuse it by its rules (x_block_size must be given)
PER_TOKEN_QUANTIZED = {op: _per_token_signature(op, "cast", True) for op in _MODES if op != "tkaot.quant.per_token_cast_and_cast_back"}


def _per_token(op, mode, x, fmt, group, x_block_size, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic, sf, out_x, out_sf):
    """Every per-token cast: check (its declared signature), pick the variant, allocate what was not given, launch."""
    scalars = (fmt, group, x_block_size, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf)
    if isinstance(x, torch.Tensor) or mode == "round_trip":
        data = x
        given = {"cast": (out_sf, out_x), "sf_only": (out_sf,), "precomputed_sf": (sf, out_x), "round_trip": ()}[mode]
        checked = PER_TOKEN_SIGNATURES[op].checker()(x, *given, *scalars)
    else:
        data, in_sf_t = pair(op, x)
        checked = PER_TOKEN_QUANTIZED[op].checker()(data, in_sf_t, out_sf, out_x, *scalars)
    (device, num_tokens, hidden, groups, out_cols, kind, layout, x_ptr, x_stride, in_sf_ptr, in_sf_stride, in_dtype, in_block, in_sf,
     sf_stride) = checked  # fmt: skip
    launcher = _PER_TOKEN[op].get(device, hidden, in_dtype, in_block, in_sf, fmt, group, kind, layout, mode, bool(stochastic))
    if mode == "precomputed_sf":
        out_sf = sf
    if out_x is None and mode != "sf_only":
        out_x = torch.empty((num_tokens, out_cols), dtype=_FMT_DTYPE[fmt], device=data.device)
    if out_sf is None:
        out_sf = _alloc_sf(num_tokens, groups, kind, layout, data.device)
        sf_stride = _sf_kernel_stride(out_sf, kind, layout)
    out_ptr = out_x.data_ptr() if out_x is not None else 0
    launcher(device, current_stream(device), x_ptr, in_sf_ptr, out_ptr, out_sf.data_ptr(), num_tokens, x_stride, in_sf_stride, sf_stride)
    if mode == "sf_only":
        return out_sf
    if mode == "precomputed_sf":
        return out_x
    return out_x, out_sf


def per_token_cast(
    x,
    fmt: str,
    num_per_channels: int,
    x_block_size: tuple[int, int] | None = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    stochastic_cast: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast rows to FP8/FP4 with one scale factor per `num_per_channels` channels of each token.

    Args:
        x: (num_tokens, hidden) bf16/fp32, or a pre-quantized (data, sf) pair (data E4M3 or
            packed E2M1 int8, sf in blocks of x_block_size); rows 16-byte aligned.
        fmt: "e4m3" or "e2m1".
        num_per_channels: channels per scale factor: 16, 32, 64 or 128.
        x_block_size: the input's scale block (num_per_tokens, num_per_channels), for (data, sf) inputs.
        use_tma_aligned_col_major_sf: return sf column-major with a 16-byte aligned token stride.
        round_sf: round scale factors up to powers of two.
        use_packed_ue8m0: store those powers of two as exponent bytes packed four to an int32.
        use_e4m3_sf: store scale factors as E4M3.
        stochastic_cast: round values stochastically (unbiased) instead of to nearest.
        out: optional (data, sf) buffers to write.

    Returns:
        (data, sf): data (num_tokens, hidden) float8_e4m3fn or (num_tokens, hidden // 2) int8;
        sf (num_tokens, hidden // num_per_channels) [int32: ceil of that / 4].
    """
    if out is None and x_block_size is None and isinstance(x, torch.Tensor):
        # hot path: x's per-call rules, then its static values: a plan's key, entered once they passed every rule
        device, dtype, num_tokens, hidden, x_ptr, x_stride = _check_x(x)
        plan = _PLANS.get(
            (device, dtype, hidden, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf,
             stochastic_cast)
        )  # fmt: skip
        if plan is None:
            plan = _plan(x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic_cast)
        launcher, out_dtype, out_cols, sf_dtype, sf_cols, sf_scale, sf_align = plan
        data = torch.empty(num_tokens, out_cols, dtype=out_dtype, device=x.device)
        if sf_align:  # column-major, token stride padded to 16 bytes
            pitch = max(-(-num_tokens // sf_align) * sf_align, 1)
            sf = torch.empty(sf_cols, pitch, dtype=sf_dtype, device=x.device).as_strided((num_tokens, sf_cols), (1, pitch))
            sf_stride = pitch * sf_scale
        else:
            sf = torch.empty(num_tokens, sf_cols, dtype=sf_dtype, device=x.device)
            sf_stride = sf_cols * sf_scale
        launcher(device, current_stream(device), x_ptr, 0, data.data_ptr(), sf.data_ptr(), num_tokens, x_stride, 0, sf_stride)
        return data, sf
    out_x, out_sf = (None, None) if out is None else out
    return _per_token("tkaot.quant.per_token_cast", "cast", x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic_cast, None, out_x, out_sf)  # fmt: skip


_check_x = lazy_checker(PER_TOKEN_X, globals(), "_check_x")
# per_token_cast's plans: (device, dtype, hidden, fmt, num_per_channels, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf,
# stochastic_cast) -> what its hot path needs; a key is entered after the full signature accepted a call with it
_PLANS: dict[tuple, tuple] = {}


def _plan(x, fmt, group, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic) -> tuple:
    """Check a bf16/fp32 per_token_cast without out by its full signature, and enter its plan for the hot path."""
    op = "tkaot.quant.per_token_cast"
    (device, _, hidden, groups, out_cols, kind, layout, _, _, _, _, in_dtype, _, _, _) = PER_TOKEN_SIGNATURES[op].checker()(
        x, None, None, fmt, group, None, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf
    )  # fmt: skip
    launcher = _PER_TOKEN[op].get(device, hidden, in_dtype, "none", "none", fmt, group, kind, layout, "cast", bool(stochastic))
    plan = (launcher, _FMT_DTYPE[fmt], out_cols, _SF_DTYPE[kind], _sf_cols(groups, kind), 4 if kind == "ue8m0" else 1,
            16 // _SF_ITEM_BYTES[kind] if layout == "col" else 0)  # fmt: skip
    _PLANS[(device, x.dtype, hidden, fmt, group, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic)] = plan
    return plan


def per_token_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out_sf: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scale factors per_token_cast would return, without writing the data."""
    return _per_token("tkaot.quant.per_token_cast_with_sf_only", "sf_only", x, fmt, num_per_channels, None, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0, use_e4m3_sf, False, None, None, out_sf)  # fmt: skip


def per_token_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    use_e4m3_sf: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cast with given row-major scale factors: data = round(x * (1 / sf)); returns the data only.

    sf is (num_tokens, hidden // num_per_channels), float32 (float8_e4m3fn with use_e4m3_sf).
    With round_sf and a bf16 input, 1 / sf is rounded to bf16 first (as TileKernels does).
    """
    return _per_token("tkaot.quant.per_token_cast_with_precomputed_sf", "precomputed_sf", x, fmt, num_per_channels, None,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, False, sf, out, None)  # fmt: skip


def per_token_cast_and_cast_back(x: torch.Tensor, fmt: str, num_per_channels: int, round_sf: bool = False, use_e4m3_sf: bool = False):
    """Replace x, in place, by its per-token cast to fmt cast back to x's dtype (simulated quantization).

    x: (num_tokens, hidden) bf16/fp32, last dim contiguous, rows 16-byte aligned (any row stride
    otherwise). The scale factors are those of per_token_cast (round_sf: powers of two; use_e4m3_sf:
    rounded to E4M3). Returns None.
    """
    _per_token("tkaot.quant.per_token_cast_and_cast_back", "round_trip", x, fmt, num_per_channels, None, False, round_sf, False,
               use_e4m3_sf, False, None, None, None)  # fmt: skip


def cast_back(x, fmt: str, x_block_size: tuple[int, int], x_special_fmt: str | None = None) -> torch.Tensor:
    """Dequantize a (data, sf) pair to bf16 ("bf16") or fp32 ("fp32"): out = round(data * sf).

    data is float8_e4m3fn or packed E2M1 int8; sf float32, int32 (packed UE8M0) or
    float8_e4m3fn, row- or column-major, one per x_block_size block.
    """
    return _cast_back("tkaot.quant.cast_back", x, fmt, x_block_size, x_special_fmt)


def per_token_cast_back(x, fmt: str, num_per_channels: int, x_special_fmt: str | None = None) -> torch.Tensor:
    """cast_back with scale blocks of (1, num_per_channels)."""
    return _cast_back("tkaot.quant.per_token_cast_back", x, fmt, (1, num_per_channels), x_special_fmt)


def _cast_back_signature(op: str) -> Signature:
    """A cast back's inputs: the (data, sf) pair, one sf per x_block_size block."""
    inputs, rules = pair_tensors("block", block_rules("x_block_size", "block", _IN_BLOCKS, "x_data", given=True))
    return Signature(
        op, tensors=inputs, scalars=("fmt", "x_block_size", "x_special_fmt"),
        rules=(
            *rules,
            Rule("fmt", "fmt in ('bf16', 'fp32')", "'bf16' or 'fp32'", actual="repr(fmt)", after="x_sf"),
            Rule("x_special_fmt", "x_special_fmt is None", "None (no special formats exist)", actual="repr(x_special_fmt)", after="x_sf"),
            Rule("x[0]", "hidden % 64 == 0", "a multiple of 64 channels wide", actual="f'{hidden} channels'", after="x_sf"),
            Rule("x[0]", "num_tokens * hidden // 16 <= _MAX_I32", "fewer than 2**35 elements", actual="f'shape {tuple(h_x_data)}'",
                 after="x_sf"),
        ),
        returns=("device", "num_tokens", "hidden", "in_dtype", "in_block", "in_sf", "p_x_data", "p_x_sf", "s_x_data[0]", "x_sf_stride"),
    )  # fmt: skip


CAST_BACK_SIGNATURES = {op: _cast_back_signature(op) for op in CAST_BACK.ops}


def _cast_back(op, x, fmt, x_block_size, x_special_fmt):
    data, sf = pair(op, x)
    device, num_tokens, hidden, in_dtype, in_block, in_sf, data_ptr, sf_ptr, data_stride, sf_stride = CAST_BACK_SIGNATURES[op].checker()(
        data, sf, fmt, x_block_size, x_special_fmt
    )  # fmt: skip
    launcher = _CAST_BACK[op].get(device, hidden, in_dtype, in_block, in_sf, "bfloat16" if fmt == "bf16" else "float32")
    out = torch.empty((num_tokens, hidden), dtype=torch.bfloat16 if fmt == "bf16" else torch.float32, device=data.device)
    launcher(device, current_stream(device), data_ptr, sf_ptr, out.data_ptr(), num_tokens, data_stride, sf_stride)
    return out


def _per_block_impl(
    op, x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, mode, sf=None, out_x=None, out_sf=None
):
    _check_fmt(op, fmt)
    block = _check_block(op, "block_size", block_size, ((32, 32), (32, 128), (128, 32), (128, 128)))
    kind = _sf_kind(op, round_sf, use_packed_ue8m0, False)
    layout = "col" if use_tma_aligned_col_major_sf else "row"
    device = _check_contiguous_input(op, x)
    num_tokens, hidden = x.shape
    if hidden % 128:
        fail(op, "x", "a multiple of 128 channels wide", f"{hidden} channels")
    m_blocks, k_blocks = _ceil_div(num_tokens, block[0]), hidden // block[1]
    if m_blocks > 65535:
        fail(op, "x", f"at most {65535 * block[0]} tokens for block_size {block}", f"{num_tokens}")
    out_dtype = _FMT_DTYPE[fmt]
    out_cols = hidden // 2 if fmt == "e2m1" else hidden
    out_sf = _check_given_outputs(
        op, mode, sf, out_sf, out_x, device, (m_blocks, k_blocks), kind, layout, out_dtype, (num_tokens, out_cols),
        lambda t: t.is_contiguous(),
    )  # fmt: skip
    launcher = _PER_BLOCK[op].get(device, hidden, _IN_NAMES[x.dtype], fmt, block[0], block[1], kind, layout, mode)
    if out_x is None and mode != "sf_only":
        out_x = torch.empty((num_tokens, out_cols), dtype=out_dtype, device=x.device)
    if out_sf is None:
        out_sf = _alloc_sf(m_blocks, k_blocks, kind, layout, x.device)
    launcher(
        device, current_stream(device), x.data_ptr(), out_x.data_ptr() if out_x is not None else 0, out_sf.data_ptr(), num_tokens,
        _sf_kernel_stride(out_sf, kind, layout),
    )  # fmt: skip
    if mode == "sf_only":
        return out_sf
    if mode == "precomputed_sf":
        return out_x
    return out_x, out_sf


def per_block_cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast a contiguous (num_tokens, hidden) bf16/fp32 matrix with one scale factor per block_size block.

    block_size is (num_per_tokens, num_per_channels), each 32 or 128; hidden a multiple of 128;
    any token count (a partial last block takes the amax of its rows). Returns (data, sf) with sf
    (ceil(num_tokens / bm), hidden / bk) [int32 packed UE8M0: a quarter of the columns, rounded up].
    """
    out_x, out_sf = (None, None) if out is None else out
    return _per_block_impl(
        "tkaot.quant.per_block_cast", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, "cast",
        out_x=out_x, out_sf=out_sf,
    )  # fmt: skip


def per_block_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out_sf: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scale factors per_block_cast would return, without writing the data."""
    return _per_block_impl(
        "tkaot.quant.per_block_cast_with_sf_only", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
        "sf_only", out_sf=out_sf,
    )  # fmt: skip


def per_block_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cast with given row-major fp32 block scale factors: data = round(x * (1 / sf)); returns the data only."""
    return _per_block_impl(
        "tkaot.quant.per_block_cast_with_precomputed_sf", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
        use_packed_ue8m0, "precomputed_sf", sf=sf, out_x=out,
    )  # fmt: skip


def per_channel_cast(
    x,
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    num_per_channels: int | None = None,
    use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast to E4M3 with one scale factor per channel for every num_per_tokens (32 or 128) tokens.

    Args:
        x: a contiguous (num_tokens, hidden) bf16/fp32 matrix, hidden a multiple of 128; or a
            pre-quantized (data, sf) pair: data contiguous float8_e4m3fn, sf its per-token scale
            factors in blocks of (1, num_per_channels) (float32, float8_e4m3fn or packed UE8M0
            int32; row-major, or column-major with any token stride, e.g. a slice along tokens).
            Such an input is decoded as data * sf in fp32 first.
        fmt: "e4m3".
        num_per_tokens: tokens per scale factor, 32 or 128.
        round_sf: round scale factors up to powers of two.
        num_per_channels: the input's scale block width, 32 or 128, for (data, sf) inputs; None otherwise.
        use_packed_ue8m0: store the powers of two as exponent bytes (needs round_sf).

    Returns:
        (data, sf): data (num_tokens, hidden) float8_e4m3fn; sf (ceil(num_tokens / num_per_tokens), hidden)
        row-major float32, or with use_packed_ue8m0 int32 of shape (ceil(that / 4), hidden), four
        token blocks a word.
    """
    op = "tkaot.quant.per_channel_cast"
    if fmt != "e4m3":
        fail(op, "fmt", "'e4m3'", repr(fmt))
    if num_per_tokens not in (32, 128):
        fail(op, "num_per_tokens", "32 or 128", repr(num_per_tokens))
    kind = _sf_kind(op, round_sf, use_packed_ue8m0, False)
    if isinstance(x, torch.Tensor):
        if num_per_channels is not None:
            fail(op, "num_per_channels", "None for a bf16/fp32 input", repr(num_per_channels))
        device = _check_contiguous_input(op, x)
        data, in_sf_t, in_dtype, in_block, in_sf, in_sf_stride = x, None, _IN_NAMES[x.dtype], "none", "none", 0
    else:
        if num_per_channels not in (32, 128):
            fail(op, "num_per_channels", "32 or 128 for a pre-quantized (data, sf) input", repr(num_per_channels))
        if isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], torch.Tensor) and x[0].dtype != torch.float8_e4m3fn:
            fail(op, "x[0]", "torch.float8_e4m3fn (pre-quantized inputs are FP8 E4M3)", x[0].dtype)
        device, data, in_sf_t, in_dtype, _, in_sf, _, in_layout, in_kind = _quantized_input(op, x, (1, num_per_channels))
        if not data.is_contiguous():
            fail(op, "x[0]", "contiguous", f"strides {data.stride()}")
        in_block, in_sf_stride = f"1x{num_per_channels}", _sf_kernel_stride(in_sf_t, in_kind, in_layout)
    num_tokens, hidden = data.shape
    if hidden % 128:
        fail(op, "x", "a multiple of 128 channels wide", f"{hidden} channels")
    m_blocks = _ceil_div(num_tokens, num_per_tokens)
    if m_blocks > 65535:
        fail(op, "x", f"at most {65535 * num_per_tokens} tokens", f"{num_tokens}")
    launcher = _PER_CHANNEL.get(device, hidden, in_dtype, in_block, in_sf, num_per_tokens, kind)
    out = torch.empty((num_tokens, hidden), dtype=torch.float8_e4m3fn, device=data.device)
    sf_rows = _ceil_div(m_blocks, 4) if kind == "ue8m0" else m_blocks
    out_sf = torch.empty((sf_rows, hidden), dtype=_SF_DTYPE[kind], device=data.device)
    launcher(
        device, current_stream(device), data.data_ptr(), in_sf_t.data_ptr() if in_sf_t is not None else 0, out.data_ptr(),
        out_sf.data_ptr(), num_tokens, in_sf_stride,
    )  # fmt: skip
    return out, out_sf


def cast(x: torch.Tensor, dtype: torch.dtype, stochastic_rounding: bool = False) -> torch.Tensor:
    """Cast a contiguous tensor to dtype (float32, bfloat16, float16, float8_e4m3fn); FP8 saturates at +-448.

    stochastic_rounding (float32 -> bfloat16 / float8_e4m3fn, bfloat16 -> float8_e4m3fn) rounds up
    with probability equal to the value's fraction of a step, so the rounding is unbiased.
    """
    op = "tkaot.quant.cast"
    device = check_cuda(op, "x", x)
    names = " or ".join(str(d) for d in _CAST_DTYPES)
    if x.dtype not in _CAST_DTYPES:
        fail(op, "x", names, x.dtype)
    if dtype not in _CAST_DTYPES:
        fail(op, "dtype", names, dtype)
    if dtype == x.dtype:
        fail(op, "dtype", f"other than x's dtype {x.dtype}", dtype)
    pair = (_CAST_DTYPES[x.dtype], _CAST_DTYPES[dtype])
    if stochastic_rounding and pair not in (("float32", "bfloat16"), ("float32", "e4m3"), ("bfloat16", "e4m3")):
        fail(op, "stochastic_rounding", "False for this cast (it supports float32 -> bfloat16/e4m3 and bfloat16 -> e4m3)", pair)
    if not x.is_contiguous():
        fail(op, "x", "contiguous", f"strides {x.stride()}")
    if x.data_ptr() % 16:
        fail(op, "x", "16-byte aligned", f"address {x.data_ptr():#x}")
    if x.numel() > MAX_I32 - 2**16:
        fail(op, "x", "smaller than 2**31 - 2**16 elements", x.numel())
    launcher = _CAST.get(device, pair[0], pair[1], bool(stochastic_rounding))
    y = torch.empty(x.shape, dtype=dtype, device=x.device)
    launcher(device, current_stream(device), x.data_ptr(), y.data_ptr(), x.numel())
    return y


_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed E2M1 bytes (int8/uint8, two codes a byte, low nibble first) to out_dtype; the last dim doubles.

    A debugging helper; runs with torch ops on any device.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tkaot.quant.unpack_from_e2m1fn_x2: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.int8, torch.uint8):
        fail("tkaot.quant.unpack_from_e2m1fn_x2", "x", "torch.int8 or torch.uint8", x.dtype)
    if x.dim() == 0:
        fail("tkaot.quant.unpack_from_e2m1fn_x2", "x", "at least 1-D (its last dim doubles)", "a 0-D tensor")
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=x.device)
    codes = x.view(torch.uint8).to(torch.int64)
    pairs = torch.stack((codes & 15, codes >> 4), dim=-1)
    return table[pairs].reshape(*x.shape[:-1], 2 * x.shape[-1]).to(out_dtype)
