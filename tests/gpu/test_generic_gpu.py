"""The generic tier on a GPU. The per-token cast: byte for byte what the specialised variants write, the torch
reference's bytes at widths no specialised variant has, and the calls that once found no kernel against TileKernels.
The top-k gate: the specialised variants' indices (ties and NaNs included), the reference's at every expert count.

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
from tests.gpu.test_casts_gpu import assert_bytes_equal, make_input, poisoned_like, poisoned_sf, sf_flags, shapeset_variants
from tests.test_generic import ONCE_MISSING
from tkaot import _op
from tkaot._moe import ops as _moe_ops
from tkaot._quant import casts as _casts
from tkaot.errors import GenericVariantWarning
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
    tables = tomllib.loads(SHAPESET.read_text())["per_token_cast_generic"]
    out = []
    for table in tables:
        values = [v if isinstance(v, list) else [v] for v in table.values()]
        out += [dict(zip(table, combo)) for combo in itertools.product(*values)]
    return out


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
        ours, theirs = tkaot.quant.per_token_cast(x, fmt, 128, **flags), tk.quant.per_token_cast(x, fmt, 128, **flags)
        torch.cuda.synchronize()
        assert_bytes_equal(ours[0], theirs[0].view(ours[0].dtype), f"data, {tokens}x{hidden}")
        assert_bytes_equal(ours[1], theirs[1].view(ours[1].dtype), f"sf, {tokens}x{hidden}")


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
