"""tkaot.quant's FP8/FP4 casts, with TileKernels 2.1.0's names, arguments, defaults and returns.

Formats: "e4m3" data is torch.float8_e4m3fn; "e2m1" data is torch.int8 holding two
FP4 codes a byte (first element in the low nibble), so its last dimension is half
the logical one. Scale factors (sf) are dequantisation factors, decoded = data * sf:
fp32; fp32 powers of two (round_sf); packed UE8M0 exponent bytes, four to an int32
(round_sf + use_packed_ue8m0); or E4M3 (use_e4m3_sf). With
use_tma_aligned_col_major_sf the sf tensor is a column-major view whose token
stride is padded to 16 bytes (DeepGEMM's layout).

Each op's inputs are declared once, as Signatures (tkaot/_validate.py; the pieces the casts share are in
cast_common.py): its checker raises ValueError/TypeError naming the argument before anything is allocated or
launched, and returns, by the names in its `returns`, what the launch reads.
"""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._op import OpKernels, current_stream
from tkaot._quant.cast_common import (
    _BF16,
    _F8,
    _F32,
    _FMT_DTYPE,
    _SF_DTYPE,
    _SF_ITEM_BYTES,
    CAST_BACK_BLOCKS,
    OUT_PAIR,
    PAIR,
    TOKEN_IN_BLOCKS,
    _alloc_sf,
    _sf_cols,
    _sf_kernel_stride,
    block_rules,
    fmt_rule,
    given_buffers,
    input_rows,
    new_sf,
    pair_input,
    sf_kind,
    sf_kind_rules,
    width_rule,
)
from tkaot._quant.kernels import CAST, CAST_BACK, PER_BLOCK_CAST, PER_CHANNEL_CAST, PER_TOKEN_CAST, STOCHASTIC_PAIRS
from tkaot._validate import MAX_I32, Let, Rule, Signature, Tensor, lazy_checker

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

_GROUPS = (16, 32, 64, 128)  # per-token scale groups
_BLOCKS = ((32, 32), (32, 128), (128, 32), (128, 128))  # per-block scale blocks
_IN_DTYPE = Let("in_dtype", "'bfloat16' if t_x is _dt_bfloat16 else 'float32'", after="x")  # a bf16/fp32 input's

_PER_TOKEN = {op: OpKernels(op, PER_TOKEN_CAST) for op in PER_TOKEN_CAST.ops}
_CAST_BACK = {op: OpKernels(op, CAST_BACK) for op in CAST_BACK.ops}
_PER_BLOCK = {op: OpKernels(op, PER_BLOCK_CAST) for op in PER_BLOCK_CAST.ops}
_PER_CHANNEL = OpKernels("tkaot.quant.per_channel_cast", PER_CHANNEL_CAST)
_CAST = OpKernels("tkaot.quant.cast", CAST)


# ---- per-token casts ---------------------------------------------------------------------------------------------------

# What every per-token checker returns, by name: each signature binds these, and _per_token unpacks them in this order
_PT_RETURNS = (
    "device", "num_tokens", "hidden", "groups", "out_cols", "kind", "layout", "x_ptr", "x_stride", "in_sf_ptr", "in_sf_stride",
    "in_dtype", "in_block", "in_sf", "sf_stride",
)  # fmt: skip
_PT_SCALARS = ("fmt", "num_per_channels", "x_block_size", "use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0", "use_e4m3_sf")
_X_ROWS = Tensor("x", (_BF16, _F32), (("num_tokens", "hidden"),), what="2-D (num_tokens, hidden)")
_SIZE = "f'{num_tokens} tokens of {hidden} channels'"
_ELEMENTS = "fewer than 2**33 elements", _SIZE  # the kernels index 4-element vectors with an int32
# per_token_cast's hot path: x alone, with every rule that reads a per-call value (the others hold for a plan's key)
PER_TOKEN_X = Signature(
    "tkaot.quant.per_token_cast", tensors=(_X_ROWS,),
    rules=(width_rule("x", "x.shape"), Rule("x", "num_tokens * hidden // 4 <= _MAX_I32", *_ELEMENTS, after="x")),
    returns=("device", "t_x", "num_tokens", "hidden", "p_x", "s_x[0]"),
)  # fmt: skip


def _group_rule(mode: str, at: str) -> Rule:
    """The row width a per-token cast takes: a multiple of 64, ending in a partial group where TileKernels allows one
    (every mode but the in-place round trip; per_token_cast_generic serves those rows)."""
    if mode != "round_trip":
        return Rule("x", "hidden % 64 == 0", "a multiple of 64 channels wide", actual="f'{hidden} channels'", after=at)
    whole = "a multiple of 64 and of num_per_channels={num_per_channels} channels wide"
    return Rule("x", "hidden % 64 == 0 and hidden % num_per_channels == 0", whole, actual="f'{hidden} channels'", after=at)


def _per_token_signature(op: str, mode: str, quantized: bool) -> Signature:
    """A per-token cast's inputs: x (quantized: its (data, sf) pair), then the caller's buffers of the mode."""
    if quantized:
        inputs, rules = pair_input(block_rules("x_block_size", "block", TOKEN_IN_BLOCKS, "x_data", given=True))
        last = "x_sf"
        rules += (
            Let("x_ptr", "p_x_data", after=last), Let("x_stride", "s_x_data[0]", after=last),
            Let("in_sf_ptr", "p_x_sf", after=last), Let("in_sf_stride", "x_sf_stride", after=last),
        )  # fmt: skip
    else:
        inputs, last = (_X_ROWS,), "x"
        rules = (
            width_rule("x", "x.shape"),
            Rule("x_block_size", "x_block_size is None", "None for a bf16/fp32 input", actual="repr(x_block_size)", after="x"),
            Let("x_ptr", "p_x", after="x"), Let("x_stride", "s_x[0]", after="x"), Let("in_sf_ptr", "0", after="x"),
            Let("in_sf_stride", "0", after="x"), _IN_DTYPE,
            Let("in_block", "'none'", after="x"), Let("in_sf", "'none'", after="x"),
        )  # fmt: skip
    rules += (
        fmt_rule(last),
        Rule("num_per_channels", f"num_per_channels in {_GROUPS!r}", f"one of {list(_GROUPS)}", actual="repr(num_per_channels)",
             after=last),
        *sf_kind_rules(last),
        Let("layout", "'col' if use_tma_aligned_col_major_sf else 'row'", after=last),
        _group_rule(mode, last),
        Rule("x", "num_tokens * hidden // 4 <= _MAX_I32", *_ELEMENTS, after=last),
        Let("groups", "-(-hidden // num_per_channels)", after=last),  # a partial last group has its own sf
        Let("out_dtype", "_FMT_DTYPE[fmt]", after=last),
        Let("out_cols", "hidden // 2 if fmt == 'e2m1' else hidden", after=last),
        Let("sf_dtype", "_SF_DTYPE[kind]", after=last),
        Let("sf_cols", "-(-groups // 4) if kind == 'ue8m0' else groups", after=last),
    )  # fmt: skip
    given, given_rules = given_buffers(mode, "num_tokens", last, packed_rows=True)
    unpack = {**(OUT_PAIR if mode == "cast" else {}), **(PAIR if quantized else {})}  # params: out before x, as the given tensors
    return Signature(
        op, tensors=(*inputs, *given), rules=rules + given_rules, scalars=_PT_SCALARS, defaults={"sf_stride": 0},
        unpack=unpack or None, env={"_FMT_DTYPE": _FMT_DTYPE, "_SF_DTYPE": _SF_DTYPE}, returns=_PT_RETURNS,
    )  # fmt: skip


_MODES = dict(zip(PER_TOKEN_CAST.ops, ("cast", "sf_only", "precomputed_sf", "round_trip")))
PER_TOKEN_SIGNATURES = {op: _per_token_signature(op, mode, False) for op, mode in _MODES.items()}
# a (data, sf) pair: per_token_cast's input; the other per-token ops refuse it by its rules (x_block_size must be given)
PER_TOKEN_QUANTIZED = {op: _per_token_signature(op, mode, True) for op, mode in _MODES.items() if mode != "round_trip"}


def _per_token(op, mode, x, fmt, group, x_block_size, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic, sf, out):
    """Every per-token cast: check (its declared signature), pick the variant, allocate what was not given, launch.
    out: the (data, sf) pair of a cast, the sf of sf_only, the data of precomputed_sf."""
    scalars = (fmt, group, x_block_size, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf)
    given = {"cast": (out,), "sf_only": (out,), "precomputed_sf": (sf, out), "round_trip": ()}[mode]
    quantized = not isinstance(x, torch.Tensor) and mode != "round_trip"
    if quantized:
        checked = PER_TOKEN_QUANTIZED[op].checker()(*given, x, *scalars)
    else:
        checked = PER_TOKEN_SIGNATURES[op].checker()(x, *given, *scalars)
    (device, num_tokens, hidden, groups, out_cols, kind, layout, x_ptr, x_stride, in_sf_ptr, in_sf_stride, in_dtype, in_block, in_sf,
     sf_stride) = checked  # fmt: skip
    launcher = _PER_TOKEN[op].get(device, hidden, in_dtype, in_block, in_sf, fmt, group, kind, layout, mode, bool(stochastic))
    if mode == "cast":
        out_x, out_sf = (None, None) if out is None else out  # a pair: checked
    else:
        out_x, out_sf = (None, out) if mode == "sf_only" else (out, sf)
    on = x[0].device if quantized else x.device
    if out_x is None and mode != "sf_only":
        out_x = torch.empty((num_tokens, out_cols), dtype=_FMT_DTYPE[fmt], device=on)
    if out_sf is None:
        out_sf = _alloc_sf(num_tokens, groups, kind, layout, on)
        sf_stride = _sf_kernel_stride(out_sf, kind, layout)
    out_ptr = out_x.data_ptr() if out_x is not None else 0
    launcher(device, current_stream(device), x_ptr, in_sf_ptr, out_ptr, out_sf.data_ptr(), num_tokens, x_stride, in_sf_stride, sf_stride)
    if mode == "sf_only":
        return out_sf
    if mode == "precomputed_sf":
        return out_x
    return out_x, out_sf


def per_token_cast(
    x, fmt: str, num_per_channels: int, x_block_size: tuple[int, int] | None = None, use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False, use_packed_ue8m0: bool = False, use_e4m3_sf: bool = False, stochastic_cast: bool = False,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Cast rows to FP8/FP4 with one scale factor per `num_per_channels` channels of each token.

    Args:
        x: (num_tokens, hidden) bf16/fp32, or a pre-quantized (data, sf) pair (data E4M3 or
            packed E2M1 int8, sf in blocks of x_block_size); rows 16-byte aligned, hidden a
            multiple of 64.
        fmt: "e4m3" or "e2m1".
        num_per_channels: channels per scale factor: 16, 32, 64 or 128. Where it does not divide
            hidden, the last group is partial: its sf is of its own channels.
        x_block_size: the input's scale block (num_per_tokens, num_per_channels), for (data, sf) inputs:
            (1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (32, 128), (128, 32) or (128, 128).
        use_tma_aligned_col_major_sf: return sf column-major with a 16-byte aligned token stride.
        round_sf: round scale factors up to powers of two.
        use_packed_ue8m0: store those powers of two as exponent bytes packed four to an int32.
        use_e4m3_sf: store scale factors as E4M3.
        stochastic_cast: round values stochastically (unbiased) instead of to nearest.
        out: optional (data, sf) buffers to write.

    Returns:
        (data, sf): data (num_tokens, hidden) float8_e4m3fn or (num_tokens, hidden // 2) int8;
        sf (num_tokens, ceil(hidden / num_per_channels)) [int32: ceil of that / 4].
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_token_cast(
            x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic_cast,
            out
        )  # fmt: skip
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
    return _per_token("tkaot.quant.per_token_cast", "cast", x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic_cast, None, out)  # fmt: skip


_check_x = lazy_checker(PER_TOKEN_X, globals(), "_check_x")
# per_token_cast's plans: (device, dtype, hidden, fmt, num_per_channels, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf,
# stochastic_cast) -> what its hot path needs; a key is entered after the full signature accepted a call with it
_PLANS: dict[tuple, tuple] = {}


def _plan(x, fmt, group, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic) -> tuple:
    """Check a bf16/fp32 per_token_cast without out by its full signature, and enter its plan for the hot path."""
    op = "tkaot.quant.per_token_cast"
    checked = PER_TOKEN_SIGNATURES[op].checker()(x, None, fmt, group, None, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf)
    (device, num_tokens, hidden, groups, out_cols, kind, layout, x_ptr, x_stride, in_sf_ptr, in_sf_stride, in_dtype, in_block, in_sf,
     sf_stride) = checked  # fmt: skip
    launcher = _PER_TOKEN[op].get(device, hidden, in_dtype, in_block, in_sf, fmt, group, kind, layout, "cast", bool(stochastic))
    plan = (launcher, _FMT_DTYPE[fmt], out_cols, _SF_DTYPE[kind], _sf_cols(groups, kind), 4 if kind == "ue8m0" else 1,
            16 // _SF_ITEM_BYTES[kind] if layout == "col" else 0)  # fmt: skip
    _PLANS[(device, x.dtype, hidden, fmt, group, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic)] = plan
    return plan


def per_token_cast_with_sf_only(
    x: torch.Tensor, fmt: str, num_per_channels: int, use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
    use_packed_ue8m0: bool = False, use_e4m3_sf: bool = False, out_sf: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The scale factors per_token_cast would return, without writing the data."""
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_token_cast_with_sf_only(
            x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, out_sf
        )
    return _per_token("tkaot.quant.per_token_cast_with_sf_only", "sf_only", x, fmt, num_per_channels, None, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0, use_e4m3_sf, False, None, out_sf)  # fmt: skip


def per_token_cast_with_precomputed_sf(
    x: torch.Tensor, fmt: str, num_per_channels: int, sf: torch.Tensor, use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False, use_packed_ue8m0: bool = False, use_e4m3_sf: bool = False, out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Cast with given row-major scale factors: data = round(x * (1 / sf)); returns the data only.

    sf is (num_tokens, ceil(hidden / num_per_channels)), float32 (float8_e4m3fn with use_e4m3_sf).
    With round_sf and a bf16 input, 1 / sf is rounded to bf16 first (as TileKernels does).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_token_cast_with_precomputed_sf(
            x, fmt, num_per_channels, sf, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, out
        )
    return _per_token("tkaot.quant.per_token_cast_with_precomputed_sf", "precomputed_sf", x, fmt, num_per_channels, None,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, False, sf, out)  # fmt: skip


def per_token_cast_and_cast_back(x: torch.Tensor, fmt: str, num_per_channels: int, round_sf: bool = False, use_e4m3_sf: bool = False):
    """Replace x, in place, by its per-token cast to fmt cast back to x's dtype (simulated quantization).

    x: (num_tokens, hidden) bf16/fp32, last dim contiguous, rows 16-byte aligned (any row stride
    otherwise). The scale factors are those of per_token_cast (round_sf: powers of two; use_e4m3_sf:
    rounded to E4M3). Returns None.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_token_cast_and_cast_back(x, fmt, num_per_channels, round_sf, use_e4m3_sf)
    _per_token("tkaot.quant.per_token_cast_and_cast_back", "round_trip", x, fmt, num_per_channels, None, False, round_sf, False,
               use_e4m3_sf, False, None, None)  # fmt: skip


# ---- cast backs --------------------------------------------------------------------------------------------------------


def _cast_back_signature(op: str) -> Signature:
    """A cast back's input: the (data, sf) pair, one sf per x_block_size block."""
    inputs, rules = pair_input(block_rules("x_block_size", "block", CAST_BACK_BLOCKS, "x_data", given=True))
    return Signature(
        op, tensors=inputs, unpack=PAIR, scalars=("fmt", "x_block_size", "x_special_fmt"),
        rules=(
            *rules,
            Rule("fmt", "fmt == 'bf16' or fmt == 'fp32'", "'bf16' or 'fp32'", actual="repr(fmt)", after="x_sf"),
            Rule("x_special_fmt", "x_special_fmt is None", "None (no special formats exist)", actual="repr(x_special_fmt)", after="x_sf"),
            Rule("x[0]", "hidden % 64 == 0", "a multiple of 64 channels wide", actual="f'{hidden} channels'", after="x_sf"),
            Rule("x[0]", "num_tokens * hidden // 16 <= _MAX_I32", "fewer than 2**35 elements", actual=_SIZE, after="x_sf"),
        ),
        returns=("device", "num_tokens", "hidden", "in_dtype", "in_block", "in_sf", "p_x_data", "p_x_sf", "s_x_data[0]", "x_sf_stride"),
    )  # fmt: skip


CAST_BACK_SIGNATURES = {op: _cast_back_signature(op) for op in CAST_BACK.ops}
_CAST_BACK_CHECKS: dict = {}  # op -> its checker (a stand-in that compiles it at the first call)
_CAST_BACK_CHECKS.update({op: lazy_checker(sig, _CAST_BACK_CHECKS, op) for op, sig in CAST_BACK_SIGNATURES.items()})


def _cast_back(op, x, fmt, x_block_size, x_special_fmt):
    device, num_tokens, hidden, in_dtype, in_block, in_sf, data_ptr, sf_ptr, data_stride, sf_stride = _CAST_BACK_CHECKS[op](
        x, fmt, x_block_size, x_special_fmt
    )  # fmt: skip
    launcher = _CAST_BACK[op].get(device, hidden, in_dtype, in_block, in_sf, "bfloat16" if fmt == "bf16" else "float32")
    out = torch.empty((num_tokens, hidden), dtype=_BF16 if fmt == "bf16" else _F32, device=x[0].device)
    launcher(device, current_stream(device), data_ptr, sf_ptr, out.data_ptr(), num_tokens, data_stride, sf_stride)
    return out


def cast_back(x, fmt: str, x_block_size: tuple[int, int], x_special_fmt: str | None = None) -> torch.Tensor:
    """Dequantize a (data, sf) pair to bf16 ("bf16") or fp32 ("fp32"): out = round(data * sf).

    data is float8_e4m3fn or packed E2M1 int8; sf float32, int32 (packed UE8M0) or
    float8_e4m3fn, row- or column-major, one per x_block_size block: a per-token (1, 16 ... 128) or
    per-block ((32 or 128) x (32 or 128)) block, or per_channel_cast's (32, 1) or (128, 1) (sf row-major,
    UE8M0 packed four token blocks a word).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_cast_back(x, fmt, x_block_size, x_special_fmt)
    return _cast_back("tkaot.quant.cast_back", x, fmt, x_block_size, x_special_fmt)


def per_token_cast_back(x, fmt: str, num_per_channels: int, x_special_fmt: str | None = None) -> torch.Tensor:
    """cast_back with scale blocks of (1, num_per_channels)."""
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_token_cast_back(x, fmt, num_per_channels, x_special_fmt)
    return _cast_back("tkaot.quant.per_token_cast_back", x, fmt, (1, num_per_channels), x_special_fmt)


# ---- per-block casts ---------------------------------------------------------------------------------------------------

_X_MATRIX = Tensor("x", (_BF16, _F32), (("num_tokens", "hidden"),), layout="contiguous", align=16, what="2-D (num_tokens, hidden)")
_WIDTH = Rule("x", "hidden % 128 == 0", "a multiple of 128 channels wide", actual="f'{hidden} channels'")

# What every per-block checker returns, by name: _per_block unpacks them in this order
_PB_RETURNS = (
    "device", "num_tokens", "hidden", "in_dtype", "block", "kind", "layout", "m_blocks", "k_blocks", "out_cols", "p_x", "sf_stride",
)  # fmt: skip


def _per_block_signature(op: str, mode: str) -> Signature:
    """A per-block cast's inputs: x, then the caller's buffers of the mode."""
    given, given_rules = given_buffers(mode, "m_blocks", "x", packed_rows=False)
    return Signature(
        op, tensors=(_X_MATRIX, *given), unpack=OUT_PAIR if mode == "cast" else None,
        rules=(
            width_rule("x", "x.shape"),
            fmt_rule("x"),
            *block_rules("block_size", "block", _BLOCKS, "x"),
            *sf_kind_rules("x", e4m3_sf=False),
            Let("layout", "'col' if use_tma_aligned_col_major_sf else 'row'", after="x"),
            _WIDTH.replace(after="x"),
            Let("m_blocks", "-(-num_tokens // block[0])", after="x"),
            Let("k_blocks", "hidden // block[1]", after="x"),
            Rule("x", "m_blocks <= 65535", "at most {65535 * block[0]} tokens for block_size {block}", actual="num_tokens", after="x"),
            _IN_DTYPE,
            Let("out_dtype", "_FMT_DTYPE[fmt]", after="x"),
            Let("out_cols", "hidden // 2 if fmt == 'e2m1' else hidden", after="x"),
            Let("sf_dtype", "_SF_DTYPE[kind]", after="x"),
            Let("sf_cols", "-(-k_blocks // 4) if kind == 'ue8m0' else k_blocks", after="x"),
            *given_rules,
        ),
        scalars=("fmt", "block_size", "use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0"), defaults={"sf_stride": 0},
        env={"_FMT_DTYPE": _FMT_DTYPE, "_SF_DTYPE": _SF_DTYPE}, returns=_PB_RETURNS,
    )  # fmt: skip


_BLOCK_MODES = dict(zip(PER_BLOCK_CAST.ops, ("cast", "sf_only", "precomputed_sf")))
PER_BLOCK_SIGNATURES = {op: _per_block_signature(op, mode) for op, mode in _BLOCK_MODES.items()}
_PER_BLOCK_CHECKS: dict = {}  # op -> its checker (a stand-in that compiles it at the first call)
_PER_BLOCK_CHECKS.update({op: lazy_checker(sig, _PER_BLOCK_CHECKS, op) for op, sig in PER_BLOCK_SIGNATURES.items()})


def _per_block(op, mode, x, fmt, block_size, col_major, round_sf, use_packed_ue8m0, sf, out):
    """Every per-block cast: check (its declared signature), pick the variant, allocate what was not given, launch.
    out: the (data, sf) pair of a cast, the sf of sf_only, the data of precomputed_sf."""
    given = {"cast": (out,), "sf_only": (out,), "precomputed_sf": (sf, out)}[mode]
    device, num_tokens, hidden, in_dtype, block, kind, layout, m_blocks, k_blocks, out_cols, x_ptr, sf_stride = _PER_BLOCK_CHECKS[op](
        x, *given, fmt, block_size, col_major, round_sf, use_packed_ue8m0
    )  # fmt: skip
    launcher = _PER_BLOCK[op].get(device, hidden, in_dtype, fmt, block[0], block[1], kind, layout, mode)
    if mode == "cast":
        out_x, out_sf = (None, None) if out is None else out  # a pair: checked
    else:
        out_x, out_sf = (None, out) if mode == "sf_only" else (out, sf)
    if out_x is None and mode != "sf_only":
        out_x = torch.empty((num_tokens, out_cols), dtype=_FMT_DTYPE[fmt], device=x.device)
    if out_sf is None:
        out_sf = _alloc_sf(m_blocks, k_blocks, kind, layout, x.device)
        sf_stride = _sf_kernel_stride(out_sf, kind, layout)
    out_ptr = out_x.data_ptr() if out_x is not None else 0
    launcher(device, current_stream(device), x_ptr, out_ptr, out_sf.data_ptr(), num_tokens, sf_stride)
    if mode == "sf_only":
        return out_sf
    if mode == "precomputed_sf":
        return out_x
    return out_x, out_sf


def per_block_cast(
    x: torch.Tensor, fmt: str, block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
    use_packed_ue8m0: bool = False, out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Cast a contiguous (num_tokens, hidden) bf16/fp32 matrix with one scale factor per block_size block.

    block_size is (num_per_tokens, num_per_channels), each 32 or 128; hidden a multiple of 128;
    any token count (a partial last block takes the amax of its rows). Returns (data, sf) with sf
    (ceil(num_tokens / bm), hidden / bk) [int32 packed UE8M0: a quarter of the columns, rounded up].
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_block_cast(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, out)
    return _per_block("tkaot.quant.per_block_cast", "cast", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                      None, out)  # fmt: skip


def per_block_cast_with_sf_only(
    x: torch.Tensor, fmt: str, block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
    use_packed_ue8m0: bool = False, out_sf: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The scale factors per_block_cast would return, without writing the data."""
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_block_cast_with_sf_only(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, out_sf)
    return _per_block("tkaot.quant.per_block_cast_with_sf_only", "sf_only", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, None, out_sf)  # fmt: skip


def per_block_cast_with_precomputed_sf(
    x: torch.Tensor, fmt: str, block_size: tuple[int, int], sf: torch.Tensor, use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False, use_packed_ue8m0: bool = False, out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Cast with given row-major fp32 block scale factors: data = round(x * (1 / sf)); returns the data only."""
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_block_cast_with_precomputed_sf(
            x, fmt, block_size, sf, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, out
        )
    return _per_block("tkaot.quant.per_block_cast_with_precomputed_sf", "precomputed_sf", x, fmt, block_size,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, sf, out)  # fmt: skip


# ---- per-channel cast --------------------------------------------------------------------------------------------------

# What both per-channel checkers return, by name: per_channel_cast unpacks them in this order
_PC_RETURNS = ("device", "num_tokens", "hidden", "in_dtype", "in_block", "in_sf", "kind", "m_blocks", "x_ptr", "in_sf_ptr", "in_sf_stride")


def _per_channel_signature(quantized: bool) -> Signature:
    """per_channel_cast's inputs: a bf16/fp32 matrix, or (quantized) a (data, sf) pair of FP8 data and per-token sf."""
    if quantized:
        inputs, rules = pair_input(
            (Rule("num_per_channels", "num_per_channels in (32, 128)", "32 or 128 for a pre-quantized (data, sf) input",
                  actual="repr(num_per_channels)", after="x_data"),
             Let("block", "(1, num_per_channels)", after="x_data")),
            data_dtypes=(_F8,), contiguous=True,
        )  # fmt: skip
        last = "x_sf"
        rules += (Let("x_ptr", "p_x_data", after=last), Let("in_sf_ptr", "p_x_sf", after=last),
                  Let("in_sf_stride", "x_sf_stride", after=last))  # fmt: skip
    else:
        inputs, last = (_X_MATRIX,), "x"
        rules = (
            width_rule("x", "x.shape"),
            Rule("num_per_channels", "num_per_channels is None", "None for a bf16/fp32 input", actual="repr(num_per_channels)", after="x"),
            _IN_DTYPE, Let("in_block", "'none'", after="x"), Let("in_sf", "'none'", after="x"),
            Let("x_ptr", "p_x", after="x"), Let("in_sf_ptr", "0", after="x"), Let("in_sf_stride", "0", after="x"),
        )  # fmt: skip
    return Signature(
        "tkaot.quant.per_channel_cast", tensors=inputs, unpack=PAIR if quantized else None,
        rules=(
            fmt_rule(last, ("e4m3",)),
            Rule("num_per_tokens", "num_per_tokens in (32, 128)", "32 or 128", actual="repr(num_per_tokens)", after=last),
            *sf_kind_rules(last, e4m3_sf=False),
            *rules,
            _WIDTH.replace(after=last),
            Let("m_blocks", "-(-num_tokens // num_per_tokens)", after=last),
            Rule("x", "m_blocks <= 65535", "at most {65535 * num_per_tokens} tokens", actual="num_tokens", after=last),
        ),
        scalars=("fmt", "num_per_tokens", "round_sf", "num_per_channels", "use_packed_ue8m0"), returns=_PC_RETURNS,
    )  # fmt: skip


PER_CHANNEL_SIGNATURE, PER_CHANNEL_QUANTIZED = _per_channel_signature(False), _per_channel_signature(True)
_check_channel = lazy_checker(PER_CHANNEL_SIGNATURE, globals(), "_check_channel")
_check_channel_pair = lazy_checker(PER_CHANNEL_QUANTIZED, globals(), "_check_channel_pair")


def per_channel_cast(
    x, fmt: str, num_per_tokens: int, round_sf: bool = False, num_per_channels: int | None = None, use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
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
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_channel_cast(x, fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0)
    quantized = not isinstance(x, torch.Tensor)
    device, num_tokens, hidden, in_dtype, in_block, in_sf, kind, m_blocks, x_ptr, in_sf_ptr, in_sf_stride = (
        _check_channel_pair if quantized else _check_channel
    )(x, fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0)
    launcher = _PER_CHANNEL.get(device, hidden, in_dtype, in_block, in_sf, num_per_tokens, kind)
    on = x[0].device if quantized else x.device
    out = torch.empty((num_tokens, hidden), dtype=_F8, device=on)
    sf_rows = -(-m_blocks // 4) if kind == "ue8m0" else m_blocks
    out_sf = torch.empty((sf_rows, hidden), dtype=_SF_DTYPE[kind], device=on)
    launcher(device, current_stream(device), x_ptr, in_sf_ptr, out.data_ptr(), out_sf.data_ptr(), num_tokens, in_sf_stride)
    return out, out_sf


# ---- the plain dtype cast, and E2M1 unpacking --------------------------------------------------------------------------

_CAST_NAMES = {_F32: "float32", _BF16: "bfloat16", torch.float16: "float16", _F8: "e4m3", torch.float8_e5m2: "e5m2"}  # the kernel's names
_DTYPES = "float32, bfloat16, float16, float8_e4m3fn or float8_e5m2"
CAST_SIGNATURE = Signature(
    "tkaot.quant.cast",
    tensors=(Tensor("x", tuple(_CAST_NAMES), None, layout="contiguous", align=16),),
    rules=(
        Rule("dtype", "dtype in _CAST_NAMES", _DTYPES, actual="dtype"),
        Rule("dtype", "dtype is not t_x", "other than x's dtype {t_x}", actual="dtype"),
        Let("pair", "(_CAST_NAMES[t_x], _CAST_NAMES[dtype])"),
        Rule("dtype", "not (pair[0] in _FP8 and pair[1] in _FP8)", "not an FP8 format when x is FP8 (no cast between FP8 formats)",
             actual="dtype"),
        Rule("stochastic_rounding", "not stochastic_rounding or pair in _STOCHASTIC",
             "False for this cast (it supports float32 -> bfloat16/e4m3 and bfloat16 -> e4m3)", actual="pair"),
        Let("numel", "x.numel()"),
        Rule("x", f"numel <= {MAX_I32 - 2**16}", "smaller than 2**31 - 2**16 elements", actual="numel"),
    ),
    scalars=("dtype", "stochastic_rounding"),
    env={"_CAST_NAMES": _CAST_NAMES, "_STOCHASTIC": STOCHASTIC_PAIRS, "_FP8": ("e4m3", "e5m2")},
    returns=("device", "pair", "h_x", "p_x", "numel"),
)  # fmt: skip
_check_cast = lazy_checker(CAST_SIGNATURE, globals(), "_check_cast")


def cast(x: torch.Tensor, dtype: torch.dtype, stochastic_rounding: bool = False) -> torch.Tensor:
    """Cast a contiguous tensor to dtype (float32, bfloat16, float16, float8_e4m3fn, float8_e5m2; not FP8 to FP8);
    FP8 saturates (E4M3 at +-448, E5M2 at +-57344).

    stochastic_rounding (float32 -> bfloat16 / float8_e4m3fn, bfloat16 -> float8_e4m3fn) rounds up
    with probability equal to the value's fraction of a step, so the rounding is unbiased.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_cast(x, dtype, stochastic_rounding)
    device, pair, shape, x_ptr, numel = _check_cast(x, dtype, stochastic_rounding)
    launcher = _CAST.get(device, pair[0], pair[1], bool(stochastic_rounding))
    y = torch.empty(shape, dtype=dtype, device=x.device)
    launcher(device, current_stream(device), x_ptr, y.data_ptr(), numel)
    return y


_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# a torch computation on any device: x is an argument the rules read, not a (CUDA) tensor of the signature
UNPACK_SIGNATURE = Signature(
    "tkaot.quant.unpack_from_e2m1fn_x2",
    tensors=(),
    rules=(
        Rule("x", "isinstance(x, _Tensor)", "a torch.Tensor", error="TypeError"),
        Rule("x", "x.dtype is _I8 or x.dtype is _U8", "torch.int8 or torch.uint8", actual="x.dtype"),
        Rule("x", "x.dim() > 0", "at least 1-D (its last dim doubles)", actual="'a 0-D tensor'"),
    ),
    scalars=("x",),
    env={"_Tensor": torch.Tensor, "_I8": torch.int8, "_U8": torch.uint8},
    returns=(),
)  # fmt: skip
_check_unpack = lazy_checker(UNPACK_SIGNATURE, globals(), "_check_unpack")


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed E2M1 bytes (int8/uint8, two codes a byte, low nibble first) to out_dtype; the last dim doubles.

    A debugging helper; runs with torch ops on any device.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_unpack_from_e2m1fn_x2(x, out_dtype)
    _check_unpack(x)
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=x.device)
    codes = x.view(torch.uint8).to(torch.int64)
    pairs = torch.stack((codes & 15, codes >> 4), dim=-1)
    return table[pairs].reshape(*x.shape[:-1], 2 * x.shape[-1]).to(out_dtype)


# ---- tracing (tkaot/_compile.py): each op's outputs, allocated through `new` ----------------------------------------


def _fake_per_token(new, x, fmt, group, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, out_x, out_sf, data=True, sf=True):
    num_tokens, hidden, device = input_rows(x)
    if data and out_x is None:
        out_x = new.empty((num_tokens, hidden // 2 if fmt == "e2m1" else hidden), _FMT_DTYPE[fmt], device)
    if sf and out_sf is None:
        out_sf = new_sf(new, num_tokens, -(-hidden // group), sf_kind(round_sf, use_packed_ue8m0, use_e4m3_sf), col_major, device)
    return out_x, out_sf


def _fake_per_token_cast(
    new, x, fmt, num_per_channels, x_block_size=None, use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False,
    use_e4m3_sf=False, stochastic_cast=False, out=None,
):  # fmt: skip
    out_x, out_sf = (None, None) if out is None else out
    col_major = use_tma_aligned_col_major_sf
    return _fake_per_token(new, x, fmt, num_per_channels, col_major, round_sf, use_packed_ue8m0, use_e4m3_sf, out_x, out_sf)


def _fake_per_token_sf_only(new, x, fmt, num_per_channels, use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False,
                            use_e4m3_sf=False, out_sf=None):  # fmt: skip
    return _fake_per_token(new, x, fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, None,
                           out_sf, data=False)[1]  # fmt: skip


def _fake_per_token_precomputed(new, x, fmt, num_per_channels, sf, use_tma_aligned_col_major_sf=False, round_sf=False,
                                use_packed_ue8m0=False, use_e4m3_sf=False, out=None):  # fmt: skip
    return _fake_per_token(new, x, fmt, num_per_channels, False, round_sf, use_packed_ue8m0, use_e4m3_sf, out, None, sf=False)[0]


def _fake_round_trip(new, x, fmt, num_per_channels, round_sf=False, use_e4m3_sf=False):
    return None  # x is replaced in place


def _fake_cast_back(new, x, fmt, x_block_size, x_special_fmt=None):
    num_tokens, hidden, device = input_rows(x)
    return new.empty((num_tokens, hidden), _BF16 if fmt == "bf16" else _F32, device)


def _fake_per_token_cast_back(new, x, fmt, num_per_channels, x_special_fmt=None):
    return _fake_cast_back(new, x, fmt, (1, num_per_channels), x_special_fmt)


def _fake_per_block(new, x, fmt, block_size, col_major, round_sf, use_packed_ue8m0, out_x, out_sf, data=True, sf=True):
    num_tokens, hidden = x.shape
    if data and out_x is None:
        out_x = new.empty((num_tokens, hidden // 2 if fmt == "e2m1" else hidden), _FMT_DTYPE[fmt], x.device)
    if sf and out_sf is None:
        m_blocks, k_blocks = -(-num_tokens // block_size[0]), hidden // block_size[1]
        out_sf = new_sf(new, m_blocks, k_blocks, sf_kind(round_sf, use_packed_ue8m0), col_major, x.device)
    return out_x, out_sf


def _fake_per_block_cast(new, x, fmt, block_size, use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False, out=None):
    out_x, out_sf = (None, None) if out is None else out
    return _fake_per_block(new, x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, out_x, out_sf)


def _fake_per_block_sf_only(new, x, fmt, block_size, use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False,
                            out_sf=None):  # fmt: skip
    return _fake_per_block(new, x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, None, out_sf, data=False)[1]


def _fake_per_block_precomputed(new, x, fmt, block_size, sf, use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False,
                                out=None):  # fmt: skip
    return _fake_per_block(new, x, fmt, block_size, False, round_sf, use_packed_ue8m0, out, None, sf=False)[0]


def _fake_per_channel(new, x, fmt, num_per_tokens, round_sf=False, num_per_channels=None, use_packed_ue8m0=False):
    num_tokens, hidden, device = input_rows(x)
    m_blocks = -(-num_tokens // num_per_tokens)
    kind = sf_kind(round_sf, use_packed_ue8m0)
    sf_rows = -(-m_blocks // 4) if kind == "ue8m0" else m_blocks
    return new.empty((num_tokens, hidden), _F8, device), new.empty((sf_rows, hidden), _SF_DTYPE[kind], device)


def _fake_cast(new, x, dtype, stochastic_rounding=False):
    return new.empty(x.shape, dtype, x.device)


def _fake_unpack(new, x, out_dtype=torch.float32):
    return new.empty((*x.shape[:-1], 2 * x.shape[-1]), out_dtype, x.device)


_TENSOR_OR_PAIR = {"x": "tensors"}
_traced_per_token_cast = traced(per_token_cast, _fake_per_token_cast, mutates=("out",), outputs=2, kinds=_TENSOR_OR_PAIR)
_traced_per_token_cast_with_sf_only = traced(
    per_token_cast_with_sf_only, _fake_per_token_sf_only, mutates=("out_sf",), kinds=_TENSOR_OR_PAIR
)
_traced_per_token_cast_with_precomputed_sf = traced(
    per_token_cast_with_precomputed_sf, _fake_per_token_precomputed, mutates=("out",), kinds=_TENSOR_OR_PAIR
)
_traced_per_token_cast_and_cast_back = traced(per_token_cast_and_cast_back, _fake_round_trip, mutates=("x",), outputs=0)
_traced_cast_back = traced(cast_back, _fake_cast_back, kinds=_TENSOR_OR_PAIR)
_traced_per_token_cast_back = traced(per_token_cast_back, _fake_per_token_cast_back, kinds=_TENSOR_OR_PAIR)
_traced_per_block_cast = traced(per_block_cast, _fake_per_block_cast, mutates=("out",), outputs=2)
_traced_per_block_cast_with_sf_only = traced(per_block_cast_with_sf_only, _fake_per_block_sf_only, mutates=("out_sf",))
_traced_per_block_cast_with_precomputed_sf = traced(per_block_cast_with_precomputed_sf, _fake_per_block_precomputed, mutates=("out",))
_traced_per_channel_cast = traced(per_channel_cast, _fake_per_channel, outputs=2, kinds=_TENSOR_OR_PAIR)
_traced_cast = traced(cast, _fake_cast)
_traced_unpack_from_e2m1fn_x2 = traced(unpack_from_e2m1fn_x2, _fake_unpack)
