"""tkaot.quant's weight-preparation casts, with TileKernels 2.1.0's names, arguments, defaults and returns.

- per_block_cast_lossless: block-scaled FP4 E2M1 (power-of-two scale factors) ->
  FP8 E4M3 with larger scale blocks, exactly (the FP4 checkpoint -> FP8 GEMM path).
- batched_transpose_weight_sf: fp32 power-of-two block scale factors of weights ->
  DeepGEMM's per-row packed UE8M0 scale factors of each weight and its transpose.

Both require power-of-two scale factors, which TileKernels asserts inside its
kernels (a device trap). tkaot checks the values on the device with torch before
launching instead, and raises ValueError; that costs one synchronisation per
call, and is skipped while a CUDA graph is being captured (see each op for what
its kernel then makes of a bad value). Every other check is on shapes, dtypes,
strides and devices, done before anything is allocated or launched.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tkaot._op import OpKernels, current_stream
from tkaot._quant.cast_common import _alloc_sf, _ceil_div, _check_block, _quantized_input, _sf_kernel_stride, _sf_kind
from tkaot._quant.kernels import BATCHED_TRANSPOSE_WEIGHT_SF, PER_BLOCK_CAST_LOSSLESS
from tkaot._validate import MAX_I32, check_cuda, fail

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


def per_block_cast_lossless(
    x: tuple[torch.Tensor, torch.Tensor],
    fmt: str,
    x_block_size: tuple[int, int],
    out_block_size: tuple[int, int],
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    op = "tkaot.quant.per_block_cast_lossless"
    if fmt != "e4m3":
        fail(op, "fmt", "'e4m3' (the lossless cast goes from FP4 E2M1 to FP8 E4M3)", repr(fmt))
    kind = _sf_kind(op, round_sf, use_packed_ue8m0, False)
    kind = "ue8m0" if kind == "ue8m0" else "pow2"
    layout = "col" if use_tma_aligned_col_major_sf else "row"
    if isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], torch.Tensor) and x[0].dtype != torch.int8:
        fail(op, "x[0]", "torch.int8 (two E2M1 codes a byte)", x[0].dtype)
    device, data, in_sf_t, _, in_block, in_sf, hidden, in_layout, in_kind = _quantized_input(op, x, x_block_size)
    if in_kind not in ("fp32", "ue8m0"):
        fail(op, "x[1]", "float32 or packed UE8M0 int32 (power-of-two scale factors)", in_sf_t.dtype)
    out_block = _check_block(op, "out_block_size", out_block_size, _OUT_BLOCKS)
    if out_block[0] % in_block[0] or out_block[1] % in_block[1]:
        fail(op, "out_block_size", f"a multiple of x_block_size {in_block} in both dimensions", out_block)
    num_tokens = data.shape[0]
    if hidden % 128:
        fail(op, "x[0]", "a multiple of 128 channels wide (two E2M1 codes a byte)", f"{hidden} channels")
    if _ceil_div(num_tokens, 128) > 65535:
        fail(op, "x[0]", f"at most {65535 * 128} tokens", num_tokens)
    launcher = _LOSSLESS.get(device, hidden, f"{in_block[0]}x{in_block[1]}", in_sf, f"{out_block[0]}x{out_block[1]}", kind, layout)
    m_in, k_in = _ceil_div(num_tokens, in_block[0]), hidden // in_block[1]
    m_out, k_out = _ceil_div(num_tokens, out_block[0]), hidden // out_block[1]
    if num_tokens and not _values_unchecked():
        _check_lossless_scales(op, in_sf_t, in_kind, (m_in, k_in), (m_out, k_out), in_block, out_block)
    out = torch.empty((num_tokens, hidden), dtype=torch.float8_e4m3fn, device=data.device)
    out_sf = _alloc_sf(m_out, k_out, kind, layout, data.device)
    # the kernel moves codes as 4-byte words: its x_stride counts words
    launcher(
        device, current_stream(device), data.data_ptr(), in_sf_t.data_ptr(), out.data_ptr(), out_sf.data_ptr(), num_tokens,
        data.stride(0) // 4, _sf_kernel_stride(in_sf_t, in_kind, in_layout), _sf_kernel_stride(out_sf, kind, layout),
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


def batched_transpose_weight_sf(
    sf: Sequence[torch.Tensor],
    block_size: int,
    transpose_sf1s: Sequence[bool],
    outs: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
) -> list[tuple[torch.Tensor, torch.Tensor]]:
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
    op = "tkaot.quant.batched_transpose_weight_sf"
    if block_size not in (32, 128) or type(block_size) is not int:
        fail(op, "block_size", "32 or 128", repr(block_size))
    sf, transpose_sf1s, outs = list(sf), list(transpose_sf1s), list(outs)
    if not len(sf) == len(transpose_sf1s) == len(outs):
        fail(op, "transpose_sf1s and outs", f"one entry per weight ({len(sf)})", f"{len(transpose_sf1s)} and {len(outs)} entries")
    if not sf:
        return []
    device, plans, pool_words = None, [], 0
    for i, (weight_sf, transpose, out) in enumerate(zip(sf, transpose_sf1s, outs)):
        name = f"sf[{i}]"
        device = check_cuda(op, name, weight_sf, device)
        if weight_sf.dtype != torch.float32:
            fail(op, name, "torch.float32", weight_sf.dtype)
        if weight_sf.dim() not in (2, 3):
            fail(op, name, "2-D (n_blocks, k_blocks) or 3-D (num_groups, n_blocks, k_blocks)", f"shape {tuple(weight_sf.shape)}")
        if not weight_sf.is_contiguous():
            fail(op, name, "contiguous", f"strides {weight_sf.stride()}")
        groups = weight_sf.shape[0] if weight_sf.dim() == 3 else 1
        n_blocks, k_blocks = weight_sf.shape[-2:]
        n, k = n_blocks * block_size, k_blocks * block_size
        if not 0 < groups <= 65535 or n % 128 or k % 128:
            want = f"1 to 65535 groups of (n / {block_size}, k / {block_size}) blocks, n and k multiples of 128"
            fail(op, name, want, f"shape {tuple(weight_sf.shape)}")
        packs_k, packs_n = _ceil_div(k_blocks, 4), _ceil_div(n_blocks, 4)
        if groups * max(packs_k * n, packs_n * k) > MAX_I32:
            fail(op, name, "small enough for 2**31 output words", f"shape {tuple(weight_sf.shape)}")
        lead = (groups,) if weight_sf.dim() == 3 else ()
        lead_stride0, lead_stride1 = ((packs_k * n,), (packs_n * k,)) if lead else ((), ())
        sf1_shape, sf1_strides = ((packs_n, k), (k, 1)) if transpose else ((k, packs_n), (1, k))
        layouts = (((*lead, n, packs_k), (*lead_stride0, 1, n)), ((*lead, *sf1_shape), (*lead_stride1, *sf1_strides)))
        if out is None:
            offsets = (pool_words, pool_words + groups * packs_k * n)
            pool_words = offsets[1] + groups * packs_n * k
        else:
            _check_out_pair(op, f"outs[{i}]", out, layouts, device)
            offsets = None
        plans.append((weight_sf, groups, n_blocks, k_blocks, layouts, offsets, out))
    launcher = _TRANSPOSE_SF.get(device, block_size)
    if not _values_unchecked():
        bad = torch.stack([((w.view(torch.int32) & _POW2_MASK) != 0).any() for w in sf]).tolist()
        if any(bad):
            fail(op, f"sf[{bad.index(True)}]", "positive powers of two (or 0) in float32", "other values")
    pool = torch.empty(pool_words, dtype=torch.int32, device=sf[0].device) if None in outs else None
    stream = current_stream(device)
    results = []
    for weight_sf, groups, n_blocks, k_blocks, layouts, offsets, out in plans:
        if out is None:
            out = tuple(pool.as_strided(shape, strides, offset) for (shape, strides), offset in zip(layouts, offsets))
        if n_blocks and k_blocks:  # else both outputs are empty
            launcher(device, stream, weight_sf.data_ptr(), out[0].data_ptr(), out[1].data_ptr(), groups, n_blocks, k_blocks)
        results.append(out)
    return results


def _check_out_pair(op: str, name: str, out, layouts, device: int) -> None:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TypeError(f"{op}: {name} must be None or an (sf0, sf1) pair, got {type(out).__name__}")
    for j, (t, (shape, strides)) in enumerate(zip(out, layouts)):
        part = f"{name}[{j}]"
        check_cuda(op, part, t, device)
        if t.dtype != torch.int32:
            fail(op, part, "torch.int32 (packed UE8M0)", t.dtype)
        # the stride of a dimension of size 1 is never used, so it may be anything
        same_strides = all(n == 1 or a == b for n, a, b in zip(shape, t.stride(), strides))
        if tuple(t.shape) != shape or not same_strides:
            fail(op, part, f"of shape {shape} with strides {strides}", f"shape {tuple(t.shape)}, strides {t.stride()}")
        if t.data_ptr() % 16:
            fail(op, part, "16-byte aligned", f"address {t.data_ptr():#x}")
