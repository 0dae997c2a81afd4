"""The word-at-a-time FP4 cast of per_token_cast's "f" tilings (kernels_src/quant/fp4_words.py) on CPU.

numpy emulates the device helpers instruction by instruction (IEEE fp32 add and
multiply, PRMT byte permutes with sign replication) and checks them against the
reference: the rounding step on every fp32 magnitude up to 6, the packed word on
random and edge inputs; then real builds.
"""

import numpy as np
import pytest
import torch

from build_tools.compile import compile_variant, lower
from build_tools.ops import Variant
from kernels_src.quant import fp4_words, per_token_cast
from kernels_src.quant.tiling import RowTiling
from tkaot.reference import quant as ref

U32 = np.uint32
CANONICAL_NAN = U32(0x7FFFFFFF)  # what the GPU's fp32 multiply returns for a NaN result


def e2m1_step(x: np.ndarray) -> np.ndarray:
    """tkaot_e2m1_step: bits of min(|x|, 6) + the magic of its step (low byte = magnitude code)."""
    v = np.fmin(np.abs(x), np.float32(6.0))  # fminf: NaN -> 6
    e = np.maximum(v.view(U32), U32(0x3F800000)) >> U32(23)
    magic = e * U32(fp4_words.MAGIC_PER_EXP) + U32(fp4_words.MAGIC_BASE)
    return (v + magic.view(np.float32)).view(U32)


def prmt(a: np.ndarray, b: np.ndarray, selector: int) -> np.ndarray:
    """prmt.b32: byte n of the result is byte (nibble n & 7) of b:a, its sign replicated when the nibble's bit 3 is set."""
    source = [(a >> U32(8 * i)) & U32(0xFF) for i in range(4)] + [(b >> U32(8 * i)) & U32(0xFF) for i in range(4)]
    out = np.zeros_like(a)
    for n in range(4):
        nibble = (selector >> (4 * n)) & 0xF
        byte = source[nibble & 7]
        if nibble & 8:
            byte = np.where(byte & U32(0x80), U32(0xFF), U32(0))
        out |= byte << U32(8 * n)
    return out


def products(words: np.ndarray, factor: np.ndarray, nan_bits=CANONICAL_NAN) -> np.ndarray:
    """The eight fp32 products of words (..., 4) of bf16 pairs times factor, element 2i from the low half of word i."""
    lo, hi = (words << U32(16)).view(np.float32), (words & U32(0xFFFF0000)).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # random words times random factors overflow, inf * 0 is NaN
        f = np.stack([lo, hi], axis=-1).reshape(*words.shape[:-1], 8) * factor[..., None]
    bits = f.view(U32).copy()
    bits[np.isnan(f)] = nan_bits
    return bits.view(np.float32)


def e2m1x8(f: np.ndarray) -> np.ndarray:
    """tkaot_e2m1x8 from its eight products f (..., 8): one uint32 of codes."""
    r = [e2m1_step(f[..., n]) for n in range(8)]
    t = [r[2 * i] + (r[2 * i + 1] << U32(4)) for i in range(4)]
    mag = prmt(prmt(t[0], t[1], 0x0040), prmt(t[2], t[3], 0x4000), 0x7610)
    b = [f[..., n].view(U32) for n in range(8)]
    even = prmt(prmt(b[0], b[2], 0x00FB), prmt(b[4], b[6], 0xFB00), 0x7610)
    odd = prmt(prmt(b[1], b[3], 0x00FB), prmt(b[5], b[7], 0xFB00), 0x7610)
    return mag | (even & U32(0x08080808)) | (odd & U32(0x80808080))


def shipped_codes(f: np.ndarray) -> np.ndarray:
    """common.e2m1_code (the TIR path of the shipped tiling) on fp32 values: uint32 codes, sign from the value's bits."""
    m = np.fmin(np.abs(f), np.float32(6.0))
    exp_field = np.maximum(m.view(U32) & U32(0x7F800000), U32(0x3F800000))
    magic = exp_field + U32(0x4AC00000 - 0x3F800000)
    code = (m + magic.view(np.float32)).view(U32) - magic + ((exp_field >> U32(22)) - U32(0x3F800000 >> 22))
    return code | ((f.view(U32) >> U32(28)) & U32(8))


def test_magic_constants():
    # e = 127 + s gives 1.5 * 2**(22 + s) plus 2 * s units in the last place
    for s in range(3):
        magic = ((127 + s) * fp4_words.MAGIC_PER_EXP + fp4_words.MAGIC_BASE) % (1 << 32)
        assert magic == np.float32(1.5 * 2.0 ** (22 + s)).view(U32) + 2 * s


def test_step_rounds_every_fp32_magnitude_to_the_e2m1_code():
    # Every fp32 bit pattern from 0 to 6: the low byte is the code of the nearest grid value, ties to the even
    # code (a midpoint below an even code rounds down), with nothing above the code's three bits
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    chunk = 1 << 22
    for start in range(0, int(np.float32(6.0).view(U32)) + 1, chunk):
        v = np.arange(start, min(start + chunk, int(np.float32(6.0).view(U32)) + 1), dtype=U32).view(np.float32)
        want = (v > mids[0]).astype(U32) + (v >= mids[1]) + (v > mids[2]) + (v >= mids[3]) + (v > mids[4]) + (v >= mids[5])
        want += v > mids[6]
        got = e2m1_step(v) & U32(0xFF)
        assert np.array_equal(got, want), f"first mismatch at {v[np.argmax(got != want)]!r}"
    # beyond 6 (the products reach 6 * (1 + 2**-23)), infinities and NaN saturate to 6 = code 7, either sign
    big = np.array([6.0000005, 7.0, 1e30, np.inf, -np.inf, np.nan, -6.5], np.float32)
    assert np.all(e2m1_step(big) & U32(0xFF) == 7)


def edge_words(rng) -> np.ndarray:
    """bf16 pairs (as uint32 words) that probe zeros, subnormals, rounding ties, the largest values, inf and NaN."""
    specials = np.array(
        [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x3E80, 0x3F40, 0x3FA0, 0x3FE0, 0x4020, 0x4060, 0x40A0,
         0x40C0, 0x40E0, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0x3F80, 0xBF80],
        dtype=U32,
    )  # fmt: skip
    pairs = rng.choice(specials, size=(4096, 4, 2))
    return pairs[..., 0] | (pairs[..., 1] << U32(16))


@pytest.mark.parametrize("nan_bits", [CANONICAL_NAN, U32(0xFFFFFFFF)])
def test_word_equals_shipped_codes_and_reference(nan_bits):
    rng = np.random.default_rng(5)
    random_words = rng.integers(0, 1 << 32, size=(60000, 4), dtype=np.uint64).astype(U32)
    words = np.concatenate([random_words, edge_words(rng)])
    # factors as the kernel forms them: 6 / amax for random amax, and the exact and near values of the ties
    amax = np.abs(rng.standard_normal(words.shape[0]).astype(np.float32)) * np.exp2(rng.integers(-40, 40, words.shape[0])).astype(
        np.float32
    )
    factor = (np.float32(6.0) / np.maximum(amax, np.float32(6.0 * 2.0**-126))).astype(np.float32)
    factor[-4096:] = rng.choice(np.array([1.0, 2.0, 0.5, 4.0, 0.0, 6.0 / 7.0, 1.0000001, 0.99999994], np.float32), 4096)
    f = products(words, factor, nan_bits)
    got = e2m1x8(f)
    codes = shipped_codes(f)
    shipped = np.zeros_like(got)
    for n in range(8):
        shipped |= codes[..., n] << U32(4 * n)
    assert np.array_equal(got, shipped)
    # and the reference (tkaot.reference.quant) wherever a product is a number (the reference's NaN sign is the CPU's)
    finite = ~np.isnan(f).any(axis=-1)
    want = ref.encode(torch.from_numpy(f[finite]), "e2m1").view(torch.uint8).numpy().astype(U32)
    want_words = want[:, 0] | (want[:, 1] << 8) | (want[:, 2] << 16) | (want[:, 3] << 24)
    assert np.array_equal(got[finite], want_words)


def test_absmax_of_words_gives_the_shipped_scale():
    # NaN is ignored; the helper starts from the first pair instead of 0, so an all-NaN vector gives NaN, which
    # the scale's clamp to the amax floor turns into the floor, as the shipped path's 0 is
    rng = np.random.default_rng(6)
    words = np.concatenate([rng.integers(0, 1 << 32, size=(20000, 4), dtype=np.uint64).astype(U32), edge_words(rng)])
    words[:8] = 0x7FC0FFC0  # all NaN
    lo, hi = (words << U32(16)).view(np.float32), (words & U32(0xFFFF0000)).view(np.float32)
    values = np.abs(np.stack([lo, hi], axis=-1).reshape(-1, 8))
    helper = np.fmax(values[:, 0], values[:, 1])
    for n in range(2, 8):
        helper = np.fmax(helper, values[:, n])
    shipped = np.zeros(values.shape[0], np.float32)
    for n in range(8):
        shipped = np.fmax(shipped, values[:, n])
    floor = np.float32(ref.amax_floor("e2m1", "fp32"))
    assert np.array_equal(np.fmax(helper, floor), np.fmax(shipped, floor))


E2M1_KEY = dict(
    hidden=2048, in_dtype="bfloat16", in_block="none", in_sf="none", fmt="e2m1", group=32, sf="ue8m0", sf_layout="row",
    mode="cast", stochastic=False,
)  # fmt: skip


@pytest.mark.parametrize("tiling", ["t128r4c1sf", "t128r2c2sf"])
def test_helper_tilings_build(tiling, monkeypatch):
    monkeypatch.setattr(per_token_cast, "TILING_E2M1_BF16", RowTiling.parse(tiling))
    variant = Variant.make("per_token_cast", E2M1_KEY)
    _, _, source = lower(variant, "sm90")
    assert "tkaot_e2m1x8" in source and "tkaot_absmax_bf16x8" in source
    compiled = compile_variant(variant)
    assert compiled.spec.block == (128, 1, 1) and len(compiled.cubin) > 0


def test_fp4_tiling_text_round_trips():
    assert RowTiling.parse("t128r4c1hsf") == RowTiling(128, 4, 1, walk="hidden", one_scale=True, fp4=True)
    for text in ("t128r4c1sf", "t128r2c2f", "t128r8c1v8hs"):
        assert str(RowTiling.parse(text)) == text


def test_shipped_tilings_take_the_helpers_only_where_timed():
    """bf16 -> e2m1/32 casts with fp32 or UE8M0 sf take TILING_E2M1_BF16 (the helpers, unchecked full CTAs);
    other e2m1 variants (E4M3 sf, group 16, stochastic, fp32 input) keep the expression path."""
    _, _, source = lower(Variant.make("per_token_cast", E2M1_KEY), "sm90")
    assert "tkaot_e2m1x8" in source and "__launch_bounds__(128, 8)" in source
    for other in (dict(sf="e4m3"), dict(group=16), dict(stochastic=True), dict(in_dtype="float32")):
        _, _, source = lower(Variant.make("per_token_cast", {**E2M1_KEY, **other}), "sm90")
        # the PDL helpers (kernels_src/pdl.py) are in every kernel; none of fp4_words' helpers
        assert "tkaot_" not in source.replace("tkaot_pdl_", "") and "__launch_bounds__(128, 1)" in source, other


def test_full_tile_tilings_check_tokens_only_in_the_last_ctas(monkeypatch):
    sources = {}
    for tiling in ("t128r4c1s", "t128r4c1sf"):
        monkeypatch.setattr(per_token_cast, "TILING_E2M1_BF16", RowTiling.parse(tiling))
        sources[tiling] = lower(Variant.make("per_token_cast", E2M1_KEY), "sm90")[2]
    checked, full = sources["t128r4c1s"], sources["t128r4c1sf"]
    # one CTA-uniform test of its four tokens; the token checks all sit in the other branch, as many as the
    # expression path (every CTA checked) has
    assert full.count("if (((((int)blockIdx.x) * 4) + 4) <= num_tokens)") == 1
    assert full.count("< num_tokens)") == checked.count("< num_tokens)") > 0
    assert full.count("= tkaot_e2m1x8(") == 2 and "tkaot_e2m1x8" not in checked
    # 8 CTAs of 128 threads an SM: at most 64 registers a thread
    assert "__launch_bounds__(128, 8)" in full and "__launch_bounds__(128, 1)" in checked


@pytest.mark.parametrize(
    "key, tiling, match",
    [
        (dict(fmt="e4m3", group=128), "t128r4c1sf", "casts bf16 to e2m1"),
        (dict(in_dtype="float32"), "t128r4c1sf", "casts bf16 to e2m1"),
        (dict(stochastic=True), "t128r4c1sf", "casts bf16 to e2m1"),
    ],
)
def test_helper_tilings_refuse_what_they_do_not_cover(key, tiling, match):
    with pytest.raises(ValueError, match=match):
        per_token_cast.build(**dict(E2M1_KEY, **key), tiling=RowTiling.parse(tiling))
