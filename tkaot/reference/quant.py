"""FP8/FP4 cast references in plain torch: the meaning tkaot's cast kernels are tested against.

Runs on any device (CPU included). Conventions (the same as tkaot.quant's):
- a scale factor sf dequantises: decoded = data * sf; the quantisation factor is inv;
- amax of a block is clamped from below (1e-4 for E4M3, 6 * 2**-126 for E2M1,
  max * 2**-9 with E4M3 scale factors) before sf is formed;
- sf kinds: "fp32" sf = amax / max, inv = max / amax; "pow2" sf = the smallest power
  of two >= amax * fl(1 / max), inv = 1 / sf; "ue8m0" the same stored as its
  biased exponent byte; "e4m3" sf = E4M3(amax / max), inv = 1 / sf;
- data = round_to_nearest_even(x * inv), saturating at +-448 (E4M3) or +-6 (E2M1,
  where NaN becomes +-6); pre-quantized inputs are scaled as data * (in_sf * inv);
- E2M1 codes: sign bit 3, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; two per int8, first
  element in the low nibble.
"""

from __future__ import annotations

import torch

import tkaot.quant
from tkaot.reference._arguments import takes_arguments_of

FORMAT_MAX = {"e4m3": 448.0, "e2m1": 6.0}
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def amax_floor(fmt: str, sf_kind: str) -> float:
    if sf_kind == "e4m3":
        return FORMAT_MAX[fmt] * 2.0**-9
    return 1e-4 if fmt == "e4m3" else 6.0 * 2.0**-126


def sf_kind_of(round_sf: bool, use_packed_ue8m0: bool, use_e4m3_sf: bool) -> str:
    if use_packed_ue8m0:
        return "ue8m0"
    if round_sf:
        return "pow2"
    return "e4m3" if use_e4m3_sf else "fp32"


def scale_factors(amax: torch.Tensor, fmt: str, sf_kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf as fp32, inv as fp32) from an fp32 amax tensor. For "ue8m0" sf is the power of two it encodes."""
    fmax = torch.full_like(amax, FORMAT_MAX[fmt])
    clamped = amax.clamp(min=amax_floor(fmt, sf_kind))
    one = torch.ones_like(amax)
    if sf_kind == "fp32":
        return clamped / fmax, fmax / clamped
    if sf_kind == "e4m3":
        sf = (clamped / fmax).clamp(max=448.0).to(torch.float8_e4m3fn).float()
        return sf, one / sf
    approx = clamped * torch.tensor(1.0 / FORMAT_MAX[fmt], dtype=torch.float32)
    biased = ((approx.view(torch.int32) - 1) >> 23) + 1
    return (biased << 23).view(torch.float32), ((254 - biased) << 23).view(torch.float32)


def round_e4m3(v: torch.Tensor) -> torch.Tensor:
    return v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8) of fp32 values, round to nearest even on E2M1's grid."""
    mag = torch.nan_to_num(v.abs(), nan=6.0, posinf=6.0).clamp(max=6.0)
    step = torch.where(mag < 2, 0.5, torch.where(mag < 4, 1.0, 2.0))
    rounded = torch.round(mag / step) * step  # torch.round is half-to-even
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=v.device)
    code = torch.searchsorted(grid, rounded.contiguous()).to(torch.uint8)
    return code | (torch.signbit(v).to(torch.uint8) << 3)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    pairs = codes.view(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).view(torch.int8)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """fp32 values of packed E2M1 bytes; the last dim doubles."""
    b = packed.view(torch.uint8).to(torch.int32)
    codes = torch.stack((b & 15, b >> 4), dim=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])
    mag = torch.tensor(E2M1_GRID, dtype=torch.float32, device=packed.device)[codes & 7]
    return torch.where((codes & 8) != 0, -mag, mag)


def stochastic_round(v: torch.Tensor, fmt: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """v rounded to fmt's grid (saturating), up with probability equal to its fraction of a step."""
    mantissa_bits, min_step_exp = (3, -9) if fmt == "e4m3" else (1, -1)
    mag = v.abs().clamp(max=FORMAT_MAX[fmt])
    exp = torch.floor(torch.log2(torch.where(mag > 0, mag, torch.ones_like(mag))))
    step = torch.exp2(torch.clamp(exp - mantissa_bits, min=min_step_exp))
    low = torch.floor(mag / step)
    r = torch.rand(v.shape, generator=generator, device=v.device)
    q = ((low + (r < mag / step - low).float()) * step).clamp(max=FORMAT_MAX[fmt])
    return torch.where(torch.signbit(v), -q, q)


def encode(v: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round fp32 values to fmt's storage: float8_e4m3fn, or packed E2M1 int8 (last dim halves)."""
    return round_e4m3(v) if fmt == "e4m3" else pack_e2m1(e2m1_codes(v))


def decode(data: torch.Tensor) -> torch.Tensor:
    """fp32 values of float8_e4m3fn or packed E2M1 int8 data."""
    return unpack_e2m1(data) if data.dtype == torch.int8 else data.float()


# ---- scale-factor storage --------------------------------------------------------------------------------------


def sf_to_float(sf: torch.Tensor, pack_along_m: bool = False) -> torch.Tensor:
    """The fp32 grid of a stored sf tensor (fp32, E4M3, or UE8M0 packed in int32), padding bytes dropped by the caller."""
    if sf.dtype == torch.float32:
        return sf
    if sf.dtype == torch.float8_e4m3fn:
        return sf.float()
    exps = (
        torch.empty(sf.shape, dtype=sf.dtype, device=sf.device)
        .copy_(sf)
        .view(torch.uint8)
        .view(sf.shape[0], sf.shape[1], 4)
        .to(torch.int32)
    )
    values = (exps << 23).view(torch.float32)
    if pack_along_m:  # (m / 4, k) int32 -> (m, k)
        return values.permute(0, 2, 1).reshape(sf.shape[0] * 4, sf.shape[1])
    return values.reshape(sf.shape[0], sf.shape[1] * 4)


def store_sf(sf: torch.Tensor, kind: str, col_major: bool, pack_along_m: bool = False) -> torch.Tensor:
    """Lay out an fp32 (m_blocks, k_blocks) sf grid as tkaot returns it.

    "ue8m0" packs exponent bytes four to an int32 (along k, or along m when
    pack_along_m), zero-filling the tail; col_major returns a column-major view
    whose m stride is padded to 16 bytes.
    """
    m, k = sf.shape
    if kind == "ue8m0":
        exps = ((sf.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
        if pack_along_m:
            padded = torch.zeros(-(-m // 4) * 4, k, dtype=torch.uint8, device=sf.device)
            padded[:m] = exps
            stored = padded.view(-1, 4, k).permute(0, 2, 1).contiguous().view(torch.int32).view(-1, k)
        else:
            padded = torch.zeros(m, -(-k // 4) * 4, dtype=torch.uint8, device=sf.device)
            padded[:, :k] = exps
            stored = padded.view(torch.int32)
    elif kind == "e4m3":
        stored = sf.to(torch.float8_e4m3fn)
    else:
        stored = sf
    if not col_major:
        return stored
    rows, cols = stored.shape
    pitch = max(-(-rows // (16 // stored.element_size())) * (16 // stored.element_size()), 1)
    storage = torch.zeros(cols, pitch, dtype=stored.dtype, device=sf.device)
    storage[:, :rows] = stored.T
    return storage.as_strided((rows, cols), (1, pitch))


def expand_blocks(grid: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """Repeat each grid entry over its (bm, bk) block and crop to shape."""
    return grid.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[: shape[0], : shape[1]]


def _input(x, x_block_size):
    """(raw fp32 values, per-element input scale or None) of a tensor or (data, sf) input."""
    if isinstance(x, torch.Tensor):
        return x.float(), None
    data, sf = x
    raw = decode(data)
    pack_m = x_block_size[1] == 1
    grid = sf_to_float(sf, pack_m)
    m_blocks, k_blocks = -(-raw.shape[0] // x_block_size[0]), -(-raw.shape[1] // x_block_size[1])
    return raw, expand_blocks(grid[:m_blocks, :k_blocks], x_block_size, raw.shape)


def block_cast(
    x,
    fmt: str,
    block: tuple[int, int],
    x_block_size: tuple[int, int] | None = None,
    sf_kind: str = "fp32",
    col_major_sf: bool = False,
    stochastic: bool = False,
    precomputed_sf: torch.Tensor | None = None,
    inv_bf16: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast x (tensor or (data, sf) pair) with one scale factor per `block` = (rows, cols) block.

    Returns (data, sf) with sf laid out by store_sf (per-channel blocks (bm, 1)
    pack UE8M0 along tokens). With precomputed_sf (fp32 or E4M3, row-major grid)
    the given factors are used (inv = 1 / sf, rounded to bf16 when inv_bf16).
    """
    raw, in_scale = _input(x, x_block_size)
    rows, cols = raw.shape
    bm, bk = block
    m_blocks, k_blocks = -(-rows // bm), -(-cols // bk)
    if precomputed_sf is not None:
        sf = precomputed_sf.float()
        inv = torch.ones_like(sf) / sf
        if inv_bf16:
            inv = inv.bfloat16().float()
    else:
        scaled = raw.abs() if in_scale is None else raw.abs() * in_scale
        padded = torch.zeros(m_blocks * bm, k_blocks * bk, dtype=torch.float32, device=raw.device)
        padded[:rows, :cols] = scaled
        amax = padded.view(m_blocks, bm, k_blocks, bk).amax(dim=(1, 3))
        sf, inv = scale_factors(amax, fmt, sf_kind)
    inv_full = expand_blocks(inv, block, raw.shape)
    v = raw * inv_full if in_scale is None else raw * (in_scale * inv_full)
    if stochastic:
        v = stochastic_round(v, fmt)
    data = encode(v, fmt)
    return data, store_sf(sf, sf_kind, col_major_sf, pack_along_m=bk == 1)


@takes_arguments_of(tkaot.quant.per_token_cast)
def per_token_cast(
    x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, use_e4m3_sf, stochastic_cast
) -> tuple[torch.Tensor, torch.Tensor]:
    """tkaot.quant.per_token_cast: blocks of (1, num_per_channels)."""
    kind = sf_kind_of(round_sf, use_packed_ue8m0, use_e4m3_sf)
    return block_cast(x, fmt, (1, num_per_channels), x_block_size, kind, use_tma_aligned_col_major_sf, stochastic_cast)


@takes_arguments_of(tkaot.quant.per_token_cast_with_precomputed_sf)
def per_token_cast_with_precomputed_sf(x, fmt, num_per_channels, sf, round_sf) -> torch.Tensor:
    """tkaot.quant.per_token_cast_with_precomputed_sf: data = round(x * (1 / sf))."""
    inv_bf16 = round_sf and x.dtype == torch.bfloat16
    return block_cast(x, fmt, (1, num_per_channels), precomputed_sf=sf, inv_bf16=inv_bf16)[0]


@takes_arguments_of(tkaot.quant.cast_back)
def cast_back(x, fmt, x_block_size) -> torch.Tensor:
    """Dequantize (data, sf) to "bf16" or "fp32": round(data * sf), the product in fp32."""
    raw, scale = _input(x, x_block_size)
    return (raw * scale).to(torch.bfloat16 if fmt == "bf16" else torch.float32)


@takes_arguments_of(tkaot.quant.per_token_cast_back)
def per_token_cast_back(x, fmt, num_per_channels) -> torch.Tensor:
    return cast_back(x, fmt, (1, num_per_channels))


@takes_arguments_of(tkaot.quant.per_block_cast)
def per_block_cast(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0) -> tuple[torch.Tensor, torch.Tensor]:
    """tkaot.quant.per_block_cast."""
    return block_cast(x, fmt, block_size, None, sf_kind_of(round_sf, use_packed_ue8m0, False), use_tma_aligned_col_major_sf)


@takes_arguments_of(tkaot.quant.per_block_cast_with_precomputed_sf)
def per_block_cast_with_precomputed_sf(x, fmt, block_size, sf, round_sf) -> torch.Tensor:
    """tkaot.quant.per_block_cast_with_precomputed_sf: data = round(x * (1 / sf)) per block."""
    return block_cast(x, fmt, block_size, precomputed_sf=sf, inv_bf16=round_sf and x.dtype == torch.bfloat16)[0]


@takes_arguments_of(tkaot.quant.per_channel_cast)
def per_channel_cast(x, fmt, num_per_tokens, round_sf, num_per_channels, use_packed_ue8m0) -> tuple[torch.Tensor, torch.Tensor]:
    """tkaot.quant.per_channel_cast: blocks of (num_per_tokens, 1); UE8M0 packs four token blocks a word.

    A (data, sf) input (scale blocks (1, num_per_channels)) is decoded to fp32 first, data * sf
    rounded once, and then cast like an fp32 input: out = round((data * sf) * inv).
    """
    if not isinstance(x, torch.Tensor):
        raw, scale = _input(x, (1, num_per_channels))
        x = raw * scale
    return block_cast(x, fmt, (num_per_tokens, 1), None, sf_kind_of(round_sf, use_packed_ue8m0, False))


@takes_arguments_of(tkaot.quant.per_token_cast_and_cast_back)
def per_token_cast_and_cast_back(x, fmt, num_per_channels, round_sf, use_e4m3_sf) -> torch.Tensor:
    """What tkaot.quant.per_token_cast_and_cast_back leaves in x: round(decode(cast(x)) * sf) in x's dtype."""
    data, sf = per_token_cast(x, fmt, num_per_channels, round_sf=round_sf, use_e4m3_sf=use_e4m3_sf)
    return (decode(data) * expand_blocks(sf.float(), (1, num_per_channels), x.shape)).to(x.dtype)


@takes_arguments_of(tkaot.quant.cast)
def cast(x, dtype, stochastic_rounding) -> torch.Tensor:
    """tkaot.quant.cast: round to nearest even (FP8 saturating), or stochastically (unbiased)."""
    if dtype == torch.float8_e4m3fn:
        v = x.float()
        return (stochastic_round(v, "e4m3") if stochastic_rounding else v.clamp(-448.0, 448.0)).to(dtype)
    if dtype == torch.float8_e5m2:
        return x.float().clamp(-57344.0, 57344.0).to(dtype)
    if stochastic_rounding:  # float32 -> bfloat16: drop 16 bits, rounding up with probability (dropped bits) / 2**16
        bits = x.float().view(torch.int32)
        low = bits & 0xFFFF
        up = torch.randint(0, 1 << 16, bits.shape, device=x.device, dtype=torch.int32) < low
        rounded = ((bits & ~0xFFFF) + up.int() * 0x10000).view(torch.float32)
        return torch.where(torch.isnan(x), x, rounded).to(dtype)
    return x.to(dtype)


# ---- weight preparation: lossless FP4 -> FP8, DeepGEMM scale-factor layouts -------------------------------------

LOSSLESS_HEADROOM = 6  # an output block's exponent is its largest input exponent minus 6 (E4M3 holds 6 * 2**6)


def sf_exponents(sf: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Biased exponents (int32) of a stored power-of-two sf tensor (fp32 or packed UE8M0, any layout), cropped to grid."""
    values = sf_to_float(sf)[: grid[0], : grid[1]].contiguous()
    return (values.view(torch.int32) >> 23) & 0xFF


@takes_arguments_of(tkaot.quant.per_block_cast_lossless)
def per_block_cast_lossless(
    x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0
) -> tuple[torch.Tensor, torch.Tensor]:
    """tkaot.quant.per_block_cast_lossless, from exponents.

    With e_in the biased exponent of each input block's sf and, per output block, e_out =
    max(largest e_in inside it - 6, 0): out sf = 2**(e_out - 127) (0.0 for e_out = 0), and every
    element is E4M3(code * 2**(e_in - e_out)) (0 once the shift passes 2**-126).
    """
    assert fmt == "e4m3"
    data, sf = x
    values = unpack_e2m1(data)
    rows, cols = values.shape
    (ibm, ibk), (obm, obk) = x_block_size, out_block_size
    m_in, k_in = -(-rows // ibm), cols // ibk
    m_out, k_out = -(-rows // obm), cols // obk
    rm, rk = obm // ibm, obk // ibk
    e_in = sf_exponents(sf, (m_in, k_in))
    padded = torch.zeros(m_out * rm, k_out * rk, dtype=torch.int32, device=data.device)
    padded[:m_in] = e_in
    e_out = (padded.view(m_out, rm, k_out, rk).amax(dim=(1, 3)) - LOSSLESS_HEADROOM).clamp(min=0)
    biased = e_in + 127 - e_out.repeat_interleave(rm, 0)[:m_in].repeat_interleave(rk, 1)
    factor = torch.where(biased >= 1, (biased.clamp(1, 254) << 23).view(torch.float32), 0.0)
    out = round_e4m3(values * expand_blocks(factor, x_block_size, values.shape))
    out_sf = (e_out << 23).view(torch.float32)
    return out, store_sf(out_sf, "ue8m0" if use_packed_ue8m0 else "pow2", use_tma_aligned_col_major_sf)


def pack_exponents(exps: torch.Tensor) -> torch.Tensor:
    """Exponent bytes (..., m) -> int32 words (..., ceil(m / 4)), four a word, lowest index in the lowest byte, zero-padded."""
    words = -(-exps.shape[-1] // 4)
    padded = torch.zeros(*exps.shape[:-1], words * 4, dtype=torch.uint8, device=exps.device)
    padded[..., : exps.shape[-1]] = exps
    return padded.view(torch.int32)


@takes_arguments_of(tkaot.quant.batched_transpose_weight_sf)
def batched_transpose_weight_sf(sf, block_size, transpose_sf1s) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """tkaot.quant.batched_transpose_weight_sf: per weight (sf0, sf1) of per-row packed UE8M0 words.

    sf0 row r holds the exponents of row block r // block_size along k; sf1 is sf0 of the
    transposed weight. Both are (…, rows, words) views of (…, words, rows) storage (rows
    contiguous); a transposed sf1 is returned as the storage itself.
    """
    results = []
    for weight_sf, transpose in zip(sf, transpose_sf1s):
        grouped = weight_sf.dim() == 3
        blocks = weight_sf if grouped else weight_sf[None]
        exps = ((blocks.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
        per_row = pack_exponents(exps.repeat_interleave(block_size, 1))  # (groups, n, words)
        per_col = pack_exponents(exps.transpose(1, 2).repeat_interleave(block_size, 1))  # (groups, k, words)
        sf0 = per_row.transpose(1, 2).contiguous().transpose(1, 2)
        sf1 = per_col.transpose(1, 2).contiguous()
        sf1 = sf1 if transpose else sf1.transpose(1, 2)
        results.append((sf0, sf1) if grouped else (sf0[0], sf1[0]))
    return results
