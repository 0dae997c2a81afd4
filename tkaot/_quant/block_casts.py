"""tkaot.quant's per-block and per-channel FP8/FP4 casts, with TileKernels 2.1.0's names, arguments and returns.

per_block_cast scales each (num_per_tokens, num_per_channels) block of a matrix by one factor; per_channel_cast each
channel of every num_per_tokens tokens. Formats and scale-factor kinds are casts.py's. Each op's inputs are declared
once, as Signatures (tkaot/_validate.py, with the pieces in cast_common.py): the checker raises ValueError/TypeError
naming the argument before anything is allocated or launched, and returns, by the names in its `returns`, what the
launch reads.
"""

from __future__ import annotations

import torch

from tkaot._op import OpKernels, current_stream
from tkaot._quant.cast_common import (
    _BF16,
    _F8,
    _F32,
    _FMT_DTYPE,
    _SF_DTYPE,
    _alloc_sf,
    _sf_kernel_stride,
    block_rules,
    fmt_rule,
    given_buffers,
    pair_input,
    sf_kind_rules,
)
from tkaot._quant.kernels import PER_BLOCK_CAST, PER_CHANNEL_CAST
from tkaot._validate import Let, Rule, Signature, Tensor, lazy_checker

__all__ = ["per_block_cast", "per_block_cast_with_precomputed_sf", "per_block_cast_with_sf_only", "per_channel_cast"]

_BLOCKS = ((32, 32), (32, 128), (128, 32), (128, 128))
_PER_BLOCK = {op: OpKernels(op, PER_BLOCK_CAST) for op in PER_BLOCK_CAST.ops}
_PER_CHANNEL = OpKernels("tkaot.quant.per_channel_cast", PER_CHANNEL_CAST)
_X = Tensor("x", (_BF16, _F32), (("num_tokens", "hidden"),), layout="contiguous", align=16, what="2-D (num_tokens, hidden)")
_IN_DTYPE = Let("in_dtype", "'bfloat16' if t_x is _dt_bfloat16 else 'float32'", after="x")
_WIDTH = Rule("x", "hidden % 128 == 0", "a multiple of 128 channels wide", actual="f'{hidden} channels'")


# ---- per-block casts -----------------------------------------------------------------------------------------------------

# What every per-block checker returns, by name: _per_block unpacks them in this order
_PB_RETURNS = (
    "device",
    "num_tokens",
    "hidden",
    "in_dtype",
    "block",
    "kind",
    "layout",
    "m_blocks",
    "k_blocks",
    "out_cols",
    "p_x",
    "sf_stride",
)


def _per_block_signature(op: str, mode: str) -> Signature:
    """A per-block cast's inputs: x, then the caller's buffers of the mode."""
    given, given_rules = given_buffers(mode, "m_blocks", "x", packed_rows=False)
    return Signature(
        op, tensors=(_X, *given),
        rules=(
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


def _per_block(op, mode, x, fmt, block_size, col_major, round_sf, use_packed_ue8m0, sf, out_x, out_sf):
    """Every per-block cast: check (its declared signature), pick the variant, allocate what was not given, launch."""
    given = {"cast": (out_sf, out_x), "sf_only": (out_sf,), "precomputed_sf": (sf, out_x)}[mode]
    device, num_tokens, hidden, in_dtype, block, kind, layout, m_blocks, k_blocks, out_cols, x_ptr, sf_stride = _PER_BLOCK_CHECKS[op](
        x, *given, fmt, block_size, col_major, round_sf, use_packed_ue8m0
    )  # fmt: skip
    launcher = _PER_BLOCK[op].get(device, hidden, in_dtype, fmt, block[0], block[1], kind, layout, mode)
    if mode == "precomputed_sf":
        out_sf = sf
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
    return _per_block("tkaot.quant.per_block_cast", "cast", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                      None, out_x, out_sf)  # fmt: skip


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
    return _per_block("tkaot.quant.per_block_cast_with_sf_only", "sf_only", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, None, None, out_sf)  # fmt: skip


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
    return _per_block("tkaot.quant.per_block_cast_with_precomputed_sf", "precomputed_sf", x, fmt, block_size,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, sf, out, None)  # fmt: skip


# ---- per-channel cast ----------------------------------------------------------------------------------------------------

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
        rules += (
            Let("x_ptr", "p_x_data", after=last),
            Let("in_sf_ptr", "p_x_sf", after=last),
            Let("in_sf_stride", "x_sf_stride", after=last),
        )
    else:
        inputs, last = (_X,), "x"
        rules = (
            Rule("num_per_channels", "num_per_channels is None", "None for a bf16/fp32 input", actual="repr(num_per_channels)", after="x"),
            _IN_DTYPE, Let("in_block", "'none'", after="x"), Let("in_sf", "'none'", after="x"),
            Let("x_ptr", "p_x", after="x"), Let("in_sf_ptr", "0", after="x"), Let("in_sf_stride", "0", after="x"),
        )  # fmt: skip
    return Signature(
        "tkaot.quant.per_channel_cast", tensors=inputs, unpack={"x": ("x_data", "x_sf")} if quantized else None,
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
