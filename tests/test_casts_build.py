"""Quantization casts on CPU: real builds of a few variants, combination refusals, argument validation
(meta tensors stand in for CUDA ones), and the torch references against independent formulations."""

import inspect
import json
import math
from pathlib import Path

import pytest
import torch

import tkaot
from build_tools.artifacts import BuildCache
from build_tools.build import build_variants
from build_tools.compile import BuildError, compile_variant
from build_tools.ops import Variant
from build_tools.sweep import load_shapeset
from tests.helpers import F32, FP8, assert_each_reaches_the_registry, meta
from tkaot._quant import casts as _casts
from tkaot._spec import LaunchSpec
from tkaot.reference import quant as ref

PTC = dict(
    in_dtype="bfloat16", in_block="none", in_sf="none", fmt="e4m3", group=128, sf="fp32", sf_layout="row", mode="cast", stochastic=False
)
BUILT = [
    Variant.make("per_token_cast", dict(PTC, hidden=512, sf="ue8m0", sf_layout="col")),
    Variant.make("per_token_cast", dict(PTC, hidden=2048, fmt="e2m1", group=32)),
    Variant.make("cast_back", dict(hidden=768, in_dtype="e4m3", in_block="1x128", in_sf="fp32", out_dtype="bfloat16")),
]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, build_cache):
    out = tmp_path_factory.mktemp("casts")
    build_variants(BUILT, out, "sm90", jobs=1, cache=BuildCache(build_cache))
    data = json.loads((out / "manifest.json").read_text())
    return {(e["kernel"], e["key"]): LaunchSpec.from_json(e["launch"]) for e in data["variants"]}


def test_per_token_cast_launch_spec(manifest):
    spec = manifest[("per_token_cast", BUILT[0].key)]
    assert spec.block == (128, 1, 1) and spec.smem == 0
    # 512 bf16 channels = 64 vectors a row: two row slots of 64 threads, 4 tokens each, one segment a row
    assert spec.grid == ("((num_tokens + 7) // 8)", "1", "1")
    params = {p.name: p.type for p in spec.params}
    # one packed int32 of scale factors a token: the sf row stride folds away
    assert params == {"out": "ptr", "out_sf": "ptr", "x": "ptr", "num_tokens": "i32", "x_stride": "i32"}
    # every argument the runtime passes is one the manifest knows
    assert set(_casts._PER_TOKEN["tkaot.quant.per_token_cast"].args) == {a.name for a in spec.args}


def test_fp4_and_cast_back_launch_specs(manifest):
    fp4 = manifest[("per_token_cast", BUILT[1].key)]
    # 2048 channels = 256 vectors a row: 128 threads span half a row, 4 tokens each
    assert fp4.grid == ("((num_tokens + 3) // 4)", "2", "1")
    back = manifest[("cast_back", BUILT[2].key)]
    # 768 E4M3 channels = 48 vectors a row: segments of 16 threads (3 a row), 8 row slots of 4 tokens;
    # one flat grid, consecutive CTAs along the row
    assert back.grid == ("(((num_tokens + 15) // 16) * 3)", "1", "1")  # 8-byte loads: 16 tokens a CTA
    assert {p.name for p in back.params} == {"out", "x", "x_sf", "num_tokens", "sf_stride", "x_stride"}
    assert back.block == (128, 1, 1)


@pytest.mark.parametrize(
    "kernel, values, match",
    [
        ("per_token_cast", dict(PTC, hidden=2048, mode="precomputed_sf", sf="ue8m0"), "row-major, unpacked"),
        ("per_token_cast", dict(PTC, hidden=2048, mode="precomputed_sf", sf_layout="col"), "row-major, unpacked"),
        ("per_token_cast", dict(PTC, hidden=2048, in_block="1x128"), "e4m3/e2m1 inputs only"),
        ("per_token_cast", dict(PTC, hidden=2048, in_dtype="e4m3"), "e4m3/e2m1 inputs only"),
        ("per_token_cast", dict(PTC, hidden=2048, in_dtype="e4m3", in_block="1x128", in_sf="fp32", mode="sf_only"), "bf16/fp32 inputs"),
        ("per_token_cast", dict(PTC, hidden=2048, mode="sf_only", stochastic=True), "stochastic"),
        ("per_token_cast", dict(PTC, hidden=64 * 3), "not a multiple of group=128"),  # the generic kernel's alone
        ("cast_back", dict(hidden=256, in_dtype="e4m3", in_block="32x1", in_sf="fp32_col", out_dtype="bfloat16"), "row-major"),
        ("cast_back", dict(hidden=192, in_dtype="e4m3", in_block="1x128", in_sf="fp32", out_dtype="bfloat16"), "not a multiple"),
    ],
)
def test_unsupported_combinations_fail_at_build_time(kernel, values, match):
    with pytest.raises(BuildError, match=match):
        compile_variant(Variant.make(kernel, values))


def test_axis_validation_refuses_bad_values():
    with pytest.raises(ValueError, match="group=24 is not supported"):
        Variant.make("per_token_cast", dict(PTC, hidden=2048, group=24))
    with pytest.raises(ValueError, match="multiple of 64"):
        Variant.make("per_token_cast", dict(PTC, hidden=100))


def test_quant_shapeset_expands():
    variants = load_shapeset(str(Path(__file__).resolve().parent.parent / "build_tools/shapesets/quant.toml"))
    keys = {(v.kernel, v.key) for v in variants}
    assert ("per_token_cast", Variant.make("per_token_cast", dict(PTC, hidden=7168, sf="ue8m0", sf_layout="col")).key) in keys
    assert len(variants) == len(keys)


# ---- validation, before any launch ---------------------------------------------------------------------------


# fake_cuda (tests/conftest.py) lets meta tensors stand in for CUDA ones


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda q: q.per_token_cast(meta(4, 512, dtype=torch.float16), "e4m3", 128), "bfloat16 or float32"),
        (lambda q: q.per_token_cast(meta(4, 512), "e5m2", 128), "fmt must be 'e4m3' or 'e2m1'"),
        (lambda q: q.per_token_cast(meta(4, 512), "e4m3", 48), "num_per_channels must be one of"),
        (lambda q: q.per_token_cast(meta(4, 544), "e4m3", 128), "multiple of 64 channels wide"),
        (lambda q: q.per_token_cast_and_cast_back(meta(4, 576), "e4m3", 128), "multiple of 64 and of num_per_channels=128"),
        (lambda q: q.per_token_cast((meta(4, 512, dtype=torch.float8_e4m3fn), meta(1, 512, dtype=torch.float32)), "e4m3", 128,
                                    x_block_size=(32, 1)), "x_block_size must be one of"),
        (lambda q: q.cast_back((meta(40, 512, dtype=torch.float8_e4m3fn), meta(512, 2, dtype=torch.float32).t()), "bf16", (32, 1)),
         "row-major for per-channel blocks"),
        (lambda q: q.cast_back((meta(40, 512, dtype=torch.float8_e4m3fn), meta(2, 512, dtype=torch.int32)), "bf16", (32, 1)),
         r"x\[1\] must be of shape \(1, 512\)"),
        (lambda q: q.per_token_cast(meta(4, 516)[:, :512], "e4m3", 128), "strided in multiples of 8 elements"),
        (lambda q: q.per_token_cast(meta(512), "e4m3", 128), "2-D"),
        (lambda q: q.per_token_cast(meta(4, 512), "e4m3", 128, use_packed_ue8m0=True), "round_sf=True"),
        (lambda q: q.per_token_cast(meta(4, 512), "e4m3", 128, round_sf=True, use_e4m3_sf=True), "use_e4m3_sf must be False"),
        (lambda q: q.per_token_cast(meta(4, 512), "e4m3", 128, x_block_size=(1, 128)), "x_block_size must be None"),
        (lambda q: q.per_token_cast((meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 4, dtype=torch.float32)), "e4m3", 128),
         "x_block_size must be given"),
        (lambda q: q.per_token_cast((meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 3, dtype=torch.float32)), "e4m3", 128,
                                    x_block_size=(1, 128)), r"x\[1\] must be of shape \(4, 4\)"),
        (lambda q: q.per_token_cast((meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 4, dtype=torch.float16)), "e4m3", 128,
                                    x_block_size=(1, 128)), "float32, float8_e4m3fn or int32"),
        (lambda q: q.per_token_cast((meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 4, dtype=torch.float32)), "e4m3", 128,
                                    x_block_size=(1, 100)), "x_block_size must be one of"),
        (lambda q: q.per_token_cast(meta(4, 512), "e4m3", 128, out=(meta(4, 512, dtype=torch.float8_e4m3fn), F32(4, 3))),
         r"out\[1\] must be of shape \(4, 4\)"),
        (lambda q: q.per_token_cast(meta(4, 512), "e2m1", 32, out=(meta(4, 512, dtype=torch.int8), F32(4, 16))),
         r"out\[0\] must be of shape \(4, 256\)"),
        (lambda q: q.per_token_cast_with_precomputed_sf(meta(4, 512), "e4m3", 128, F32(4, 4).t().contiguous().t()),
         "row-major"),
        (lambda q: q.per_token_cast_with_precomputed_sf(meta(4, 512), "e4m3", 128, meta(4, 4, dtype=torch.int32), round_sf=True,
                                                        use_packed_ue8m0=True), "row-major and unpacked"),
        (lambda q: q.per_token_cast_with_sf_only(meta(4, 512), "e4m3", 128, out_sf=FP8(4, 4)), "out_sf must be torch.float32"),
        (lambda q: q.cast_back((FP8(4, 512), F32(4, 4)), "fp16", (1, 128)), "'bf16' or 'fp32'"),
        (lambda q: q.cast_back((meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 4, dtype=torch.float32)), "bf16", (1, 128), "x"),
         "x_special_fmt must be None"),
        (lambda q: q.per_token_cast_back((meta(4, 512, dtype=torch.bfloat16), meta(4, 4, dtype=torch.float32)), "bf16", 128),
         r"x\[0\] must be float8_e4m3fn or int8"),
        (lambda q: q.per_token_cast_back((meta(4, 256, dtype=torch.int8), F32(4, 4)), "bf16", 32), r"of shape \(4, 16\)"),
        (lambda q: q.per_block_cast(meta(4, 512), "e4m3", (64, 128)), "block_size must be one of"),
        (lambda q: q.per_block_cast(meta(4, 576), "e4m3", (128, 128)), "multiple of 128"),
        (lambda q: q.per_block_cast(meta(512, 4).t(), "e4m3", (128, 128)), "contiguous"),
        (lambda q: q.per_block_cast_with_precomputed_sf(meta(4, 512), "e4m3", (128, 128), F32(1, 3)), r"sf must be of shape \(1, 4\)"),
        (lambda q: q.per_block_cast_with_sf_only(meta(4, 512), "e4m3", (32, 32), round_sf=True, use_packed_ue8m0=True,
                                                 out_sf=meta(1, 16, dtype=torch.int32)), r"out_sf must be of shape \(1, 4\)"),
        (lambda q: q.per_channel_cast(meta(256, 512), "e2m1", 128), "fmt must be 'e4m3'"),
        (lambda q: q.per_channel_cast(meta(256, 512), "e4m3", 64), "num_per_tokens must be 32 or 128"),
        (lambda q: q.per_channel_cast((FP8(256, 512), F32(256, 4)), "e4m3", 128), "num_per_channels must be 32 or 128"),
        (lambda q: q.cast(meta(4, 512), torch.bfloat16), "other than x's dtype"),
        (lambda q: q.cast(meta(4, 512), torch.int8), "dtype must be"),
        (lambda q: q.cast(meta(4, 512), torch.float16, stochastic_rounding=True), "stochastic_rounding must be False"),
        (lambda q: q.cast(meta(512, 4).t(), torch.float32), "contiguous"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_before_launch(fake_cuda, call, match):
    with pytest.raises(ValueError, match=match):
        call(tkaot.quant)


def test_valid_calls_reach_the_registry(fake_cuda):
    q = tkaot.quant
    assert_each_reaches_the_registry(
        lambda: q.per_token_cast(meta(4, 512), "e4m3", 128, round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True),
        lambda: q.per_token_cast(meta(3, 2048, dtype=torch.float32), "e2m1", 16, use_e4m3_sf=True, stochastic_cast=True),
        lambda: q.per_token_cast((meta(4, 1024, dtype=torch.int8), meta(4, 16, dtype=torch.int32)), "e4m3", 128, x_block_size=(1, 32)),
        lambda: q.per_token_cast_with_precomputed_sf(meta(4, 512), "e4m3", 128, meta(4, 4, dtype=torch.float32)),
        lambda: q.cast_back((meta(4, 512, dtype=torch.float8_e4m3fn), meta(1, 4, dtype=torch.float32)), "bf16", (128, 128)),
        lambda: q.cast_back((meta(300, 512, dtype=torch.float8_e4m3fn), meta(1, 512, dtype=torch.int32)), "fp32", (128, 1)),
        lambda: q.cast_back((meta(300, 512, dtype=torch.float8_e4m3fn), meta(3, 512, dtype=torch.float32)), "fp32", (128, 1)),
        lambda: q.cast_back((meta(40, 256, dtype=torch.int8), meta(2, 4, dtype=torch.float32)), "bf16", (32, 128)),
        lambda: q.per_token_cast(meta(4, 576), "e2m1", 128, round_sf=True, use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True),
        lambda: q.per_token_cast(
            (meta(200, 512, dtype=torch.float8_e4m3fn), meta(2, 16, dtype=torch.float32)), "e4m3", 64, x_block_size=(128, 32)
        ),
        lambda: q.per_block_cast(meta(300, 512), "e2m1", (32, 128), use_tma_aligned_col_major_sf=True),
        lambda: q.per_block_cast_with_precomputed_sf(meta(300, 512), "e4m3", (128, 128), F32(3, 4)),
        lambda: q.per_channel_cast(meta(300, 512), "e4m3", 128, round_sf=True, use_packed_ue8m0=True),
        lambda: q.cast(F32(3, 5), torch.bfloat16, stochastic_rounding=True),
    )


def test_cpu_tensor_is_refused():
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        tkaot.quant.per_token_cast(torch.randn(4, 512), "e4m3", 128)


def test_signatures_match_tile_kernels():
    path = Path(__file__).resolve().parent / "data" / "tile_kernels_2.1.0_api.json"
    if not path.exists():
        pytest.skip("no TileKernels API listing beside the checkout")
    api = json.loads(path.read_text())
    for name in _casts.__all__:
        params = list(inspect.signature(getattr(tkaot.quant, name)).parameters)
        assert api[f"quant.{name}"]["params"] == params, name


# ---- references against independent formulations -------------------------------------------------------------


def test_pow2_scale_matches_division_and_frexp():
    amax = torch.cat([torch.rand(20000) * 2.0 ** torch.randint(-30, 30, (20000,)).float(), 448.0 * 2.0 ** torch.arange(-20, 20.0)])
    for fmt in ("e4m3", "e2m1"):
        sf, inv = ref.scale_factors(amax, fmt, "pow2")
        clamped = amax.clamp(min=ref.amax_floor(fmt, "pow2"))
        exact = clamped.double() / ref.FORMAT_MAX[fmt]  # the quotient before any fp32 rounding
        mant, exp = torch.frexp(exact)
        expected = torch.ldexp(torch.ones_like(exact), exp - (mant == 0.5).long())  # smallest power of two >= quotient
        # fp32 rounding of the quotient may only move it onto a power of two, never past one
        assert torch.all((sf.double() == expected) | ((sf.double() * 2 == expected) & ((exact - sf.double()) / sf.double() < 2.0**-22)))
        assert torch.equal(sf * inv, torch.ones_like(sf))


def test_e2m1_rounding_matches_kernel_formula_and_grid_search():
    grid = torch.tensor(ref.E2M1_GRID)
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([mids, grid, torch.tensor([7.0, 100.0, float("inf"), 1e-30])])
    ulps = torch.stack([torch.nextafter(near, torch.tensor(-1.0)), near, torch.nextafter(near, torch.tensor(100.0))]).flatten()
    v = torch.cat([ulps, -ulps, torch.randn(50000) * 3, torch.tensor([0.0, -0.0, float("nan")])])
    codes = ref.e2m1_codes(v)
    # brute force: nearest grid value, ties to the even code
    mag = torch.nan_to_num(v.abs(), nan=6.0).clamp(max=6.0).double()
    dist = (mag[:, None] - grid.double()[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    candidates = (dist == best).long() * (torch.arange(8) + 1)
    even = torch.where((candidates > 0) & (torch.arange(8) % 2 == 0), candidates, 0).amax(dim=1)
    brute = torch.where(even > 0, even, candidates.amax(dim=1)) - 1
    assert torch.equal(codes & 7, brute.to(torch.uint8))
    assert torch.equal((codes >> 3).bool(), torch.signbit(v))
    # the kernel's formula (common.e2m1_code): one fp32 add of 1.5 * 2**(22 + s), s the exponent clamped at 0,
    # rounds m to a multiple of the step 0.5 * 2**s; the code is the step count plus 2 * s
    m = torch.nan_to_num(v.abs(), nan=6.0).clamp(max=6.0)
    exp_field = (m.view(torch.int32) & 0x7F800000).clamp(min=0x3F800000)
    magic = exp_field + (0x4AC00000 - 0x3F800000)
    kernel = (m + magic.view(torch.float32)).view(torch.int32) - magic + (exp_field >> 22) - (0x3F800000 >> 22)
    assert torch.equal(kernel.to(torch.uint8), codes & 7)


def test_row_tiling_text_round_trips():
    from kernels_src.quant.tiling import RowTiling

    for text in ("t128r4c1", "t128r4c1h", "t128r4c1s", "t128r8c1v8h", "t256r2c1hs"):
        assert str(RowTiling.parse(text)) == text
    assert RowTiling.parse("t128r8c1v8hs") == RowTiling(128, 8, 1, vec_bytes=8, walk="hidden", one_scale=True)
    with pytest.raises(ValueError, match="not a row tiling"):
        RowTiling.parse("t128r4")


def test_unpack_from_e2m1fn_x2_decodes_every_byte():
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8).view(16, 16)
    values = tkaot.quant.unpack_from_e2m1fn_x2(packed)
    assert values.shape == (16, 32) and values.dtype == torch.float32
    for byte in range(256):
        for nibble, code in enumerate((byte & 15, byte >> 4)):
            sign = -1.0 if code & 8 else 1.0
            exp, man = (code >> 1) & 3, code & 1
            expected = sign * (man * 0.5 if exp == 0 else 2.0 ** (exp - 1) * (1 + man / 2))
            got = values.flatten()[2 * byte + nibble].item()
            assert got == expected and math.copysign(1, got) == sign
    assert torch.equal(ref.unpack_e2m1(packed), values)
    assert tkaot.quant.unpack_from_e2m1fn_x2(packed, torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("fmt, group", [("e4m3", 128), ("e2m1", 32), ("e2m1", 16), ("e4m3", 64)])
@pytest.mark.parametrize("kind", ["fp32", "pow2", "ue8m0", "e4m3"])
@pytest.mark.parametrize("col", [False, True])
def test_reference_round_trip_is_within_format_error(seed, fmt, group, kind, col):
    x = (torch.randn(37, 512) * 2.0 ** torch.randint(-8, 8, (37, 1)).float()).bfloat16()
    x[3] = 0
    data, sf = ref.per_token_cast(x, fmt, group, None, col, kind in ("pow2", "ue8m0"), kind == "ue8m0", kind == "e4m3")
    assert data.shape == (37, 512 if fmt == "e4m3" else 256)
    if col:
        pitch = -(-37 // (16 // sf.element_size())) * (16 // sf.element_size())
        assert sf.stride() == (1, pitch)
    back = ref.cast_back((data, sf), "fp32", (1, group))
    scale = ref.expand_blocks(ref.sf_to_float(sf)[:, : 512 // group], (1, group), x.shape)
    # half a step of the format at its largest binade, in units of the group's scale
    half_step = 2.0**-4 * 448 if fmt == "e4m3" else 1.0
    err = (back - x.float()).abs()
    # an E4M3 sf rounded below amax / max makes the group's largest values saturate
    amax = ref.expand_blocks(x.float().abs().view(37, -1, group).amax(dim=2), (1, group), x.shape)
    saturation = (amax - ref.FORMAT_MAX[fmt] * scale).clamp(min=0)
    assert torch.all(err <= scale * half_step * (1 + 2**-20) + saturation)
    if kind != "e4m3":
        assert torch.all(saturation <= amax * 2.0**-22)  # fp32 rounding of amax / max only
    assert torch.all(back[3] == 0)
    # and never worse than the relative precision of the format where values are normal
    if fmt == "e4m3" and kind != "e4m3":
        normal = x.float().abs() >= scale * 2.0**-6
        assert torch.all(err[normal] <= x.float().abs()[normal] * 2.0**-4)


def test_reference_packed_sf_round_trips_and_pads_with_zero():
    sf = 2.0 ** torch.randint(-20, 20, (9, 6)).float()
    for col in (False, True):
        stored = ref.store_sf(sf, "ue8m0", col)
        assert stored.dtype == torch.int32 and stored.shape == (9, 2)
        raw = stored.contiguous().view(torch.uint8).view(9, 8)
        assert torch.all(raw[:, 6:] == 0)
        assert torch.equal(ref.sf_to_float(stored)[:, :6], sf)
    along_m = ref.store_sf(sf, "ue8m0", False, pack_along_m=True)
    assert along_m.shape == (3, 6) and torch.equal(ref.sf_to_float(along_m, pack_along_m=True)[:9], sf)


def test_reference_requantizes_prequantized_input_like_its_decoded_value(seed):
    x = torch.randn(256, 512).bfloat16()
    for block in ((1, 128), (128, 128)):
        q = ref.block_cast(x, "e4m3", block)
        decoded = ref.cast_back(q, "fp32", block)
        direct = ref.per_token_cast(decoded, "e2m1", 32, round_sf=True)
        via_pair = ref.per_token_cast(q, "e2m1", 32, block, round_sf=True)
        assert torch.equal(direct[1], via_pair[1])  # same scale factors: amax of the decoded values
        assert (direct[0] != via_pair[0]).float().mean() < 0.01  # values differ only where fp32 products round apart


def test_reference_stochastic_rounding_is_unbiased(seed):
    grid_point = torch.tensor(1.25)  # an E4M3 value; its step is 0.125
    x = torch.full((1_000_000,), 1.25 + 0.3 * 0.125)
    q = ref.stochastic_round(x, "e4m3")
    assert set(q.unique().tolist()) == {1.25, 1.375}
    assert abs((q - x).mean().item()) / 0.125 < 5e-3
    assert grid_point.item() == 1.25


def test_reference_per_channel_is_per_token_of_the_transpose(seed):
    x = torch.randn(256, 384).bfloat16() * 3
    for round_sf in (False, True):
        data, sf = ref.per_channel_cast(x, "e4m3", 128, round_sf=round_sf)
        t_data, t_sf = ref.per_token_cast(x.T.contiguous(), "e4m3", 128, round_sf=round_sf)
        assert torch.equal(data.view(torch.uint8), t_data.T.view(torch.uint8)) and torch.equal(sf, t_sf.T)
    packed = ref.per_channel_cast(x[:255], "e4m3", 32, round_sf=True, use_packed_ue8m0=True)[1]
    assert packed.shape == (2, 384) and packed.dtype == torch.int32
    assert torch.equal(ref.sf_to_float(packed, pack_along_m=True)[:8], ref.per_channel_cast(x[:255], "e4m3", 32, round_sf=True)[1])


def test_reference_per_block_matches_per_token_when_blocks_are_one_row_high(seed):
    x = torch.randn(7, 256)
    a = ref.block_cast(x, "e4m3", (1, 128), sf_kind="pow2")
    b = ref.per_token_cast(x, "e4m3", 128, round_sf=True)
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
    blocks = ref.per_block_cast(torch.randn(130, 256), "e4m3", (128, 128), use_tma_aligned_col_major_sf=True)[1]
    assert blocks.shape == (2, 2) and blocks.stride() == (1, 4)


def test_reference_stochastic_bf16_cast_is_unbiased(seed):
    x = torch.full((1_000_000,), 1.5 + 0.25 * 2.0**-7)
    q = ref.cast(x, torch.bfloat16, stochastic_rounding=True).float()
    assert set(q.unique().tolist()) == {1.5, 1.5 + 2.0**-7}
    assert abs(((q - x) / 2.0**-7).mean().item()) < 5e-3
    assert torch.equal(ref.cast(torch.tensor([1000.0, -1e9]), torch.float8_e4m3fn).float(), torch.tensor([448.0, -448.0]))


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("kind", ["fp32", "pow2", "ue8m0", "e4m3"])
@pytest.mark.parametrize("col", [False, True])
def test_reference_partial_last_group_is_a_group_of_its_own_channels(seed, fmt, kind, col):
    """A row of 64 * odd channels in groups of 128 (TileKernels takes it): the whole groups are cast as a row of whole
    groups would be, and the last 64 channels as a row cast in groups of 64."""
    x = (torch.randn(5, 320) * 2.0 ** torch.randint(-8, 8, (5, 1)).float()).bfloat16()
    x[1, 256:] = 0  # the partial group alone all zeros: its sf from the floor, as a whole group's
    flags = (None, col, kind in ("pow2", "ue8m0"), kind == "ue8m0", kind == "e4m3")
    data, sf = ref.per_token_cast(x, fmt, 128, *flags)
    head, head_sf = ref.per_token_cast(x[:, :256].contiguous(), fmt, 128, *flags)
    tail, tail_sf = ref.per_token_cast(x[:, 256:].contiguous(), fmt, 64, *flags)
    split = 256 if fmt == "e4m3" else 128
    assert data.shape == (5, 2 * split + (64 if fmt == "e4m3" else 32) - split)
    assert torch.equal(data[:, :split].view(torch.uint8), head.view(torch.uint8))
    assert torch.equal(data[:, split:].view(torch.uint8), tail.view(torch.uint8))
    grid = ref.sf_to_float(sf)[:, :3]
    assert sf.shape == (5, 1 if kind == "ue8m0" else 3)
    assert torch.equal(grid, torch.cat([ref.sf_to_float(head_sf)[:, :2], ref.sf_to_float(tail_sf)[:, :1]], dim=1))
    if col:
        assert sf.stride()[0] == 1


def test_reference_cast_back_of_per_channel_blocks_reads_tokens_packed_sf(seed):
    """per_channel_cast's output, (m, 1) blocks with UE8M0 packed four token blocks a word, cast back element by
    element: data[t, c] * 2 ** (exponent of block (t // m, c)), the exponent read from its byte."""
    x = torch.randn(300, 256).bfloat16()
    for m in (32, 128):
        data, sf = ref.per_channel_cast(x, "e4m3", m, round_sf=True, use_packed_ue8m0=True)
        m_blocks = -(-300 // m)
        assert sf.shape == (-(-m_blocks // 4), 256) and sf.dtype == torch.int32
        got = ref.cast_back((data, sf), "fp32", (m, 1))
        exps = sf.view(torch.uint8).view(sf.shape[0], 256, 4)  # word (r, c), byte b: token block 4 r + b
        block = torch.arange(300) // m
        exp_of = exps[(block // 4)[:, None], torch.arange(256)[None, :], (block % 4)[:, None]]
        want = data.float() * torch.exp2(exp_of.float() - 127)
        assert torch.equal(got, want)
        assert torch.equal(ref.cast_back((data, ref.per_channel_cast(x, "e4m3", m, round_sf=True)[1]), "fp32", (m, 1)), want)
