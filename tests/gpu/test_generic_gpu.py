"""The generic tier on a GPU. The per-token cast: byte for byte what the specialised variants write, the torch
reference's bytes at widths no specialised variant has, and the calls that once found no kernel against TileKernels.
The per-block, per-channel and lossless casts likewise, with every block and sf layout (runtime values there).
The top-k gate: the specialised variants' indices (ties and NaNs included), the reference's at every expert count.
The RMSNorm backward: the specialised variants' x_grad and weight_grad byte for byte, the reference's within the
backward tolerances (tests/gpu/test_backward_gpu.py) at every width, in both dtypes.

Every output is poisoned (0xFF bytes) first, so an element either kernel leaves unwritten shows. `on_generic`
hides the specialised per_token_cast variants from the registry, so the same call runs on the generic one.
"""

import itertools
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

import tkaot
from bench.generic import on_generic
from tests.gpu.test_casts_gpu import assert_bytes_equal, dense, make_input, poisoned_like, poisoned_sf, sf_flags, shapeset_variants
from tests.helpers import poisoned_allocations
from tests.test_generic import ONCE_MISSING
from tkaot import _op
from tkaot._moe import ops as _moe_ops
from tkaot._quant import casts as _casts
from tkaot._quant import weight_casts as _weight_casts
from tkaot.errors import GenericVariantWarning
from tkaot.reference import fused as ref_fused
from tkaot.reference import moe as moe_ref
from tkaot.reference import quant as ref

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.gpu

TOKENS = [1, 3, 127, 4097]
SHAPESET = Path(__file__).resolve().parents[2] / "build_tools/shapesets/quant.toml"
# Row widths: the narrowest, odd multiples of 64, the widths of models with no specialised variant, the widest cast
WIDTHS = (64, 128, 192, 640, 1536, 2880, 4160, 5120, 7168, 9216, 16384)


def generic_combos() -> list[dict]:
    """The option combinations the default set builds generic variants for (quant.toml)."""
    return shapeset_variants("per_token_cast_generic")


def combo_id(v: dict) -> str:
    return ",".join(f"{k}={v[k]}" for k in v if k not in ("in_block", "in_sf") or v[k] != "none")


def widths(v: dict) -> list[int]:
    step = math.lcm(64, v["group"], int(v["in_block"].split("x")[1]) if v["in_block"] != "none" else 1)
    return [w for w in WIDTHS if w % step == 0]


def quantized_input(tokens: int, hidden: int, v: dict):
    bm, bk = (int(n) for n in v["in_block"].split("x"))
    kind, _, col = v["in_sf"].partition("_")
    data, sf = ref.block_cast(make_input(tokens, hidden, torch.bfloat16), v["in_dtype"], (bm, bk), sf_kind=kind, col_major_sf=bool(col))
    return (data, sf), (bm, bk)


def run(v: dict, tokens: int, hidden: int, seed: int):
    """The variant's op on fresh poisoned outputs: a dict of every tensor it wrote. Inputs depend on `seed` only."""
    torch.manual_seed(seed)
    fmt, group, kind, layout, mode = v["fmt"], v["group"], v["sf"], v["sf_layout"], v["mode"]
    flags = sf_flags(kind, layout)
    if v["in_dtype"] in ("e4m3", "e2m1"):
        x, block = quantized_input(tokens, hidden, v)
    else:
        x, block = make_input(tokens, hidden, getattr(torch, v["in_dtype"])), None
    if mode == "round_trip":
        x = x.clone()
        tkaot.quant.per_token_cast_and_cast_back(x, fmt, group, kind == "pow2", kind == "e4m3")
        return {"x": x}
    out_sf = poisoned_sf(tokens, -(-hidden // group), kind, layout)  # a partial last group has an sf too
    if mode == "sf_only":
        return {"sf": tkaot.quant.per_token_cast_with_sf_only(x, fmt, group, **flags, out_sf=out_sf)}
    cols = hidden // 2 if fmt == "e2m1" else hidden
    out_x = poisoned_like(torch.empty(tokens, cols, dtype=torch.int8 if fmt == "e2m1" else torch.float8_e4m3fn, device="cuda"))
    if mode == "precomputed_sf":
        _, sf = ref.per_token_cast(make_input(tokens, hidden, torch.bfloat16), fmt, group, **sf_flags(kind))
        return {"x": tkaot.quant.per_token_cast_with_precomputed_sf(x, fmt, group, sf, **sf_flags(kind), out=out_x)}
    data, sf = tkaot.quant.per_token_cast(x, fmt, group, block, **flags, stochastic_cast=v["stochastic"], out=(out_x, out_sf))
    return {"x": data, "sf": sf}


def reference(v: dict, tokens: int, hidden: int, seed: int):
    """What `run` must write, by the torch reference (stochastic modes: the scale factors only)."""
    torch.manual_seed(seed)
    fmt, group, kind, layout, mode = v["fmt"], v["group"], v["sf"], v["sf_layout"], v["mode"]
    if v["in_dtype"] in ("e4m3", "e2m1"):
        x, block = quantized_input(tokens, hidden, v)
    else:
        x, block = make_input(tokens, hidden, getattr(torch, v["in_dtype"])), None
    if mode == "round_trip":
        return {"x": ref.per_token_cast_and_cast_back(x, fmt, group, round_sf=kind == "pow2", use_e4m3_sf=kind == "e4m3")}
    if mode == "precomputed_sf":
        _, sf = ref.per_token_cast(make_input(tokens, hidden, torch.bfloat16), fmt, group, **sf_flags(kind))
        return {"x": ref.per_token_cast_with_precomputed_sf(x, fmt, group, sf, round_sf=kind == "pow2")}
    data, sf = ref.per_token_cast(x, fmt, group, block, **sf_flags(kind, layout))
    if mode == "sf_only":
        return {"sf": sf}
    return {"sf": sf} if v["stochastic"] else {"x": data, "sf": sf}


@pytest.mark.parametrize("v", shapeset_variants("per_token_cast"), ids=combo_id)
def test_generic_writes_the_bytes_of_the_specialised_variant(seed, v):
    """Every specialised variant of the default set (every width it has, every option it covers) against the
    generic variant of its options on the same inputs, stochastic rounding included."""
    for tokens in TOKENS:
        want = run(v, tokens, v["hidden"], seed + tokens)
        with on_generic():
            got = run(v, tokens, v["hidden"], seed + tokens)
        torch.cuda.synchronize()
        for name in want:
            assert_bytes_equal(got[name], want[name], f"{name}, {tokens} tokens")


def check_against_reference(v: dict, tokens: int, hidden: int, seed: int) -> dict:
    """The generic variant's outputs for one call equal the reference's byte for byte (stochastic: the sf); returns them."""
    with on_generic():
        got = run(v, tokens, hidden, seed)
    want = reference(v, tokens, hidden, seed)
    torch.cuda.synchronize()
    for name in want:
        assert_bytes_equal(got[name], want[name], f"{name}, {tokens}x{hidden}")
    return got


@pytest.mark.parametrize("v", generic_combos(), ids=combo_id)
def test_generic_matches_the_reference_at_any_width(seed, v):
    """Every generic variant of the default set at widths with and without specialised variants, odd token counts."""
    for hidden, tokens in itertools.product(widths(v), TOKENS):
        if tokens == 4097 and hidden > 5120:
            continue  # the widest rows at fewer tokens: the reference is slow
        got = check_against_reference(v, tokens, hidden, seed)
        if v["stochastic"]:
            assert_on_neighbours(got["x"], got["sf"], v, tokens, hidden, seed)


def assert_on_neighbours(data, sf, v: dict, tokens: int, hidden: int, seed: int):
    """Stochastic rounding lands each scaled value on one of its two neighbours on the format's grid."""
    torch.manual_seed(seed)
    x = make_input(tokens, hidden, getattr(torch, v["in_dtype"])).float()
    scale = ref.expand_blocks(ref.sf_to_float(sf)[:, : -(-hidden // v["group"])], (1, v["group"]), x.shape)
    scaled, back = x / scale, ref.decode(data)
    down = ref.decode(ref.encode(scaled, v["fmt"]))  # nearest; the other neighbour is within one grid step
    step = grid_step(torch.maximum(scaled.abs(), down.abs()), v["fmt"])
    # an E4M3 sf of a group whose amax / 448 is below E4M3's smallest step is 0: no grid to round on there
    # (such a group's sf is compared with the reference above)
    on_grid = (back - scaled).abs() <= step * 1.0001 + 1e-30
    assert torch.all(on_grid | (scale == 0)), "a stochastic value left its neighbours"


def grid_step(mag: torch.Tensor, fmt: str) -> torch.Tensor:
    """The spacing of the format's grid at magnitude `mag` (the larger of the two steps around it)."""
    if fmt == "e2m1":
        return torch.where(mag < 2, 0.5, torch.where(mag < 4, 1.0, 2.0))
    exp = torch.floor(torch.log2(mag.clamp(min=2.0**-6)))
    return torch.exp2(exp - 2)  # three mantissa bits: 2 ** (e - 3), doubled at the top of a binade


@pytest.mark.parametrize("fmt,group,kind,layout", [
    ("e4m3", 128, "fp32", "row"), ("e4m3", 128, "ue8m0", "col"), ("e2m1", 32, "ue8m0", "row"), ("e2m1", 16, "e4m3", "row"),
    ("e4m3", 64, "pow2", "row"), ("e2m1", 32, "fp32", "col"),
])  # fmt: skip
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_width_from_64_to_16384(seed, fmt, group, kind, layout, dtype):
    """One row width after another, in steps of the narrowest the group allows, at 3 tokens; then 1 and 127 tokens."""
    v = dict(in_dtype=dtype, in_block="none", in_sf="none", fmt=fmt, group=group, sf=kind, sf_layout=layout, mode="cast", stochastic=False)
    step = math.lcm(64, group)
    for hidden in list(range(step, 4096 + 1, step)) + list(range(4096 + 7 * step, 16384 + 1, 7 * step)) + [16384]:
        for tokens in (3,) if hidden % 1024 else (1, 3, 127):
            check_against_reference(v, tokens, hidden, seed)


def forget_kernels(monkeypatch):
    """Empty the casts' launcher caches and the fallback warnings, so the next call looks its variant up again."""
    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(_casts, "_PLANS", {})
    for kernels in (*_casts._PER_TOKEN.values(), *_casts._CAST_BACK.values()):
        monkeypatch.setattr(kernels, "cache", {})


def tile_kernels():
    """TileKernels' module, where it is installed and runs here; else None."""
    try:
        import tile_kernels as tk
    except Exception:  # not installed, or no TileLang here
        return None
    return tk


def assert_sf_matches_tile_kernels(ours: torch.Tensor, theirs: torch.Tensor, groups: int, what: str) -> None:
    """Scale factors against TileKernels' (theirs made under poisoned_allocations). Packed UE8M0 rows whose groups
    do not fill their last int32 word: the first `groups` bytes of each row byte for byte, and the padding bytes
    after them zero in ours (as TileKernels' torch reference pads them). TileKernels' per_token_cast and row-major
    norm_forward_and_per_token_cast kernels store the exponents of the row's groups only and leave those bytes as
    the allocation held them, so in theirs they still hold the poison. Any other sf: every byte."""
    theirs = theirs.view(ours.dtype)
    if ours.dtype != torch.int32 or groups % 4 == 0:
        assert_bytes_equal(ours, theirs, what)
        return
    assert ours.shape == theirs.shape, f"{what}: {ours.shape} vs {theirs.shape}"
    g, w = dense(ours).view(torch.uint8), dense(theirs).view(torch.uint8)
    assert_bytes_equal(g[..., :groups], w[..., :groups], what)
    assert not g[..., groups:].any(), f"{what}: padding bytes after the row's {groups} exponents are not zero"
    assert (w[..., groups:] == 0xFF).all(), f"{what}: TileKernels now writes the padding bytes, so compare them too"


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize(("hidden", "args", "kwargs"), ONCE_MISSING, ids=lambda p: str(p))
def test_calls_once_missing_run_and_agree_with_the_reference_and_tile_kernels(seed, monkeypatch, hidden, args, kwargs, tokens):
    """The issue's calls: the hot path (no out), then into poisoned out buffers; the reference's bytes, TileKernels'."""
    forget_kernels(monkeypatch)
    x = make_input(tokens, hidden, torch.bfloat16)
    with pytest.warns(GenericVariantWarning, match="tkaot-build build --op per_token_cast --set hidden="):
        data, sf = tkaot.quant.per_token_cast(x, *args, **kwargs)
    want = ref.per_token_cast(x, *args, **kwargs)
    assert_bytes_equal(data, want[0], "data")
    assert_bytes_equal(sf, want[1], "sf")
    out = (poisoned_like(want[0]), poisoned_like(want[1]) if not kwargs.get("use_tma_aligned_col_major_sf") else None)
    got = tkaot.quant.per_token_cast(x, *args, **kwargs, out=out)
    assert_bytes_equal(got[0], want[0], "data, into poisoned out")
    assert_bytes_equal(got[1], want[1], "sf, into poisoned out")
    tk = tile_kernels()
    if tk is None:
        return
    theirs = tk.quant.per_token_cast(x, *args, **kwargs)
    torch.cuda.synchronize()
    assert_bytes_equal(data, theirs[0].view(data.dtype), "data, against TileKernels")
    assert_bytes_equal(sf, theirs[1].view(sf.dtype), "sf, against TileKernels")


# ---- rows that end in a partial group (per_token_cast_generic's alone) ----

PARTIAL_WIDTHS = (64, 192, 1088, 5184, 16320)  # 64 * odd: the last 128-channel group holds 64 channels


@pytest.mark.parametrize("mode", ["cast", "sf_only", "precomputed_sf"])
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("kind", ["fp32", "pow2", "ue8m0", "e4m3"])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_partial_last_group_matches_the_reference(seed, monkeypatch, dtype, fmt, kind, layout, mode):
    """Every option of a 128-channel group over rows of 64 * odd channels, every token count, outputs poisoned: the
    reference's bytes (the last group's sf is its 64 channels'), and no fallback warning (no specialised variant
    can exist)."""
    if mode == "precomputed_sf" and (kind == "ue8m0" or layout == "col"):
        pytest.skip("precomputed sf are row-major and unpacked")
    forget_kernels(monkeypatch)
    v = dict(in_dtype=dtype, in_block="none", in_sf="none", fmt=fmt, group=128, sf=kind, sf_layout=layout, mode=mode, stochastic=False)
    for hidden, tokens in itertools.product(PARTIAL_WIDTHS, TOKENS):
        if tokens == 4097 and hidden > 5184:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error", GenericVariantWarning)
            got = run(v, tokens, hidden, seed)
        want = reference(v, tokens, hidden, seed)
        torch.cuda.synchronize()
        for name in want:
            assert_bytes_equal(got[name], want[name], f"{name}, {tokens}x{hidden}")


@pytest.mark.parametrize("fmt,kind,layout", [("e4m3", "fp32", "row"), ("e4m3", "ue8m0", "col"), ("e2m1", "ue8m0", "row"),
                                             ("e2m1", "e4m3", "row"), ("e4m3", "pow2", "row")])  # fmt: skip
def test_partial_last_group_matches_tile_kernels(seed, fmt, kind, layout):
    tk = tile_kernels()
    if tk is None:
        pytest.skip("TileKernels is not installed")
    for hidden, tokens in itertools.product((192, 1088, 5184), TOKENS):
        x = make_input(tokens, hidden, torch.bfloat16)
        flags = sf_flags(kind, layout)
        ours = tkaot.quant.per_token_cast(x, fmt, 128, **flags)
        with poisoned_allocations():
            theirs = tk.quant.per_token_cast(x, fmt, 128, **flags)
        torch.cuda.synchronize()
        assert_bytes_equal(ours[0], theirs[0].view(ours[0].dtype), f"data, {tokens}x{hidden}")
        assert_sf_matches_tile_kernels(ours[1], theirs[1], math.ceil(hidden / 128), f"sf, {tokens}x{hidden}")


# ---- the cast back ----


def cast_back_input(tokens: int, hidden: int, v: dict, seed: int):
    """A (data, sf) input of the variant's format and block, and its x_block_size."""
    torch.manual_seed(seed)
    bm, bk = (int(n) for n in v["in_block"].split("x"))
    kind, _, col = v["in_sf"].partition("_")
    x = make_input(tokens, hidden, torch.bfloat16)
    return ref.block_cast(x, v["in_dtype"], (bm, bk), sf_kind=kind, col_major_sf=bool(col)), (bm, bk)


def poisoned_cast_back(x, fmt: str, block) -> torch.Tensor:
    """cast_back into memory the caching allocator hands out poisoned: its output block is the one just filled with
    0xFF (NaN) and freed (cast_back takes no out buffer)."""
    tokens, hidden = x[0].shape[0], x[0].shape[1] * (2 if x[0].dtype == torch.int8 else 1)
    bait = torch.empty(tokens, hidden, dtype=torch.bfloat16 if fmt == "bf16" else torch.float32, device="cuda")
    bait.untyped_storage().fill_(0xFF)
    del bait
    return tkaot.quant.cast_back(x, fmt, block)


def cast_back_combos() -> list[dict]:
    tables = tomllib.loads(SHAPESET.read_text())["cast_back_generic"]
    return [dict(zip(t, combo)) for t in tables for combo in itertools.product(*[v if isinstance(v, list) else [v] for v in t.values()])]


@pytest.mark.parametrize("v", shapeset_variants("cast_back"), ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_generic_cast_back_writes_the_bytes_of_the_specialised_variant(seed, v):
    out = "bf16" if v["out_dtype"] == "bfloat16" else "fp32"
    for tokens in TOKENS:
        x, block = cast_back_input(tokens, v["hidden"], v, seed + tokens)
        want = poisoned_cast_back(x, out, block)
        with on_generic("cast_back"):
            got = poisoned_cast_back(x, out, block)
        torch.cuda.synchronize()
        assert_bytes_equal(got, want, f"{tokens} tokens")


@pytest.mark.parametrize("v", cast_back_combos(), ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_generic_cast_back_matches_the_reference_at_any_width(seed, v):
    """Every generic cast back of the default set, at widths with and without specialised variants, odd token counts,
    poisoned output; against TileKernels' cast_back too where it is installed."""
    out = "bf16" if v["out_dtype"] == "bfloat16" else "fp32"
    step = math.lcm(64, int(v["in_block"].split("x")[1]))
    tk = tile_kernels()
    for hidden, tokens in itertools.product([w for w in WIDTHS if w % step == 0], TOKENS):
        if tokens == 4097 and hidden > 5120:
            continue
        x, block = cast_back_input(tokens, hidden, v, seed)
        with on_generic("cast_back"):
            got = poisoned_cast_back(x, out, block)
        want = ref.cast_back(x, out, block)
        torch.cuda.synchronize()
        assert_bytes_equal(got, want, f"{tokens}x{hidden}")
        if tk is not None and hidden in (192, 7168):
            assert_bytes_equal(got, tk.quant.cast_back(x, out, block), f"{tokens}x{hidden}, against TileKernels")


def test_strict_mode_raises_where_the_generic_variant_would_serve(monkeypatch):
    monkeypatch.setenv("TKAOT_STRICT", "1")
    monkeypatch.setattr(_casts, "_PLANS", {})
    for kernels in _casts._PER_TOKEN.values():
        monkeypatch.setattr(kernels, "cache", {})
    with pytest.raises(tkaot.VariantNotBuilt, match="hidden=5120"):
        tkaot.quant.per_token_cast(torch.randn(4, 5120, dtype=torch.bfloat16, device="cuda"), "e2m1", 32)


# ---- the top-k gate ----

TOPK_BUILT = [(128, 8), (256, 8), (64, 6), (64, 8), (8, 4)]  # build_tools/shapesets/moe.toml
EXPERTS = [1, 2, 3, 5, 8, 31, 32, 33, 63, 64, 100, 127, 128, 129, 200, 255, 256, 257, 384, 511, 512]


def tied_scores(tokens: int, experts: int) -> torch.Tensor:
    return torch.randint(-20, 20, (tokens, experts), device="cuda").float() / 4  # many exact ties


@pytest.mark.parametrize(("experts", "topk"), TOPK_BUILT)
def test_generic_topk_gate_returns_the_specialised_indices(seed, experts, topk):
    for tokens in TOKENS:
        scores = tied_scores(tokens, experts)
        scores[::5, ::7] = float("nan")  # outside the op's contract, but the two kernels still agree
        scores[::3, 1::9] = float("-inf")
        want = tkaot.moe.topk_gate(scores, topk)
        with on_generic("topk_gate"):
            got = tkaot.moe.topk_gate(scores, topk)
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"{tokens} tokens"


@pytest.mark.parametrize("experts", EXPERTS)
def test_generic_topk_gate_matches_the_reference(seed, experts):
    for topk in sorted({k for k in (1, 2, 6, 8, 9) if k <= experts} | {min(experts, 32)}):
        for tokens in TOKENS:
            scores = tied_scores(tokens, experts)
            with on_generic("topk_gate"):
                got = tkaot.moe.topk_gate(scores, topk)
            torch.cuda.synchronize()
            assert got.shape == (tokens, topk) and got.is_contiguous()
            assert torch.equal(got, moe_ref.topk_gate(scores, topk)), f"top-{topk}, {tokens} tokens"


def test_topk_gate_256_experts_top6_against_the_reference_and_tile_kernels(seed, monkeypatch):
    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(_moe_ops._TOPK, "cache", {})
    scores = tied_scores(4097, 256)
    with pytest.warns(GenericVariantWarning, match="tkaot-build build --op topk_gate --set num_experts=256 --set num_topk=6"):
        got = tkaot.moe.topk_gate(scores, 6)
    assert torch.equal(got, moe_ref.topk_gate(scores, 6))
    try:
        import tile_kernels as tk
    except Exception:  # not installed, or no TileLang here
        return
    assert torch.equal(got, tk.moe.topk_gate(scores, 6))


# ---- SwiGLU: the generic kernel against the specialised one, and against the reference at widths only it takes ----

FUSED_SHAPESET = SHAPESET.parent / "fused.toml"
# Widths the specialised tilings refuse (not multiples of 256; 1408: DeepSeek-V2-Lite and Qwen1.5-MoE experts),
# and the widest each input dtype takes
SWIGLU_WIDTHS = (64, 128, 192, 320, 1408, 2880, 4160, 7104, 16320, 18432, 32704)
SWIGLU_FORMATS = [  # (fmt, group, the op's sf flags)
    ("bf16", None, {}), ("fp32", None, {}), ("e4m3", 128, {}), ("e4m3", 32, {}), ("e4m3", 128, {"round_sf": True}),
    ("e4m3", 32, {"round_sf": True, "use_packed_ue8m0": True, "use_tma_aligned_col_major_sf": True}),
    ("e4m3", 128, {"round_sf": True, "use_packed_ue8m0": True}), ("e4m3", 32, {"use_tma_aligned_col_major_sf": True}),
]  # fmt: skip
SWIGLU_SF_FLAGS = {"fp32": {}, "pow2": {"round_sf": True}, "ue8m0": {"round_sf": True, "use_packed_ue8m0": True}}


def swiglu_variants() -> list[dict]:
    """The specialised swiglu variants the default set builds (fused.toml)."""
    return shapeset_variants("swiglu", FUSED_SHAPESET)


def swiglu_options(tokens: int, i: int, clamp: bool) -> dict:
    """The MoE options of call i: expert segments (rows in the padding between them are left unwritten), weights
    with and without a scaling factor, a clamp (0 clamps everything) with and without counts."""
    kw = {}
    if i % 3 == 2:
        ends, begin = [], 0
        for count in (0, 1, 130, max(tokens // 2, 1)):  # each segment starts 128-aligned
            start = -(-begin // 128) * 128
            ends.append(min(start + count, tokens))
            begin = start + count
        kw["psum_num_tokens_per_expert"] = torch.tensor(ends, dtype=torch.int32, device="cuda")
    if i % 2:
        kw["topk_weights"] = torch.rand(tokens, device="cuda")
        kw["routed_scaling_factor"] = 2.5 if i % 4 == 1 else None
    if clamp:
        kw["clamp_value"] = (6.0, 0.0, 3.0e38, 1.5)[i % 4]
        kw["clamped_count"] = torch.tensor([5, 6, 7, 8], dtype=torch.int64, device="cuda") if i % 4 != 3 else None
    return kw


def swiglu_input(tokens: int, hidden: int, dtype: torch.dtype, specials: bool) -> torch.Tensor:
    """[gate | up] * 4, one all-zero gate row; with `specials`, NaN, infinities, -0 and gates below -87.5 sprinkled in
    (the generic and specialised kernels must agree on those too; the reference's amax differs at a NaN by design)."""
    x = torch.randn(tokens, 2 * hidden, device="cuda") * 4
    x[tokens // 2, :hidden] = 0
    if specials:
        x[:, 5::97] = float("nan")
        x[:, 11::89] = float("inf")
        x[:, 17::83] = float("-inf")
        x[:, 23::79] = -0.0
        x[:, 29::71] = -100.0
    return x.to(dtype)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """The SwiGLU ops' outputs (which they allocate) start as 0xFF bytes, NaN: their allocator fills what it returns."""
    from tkaot._quant import swiglu as ops

    real = ops._empty_strided

    def poisoned(*args, **kwargs):
        t = real(*args, **kwargs)
        t.untyped_storage().fill_(0xFF)
        return t

    monkeypatch.setattr(ops, "_empty_strided", poisoned)


def run_swiglu(x: torch.Tensor, fmt: str, group, flags: dict, kw: dict) -> dict:
    """The op's outputs for one call (poisoned first, with `poisoned_outputs`), and the clamp counts after it."""
    args = {**kw, "clamped_count": None if kw.get("clamped_count") is None else kw["clamped_count"].clone()}
    if fmt in ("bf16", "fp32"):
        out = tkaot.quant.swiglu_forward(x, fmt, **args)
    else:
        out = tkaot.quant.swiglu_forward_and_per_token_cast(x, fmt, group, **flags, **args)
    outs = out if isinstance(out, tuple) else (out,)
    count = args["clamped_count"]
    return {"out": outs[0], **({"sf": outs[1]} if len(outs) > 1 else {}), **({"count": count} if count is not None else {})}


def swiglu_call_of(v: dict) -> tuple:
    """(fmt, group, sf flags, dtype, clamp) of a specialised variant's calls."""
    group = v["group"] or None
    flags = SWIGLU_SF_FLAGS[v["sf"]] if group else {}
    return v["fmt"], group, flags, getattr(torch, v["dtype"]), v["tiling"] == SWIGLU_CLAMP


SWIGLU_CLAMP = "wscc2v9b1gkm"  # the tiling calls with a clamp_value take (tkaot/_quant/kernels.py)


@pytest.mark.parametrize("v", swiglu_variants(), ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_generic_swiglu_writes_the_bytes_of_the_specialised_variant(seed, poisoned_outputs, v):
    """Every specialised swiglu variant of the default set against the generic variant of its options, on the same
    inputs (NaN, infinities and gates below the lean division's floor included): every byte of every output, the
    rows left unwritten included, and the clamp counts."""
    fmt, group, flags, dtype, clamp = swiglu_call_of(v)
    for i, tokens in enumerate(TOKENS):
        x = swiglu_input(tokens, v["hidden"], dtype, specials=i != 1)
        kw = swiglu_options(tokens, i, clamp)
        flags = {**flags, "use_tma_aligned_col_major_sf": bool(i % 2)} if group else flags
        want = run_swiglu(x, fmt, group, flags, kw)
        with on_generic("swiglu"):
            got = run_swiglu(x, fmt, group, flags, kw)
        torch.cuda.synchronize()
        assert got.keys() == want.keys()
        for name in want:
            assert_bytes_equal(got[name], want[name], f"{name}, {tokens} tokens")


def check_swiglu_against_reference(x: torch.Tensor, fmt: str, group, flags: dict, kw: dict, what: str) -> None:
    """The op (on whichever variant serves it) against the reference, byte for byte on the rows it computes; the rows
    in the padding between expert segments keep their poison; the counts equal."""
    got = run_swiglu(x, fmt, group, flags, kw)
    want_count = None if kw.get("clamped_count") is None else kw["clamped_count"].clone()
    args = {**kw, "clamped_count": want_count}
    if fmt in ("bf16", "fp32"):
        want = {"out": ref_fused.swiglu_forward(x, fmt, **args)}
    else:
        out, sf = ref_fused.swiglu_forward_and_per_token_cast(x, fmt, group, **{"use_tma_aligned_col_major_sf": False, **flags}, **args)
        want = {"out": out, "sf": sf}
    torch.cuda.synchronize()
    rows = ref_fused.psum_row_mask(x.shape[0], kw.get("psum_num_tokens_per_expert")).cuda()
    for name in want:
        assert got[name].shape == want[name].shape and got[name].stride() == want[name].stride(), f"{name}, {what}"
        assert_bytes_equal(got[name][rows], want[name][rows], f"{name}, {what}")
        skipped = got[name][~rows]
        assert torch.all(dense(skipped).view(torch.uint8) == 0xFF), f"{name}, {what}: a row between expert segments was written"
    if want_count is not None:
        assert torch.equal(got["count"], want_count), what


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt,group,flags", SWIGLU_FORMATS, ids=lambda p: str(p))
def test_generic_swiglu_matches_the_reference_at_widths_no_specialised_tiling_takes(seed, poisoned_outputs, dtype, fmt, group, flags):
    """Widths that are multiples of 64 (of the group) but not of 256 — only the generic kernel takes them — every
    format and option, 1 to 4097 tokens, with and without a clamp."""
    limit = 32768 if dtype == torch.bfloat16 else 18432
    for hidden in (h for h in SWIGLU_WIDTHS if h <= limit and not (group and h % group)):
        for i, tokens in enumerate(TOKENS):
            if tokens == 4097 and hidden > 7104:
                tokens = 1031  # the widest rows at fewer tokens: the reference is slow
            x = swiglu_input(tokens, hidden, dtype, specials=False)
            check_swiglu_against_reference(x, fmt, group, flags, swiglu_options(tokens, i, i % 2 == 0), f"{tokens}x{hidden}")


@pytest.mark.parametrize("fmt,group,flags", SWIGLU_FORMATS[:3] + SWIGLU_FORMATS[5:6], ids=lambda p: str(p))
def test_generic_swiglu_at_every_width_from_64_to_8192(seed, poisoned_outputs, fmt, group, flags):
    """One row width after another, in steps of the narrowest the group allows, at 3 tokens (127 where hidden is a
    multiple of 1024), with weights and a counted clamp; the widths the default set builds run specialised."""
    step = math.lcm(64, group or 64)
    for hidden in range(step, 8192 + 1, step):
        tokens = 127 if hidden % 1024 == 0 else 3
        x = swiglu_input(tokens, hidden, torch.bfloat16, specials=False)
        kw = swiglu_options(tokens, 1, True) | {"clamp_value": 6.0}  # weights, scaled, a counted clamp
        check_swiglu_against_reference(x, fmt, group, flags, kw, f"{hidden}")


def test_swiglu_at_1408_warns_and_matches_the_reference_and_tile_kernels(seed, monkeypatch, poisoned_outputs):
    """A width TileKernels takes and tkaot refused before the generic tier (DeepSeek-V2-Lite's experts)."""
    from tkaot._quant import swiglu as ops

    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(ops._SWIGLU, "cache", {})
    x = swiglu_input(4097, 1408, torch.bfloat16, specials=False)
    weights = torch.rand(4097, device="cuda")
    with pytest.warns(GenericVariantWarning, match=r"no specialised swiglu variant can serve \[hidden=1408,"):
        out, sf = tkaot.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, topk_weights=weights, round_sf=True)
    want = ref_fused.swiglu_forward_and_per_token_cast(x, "e4m3", 128, topk_weights=weights, round_sf=True)
    assert_bytes_equal(out, want[0], "out")
    assert_bytes_equal(sf, want[1], "sf")
    try:
        import tile_kernels as tk
    except Exception:  # not installed, or no TileLang here
        return
    theirs = tk.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, topk_weights=weights, round_sf=True)
    torch.cuda.synchronize()
    assert_bytes_equal(out, theirs[0].view(out.dtype), "out, against TileKernels")
    assert_bytes_equal(sf, theirs[1].view(sf.dtype), "sf, against TileKernels")


# ---- the norm kernels: rmsnorm_generic (norm_forward) and norm_cast_generic (norm_forward_and_per_token_cast) ----

NORM_BUILT = [512, 1536, 2048, 4096, 5120, 7168, 8192]  # build_tools/shapesets/default.toml, fused.toml
# Widths no specialised variant has: the narrowest (2 and 4 threads a row), rows of whole and partial vectors a
# thread at every threads-a-row class (8 to 128), and the widest
NORM_UNBUILT = [16, 32, 48, 96, 160, 272, 544, 1056, 2080, 2880, 4160, 6144, 7200, 8160]
NORM_DTYPES = [torch.bfloat16, torch.float32]
NORM_SF = {"fp32": {}, "pow2": {"round_sf": True}, "ue8m0": {"round_sf": True, "use_packed_ue8m0": True}}


def norm_input(shape, dtype: torch.dtype) -> torch.Tensor:
    """Rows of very different magnitudes (one all zero), so the sum of squares rounds at every step."""
    x = torch.randn(*shape, device="cuda") * torch.exp2(torch.randint(-8, 8, (*shape[:-1], 1), device="cuda").float())
    x[..., shape[-2] // 2, :] = 0
    return x.to(dtype)


def run_norm(x, weight, residual, out_scale: float) -> dict:
    """norm_forward into poisoned buffers, rstd asked: every tensor it wrote."""
    out, residual_out = poisoned_like(x), (poisoned_like(x) if residual is not None else None)
    got, rstd, norm_in = tkaot.quant.norm_forward(x, weight, 1e-6, residual, out_scale, out=out, residual_out=residual_out, with_rstd=True)
    assert got is out
    return {"out": out, "rstd": rstd, **({"residual_out": norm_in} if residual is not None else {})}


def run_norm_cast(x, weight, residual, sf: str, out_scale: float) -> dict:
    """norm_forward_and_per_token_cast with every output asked, into poisoned buffers where the op takes them."""
    out_bf16 = poisoned_like(torch.empty(x.shape, dtype=torch.bfloat16, device="cuda"))
    residual_out = poisoned_like(x) if residual is not None else None
    data = poisoned_like(torch.empty(x.shape, dtype=torch.float8_e4m3fn, device="cuda"))
    (q, qsf), y, rstd, norm_in = tkaot.quant.norm_forward_and_per_token_cast(
        x, weight, 1e-6, "e4m3", 32, residual, out_scale, out=(data, None), out_bf16=out_bf16, residual_out=residual_out,
        with_out_bf16=True, with_rstd=True, **NORM_SF[sf],
    )  # fmt: skip
    assert q is data and y is out_bf16
    return {"values": q, "sf": qsf, "out_bf16": y, "rstd": rstd, **({"residual_out": norm_in} if residual is not None else {})}


def norm_calls(hidden: int, dtype: torch.dtype, tokens: int, seed: int):
    """The calls each test makes at one width and token count: weight or none, residual or none, an out_scale, a
    batch of two once. Inputs depend on `seed` only."""
    torch.manual_seed(seed)
    weight = torch.randn(hidden, device="cuda").to(dtype)
    for i, (with_weight, with_residual) in enumerate(itertools.product((True, False), (False, True))):
        shape = (2, tokens, hidden) if i == 3 else (tokens, hidden)
        x = norm_input(shape, dtype)
        residual = norm_input(shape, dtype) if with_residual else None
        yield x, (weight if with_weight else None), residual, (0.5 if i == 2 else 1.0)


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", NORM_BUILT)
def test_generic_norm_writes_the_bytes_of_the_specialised_variant(seed, hidden, dtype):
    for tokens in TOKENS:
        for x, weight, residual, out_scale in norm_calls(hidden, dtype, tokens, seed + tokens):
            want = run_norm(x, weight, residual, out_scale)
            with on_generic("rmsnorm"):
                got = run_norm(x, weight, residual, out_scale)
            torch.cuda.synchronize()
            for name in want:
                assert_bytes_equal(got[name], want[name], f"{name}, {tuple(x.shape)}")


@pytest.mark.parametrize("sf", list(NORM_SF))
@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", NORM_BUILT)
def test_generic_norm_cast_writes_the_bytes_of_the_specialised_variant(seed, hidden, dtype, sf):
    """Both tilings: calls with a residual take the residual one, generic or specialised."""
    for tokens in TOKENS:
        for x, weight, residual, out_scale in norm_calls(hidden, dtype, tokens, seed + tokens):
            want = run_norm_cast(x, weight, residual, sf, out_scale)
            with on_generic("norm_cast"):
                got = run_norm_cast(x, weight, residual, sf, out_scale)
            torch.cuda.synchronize()
            for name in want:
                assert_bytes_equal(got[name], want[name], f"{name}, {tuple(x.shape)}")


def check_norm_against_reference(got: dict, x, weight, residual, out_scale: float) -> None:
    """rstd within its tolerance of the reference's; every other output, bit for bit, the reference's steps from
    the kernel's rstd (the sum of squares is the one step whose order the reference does not follow)."""
    s = x if residual is None else (x + residual).to(x.dtype)
    ref_rstd = torch.rsqrt(s.float().square().mean(dim=-1) + 1e-6)
    torch.testing.assert_close(got["rstd"], ref_rstd, rtol=1e-5, atol=0)
    scale = weight.float() * out_scale if weight is not None else out_scale
    assert_bytes_equal(got["out"], (s.float() * got["rstd"][..., None] * scale).to(x.dtype), "out")
    if residual is not None:
        assert_bytes_equal(got["residual_out"], s, "residual_out")


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", NORM_UNBUILT + NORM_BUILT)
def test_generic_norm_matches_the_reference_at_any_width(seed, hidden, dtype):
    for tokens in TOKENS:
        for x, weight, residual, out_scale in norm_calls(hidden, dtype, tokens, seed + tokens):
            with on_generic("rmsnorm"):
                got = run_norm(x, weight, residual, out_scale)
            torch.cuda.synchronize()
            check_norm_against_reference(got, x, weight, residual, out_scale)


@pytest.mark.parametrize("sf", list(NORM_SF))
@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [h for h in NORM_UNBUILT + NORM_BUILT if h % 32 == 0])
def test_generic_norm_cast_matches_the_reference_at_any_width(seed, hidden, dtype, sf):
    from tkaot.reference import fused as fused_ref

    round_sf, packed = sf != "fp32", sf == "ue8m0"
    for tokens in TOKENS:
        for x, weight, residual, out_scale in norm_calls(hidden, dtype, tokens, seed + tokens):
            with on_generic("norm_cast"):
                got = run_norm_cast(x, weight, residual, sf, out_scale)
            torch.cuda.synchronize()
            s = x if residual is None else (x + residual).to(x.dtype)
            torch.testing.assert_close(got["rstd"], torch.rsqrt(s.float().square().mean(dim=-1) + 1e-6), rtol=1e-5, atol=0)
            (want_q, want_sf), want_y, _, want_sum = fused_ref.norm_forward_and_per_token_cast(
                x, weight, 1e-6, residual, out_scale, round_sf, packed, rstd=got["rstd"]
            )
            assert_bytes_equal(got["values"], want_q, f"values, {tuple(x.shape)}")
            assert_bytes_equal(got["sf"], want_sf, f"sf, {tuple(x.shape)}")
            assert_bytes_equal(got["out_bf16"], want_y.bfloat16(), f"out_bf16, {tuple(x.shape)}")
            if residual is not None:
                assert_bytes_equal(got["residual_out"], want_sum, "residual_out")


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", NORM_UNBUILT)
def test_generic_norms_at_unbuilt_widths_match_tile_kernels(seed, hidden, dtype):
    """Where no specialised variant exists to compare with, TileKernels (which builds any width) is the check of
    the split and the sum order: rstd and every output byte for byte."""
    tk = pytest.importorskip("tile_kernels")
    for tokens in TOKENS:
        for x, weight, residual, out_scale in norm_calls(hidden, dtype, tokens, seed + tokens):
            with on_generic("rmsnorm"):
                got = run_norm(x, weight, residual, out_scale)
            out, rstd, norm_in = tk.quant.norm_forward(x, weight, 1e-6, residual, out_scale, with_rstd=True)
            torch.cuda.synchronize()
            assert_bytes_equal(got["rstd"], rstd, f"norm_forward rstd, {tuple(x.shape)}")
            assert_bytes_equal(got["out"], out, f"norm_forward out, {tuple(x.shape)}")
            if hidden % 32:
                continue
            for sf, flags in NORM_SF.items():
                with on_generic("norm_cast"):
                    got = run_norm_cast(x, weight, residual, sf, out_scale)
                with poisoned_allocations():
                    (q, qsf), y, rstd, norm_in = tk.quant.norm_forward_and_per_token_cast(
                        x, weight, 1e-6, "e4m3", 32, residual, out_scale, with_out_bf16=True, with_rstd=True, **flags
                    )
                torch.cuda.synchronize()
                for name, theirs in (("rstd", rstd), ("values", q), ("out_bf16", y)):
                    assert_bytes_equal(got[name], theirs.view(got[name].dtype), f"norm_cast {sf} {name}, {tuple(x.shape)}")
                assert_sf_matches_tile_kernels(got["sf"], qsf, hidden // 32, f"norm_cast {sf} sf, {tuple(x.shape)}")


def test_norm_calls_at_unbuilt_widths_warn_once_and_run(seed, monkeypatch):
    from tkaot._quant import norm as _norm
    from tkaot._quant import norm_cast as _norm_cast

    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(_norm._NORM, "cache", {})
    monkeypatch.setattr(_norm_cast._NORM_CAST, "cache", {})
    x = norm_input((4097, 2880), torch.bfloat16)
    w = torch.randn(2880, device="cuda").to(torch.bfloat16)
    with pytest.warns(GenericVariantWarning, match="tkaot-build build --op rmsnorm --set hidden=2880"):
        tkaot.quant.norm_forward(x, w, 1e-6)
    with pytest.warns(GenericVariantWarning, match="tkaot-build build --op norm_cast --set hidden=2880"):
        tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32)


# ---- the per-block, per-channel and lossless casts (hidden, blocks and sf layouts at run time) ----

BLOCK_TOKENS = [1, 3, 127, 128, 4097]
BLOCK_WIDTHS = (128, 640, 3200, 7168, 16512)  # 3200 and 16512: widths no specialised variant has
BLOCK_SIZES = [(32, 32), (32, 128), (128, 32), (128, 128)]


def generic_table(kernel: str) -> list[dict]:
    return shapeset_variants(kernel)


def forget_block_casts(monkeypatch):
    monkeypatch.setattr(_op, "_WARNED", set())
    for kernels in (*_casts._PER_BLOCK.values(), _casts._PER_CHANNEL, _weight_casts._LOSSLESS, *_casts._CAST_BACK.values()):
        monkeypatch.setattr(kernels, "cache", {})


def run_per_block(x, fmt: str, block, kind: str, layout: str, mode: str) -> dict:
    """The per-block op of `mode` into poisoned outputs (the precomputed sf: the reference's of x); what it wrote."""
    flags = dict(round_sf=kind in ("pow2", "ue8m0"), use_packed_ue8m0=kind == "ue8m0", use_tma_aligned_col_major_sf=layout == "col")
    tokens, hidden = x.shape
    cols = hidden // 2 if fmt == "e2m1" else hidden
    out_x = poisoned_like(torch.empty(tokens, cols, dtype=torch.int8 if fmt == "e2m1" else torch.float8_e4m3fn, device="cuda"))
    if mode == "precomputed_sf":
        _, sf = ref.per_block_cast(x, fmt, block, round_sf=kind == "pow2")
        return {"x": tkaot.quant.per_block_cast_with_precomputed_sf(x, fmt, block, sf, round_sf=kind == "pow2", out=out_x)}
    out_sf = poisoned_sf(-(-tokens // block[0]), hidden // block[1], kind, layout)
    if mode == "sf_only":
        return {"sf": tkaot.quant.per_block_cast_with_sf_only(x, fmt, block, **flags, out_sf=out_sf)}
    data, sf = tkaot.quant.per_block_cast(x, fmt, block, **flags, out=(out_x, out_sf))
    return {"x": data, "sf": sf}


def reference_per_block(x, fmt: str, block, kind: str, layout: str, mode: str) -> dict:
    flags = dict(round_sf=kind in ("pow2", "ue8m0"), use_packed_ue8m0=kind == "ue8m0", use_tma_aligned_col_major_sf=layout == "col")
    if mode == "precomputed_sf":
        _, sf = ref.per_block_cast(x, fmt, block, round_sf=kind == "pow2")
        return {"x": ref.per_block_cast_with_precomputed_sf(x, fmt, block, sf, round_sf=kind == "pow2")}
    data, sf = ref.per_block_cast(x, fmt, block, **flags)
    return {"sf": sf} if mode == "sf_only" else {"x": data, "sf": sf}


def assert_all_equal(got: dict, want: dict, what: str):
    torch.cuda.synchronize()
    assert set(got) == set(want), what
    for name in want:
        assert_bytes_equal(got[name], want[name], f"{name}, {what}")


@pytest.mark.parametrize("v", shapeset_variants("per_block_cast"), ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_generic_per_block_cast_writes_the_bytes_of_the_specialised_variant(seed, v):
    block = (v["block_m"], v["block_k"])
    for tokens in BLOCK_TOKENS:
        x = make_input(tokens, v["hidden"], getattr(torch, v["in_dtype"]))
        want = run_per_block(x, v["fmt"], block, v["sf"], v["sf_layout"], v["mode"])
        with on_generic("per_block_cast"):
            got = run_per_block(x, v["fmt"], block, v["sf"], v["sf_layout"], v["mode"])
        assert_all_equal(got, want, f"{tokens} tokens")


@pytest.mark.parametrize("v", generic_table("per_block_cast_generic"), ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_generic_per_block_cast_matches_the_reference_at_any_width(seed, v):
    """Every generic per-block variant, with every block and sf layout its mode takes, at widths with and without
    specialised variants, odd token counts, poisoned outputs."""
    layouts = ("row",) if v["mode"] == "precomputed_sf" else ("row", "col")
    for block, layout, hidden, tokens in itertools.product(BLOCK_SIZES, layouts, BLOCK_WIDTHS, BLOCK_TOKENS):
        if tokens == 4097 and hidden > 7168:
            continue
        x = make_input(tokens, hidden, getattr(torch, v["in_dtype"]))
        with on_generic("per_block_cast"):
            got = run_per_block(x, v["fmt"], block, v["sf"], layout, v["mode"])
        assert_all_equal(got, reference_per_block(x, v["fmt"], block, v["sf"], layout, v["mode"]), f"{block} {layout} {tokens}x{hidden}")


def per_channel_input(tokens: int, hidden: int, in_dtype: str, in_block: str, in_sf: str):
    """x for per_channel_cast: bf16 / fp32, or a (data, sf) pair of per-token E4M3 in 1 x 32 / 1 x 128 blocks; and
    num_per_channels."""
    if in_dtype != "e4m3":
        return make_input(tokens, hidden, getattr(torch, in_dtype)), None
    bk = int(in_block.split("x")[1])
    kind, _, col = in_sf.partition("_")
    return ref.block_cast(make_input(tokens, hidden, torch.bfloat16), "e4m3", (1, bk), sf_kind=kind, col_major_sf=bool(col)), bk


def run_per_channel(x, group, block_m: int, kind: str) -> dict:
    """per_channel_cast's outputs, allocated poisoned (the op takes no out buffers)."""
    with poisoned_allocations():
        data, sf = tkaot.quant.per_channel_cast(x, "e4m3", block_m, round_sf=kind != "fp32", num_per_channels=group,
                                                use_packed_ue8m0=kind == "ue8m0")  # fmt: skip
    return {"x": data, "sf": sf}


@pytest.mark.parametrize("v", shapeset_variants("per_channel_cast"), ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_generic_per_channel_cast_writes_the_bytes_of_the_specialised_variant(seed, v):
    for tokens in BLOCK_TOKENS:
        x, group = per_channel_input(tokens, v["hidden"], v["in_dtype"], v["in_block"], v["in_sf"])
        want = run_per_channel(x, group, v["block_m"], v["sf"])
        with on_generic("per_channel_cast"):
            got = run_per_channel(x, group, v["block_m"], v["sf"])
        assert_all_equal(got, want, f"{tokens} tokens")


@pytest.mark.parametrize("v", generic_table("per_channel_cast_generic"), ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_generic_per_channel_cast_matches_the_reference_at_any_width(seed, v):
    in_blocks = ("1x32", "1x128") if v["in_dtype"] == "e4m3" else ("none",)
    for in_block, block_m, hidden, tokens in itertools.product(in_blocks, (32, 128), BLOCK_WIDTHS, BLOCK_TOKENS):
        if tokens == 4097 and hidden > 7168:
            continue
        x, group = per_channel_input(tokens, hidden, v["in_dtype"], in_block, v["in_sf"])
        with on_generic("per_channel_cast"):
            got = run_per_channel(x, group, block_m, v["sf"])
        kind = v["sf"]
        flags = dict(round_sf=kind != "fp32", num_per_channels=group, use_packed_ue8m0=kind == "ue8m0")
        data, sf = ref.per_channel_cast(x, "e4m3", block_m, **flags)
        assert_all_equal(got, {"x": data, "sf": sf}, f"{in_block} m={block_m} {tokens}x{hidden}")


LOSSLESS_IN = [tuple(int(n) for n in b.split("x")) for b in ("1x16", "1x32", "1x64", "1x128", "32x32", "128x128")]
LOSSLESS_OUT = [tuple(int(n) for n in b.split("x")) for b in ("1x16", "1x32", "1x64", "1x128", "32x32", "32x128", "128x32", "128x128")]


def run_lossless(pair, in_block, out_block, sf: str, layout: str) -> dict:
    flags = dict(use_tma_aligned_col_major_sf=layout == "col", round_sf=sf == "ue8m0", use_packed_ue8m0=sf == "ue8m0")
    with poisoned_allocations():
        data, out_sf = tkaot.quant.per_block_cast_lossless(pair, "e4m3", in_block, out_block, **flags)
    return {"x": data, "sf": out_sf}


@pytest.mark.parametrize("spread", [11, 20])  # 20: shifts below the table's -5 reach the fp32 path (values unchecked)
def test_generic_lossless_writes_the_bytes_of_the_specialised_variant(seed, monkeypatch, spread):
    from tests.gpu.test_weight_casts_gpu import random_fp4

    monkeypatch.setattr(_weight_casts, "_values_unchecked", lambda: True)
    for v in shapeset_variants("per_block_cast_lossless"):
        in_block, out_block = (tuple(int(n) for n in v[k].split("x")) for k in ("in_block", "out_block"))
        for tokens in (1, 127, 128, 300, 1031):
            pair, _ = random_fp4(tokens, v["hidden"], in_block, v["in_sf"], spread)
            want = run_lossless(pair, in_block, out_block, v["sf"], v["sf_layout"])
            with on_generic("per_block_cast_lossless"):
                got = run_lossless(pair, in_block, out_block, v["sf"], v["sf_layout"])
            assert_all_equal(got, want, f"{v} {tokens} tokens")


@pytest.mark.parametrize("v", generic_table("per_block_cast_lossless_generic"), ids=lambda v: ",".join(f"{k}={v[k]}" for k in v))
def test_generic_lossless_matches_the_reference_at_any_width(seed, v):
    from tests.gpu.test_weight_casts_gpu import random_fp4

    for in_block, out_block, layout in itertools.product(LOSSLESS_IN, LOSSLESS_OUT, ("row", "col")):
        if out_block[0] % in_block[0] or out_block[1] % in_block[1]:
            continue
        for hidden, tokens in itertools.product((128, 640, 3200), (1, 127, 300)):
            pair, _ = random_fp4(tokens, hidden, in_block, v["in_sf"])
            with on_generic("per_block_cast_lossless"):
                got = run_lossless(pair, in_block, out_block, v["sf"], layout)
            flags = dict(use_tma_aligned_col_major_sf=layout == "col", round_sf=v["sf"] == "ue8m0", use_packed_ue8m0=v["sf"] == "ue8m0")
            data, sf = ref.per_block_cast_lossless(pair, "e4m3", in_block, out_block, **flags)
            assert_all_equal(got, {"x": data, "sf": sf}, f"{in_block} -> {out_block} {layout} {tokens}x{hidden}")


# The parity run's calls that once found no variant (issue 15), against TileKernels where it runs here (its
# per-block casts take multiples of 128 tokens)
ONCE_MISSING_BLOCK_CASTS = [
    ("per_block_cast", 5888, torch.float32, "e4m3", (128, 128), "fp32", "col"),
    ("per_block_cast", 14592, torch.bfloat16, "e2m1", (32, 128), "pow2", "row"),
    ("per_block_cast", 8832, torch.float32, "e4m3", (32, 32), "ue8m0", "row"),
    ("per_block_cast", 2048, torch.bfloat16, "e4m3", (128, 32), "pow2", "col"),
    ("per_block_cast_with_sf_only", 7168, torch.float32, "e4m3", (32, 128), "ue8m0", "row"),
    ("per_block_cast_with_sf_only", 14336, torch.bfloat16, "e2m1", (128, 128), "fp32", "col"),
    ("per_block_cast_with_precomputed_sf", 4096, torch.bfloat16, "e4m3", (32, 32), "pow2", "row"),
    ("per_block_cast_with_precomputed_sf", 768, torch.bfloat16, "e4m3", (128, 32), "pow2", "row"),
]


@pytest.mark.parametrize("op, hidden, dtype, fmt, block, kind, layout", ONCE_MISSING_BLOCK_CASTS)
def test_block_casts_once_missing_agree_with_the_reference_and_tile_kernels(seed, monkeypatch, op, hidden, dtype, fmt, block, kind, layout):
    forget_block_casts(monkeypatch)
    mode = {"per_block_cast": "cast", "per_block_cast_with_sf_only": "sf_only"}.get(op, "precomputed_sf")
    tk = tile_kernels()
    for tokens in (128, 384, 4096):
        x = make_input(tokens, hidden, dtype)
        with pytest.warns(GenericVariantWarning, match=f"tkaot-build build --op per_block_cast --set hidden={hidden}"):
            got = run_per_block(x, fmt, block, kind, layout, mode)
        forget_block_casts(monkeypatch)
        assert_all_equal(got, reference_per_block(x, fmt, block, kind, layout, mode), f"{tokens}x{hidden}")
        if tk is None:
            continue
        flags = dict(round_sf=kind in ("pow2", "ue8m0"), use_packed_ue8m0=kind == "ue8m0", use_tma_aligned_col_major_sf=layout == "col")
        if mode == "precomputed_sf":
            _, sf = ref.per_block_cast(x, fmt, block, round_sf=kind == "pow2")
            theirs = {"x": tk.quant.per_block_cast_with_precomputed_sf(x, fmt, block, sf, round_sf=kind == "pow2")}
        elif mode == "sf_only":
            theirs = {"sf": tk.quant.per_block_cast_with_sf_only(x, fmt, block, **flags)}
        else:
            theirs = dict(zip(("x", "sf"), tk.quant.per_block_cast(x, fmt, block, **flags)))
        torch.cuda.synchronize()
        for name in got:
            assert_bytes_equal(got[name], theirs[name].view(got[name].dtype), f"{name}, {tokens}x{hidden}, against TileKernels")


def test_per_channel_and_lossless_casts_once_missing_agree_with_tile_kernels(seed):
    """The parity run's per-channel and lossless misses (issue 15) on the generic variants, against TileKernels."""
    from tests.gpu.test_weight_casts_gpu import random_fp4

    tk = tile_kernels()
    if tk is None:
        pytest.skip("TileKernels is not installed")
    for hidden, in_block, in_sf, block_m, kind in ((4096, "1x128", "ue8m0_col", 32, "fp32"), (5120, "1x32", "ue8m0", 128, "ue8m0"),
                                                   (6272, "1x128", "fp32", 32, "pow2")):  # fmt: skip
        x, group = per_channel_input(384, hidden, "e4m3", in_block, in_sf)
        ours = run_per_channel(x, group, block_m, kind)
        flags = dict(round_sf=kind != "fp32", num_per_channels=group, use_packed_ue8m0=kind == "ue8m0")
        theirs = tk.quant.per_channel_cast(x, "e4m3", block_m, **flags)
        torch.cuda.synchronize()
        assert_bytes_equal(ours["x"], theirs[0].view(ours["x"].dtype), f"per_channel data, {hidden}")
        if kind == "ue8m0":  # 4 blocks' exponents an int32: TileKernels leaves the padding bytes past the last block
            blocks = -(-384 // block_m)  # unwritten (seen on the H200: every 4th byte of 3 blocks a word); ours are 0
            a, b = (t.view(torch.uint8).reshape(t.shape[0], t.shape[1], 4) for t in (ours["sf"], theirs[1]))
            real = (torch.arange(a.shape[0], device=a.device)[:, None, None] * 4 + torch.arange(4, device=a.device)) < blocks
            assert torch.equal(a[real.expand_as(a)], b[real.expand_as(b)]), f"per_channel sf exponents, {hidden}"
            assert not a[~real.expand_as(a)].any(), f"per_channel sf padding, {hidden}"
        else:
            assert_bytes_equal(ours["sf"], theirs[1].view(ours["sf"].dtype), f"per_channel sf, {hidden}")
    for hidden, in_block, in_sf, out_block, kind, layout in (
        (8320, (128, 128), "ue8m0_col", (128, 128), "ue8m0", "row"), (8576, (1, 32), "fp32", (1, 128), "pow2", "col"),
        (10880, (1, 16), "ue8m0", (128, 32), "pow2", "col"), (14464, (32, 32), "fp32", (32, 32), "ue8m0", "row"),
    ):  # fmt: skip
        pair, _ = random_fp4(384, hidden, in_block, in_sf)
        ours = run_lossless(pair, in_block, out_block, kind, layout)
        flags = dict(use_tma_aligned_col_major_sf=layout == "col", round_sf=kind == "ue8m0", use_packed_ue8m0=kind == "ue8m0")
        theirs = tk.quant.per_block_cast_lossless(pair, "e4m3", in_block, out_block, **flags)
        torch.cuda.synchronize()
        assert_bytes_equal(ours["x"], theirs[0].view(ours["x"].dtype), f"lossless data, {hidden}")
        if kind == "ue8m0" and layout == "row":  # packed exponents a row: TileKernels leaves the bytes past the last
            blocks = -(-hidden // out_block[1])  # block unwritten (seen on the H200 at 8320: 65 blocks in 68 bytes)
            a, b = (t.contiguous().view(torch.uint8).reshape(t.shape[0], -1) for t in (ours["sf"], theirs[1]))
            assert_bytes_equal(a[:, :blocks], b[:, :blocks], f"lossless sf exponents, {hidden}")
            assert not a[:, blocks:].any(), f"lossless sf padding, {hidden}"
        else:
            assert_bytes_equal(ours["sf"], theirs[1].view(ours["sf"].dtype), f"lossless sf, {hidden}")


# ---- norm_backward: rmsnorm_backward_generic against the specialised kernel and the reference ----

NORM_BACKWARD_TOKENS = TOKENS + [8191]
# (weight, residual gradient, dtype of a given weight_grad or None, out_scale, x rows strided)
NORM_BACKWARD_CALLS = [
    (True, False, None, 1.0, False),
    (True, True, torch.float32, 0.5, True),
    (True, False, torch.bfloat16, 2.5, False),
    (False, True, None, 1.0, False),
    (False, False, None, 0.75, True),
]


def norm_backward_calls(hidden: int, dtype: torch.dtype, tokens: int, seed: int, spread: int = 8):
    """The calls each test makes at one width and token count: (out_grad, x, weight, rstd, residual_out_grad,
    out_scale, weight_grad). Rows of x scaled by 2**-spread to 2**spread (one all zero); inputs depend on `seed` only.
    Against the reference, a small spread: x_grad is (g - xhat * mean) * rstd, and where g - xhat * mean cancels, the
    two orders of rounding differ by an fp32 ulp of g times rstd, past the fp32 tolerance for rstd far above 1."""
    torch.manual_seed(seed)
    weight = torch.randn(hidden, device="cuda").to(dtype)
    for with_weight, residual, given, out_scale, strided in NORM_BACKWARD_CALLS:
        scale = torch.exp2(torch.randint(-spread, spread + 1, (tokens, 1), device="cuda").float())
        x = (torch.randn(tokens, hidden, device="cuda") * scale).to(dtype)
        x[tokens // 2] = 0
        if strided:  # rows 64 elements apart beyond their width, as a slice of a wider tensor
            x = torch.cat([x, torch.randn(tokens, 64, device="cuda").to(dtype)], dim=1)[:, :hidden]
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        dy = torch.randn(tokens, hidden, device="cuda").to(dtype)
        dr = torch.randn(tokens, hidden, device="cuda").to(dtype) if residual else None
        wg = torch.randn(hidden, device="cuda").to(given) if given is not None else None
        yield dy, x, (weight if with_weight else None), rstd, dr, out_scale, wg


def run_norm_backward(dy, x, weight, rstd, dr, out_scale, wg) -> dict:
    """norm_backward with every allocation poisoned: each tensor it wrote (a given weight_grad is copied first)."""
    with poisoned_allocations():
        x_grad, w_grad = tkaot.quant.norm_backward(dy, x, weight, rstd, dr, out_scale, None if wg is None else wg.clone())
    return {"x_grad": x_grad, **({"weight_grad": w_grad} if weight is not None else {})}


@pytest.mark.parametrize("hidden", NORM_BUILT)
def test_generic_norm_backward_writes_the_bytes_of_the_specialised_variant(seed, hidden):
    """x_grad and weight_grad: the same row dot products and the same partial sums, in the same order."""
    for tokens in NORM_BACKWARD_TOKENS:
        for call in norm_backward_calls(hidden, torch.bfloat16, tokens, seed + tokens):
            want = run_norm_backward(*call)
            with on_generic("rmsnorm_backward"):
                got = run_norm_backward(*call)
            torch.cuda.synchronize()
            for name in want:
                assert_bytes_equal(got[name], want[name], f"{name}, {tokens}x{hidden}")


def check_norm_backward_against_reference(got: dict, call, what: str) -> None:
    from tests.gpu.test_backward_gpu import SUM_TOL, WEIGHT_GRAD_TOL
    from tkaot.reference import backward as backward_ref

    dy, x, weight, rstd, dr, out_scale, wg = call
    x_grad, w_grad = backward_ref.norm_backward(dy, x, weight, rstd, dr, out_scale, wg)
    assert not got["x_grad"].isnan().any(), f"x_grad has unwritten elements, {what}"
    torch.testing.assert_close(got["x_grad"], x_grad, **SUM_TOL[x.dtype], msg=lambda m: f"x_grad, {what}: {m}")
    if weight is not None:
        assert got["weight_grad"].dtype == w_grad.dtype and not got["weight_grad"].isnan().any()
        torch.testing.assert_close(got["weight_grad"].float(), w_grad.float(), **WEIGHT_GRAD_TOL[w_grad.dtype],
                                   msg=lambda m: f"weight_grad, {what}: {m}")  # fmt: skip


def norm_backward_class_edges() -> set[int]:
    """Both ends of each width class of the generic kernel's bodies (the widths whose rows take the same threads,
    norm_backward_tiling), in either dtype: the last width of a class and the first of the next."""
    from tkaot._quant.kernels import norm_backward_tiling

    def threads(h, dtype):
        return norm_backward_tiling(h, dtype)[1]

    return {e for d in ("bfloat16", "float32") for h in range(32, 8192, 32) if threads(h, d) != threads(h + 32, d) for e in (h, h + 32)}


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize(
    "hidden", sorted({h for h in NORM_UNBUILT + NORM_BUILT if h % 32 == 0} | {64, 128, 288, 3168, 7776} | norm_backward_class_edges())
)
def test_generic_norm_backward_matches_the_reference_at_any_width(seed, hidden, dtype):
    """Every call kind (weight, residual gradient, given weight_grad, out_scale, strided rows) at widths of every class
    body, both ends of each class among them."""
    for tokens in NORM_BACKWARD_TOKENS:
        for call in norm_backward_calls(hidden, dtype, tokens, seed + tokens, spread=1):
            with on_generic("rmsnorm_backward"):
                got = run_norm_backward(*call)
            torch.cuda.synchronize()
            check_norm_backward_against_reference(got, call, f"{tokens}x{hidden} {dtype}")


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
def test_generic_norm_backward_at_every_width_from_32_to_8192(seed, dtype):
    """Every width norm_backward takes, a few rows and more rows than a block's slots: all threads-a-row classes,
    every count of partial vectors a thread."""
    for hidden in range(32, 8193, 32):
        for tokens in (3, 300):
            call = next(norm_backward_calls(hidden, dtype, tokens, seed + hidden, spread=1))
            with on_generic("rmsnorm_backward"):
                got = run_norm_backward(*call)
            torch.cuda.synchronize()
            check_norm_backward_against_reference(got, call, f"{tokens}x{hidden} {dtype}")


def test_norm_backward_at_an_unbuilt_width_warns_once_and_runs(seed, monkeypatch):
    from tkaot._quant import norm_backward as _norm_backward

    monkeypatch.setattr(_op, "_WARNED", set())
    monkeypatch.setattr(_norm_backward._PASS1, "cache", {})
    call = next(norm_backward_calls(3168, torch.bfloat16, 127, seed, spread=1))
    with pytest.warns(GenericVariantWarning, match="tkaot-build build --op rmsnorm_backward --set hidden=3168 --set dtype=bfloat16"):
        got = run_norm_backward(*call)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = run_norm_backward(*call)
    torch.cuda.synchronize()
    for name in got:
        assert_bytes_equal(again[name], got[name], name)
    check_norm_backward_against_reference(got, call, "127x3168")
