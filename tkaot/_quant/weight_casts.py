"""tkaot.quant's weight-preparation casts, with TileKernels 2.1.0's names, arguments, defaults and returns.

- per_block_cast_lossless: block-scaled FP4 E2M1 (power-of-two scale factors) ->
  FP8 E4M3 with larger scale blocks, exactly (the FP4 checkpoint -> FP8 GEMM path).
- batched_transpose_weight_sf: fp32 power-of-two block scale factors of weights ->
  DeepGEMM's per-row packed UE8M0 scale factors of each weight and its transpose.

Both require power-of-two scale factors, which TileKernels asserts inside its
kernels (a device trap). tkaot checks the values on the device with torch before
launching instead, and raises ValueError; that costs one synchronisation per
call, and is skipped while a CUDA graph is being captured (see each op for what
its kernel then makes of a bad value). Every other check is declared, as Signatures
(tkaot/_validate.py), and done before anything is allocated or launched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._op import OpKernels, current_stream
from tkaot._quant.cast_common import (
    _F8,
    _F32,
    _I8,
    _I32,
    IN_BLOCKS,
    PAIR,
    SF_PACKED_RULE,
    _alloc_sf,
    _sf_kernel_stride,
    block_rules,
    fmt_rule,
    input_rows,
    new_sf,
    pair_input,
)
from tkaot._quant.kernels import BATCHED_TRANSPOSE_WEIGHT_SF, PER_BLOCK_CAST_LOSSLESS
from tkaot._validate import Let, Rule, Signature, Tensor, fail, lazy_checker

__all__ = ["batched_transpose_weight_sf", "per_block_cast_lossless"]

_OUT_BLOCKS = ((1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (32, 128), (128, 32), (128, 128))
_LOSSLESS = OpKernels("tkaot.quant.per_block_cast_lossless", PER_BLOCK_CAST_LOSSLESS)
_TRANSPOSE_SF = OpKernels("tkaot.quant.batched_transpose_weight_sf", BATCHED_TRANSPOSE_WEIGHT_SF)
_HEADROOM = 6  # an output block's exponent sits 2**6 below its largest input block's (E4M3 max 448 >= 6 * 2**6)
_MAX_SPREAD = 5  # TileKernels' bound: no input block more than 2**11 below the largest of its output block
_POW2_MASK = -0x7F800001  # sign and mantissa bits of an fp32 (0x807FFFFF as int32)


def _values_unchecked() -> bool:
    """True while a CUDA graph is being captured: a value check would synchronise, which capture forbids."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _sf_exponents(sf: torch.Tensor, kind: str, m_blocks: int, k_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(biased exponents as int32 (m_blocks, k_blocks), bool: some fp32 value is not a positive power of two or 0)."""
    if kind == "ue8m0":
        dense = torch.empty(sf.shape, dtype=torch.int32, device=sf.device).copy_(sf)
        exps = dense.view(torch.uint8).view(sf.shape[0], -1)[:, :k_blocks].to(torch.int32)
        return exps, torch.zeros((), dtype=torch.bool, device=sf.device)
    bits = sf.view(torch.int32)
    return (bits >> 23) & 0xFF, ((bits & _POW2_MASK) != 0).any()


# ---- per_block_cast_lossless ----------------------------------------------------------------------------------------

_LOSSLESS_INPUT, _LOSSLESS_PAIR_RULES = pair_input(
    block_rules("x_block_size", "block", IN_BLOCKS, "x_data", given=True), data_dtypes=(_I8,), sf_dtypes=(_F32, _I32)
)
LOSSLESS_SIGNATURE = Signature(
    "tkaot.quant.per_block_cast_lossless",
    tensors=_LOSSLESS_INPUT,
    unpack=PAIR,
    rules=(
        *_LOSSLESS_PAIR_RULES,
        fmt_rule("x_sf", ("e4m3",), " (the lossless cast goes from FP4 E2M1 to FP8 E4M3)"),
        SF_PACKED_RULE.replace(after="x_sf"),
        Let("kind", "'ue8m0' if use_packed_ue8m0 else 'pow2'", after="x_sf"),  # powers of two with round_sf or without
        Let("layout", "'col' if use_tma_aligned_col_major_sf else 'row'", after="x_sf"),
        *block_rules("out_block_size", "out_block", _OUT_BLOCKS, "x_sf"),
        Rule("out_block_size", "out_block[0] % block[0] == 0 and out_block[1] % block[1] == 0",
             "a multiple of x_block_size {block} in both dimensions", actual="out_block", after="x_sf"),
        Rule("x[0]", "hidden % 128 == 0", "a multiple of 128 channels wide (two E2M1 codes a byte)", actual="f'{hidden} channels'",
             after="x_sf"),
        Rule("x[0]", f"num_tokens <= {65535 * 128}", f"at most {65535 * 128} tokens", actual="num_tokens", after="x_sf"),
        Let("out_key", "f'{out_block[0]}x{out_block[1]}'", after="x_sf"),
    ),
    scalars=("fmt", "x_block_size", "out_block_size", "use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0"),
    returns=("device", "num_tokens", "hidden", "block", "in_block", "in_sf", "in_kind", "out_block", "out_key", "kind", "layout",
             "p_x_data", "s_x_data[0]", "p_x_sf", "x_sf_stride"),
)  # fmt: skip
_check_lossless = lazy_checker(LOSSLESS_SIGNATURE, globals(), "_check_lossless")


def per_block_cast_lossless(
    x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int], out_block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False, use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Re-quantize block-scaled FP4 (E2M1) data to FP8 (E4M3) with larger scale blocks, exactly.

    Args:
        x: (data, sf): data (num_tokens, hidden // 2) int8, two E2M1 codes a byte, rows 16-byte
            aligned; sf its scale factors in blocks of x_block_size, every one a power of two:
            float32, or packed UE8M0 int32; row-major or column-major.
        fmt: "e4m3".
        x_block_size: the input's scale block (num_per_tokens, num_per_channels): (1, 16), (1, 32),
            (1, 64), (1, 128), (32, 32) or (128, 128).
        out_block_size: the output's scale block, a multiple of x_block_size in both dimensions:
            (1, 16) .. (1, 128), (32, 32), (32, 128), (128, 32) or (128, 128).
        use_tma_aligned_col_major_sf: return sf column-major with a 16-byte aligned token stride.
        round_sf: accepted for TileKernels' signature; the output scale factors are powers of two either way.
        use_packed_ue8m0: return them as UE8M0 bytes packed four to an int32 (needs round_sf).

    Returns:
        (data, sf): data (num_tokens, hidden) float8_e4m3fn; sf (ceil(num_tokens / bm), hidden / bk)
        float32 powers of two [int32 packed UE8M0: a quarter of the columns, rounded up].

    An output block's scale factor is 2**(e - 6), e the largest input exponent inside it
    (at least 2**-127; 0 when every input exponent is below 2**-121); each value is
    stored as data * (in sf / out sf), which E4M3 holds exactly. Raises ValueError when
    an fp32 input scale factor is not a power of two (or 0), or when an input block is
    more than 2**11 below the largest of its output block (TileKernels' bound). During
    CUDA-graph capture these two value checks are skipped: the kernel then uses each fp32
    scale factor's exponent field, and rounds values of blocks beyond the bound to the
    nearest E4M3 (exact down to 2**14 below).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_per_block_cast_lossless(
            x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0
        )
    checked = _check_lossless(x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    (device, num_tokens, hidden, block, in_block, in_sf, in_kind, out_block, out_key, kind, layout, x_ptr, x_stride, in_sf_ptr,
     in_sf_stride) = checked  # fmt: skip
    launcher = _LOSSLESS.get(device, hidden, in_block, in_sf, out_key, kind, layout)
    m_in, k_in = -(-num_tokens // block[0]), hidden // block[1]
    m_out, k_out = -(-num_tokens // out_block[0]), hidden // out_block[1]
    if num_tokens and not _values_unchecked():
        _check_lossless_scales(LOSSLESS_SIGNATURE.op, x[1], in_kind, (m_in, k_in), (m_out, k_out), block, out_block)
    out = torch.empty((num_tokens, hidden), dtype=_F8, device=x[0].device)
    out_sf = _alloc_sf(m_out, k_out, kind, layout, x[0].device)
    # the kernel moves codes as 4-byte words: its x_stride counts words
    launcher(
        device, current_stream(device), x_ptr, in_sf_ptr, out.data_ptr(), out_sf.data_ptr(), num_tokens, x_stride // 4, in_sf_stride,
        _sf_kernel_stride(out_sf, kind, layout),
    )  # fmt: skip
    return out, out_sf


def _check_lossless_scales(op, sf, kind, in_grid, out_grid, in_block, out_block) -> None:
    """Raise ValueError unless every input sf is a power of two and no block falls past TileKernels' bound."""
    exps, not_pow2 = _sf_exponents(sf, kind, *in_grid)
    rows, cols = out_block[0] // in_block[0], out_block[1] // in_block[1]
    padded = torch.zeros((out_grid[0] * rows, out_grid[1] * cols), dtype=torch.int32, device=sf.device)
    padded[: in_grid[0]] = exps
    e_out = (padded.view(out_grid[0], rows, out_grid[1], cols).amax(dim=(1, 3)) - _HEADROOM).clamp(min=0)
    e_out = e_out.repeat_interleave(rows, 0)[: in_grid[0]].repeat_interleave(cols, 1)  # per input block
    spread = exps + _MAX_SPREAD < e_out
    flags = torch.stack((not_pow2, spread.any())).tolist()
    if flags[0]:
        fail(op, "x[1]", "positive powers of two (or 0)", "other float32 values")
    if flags[1]:
        m, k = spread.nonzero()[0].tolist()
        gap = int(e_out[m, k] - exps[m, k]) + _HEADROOM
        fail(
            op,
            "x[1]",
            f"within 2**11 of the largest scale factor of its {out_block} output block, for the cast to be lossless",
            f"the scale factor at [{m}, {k}] 2**{gap} below it",
        )


# ---- batched_transpose_weight_sf: its options, then each weight's ----------------------------------------------------

_TRANSPOSE_OP = "tkaot.quant.batched_transpose_weight_sf"
_TRANSPOSE_OPTIONS = Signature(
    _TRANSPOSE_OP,
    tensors=(),
    rules=(
        Rule("block_size", "block_size in (32, 128) and type(block_size) is int", "32 or 128", actual="repr(block_size)"),
        Rule("transpose_sf1s and outs", "len(sf) == len(transpose_sf1s) == len(outs)", "one entry per weight ({len(sf)})",
             actual="f'{len(transpose_sf1s)} and {len(outs)} entries'"),
    ),
    scalars=("sf", "block_size", "transpose_sf1s", "outs"),
    returns=(),
)  # fmt: skip
_check_transpose_options = lazy_checker(_TRANSPOSE_OPTIONS, globals(), "_check_transpose_options")


def _out_layouts(grouped: bool, groups: int, n: int, k: int, packs_n: int, packs_k: int, transpose) -> tuple:
    """((shape, strides) of sf0, (shape, strides) of sf1): TileKernels' layouts, groups leading when the input has them."""
    lead = (groups,) if grouped else ()
    lead_stride0, lead_stride1 = ((packs_k * n,), (packs_n * k,)) if grouped else ((), ())
    sf1_shape, sf1_strides = ((packs_n, k), (k, 1)) if transpose else ((k, packs_n), (1, k))
    return ((*lead, n, packs_k), (*lead_stride0, 1, n)), ((*lead, *sf1_shape), (*lead_stride1, *sf1_strides))


def _laid_out(shape, strides, layout) -> bool:
    """A given output has the layout's shape and strides (the stride of a dimension of size 1 is never used: any)."""
    return tuple(shape) == layout[0] and all(n == 1 or a == b for n, a, b in zip(layout[0], strides, layout[1]))


_GIVEN_LAYOUT = "f'shape {tuple(h_sf%d)}, strides {s_sf%d}'"
# One weight's checks (its errors name sf[i] and outs[i]): its sf, contiguous fp32 blocks with groups or without, on the
# device of the first weight (`first`, None for the first), and when given the (sf0, sf1) written
WEIGHT_SIGNATURE = Signature(
    _TRANSPOSE_OP,
    tensors=(
        Tensor("sf", (_F32,), (("n_blocks", "k_blocks"), ("groups", "n_blocks", "k_blocks")), layout="contiguous", label="sf[{i}]",
               what="2-D (n_blocks, k_blocks) or 3-D (num_groups, n_blocks, k_blocks)"),
        Tensor("sf0", (_I32,), None, layout="any", align=16, optional=True, label="outs[{i}][0]"),
        Tensor("sf1", (_I32,), None, layout="any", align=16, optional=True, label="outs[{i}][1]"),
    ),
    unpack={"out": ("sf0", "sf1")},
    defaults={"groups": 1},
    rules=(
        Rule("sf[{i}]", "first is None or device == first", "on cuda:{first} like the input", actual="f'cuda:{device}'", after="sf"),
        Let("n", "n_blocks * block_size", after="sf"),
        Let("k", "k_blocks * block_size", after="sf"),
        Rule("sf[{i}]", "0 < groups <= 65535 and n % 128 == 0 and k % 128 == 0",
             "1 to 65535 groups of (n / {block_size}, k / {block_size}) blocks, n and k multiples of 128",
             actual="f'shape {tuple(h_sf)}'", after="sf"),
        Let("packs_n", "-(-n_blocks // 4)", after="sf"),
        Let("packs_k", "-(-k_blocks // 4)", after="sf"),
        Let("words", "(groups * packs_k * n, groups * packs_n * k)", after="sf"),
        Rule("sf[{i}]", "max(words) <= _MAX_I32", "small enough for 2**31 output words", actual="f'shape {tuple(h_sf)}'", after="sf"),
        Let("layouts", "_out_layouts(len(h_sf) == 3, groups, n, k, packs_n, packs_k, transpose)", after="sf"),
        Rule("outs[{i}][0]", "_laid_out(h_sf0, s_sf0, layouts[0])", "of shape {layouts[0][0]} with strides {layouts[0][1]}",
             actual=_GIVEN_LAYOUT % (0, 0), after="sf0"),
        Rule("outs[{i}][1]", "_laid_out(h_sf1, s_sf1, layouts[1])", "of shape {layouts[1][0]} with strides {layouts[1][1]}",
             actual=_GIVEN_LAYOUT % (1, 1), after="sf1"),
    ),
    scalars=("block_size", "transpose", "first", "i"),
    env={"_out_layouts": _out_layouts, "_laid_out": _laid_out},
    returns=("device", "groups", "n_blocks", "k_blocks", "layouts", "words", "p_sf"),
)  # fmt: skip
_check_weight = lazy_checker(WEIGHT_SIGNATURE, globals(), "_check_weight")


def batched_transpose_weight_sf(
    sf: Sequence[torch.Tensor], block_size: int, transpose_sf1s: Sequence[bool], outs: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """Turn weights' fp32 power-of-two block scale factors into DeepGEMM's per-row packed UE8M0 ones.

    Args:
        sf: per weight, fp32 scale factors (n / block_size, k / block_size), or
            (num_groups, n / block_size, k / block_size) for grouped (expert) weights; contiguous,
            every value a power of two (or 0); n and k multiples of 128; all on one device.
        block_size: the weights' square scale block, 32 or 128.
        transpose_sf1s: per weight, return sf1 as (num_packed_sf1, k) instead of (k, num_packed_sf1).
        outs: per weight, None to allocate, or the (sf0, sf1) pair of an earlier call to write again
            (int32, the exact shapes and strides below, 16-byte aligned).

    Returns:
        per weight (sf0, sf1), int32, four exponent bytes a word (lowest block in the lowest byte,
        bytes past the last block 0), with groups leading when the input has them:
        sf0 (n, ceil(k_blocks / 4)) with strides (1, n): row r's word p holds k blocks 4p .. 4p + 3 of
        row block r // block_size; sf1, for the transposed weight, (k, ceil(n_blocks / 4)) with
        strides (1, k) (or its transpose): column c's word q holds row blocks 4q .. 4q + 3 at column
        block c // block_size. New outputs are views of one allocation, as in TileKernels.

    Raises ValueError when a scale factor is not a power of two (checked with torch first, one
    synchronisation; skipped during CUDA-graph capture, when the kernel uses each value's
    exponent field).
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_batched_transpose_weight_sf(sf, block_size, transpose_sf1s, outs)
    sf, transpose_sf1s, outs = list(sf), list(transpose_sf1s), list(outs)
    _check_transpose_options(sf, block_size, transpose_sf1s, outs)
    if not sf:
        return []
    device, plans, pool_words = None, [], 0
    for i, (weight_sf, transpose, out) in enumerate(zip(sf, transpose_sf1s, outs)):
        device, groups, n_blocks, k_blocks, layouts, words, sf_ptr = _check_weight(weight_sf, out, block_size, transpose, device, i)
        offsets = None
        if out is None:
            offsets = (pool_words, pool_words + words[0])
            pool_words = offsets[1] + words[1]
        plans.append((sf_ptr, groups, n_blocks, k_blocks, layouts, offsets, out))
    launcher = _TRANSPOSE_SF.get(device, block_size)
    if not _values_unchecked():
        bad = torch.stack([((w.view(torch.int32) & _POW2_MASK) != 0).any() for w in sf]).tolist()
        if any(bad):
            fail(_TRANSPOSE_OP, f"sf[{bad.index(True)}]", "positive powers of two (or 0) in float32", "other values")
    pool = torch.empty(pool_words, dtype=torch.int32, device=sf[0].device) if None in outs else None
    stream = current_stream(device)
    results = []
    for sf_ptr, groups, n_blocks, k_blocks, layouts, offsets, out in plans:
        if out is None:
            out = tuple(pool.as_strided(shape, strides, offset) for (shape, strides), offset in zip(layouts, offsets))
        if n_blocks and k_blocks:  # else both outputs are empty
            launcher(device, stream, sf_ptr, out[0].data_ptr(), out[1].data_ptr(), groups, n_blocks, k_blocks)
        results.append(out)
    return results


# ---- tracing (tkaot/_compile.py): each op's outputs, allocated through `new` ----------------------------------------


def _fake_lossless(new, x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf=False, round_sf=False, use_packed_ue8m0=False):
    num_tokens, hidden, device = input_rows(x)
    m_out, k_out = -(-num_tokens // out_block_size[0]), hidden // out_block_size[1]
    kind = "ue8m0" if use_packed_ue8m0 else "pow2"
    return new.empty((num_tokens, hidden), _F8, device), new_sf(new, m_out, k_out, kind, use_tma_aligned_col_major_sf, device)


def _fake_transpose(new, sf, block_size, transpose_sf1s, outs):
    """Each new (sf0, sf1) as its own tensor (the op makes them views of one allocation): same shapes and strides."""
    results = []
    for weight_sf, transpose, out in zip(sf, transpose_sf1s, outs):
        if out is None:
            *lead, n_blocks, k_blocks = weight_sf.shape
            n, k = n_blocks * block_size, k_blocks * block_size
            layouts = _out_layouts(bool(lead), lead[0] if lead else 1, n, k, -(-n_blocks // 4), -(-k_blocks // 4), transpose)
            out = tuple(new.empty_strided(shape, strides, _I32, weight_sf.device) for shape, strides in layouts)
        results.append(out)
    return results


# A traced call returns at most this many new tensors (4 weights without outs): trace larger batches as several calls
MAX_TRACED_WEIGHTS = 4
_traced_per_block_cast_lossless = traced(per_block_cast_lossless, _fake_lossless, outputs=2)
_traced_batched_transpose_weight_sf = traced(
    batched_transpose_weight_sf, _fake_transpose, mutates=("outs",), outputs=2 * MAX_TRACED_WEIGHTS
)
