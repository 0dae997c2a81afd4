"""Lossless FP4 -> FP8, weight scale-factor transposes and per-channel casts of FP8 inputs, on CPU: real builds,
combination refusals, argument validation (meta tensors stand in for CUDA ones), the static key and launch
arguments each call picks (a recorded launch against a real manifest), and the torch references against
independent formulations."""

import inspect
import json
from pathlib import Path

import pytest
import torch

import tkaot
from build_tools.artifacts import BuildCache
from build_tools.build import build_variants
from build_tools.compile import BuildError, compile_variant
from build_tools.ops import Variant
from tests.helpers import F32, FP8, I8, I32, assert_each_reaches_the_registry, meta, refusals
from tkaot._kernel import Kernel
from tkaot._quant import casts as _casts
from tkaot._quant import weight_casts as _weight_casts
from tkaot._spec import compile_grid
from tkaot.errors import VariantNotBuilt
from tkaot.reference import quant as ref

LOSSLESS = dict(hidden=512, in_block="1x32", in_sf="ue8m0", out_block="128x128", sf="pow2", sf_layout="row")
CHANNEL = dict(hidden=512, in_dtype="e4m3", in_block="1x128", in_sf="fp32_col", block_m=128, sf="fp32")
BUILT = [
    Variant.make("per_block_cast_lossless", LOSSLESS),
    Variant.make("per_block_cast_lossless", dict(LOSSLESS, in_sf="fp32_col", out_block="1x128", sf="ue8m0", sf_layout="col")),
    Variant.make("batched_transpose_weight_sf", dict(block_size=128)),
    Variant.make("per_channel_cast", CHANNEL),
]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, build_cache):
    out = tmp_path_factory.mktemp("weight-casts")
    build_variants(BUILT, out, "sm90", jobs=1, cache=BuildCache(build_cache))
    return out


def col_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def strided(shape, strides, dtype=torch.int32, device="meta"):
    return torch.empty_strided(shape, strides, dtype=dtype, device=device)


# ---- builds ----------------------------------------------------------------------------------------------------


def test_launch_specs_match_what_the_ops_pass(artifacts):
    data = json.loads((artifacts / "manifest.json").read_text())
    specs = {e["kernel"]: e["launch"] for e in data["variants"]}
    assert {a[0] for a in specs["per_block_cast_lossless"]["args"]} == set(_weight_casts._LOSSLESS.args)
    assert {a[0] for a in specs["batched_transpose_weight_sf"]["args"]} == set(_weight_casts._TRANSPOSE_SF.args)
    assert {a[0] for a in specs["per_channel_cast"]["args"]} == set(_casts._PER_CHANNEL.args)
    # a 128 x 128 tile a CTA: 4 tiles across 512 channels
    lossless = [e["launch"] for e in data["variants"] if e["key"] == Variant.make("per_block_cast_lossless", LOSSLESS).key][0]
    assert lossless["grid"] == ["4", "((num_tokens + 127) // 128)", "1"] and lossless["block"] == [256, 1, 1]
    # one CTA a chunk of an output row of one group: sf0's rows (packed k blocks), then sf1's
    assert specs["batched_transpose_weight_sf"]["grid"] == [
        "(((num_sf_k + 3) // 4) + ((num_sf_n + 3) // 4))",
        "((max(num_sf_n, num_sf_k) + 3) // 4)",
        "num_groups",
    ]


@pytest.mark.parametrize(
    "kernel, values, match",
    [
        ("per_block_cast_lossless", dict(LOSSLESS, in_block="32x32", out_block="1x128"), "not a multiple of in_block"),
        ("per_block_cast_lossless", dict(LOSSLESS, in_block="1x128", out_block="128x32"), "not a multiple of in_block"),
        ("per_block_cast_lossless", dict(LOSSLESS, in_block="128x128", out_block="32x128"), "not a multiple of in_block"),
        ("per_channel_cast", dict(CHANNEL, in_dtype="bfloat16"), "e4m3 inputs only"),
        ("per_channel_cast", dict(CHANNEL, in_block="none"), "e4m3 inputs need both"),
        ("per_channel_cast", dict(CHANNEL, in_sf="none"), "e4m3 inputs need both"),
    ],
)
def test_unsupported_combinations_fail_at_build_time(kernel, values, match):
    with pytest.raises(BuildError, match=match):
        compile_variant(Variant.make(kernel, values))


def test_axes_refuse_bad_values():
    with pytest.raises(ValueError, match="in_sf='e4m3' is not supported"):
        Variant.make("per_block_cast_lossless", dict(LOSSLESS, in_sf="e4m3"))
    with pytest.raises(ValueError, match="multiple of 128"):
        Variant.make("per_block_cast_lossless", dict(LOSSLESS, hidden=576))
    with pytest.raises(ValueError, match="block_size=64 is not supported"):
        Variant.make("batched_transpose_weight_sf", dict(block_size=64))
    with pytest.raises(ValueError, match="in_block='1x64' is not supported"):
        Variant.make("per_channel_cast", dict(CHANNEL, in_block="1x64"))


# ---- validation, before any launch -----------------------------------------------------------------------------

FP4 = (I8(256, 256), I32(256, 4))  # 256 x 512 E2M1, 1x32 UE8M0 scale factors packed four a word
SF0 = strided((512, 1), (1, 512))  # sf0 of a 512 x 512 weight in 128x128 blocks: (n, 1 word), unit row stride
CPU_SF0 = strided((512, 1), (1, 512), device="cpu")


test_bad_arguments_raise_before_launch = refusals(
    [
        (lambda q: q.per_block_cast_lossless(FP4, "e2m1", (1, 32), (128, 128)), ValueError, "fmt must be 'e4m3'"),
        (lambda q: q.per_block_cast_lossless(I8(256, 256), "e4m3", (1, 32), (128, 128)), TypeError, r"x must be a \(x_data, x_sf\) pair"),
        (lambda q: q.per_block_cast_lossless((FP8(256, 512), F32(256, 4)), "e4m3", (1, 128), (128, 128)), ValueError,
         r"x\[0\] must be torch.int8"),
        (lambda q: q.per_block_cast_lossless((I8(256, 256), FP8(256, 16)), "e4m3", (1, 32), (128, 128)), ValueError,
         r"x\[1\] must be float32 or int32"),
        (lambda q: q.per_block_cast_lossless(FP4, "e4m3", (1, 32), (64, 128)), ValueError, "out_block_size must be one of"),
        (lambda q: q.per_block_cast_lossless(FP4, "e4m3", (1, 32), (1, 16)), ValueError, "multiple of x_block_size"),
        (lambda q: q.per_block_cast_lossless((I8(256, 256), F32(8, 16)), "e4m3", (32, 32), (1, 128)), ValueError,
         "multiple of x_block_size"),
        (lambda q: q.per_block_cast_lossless(FP4, "e4m3", (1, 24), (128, 128)), ValueError, "x_block_size must be one of"),
        (lambda q: q.per_block_cast_lossless(FP4, "e4m3", (1, 32), (128, 128), use_packed_ue8m0=True), ValueError,
         "round_sf=True"),
        (lambda q: q.per_block_cast_lossless((I8(256, 256), I32(256, 3)), "e4m3", (1, 32), (128, 128)), ValueError,
         r"x\[1\] must be of shape \(256, 4\)"),
        (lambda q: q.per_block_cast_lossless((I8(256, 96), I32(256, 2)), "e4m3", (1, 32), (1, 32)), ValueError,
         "multiple of 128 channels"),
        (lambda q: q.per_block_cast_lossless((I8(256, 264)[:, :256], I32(256, 4)), "e4m3", (1, 32), (128, 128)), ValueError,
         "strided in multiples of 16 elements"),
        (lambda q: q.per_channel_cast((FP8(256, 512), F32(256, 4)), "e4m3", 128), ValueError,
         "num_per_channels must be 32 or 128 for a pre-quantized"),
        (lambda q: q.per_channel_cast((FP8(256, 512), F32(256, 8)), "e4m3", 128, num_per_channels=64), ValueError,
         "num_per_channels must be 32 or 128"),
        (lambda q: q.per_channel_cast(meta(256, 512), "e4m3", 128, num_per_channels=128), ValueError,
         "num_per_channels must be None for a bf16/fp32 input"),
        (lambda q: q.per_channel_cast((I8(256, 256), F32(256, 4)), "e4m3", 128, num_per_channels=128), ValueError,
         r"x\[0\] must be torch.float8_e4m3fn"),
        (lambda q: q.per_channel_cast((FP8(256, 512), F32(256, 3)), "e4m3", 128, num_per_channels=128), ValueError,
         r"x\[1\] must be of shape \(256, 4\)"),
        (lambda q: q.per_channel_cast((FP8(256, 1024)[:, :512], F32(256, 4)), "e4m3", 128, num_per_channels=128), ValueError,
         r"x\[0\] must be contiguous"),
        (lambda q: q.per_channel_cast((FP8(256, 512), meta(256, 4)), "e4m3", 128, num_per_channels=128), ValueError,
         "float32, float8_e4m3fn or int32"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4)], 64, [False], [None]), ValueError, "block_size must be 32 or 128"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4)], 128, [False, True], [None]), ValueError, "one entry per weight"),
        (lambda q: q.batched_transpose_weight_sf([meta(4, 4)], 128, [False], [None]), ValueError, r"sf\[0\] must be torch.float32"),
        (lambda q: q.batched_transpose_weight_sf([F32(4)], 128, [False], [None]), ValueError, r"sf\[0\] must be 2-D"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 8)[:, :4]], 128, [False], [None]), ValueError, "contiguous"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4), F32(3, 4)], 32, [False, False], [None, None]), ValueError,
         r"sf\[1\] must be 1 to 65535 groups"),
        (lambda q: q.batched_transpose_weight_sf([F32(0, 4, 4)], 128, [False], [None]), ValueError, "1 to 65535 groups"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4)], 128, [False], [(I32(512, 1),)]), TypeError, r"\(sf0, sf1\) pair"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4), F32(4, 4)], 128, [False, False], [None, [I32(512, 1)]]), TypeError,
         r"outs\[1\] must be None or a \(sf0, sf1\) pair"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4), F32(4, 8)[:, :4]], 128, [False, False], [None, None]), ValueError,
         r"sf\[1\] must be contiguous"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4)], 128, [False], [(I32(512, 2)[:, :1], I32(512, 1))]), ValueError,
         r"outs\[0\]\[0\] must be of shape \(512, 1\) with strides \(1, 512\)"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4)], 128, [True], [(SF0, SF0)]),
         ValueError, r"outs\[0\]\[1\] must be of shape \(1, 512\) with strides \(512, 1\)"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4)], 128, [False], [(SF0.float(), SF0)]),
         ValueError, r"outs\[0\]\[0\] must be torch.int32"),
        (lambda q: q.batched_transpose_weight_sf([F32(4, 4)], 128, [False], [(SF0, CPU_SF0)]),
         ValueError, r"outs\[0\]\[1\] must be on the device of sf\[0\]"),
    ],
    "Each weight cast's bad arguments raise before any launch.",
)  # fmt: skip


def test_valid_calls_reach_the_registry(fake_cuda):
    q = tkaot.quant
    assert_each_reaches_the_registry(
        lambda: q.per_block_cast_lossless(FP4, "e4m3", (1, 32), (128, 128)),
        lambda: q.per_block_cast_lossless((I8(300, 256), col_major(F32(300, 16))), "e4m3", (1, 32), (1, 128), True, True, True),
        lambda: q.per_block_cast_lossless((I8(300, 1024), I32(10, 16)), "e4m3", (32, 32), (128, 128), round_sf=True),
        lambda: q.per_channel_cast((FP8(300, 512), col_major(I32(300, 1))), "e4m3", 32, True, 128, True),
        lambda: q.per_channel_cast((FP8(300, 512), FP8(300, 16)), "e4m3", 128, num_per_channels=32),
        lambda: q.batched_transpose_weight_sf([F32(56, 16), F32(8, 56, 16)], 128, [False, True], [None, None]),
    )


def test_an_empty_batch_of_weights_returns_nothing(fake_cuda):
    assert tkaot.quant.batched_transpose_weight_sf([], 128, [], []) == []


def test_signatures_and_defaults_match_tile_kernels():
    path = Path(__file__).resolve().parent / "data" / "tile_kernels_2.1.0_api.json"
    if not path.exists():
        pytest.skip("no TileKernels API listing beside the checkout")
    api = json.loads(path.read_text())
    for name in (*_weight_casts.__all__, "per_channel_cast"):
        signature = inspect.signature(getattr(tkaot.quant, name))
        assert api[f"quant.{name}"]["params"] == list(signature.parameters), name
        listed = api[f"quant.{name}"]["signature"]
        for param in signature.parameters.values():
            if param.default is not inspect.Parameter.empty:
                assert f"{param.name}: " in listed and f"= {param.default}" in listed.split(f"{param.name}: ")[1].split(",")[0]


# ---- the key each call selects, and what it launches with ------------------------------------------------------


@pytest.fixture
def launches(fake_cuda, registry, artifacts, monkeypatch):
    """Ops run against the built set through a fresh registry; each launch is recorded instead of made.

    The recording launcher checks the op's argument names against the manifest's launch spec the way
    the real ones do, and evaluates the grid from the manifest's expressions.
    """
    monkeypatch.setenv("TKAOT_PATH", str(artifacts))
    monkeypatch.setattr("tkaot._op.REGISTRY", registry)
    for op in (_weight_casts._LOSSLESS, _weight_casts._TRANSPOSE_SF, _casts._PER_CHANNEL):
        monkeypatch.setattr(op, "cache", {})
    monkeypatch.setattr(_weight_casts, "current_stream", lambda device: 7)
    monkeypatch.setattr(_casts, "current_stream", lambda device: 7)
    monkeypatch.setattr(_weight_casts, "_values_unchecked", lambda: True)  # meta tensors hold no values
    recorded = []

    def bind(kernel, arg_names, *_, **__):
        spec = kernel.spec
        assert set(arg_names) <= {a.name for a in spec.args} and {p.name for p in spec.params} <= set(arg_names)
        grid = compile_grid(spec.grid, arg_names, {a.name for a in spec.args if a.role == "dim"} & set(arg_names))

        def launch(device, stream, *values):
            if min(grid(values)) > 0:  # as the real launchers: an empty grid launches nothing
                recorded.append((kernel.key, dict(zip(arg_names, values)), grid(values), stream))

        return launch

    monkeypatch.setattr(Kernel, "bind", bind)
    return recorded


def test_lossless_selects_its_variant_and_launch_arguments(launches):
    data, sf = I8(300, 256), I32(300, 4)
    out, out_sf = tkaot.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (128, 128), round_sf=True)
    assert out.shape == (300, 512) and out.dtype == torch.float8_e4m3fn
    assert out_sf.shape == (3, 4) and out_sf.dtype == torch.float32 and out_sf.stride() == (4, 1)
    key, args, grid, stream = launches[-1]
    assert key == Variant.make("per_block_cast_lossless", LOSSLESS).key and stream == 7
    # the kernel reads codes as 4-byte words: a 256-byte row stride is 64 words
    assert (args["num_tokens"], args["x_stride"], args["in_sf_stride"], args["sf_stride"]) == (300, 64, 16, 4)
    assert grid == (4, 3, 1)
    # round_sf without packing asks for the same variant: the scale factors are powers of two either way
    tkaot.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (128, 128))
    assert launches[-1][0] == key

    # column-major fp32 input sf, packed column-major UE8M0 output
    in_sf = col_major(F32(300, 16))
    out, out_sf = tkaot.quant.per_block_cast_lossless((data, in_sf), "e4m3", (1, 32), (1, 128), True, True, True)
    assert out_sf.shape == (300, 1) and out_sf.dtype == torch.int32 and out_sf.stride() == (1, 300)
    key, args, _, _ = launches[-1]
    assert key == BUILT[1].key
    assert (args["in_sf_stride"], args["sf_stride"]) == (300, 1200)  # elements of fp32 in; bytes of packed UE8M0 out


def test_lossless_without_a_built_variant_names_the_missing_key(launches):
    with pytest.raises(VariantNotBuilt, match="out_block=32x32"):
        tkaot.quant.per_block_cast_lossless(FP4, "e4m3", (1, 32), (32, 32))


def test_lossless_of_no_tokens_launches_nothing(launches):
    out, out_sf = tkaot.quant.per_block_cast_lossless((I8(0, 256), I32(0, 4)), "e4m3", (1, 32), (128, 128))
    assert out.shape == (0, 512) and out_sf.shape == (0, 4) and launches == []


def test_transpose_weight_sf_allocates_tile_kernels_layouts(launches):
    dense, grouped = F32(56, 14), F32(3, 16, 14)
    given = (torch.empty(3, 2048, 4, dtype=torch.int32, device="meta").transpose(1, 2).contiguous().transpose(1, 2),
             torch.empty(3, 4, 1792, dtype=torch.int32, device="meta"))  # fmt: skip
    (a0, a1), (b0, b1), (c0, c1) = tkaot.quant.batched_transpose_weight_sf(
        [dense, grouped, grouped], 128, [False, True, True], [None, None, given]
    )
    # n = 56 * 128 = 7168 rows, k = 14 * 128 = 1792 columns: sf0 (n, ceil(14 / 4)) MN-major, sf1 (k, ceil(56 / 4))
    assert a0.shape == (7168, 4) and a0.stride() == (1, 7168) and a1.shape == (1792, 14) and a1.stride() == (1, 1792)
    assert b0.shape == (3, 2048, 4) and b0.stride() == (8192, 1, 2048)
    assert b1.shape == (3, 4, 1792) and b1.stride() == (7168, 1792, 1)
    assert (c0, c1) == given
    assert a0.dtype == b1.dtype == torch.int32
    assert [(key, args["num_groups"], args["num_sf_n"], args["num_sf_k"], grid) for key, args, grid, _ in launches] == [
        ("block_size=128", 1, 56, 14, (4 + 14, 14, 1)),
        ("block_size=128", 3, 16, 14, (4 + 4, 4, 3)),
        ("block_size=128", 3, 16, 14, (4 + 4, 4, 3)),
    ]
    assert launches[2][1]["sf0"] == given[0].data_ptr()
    # a weight without rows (n = 0 passes TileKernels' checks too): empty sf0, sf1 of k rows without words
    ((e0, e1),) = tkaot.quant.batched_transpose_weight_sf([F32(0, 14)], 128, [False], [None])
    assert e0.shape == (0, 4) and e1.shape == (1792, 0) and len(launches) == 3


def test_per_channel_of_fp8_selects_its_variant(launches):
    sf = col_major(F32(256, 4))[:200]  # a slice along tokens of a column-major sf
    out, out_sf = tkaot.quant.per_channel_cast((FP8(200, 512), sf), "e4m3", 128, num_per_channels=128)
    assert out.shape == (200, 512) and out_sf.shape == (2, 512)
    key, args, grid, _ = launches[-1]
    assert key == Variant.make("per_channel_cast", CHANNEL).key
    assert args["in_sf_stride"] == 256 and args["num_tokens"] == 200 and grid == (4, 2, 1)
    with pytest.raises(VariantNotBuilt, match="in_sf=fp32,"):
        tkaot.quant.per_channel_cast((FP8(200, 512), F32(200, 4)), "e4m3", 128, num_per_channels=128)


# ---- the value checks (plain torch; the ops run them on the GPU before launching) -----------------------------


def test_lossless_value_checks_refuse_what_tile_kernels_asserts():
    check = _weight_casts._check_lossless_scales
    op = "tkaot.quant.per_block_cast_lossless"
    exps = torch.full((256, 4), 120, dtype=torch.int32)
    exps[7, 2] = 120 - 11  # 2**11 below its block's largest: still within TileKernels' bound
    fp32 = (exps << 23).view(torch.float32)
    check(op, fp32, "fp32", (256, 4), (2, 1), (1, 32), (128, 128))
    packed = ref.store_sf(fp32, "ue8m0", False)
    check(op, packed, "ue8m0", (256, 4), (2, 1), (1, 32), (128, 128))
    exps[200, 1] = 120 - 12
    with pytest.raises(ValueError, match=r"scale factor at \[200, 1\] 2\*\*12 below it"):
        check(op, (exps << 23).view(torch.float32), "fp32", (256, 4), (2, 1), (1, 32), (128, 128))
    # each output block is judged on its own: the same spread across two (1, 128) blocks is fine
    spread = torch.full((2, 8), 120, dtype=torch.int32)
    spread[1, 4:] = 100
    check(op, (spread << 23).view(torch.float32), "fp32", (2, 8), (2, 2), (1, 32), (1, 128))
    with pytest.raises(ValueError, match="positive powers of two"):
        check(op, torch.full((2, 8), 1.5), "fp32", (2, 8), (2, 2), (1, 32), (1, 128))
    with pytest.raises(ValueError, match="positive powers of two"):
        check(op, torch.full((2, 8), -0.5), "fp32", (2, 8), (2, 2), (1, 32), (1, 128))
    check(op, torch.zeros(2, 8), "fp32", (2, 8), (2, 2), (1, 32), (1, 128))  # 0 is exponent 0: allowed


# ---- references against independent formulations -------------------------------------------------------------


def random_mxfp4(rows: int, cols: int, block=(1, 32), spread: int = 11, col: bool = False, kind: str = "ue8m0"):
    """Random E2M1 codes with power-of-two scale factors no more than 2**spread apart inside each 128x128 block."""
    data = torch.randint(-128, 128, (rows, cols // 2), dtype=torch.int8)
    m, k = -(-rows // block[0]), cols // block[1]
    base = torch.randint(20, 230, (-(-m * block[0] // 128), -(-k * block[1] // 128)), dtype=torch.int32)
    per_block = ref.expand_blocks(base, (128 // block[0], 128 // block[1]), (m, k))
    exps = per_block - torch.randint(0, spread + 1, (m, k), dtype=torch.int32)
    sf = ref.store_sf((exps << 23).view(torch.float32), kind, col)
    return (data, sf), exps


@pytest.mark.parametrize("block, out_block", [((1, 32), (128, 128)), ((1, 16), (1, 128)), ((32, 32), (128, 128)), ((1, 32), (32, 32))])
@pytest.mark.parametrize("kind, col", [("ue8m0", False), ("fp32", True)])
def test_reference_lossless_cast_keeps_every_value(seed, block, out_block, kind, col):
    (data, sf), exps = random_mxfp4(300, 512, block, col=col, kind=kind)
    out, out_sf = ref.per_block_cast_lossless((data, sf), "e4m3", block, out_block)
    decoded_in = ref.unpack_e2m1(data).double() * ref.expand_blocks(torch.exp2(exps.double() - 127), block, (300, 512))
    decoded_out = out.double() * ref.expand_blocks(out_sf.double(), out_block, (300, 512))
    assert torch.equal(decoded_in, decoded_out)
    # the output sf: 2**-6 of its block's largest input sf (in-range blocks only)
    for i in range(out_sf.shape[0]):
        for j in range(out_sf.shape[1]):
            rows = slice(i * out_block[0] // block[0], min((i + 1) * out_block[0] // block[0], exps.shape[0]))
            cols = slice(j * out_block[1] // block[1], (j + 1) * out_block[1] // block[1])
            assert out_sf[i, j].item() == 2.0 ** (exps[rows, cols].max().item() - 127 - 6)


def test_reference_lossless_edges():
    # bytes 0x7F 0x08 0x21 0x00: codes -6, 6, -0, 0, 0.5, 1, 0, 0 (low nibble first); 128 values in four 1x32 blocks
    data = torch.tensor([[0x7F, 0x08, 0x21, 0x00] * 16], dtype=torch.int8)
    pattern = torch.tensor([-6.0, 6.0, -0.0, 0.0, 0.5, 1.0, 0.0, 0.0])

    def cast(exps, **flags):
        sf = ref.store_sf((torch.tensor([exps], dtype=torch.int32) << 23).view(torch.float32), "ue8m0", False)
        return ref.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (1, 128), **flags)

    out, out_sf = cast([3, 130, 130, 0])
    assert out_sf.item() == 2.0 ** (130 - 127 - 6)
    assert torch.equal(out[0, 32:40].float(), pattern * 64)  # the largest block: shifted up by 2**6 (6 * 64 = 384)
    # far below: values underflow E4M3 (2**-121 here) or the shift passes 2**-126 (factor 0); zeros keep their sign
    for block in (0, 3):
        assert torch.equal(
            out[0, 32 * block : 32 * block + 8].view(torch.uint8), torch.tensor([0x80, 0, 0x80, 0, 0, 0, 0, 0], dtype=torch.uint8)
        )
    # every exponent below 6: the output sf is 0.0 (exponent 0) and values are scaled by 2**e_in
    out, out_sf = cast([5, 1, 0, 2])
    assert out_sf.item() == 0.0 and torch.equal(out[0, :8].float(), pattern * 32)
    packed = cast([5, 1, 0, 2], use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)[1]
    assert packed.dtype == torch.int32 and packed.shape == (1, 1) and packed.item() == 0
    assert cast([200, 1, 0, 2], round_sf=True, use_packed_ue8m0=True)[1].item() == 194


def test_reference_transpose_weight_sf_matches_plain_loops(seed):
    exps = torch.randint(0, 255, (2, 5, 7), dtype=torch.int32)
    sf = (exps << 23).view(torch.float32)
    for block in (32, 128):
        (g0, g1), (d0, d1) = ref.batched_transpose_weight_sf([sf, sf[1]], block, [True, False])
        n, k = 5 * block, 7 * block
        assert g0.shape == (2, n, 2) and g0.stride() == (2 * n, 1, n) and g1.shape == (2, 2, k) and g1.stride() == (2 * k, k, 1)
        assert d0.shape == (n, 2) and d0.stride() == (1, n) and d1.shape == (k, 2) and d1.stride() == (1, k)
        assert torch.equal(d0, g0[1]) and torch.equal(d1, g1[1].T)
        b0 = g0.contiguous().view(torch.uint8).view(2, n, 8)
        b1 = g1.transpose(1, 2).contiguous().view(torch.uint8).view(2, k, 8)
        for g in range(2):
            for r in range(0, n, 31):
                assert b0[g, r].tolist() == [exps[g, r // block, j].item() if j < 7 else 0 for j in range(8)]
            for c in range(0, k, 29):
                assert b1[g, c].tolist() == [exps[g, i, c // block].item() if i < 5 else 0 for i in range(8)]


def test_reference_per_channel_of_fp8_is_per_channel_of_the_decoded_values(seed):
    x = torch.randn(300, 512).bfloat16() * 3
    for block, kind, col in (((1, 128), "fp32", True), ((1, 32), "ue8m0", False), ((1, 32), "e4m3", True)):
        q = ref.block_cast(x, "e4m3", block, sf_kind=kind, col_major_sf=col)
        decoded = ref.decode(q[0]) * ref.expand_blocks(ref.sf_to_float(q[1])[:, : 512 // block[1]], block, x.shape)
        for round_sf, packed in ((False, False), (True, True)):
            want = ref.per_channel_cast(decoded, "e4m3", 32, round_sf, None, packed)
            got = ref.per_channel_cast(q, "e4m3", 32, round_sf, block[1], packed)
            assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])


def byte_perm(lo: int, hi: int, selector: int) -> int:
    """CUDA's __byte_perm for selector nibbles below 8: byte n of the result is byte (nibble n) of hi:lo."""
    pool = (hi << 32 | lo).to_bytes(8, "little")
    return int.from_bytes(bytes(pool[(selector >> 4 * n) & 7] for n in range(4)), "little")


def test_kernel_table_conversion_matches_e4m3_rounding_for_every_code_and_shift():
    """per_block_cast_lossless's fast path (kernels_src/quant/per_block_cast_lossless.py: e4m3_table, e4m3_lookup,
    INTERLEAVE) replayed in Python: every word of eight codes it sees gives the bytes of E4M3(value * 2**shift)."""
    from kernels_src.quant.per_block_cast_lossless import EVEN_CODES, INTERLEAVE, MIN_TABLE_SHIFT, TABLE_OFFSETS, TABLE_SPLAT

    def lookup(codes: int, lo: int, hi: int) -> int:
        mag = codes & 0x07070707
        nibbles = mag | (mag >> 4)
        selector = (nibbles & 0xFF) | ((nibbles >> 8) & 0xFF00)
        return byte_perm(lo, hi, selector) | ((codes & 0x08080808) << 4)

    generator = torch.Generator().manual_seed(0)
    words = [0x76543210, 0xFEDCBA98, 0x08800880] + torch.randint(0, 2**32, (64,), generator=generator).tolist()
    for shift in range(MIN_TABLE_SHIFT, 7):
        base = (shift + 6) << 3
        lo, hi = ((base * splat + offset) & 0xFFFFFFFF for splat, offset in zip(TABLE_SPLAT, TABLE_OFFSETS))
        for word in words:
            even, odd = lookup(word & EVEN_CODES, lo, hi), lookup((word >> 4) & EVEN_CODES, lo, hi)
            got = byte_perm(even, odd, INTERLEAVE[0]) | byte_perm(even, odd, INTERLEAVE[1]) << 32
            codes = torch.tensor(list(word.to_bytes(4, "little")), dtype=torch.uint8).view(torch.int8)[None]
            want = ref.round_e4m3(ref.unpack_e2m1(codes) * 2.0**shift).view(torch.uint8)[0].tolist()
            assert list(got.to_bytes(8, "little")) == want, (hex(word), shift)
