"""The generic tier on a GPU. The per-token cast: byte for byte what the specialised variants write, the torch
reference's bytes at widths no specialised variant has, and the calls that once found no kernel against TileKernels.
The top-k gate: the specialised variants' indices (ties and NaNs included), the reference's at every expert count.

Every output is poisoned (0xFF bytes) first, so an element either kernel leaves unwritten shows. `on_generic`
hides the specialised per_token_cast variants from the registry, so the same call runs on the generic one.
"""

import itertools
import math
import sys
from pathlib import Path

import pytest
import torch

import tkaot
from bench.generic import on_generic
from tests.gpu.test_casts_gpu import assert_bytes_equal, dense, make_input, poisoned_like, poisoned_sf, sf_flags, shapeset_variants
from tests.test_generic import ONCE_MISSING
from tkaot import _op
from tkaot._moe import ops as _moe_ops
from tkaot._quant import casts as _casts
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
    out_sf = poisoned_sf(tokens, hidden // group, kind, layout)
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
    scale = ref.expand_blocks(ref.sf_to_float(sf)[:, : hidden // v["group"]], (1, v["group"]), x.shape)
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


@pytest.mark.parametrize(("hidden", "args", "kwargs"), ONCE_MISSING, ids=lambda p: str(p))
def test_calls_once_missing_run_and_agree_with_the_reference_and_tile_kernels(seed, monkeypatch, hidden, args, kwargs):
    monkeypatch.setattr(_op, "_WARNED", set())
    x = make_input(4097, hidden, torch.bfloat16)
    with pytest.warns(GenericVariantWarning, match="tkaot-build build --op per_token_cast --set hidden="):
        data, sf = tkaot.quant.per_token_cast(x, *args, **kwargs)
    want = ref.per_token_cast(x, *args, **kwargs)
    assert_bytes_equal(data, want[0], "data")
    assert_bytes_equal(sf, want[1], "sf")
    try:
        import tile_kernels as tk
    except Exception:  # not installed, or no TileLang here
        return
    theirs = tk.quant.per_token_cast(x, *args, **kwargs)
    torch.cuda.synchronize()
    assert_bytes_equal(data, theirs[0].view(data.dtype), "data, against TileKernels")
    assert_bytes_equal(sf, theirs[1].view(sf.dtype), "sf, against TileKernels")


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
    tables = tomllib.loads(FUSED_SHAPESET.read_text())["swiglu"]
    out = []
    for table in tables:
        values = [v if isinstance(v, list) else [v] for v in table.values()]
        out += [dict(zip(table, combo)) for combo in itertools.product(*values)]
    return out


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
