"""MoE routing on the CPU: real builds of two variants and their generic ones and their LaunchSpecs, input
validation before any launch (meta tensors stand in for CUDA ones), the calls without a specialised variant
resolving to the generic one (fake driver), and the pure-torch references checked against plain per-token
formulations written independently here."""

import inspect
import json
import math
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import tkaot
from build_tools.ops import Variant
from tests.helpers import build_by_kernel, serve_ops
from tests.test_launcher import SIZES, driver  # noqa: F401 (driver: the fake driver fixture)
from tkaot._decl import generic_kernel
from tkaot._kernel import Kernel
from tkaot._moe import ops as moe_ops
from tkaot._spec import LaunchSpec
from tkaot.errors import NoGPUError
from tkaot.reference import moe as ref

BUILT = [
    Variant.make("moe_topk_gate", dict(num_experts=256, num_topk=8, tiling=moe_ops._GATE_TILING)),
    Variant.make("moe_topk_gate_generic", dict(tiling=moe_ops._GATE_TILING)),
    Variant.make("normalize_weight", dict(num_topk=9)),
    Variant.make("normalize_weight_generic", {}),
]
API = Path(__file__).resolve().parent / "data" / "tile_kernels_2.1.0_api.json"


@pytest.fixture(scope="module")
def built(tmp_path_factory, build_cache):
    return build_by_kernel(tmp_path_factory.mktemp("moe-art"), BUILT, build_cache)


def bound(out: Path, entry: dict, args: tuple[str, ...]):
    spec = LaunchSpec.from_json(entry["launch"])
    kernel = Kernel(entry["kernel"], entry["key"], spec, out / "cubins" / f"{entry['cubin']}.cubin", entry["cubin"], "test")
    return spec, kernel.bind(args)  # raises unless the op supplies every kernel parameter


def test_gate_launch_spec(built):
    out, entries = built
    spec, _ = bound(out, entries["moe_topk_gate"], moe_ops._GATE.args)
    types = {p.name: p.type for p in spec.params}
    # every optional tensor stays a kernel parameter: options are runtime flags, not variants
    for name in ("logits", "bias", "image_bias", "mask", "force_random", "to_physical_map", "unmapped_topk_idx", "scores"):
        assert types[name] == "ptr"
    assert {"flags": "i32", "ep_rank": "i32", "routed_scaling_factor": "f32", "num_physical_topk": "i32"}.items() <= types.items()
    assert spec.grid == ("((num_tokens + 3) // 4)", "1", "1") and spec.block == (128, 1, 1) and spec.smem == 0
    assert spec.symbol.encode() in (out / "cubins" / f"{entries['moe_topk_gate']['cubin']}.cubin").read_bytes()


def test_normalize_launch_spec(built):
    out, entries = built
    spec, _ = bound(out, entries["normalize_weight"], moe_ops._NORMALIZE.args)
    assert [p.name for p in spec.params if p.type == "ptr"] == ["denominator", "normalized_weights", "topk_weights"]
    assert spec.grid == ("((num_tokens + 127) // 128)", "1", "1")


def test_generic_launch_specs_take_the_sizes_at_run_time(built):
    out, entries = built
    for kernel, ops in (("moe_topk_gate", moe_ops._GATE), ("normalize_weight", moe_ops._NORMALIZE)):
        generic = generic_kernel(kernel)
        spec, _ = bound(out, entries[generic.name], ops.args + tuple(a.name for a in generic.runtime_axes))
        special = LaunchSpec.from_json(entries[kernel]["launch"])
        runtime = {a.name for a in generic.runtime_axes}
        assert [p for p in spec.params if p.name not in runtime] == list(special.params), kernel
        assert {p.name: p.type for p in spec.params if p.name in runtime} == dict.fromkeys(runtime, "i32")
        assert (spec.grid, spec.block, spec.smem) == (special.grid, special.block, special.smem)
        assert (
            spec.symbol == f"{generic.name}_kernel"
            and spec.symbol.encode() in (out / "cubins" / f"{entries[generic.name]['cubin']}.cubin").read_bytes()
        )


def test_shapeset_lists_the_default_models():
    from build_tools.sweep import read_shapeset, resolve_shapeset, sweep

    keys = {(v.kernel, v.key) for v in sweep(read_shapeset(resolve_shapeset("moe")))}
    for experts, topk in ((256, 8), (128, 8), (64, 6), (64, 8)):
        assert ("moe_topk_gate", f"num_experts={experts},num_topk={topk},tiling={moe_ops._GATE_TILING}") in keys
        assert ("topk_gate", f"num_experts={experts},num_topk={topk},tiling={moe_ops._TOPK_TILING}") in keys
    # the generic tier: one variant a kernel
    generic = {("moe_topk_gate_generic", f"tiling={moe_ops._GATE_TILING}"), ("topk_gate_generic", f"tiling={moe_ops._TOPK_TILING}")}
    assert generic | {("normalize_weight_generic", "")} <= keys
    assert sum(kernel.endswith("_generic") for kernel, _ in keys) == 3


def test_axes_refuse_unsupported_shapes():
    with pytest.raises(ValueError, match="multiple of 4"):
        Variant.make("moe_topk_gate", dict(num_experts=66, num_topk=8, tiling="ballot4"))
    with pytest.raises(ValueError, match="num_topk"):
        Variant.make("moe_topk_gate", dict(num_experts=256, num_topk=33, tiling="ballot4"))
    with pytest.raises(ValueError, match="multiple of 4"):
        Variant.make("moe_topk_gate", dict(num_experts=0, num_topk=1, tiling="ballot4"))
    Variant.make("moe_topk_gate", dict(num_experts=4, num_topk=4, tiling="ballot4"))  # as TileKernels: any multiple of 4


# ---- validation -------------------------------------------------------------------------------


# fake_cuda (tests/conftest.py) lets meta tensors stand in for CUDA ones


def meta(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta")


GATE = dict(num_topk=8, use_shared_as_routed=True, num_shared_experts=1, routed_scaling_factor=2.5, ep_rank=0)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(logits=meta(4, 256, dtype=torch.bfloat16)), ValueError, "logits must be torch.float32"),
        (dict(logits=meta(256)), ValueError, "logits must be 2-D"),
        (dict(logits=meta(4, 66)), ValueError, "multiple of 4 in \\[4, 512\\] experts, got 66"),
        (dict(logits=meta(4, 0)), ValueError, "multiple of 4 in \\[4, 512\\] experts, got 0"),
        (dict(logits=meta(4, 4)), ValueError, "num_topk must be in \\[1, 4\\], got 8"),
        (dict(logits=meta(4, 1024)), ValueError, "got 1024"),
        (dict(logits=meta(4, 512)[:, :256]), ValueError, "logits must be contiguous"),
        (dict(num_topk=0), ValueError, "num_topk must be in \\[1, 32\\], got 0"),
        (dict(num_topk=8.0), TypeError, "num_topk must be an int, got float"),
        (dict(num_topk=32), ValueError, "num_topk \\+ num_shared_experts must be at most 32, got 33"),
        (dict(num_shared_experts=3), ValueError, "num_shared_experts must be in \\[1, 2\\], got 3"),
        (dict(num_shared_experts=0), ValueError, "num_shared_experts must be in \\[1, 2\\], got 0"),
        (dict(ep_rank=-1), ValueError, "ep_rank must be in"),
        (dict(scoring_func="softmax"), ValueError, "scoring_func must be 'sqrtsoftplus', got 'softmax'"),
        (dict(mask=meta(5, dtype=torch.bool)), ValueError, "mask must be of 4 elements"),
        (dict(mask=meta(4, dtype=torch.int32)), ValueError, "mask must be torch.bool"),
        (dict(bias=meta(128)), ValueError, "bias must be of shape \\(256,\\), got \\(128,\\)"),
        (dict(bias=meta(256, dtype=torch.bfloat16)), ValueError, "bias must be torch.float32"),
        (dict(image_bias=meta(256)), ValueError, "image_bias needs image_token_mask"),
        (dict(image_token_mask=meta(4, dtype=torch.bool)), ValueError, "image_token_mask needs image_bias"),
        (dict(image_bias=meta(256), image_token_mask=meta(3, dtype=torch.bool)), ValueError, "image_token_mask must be of shape"),
        (dict(fix_routing_mask=meta(4, dtype=torch.bool)), ValueError, "fix_routing_mask needs unmapped_topk_idx"),
        (dict(unmapped_topk_idx=meta(4, 9, dtype=torch.int64)), ValueError, "unmapped_topk_idx must be of shape \\(4, 8\\)"),
        (dict(unmapped_topk_idx=meta(4, 8, dtype=torch.int32)), ValueError, "unmapped_topk_idx must be torch.int64"),
        (dict(unmapped_topk_idx=meta(8, 4, dtype=torch.int64).t()), ValueError, "column stride 1"),
        (dict(to_physical_map=meta(257, 2, dtype=torch.int32)), ValueError, "to_physical_map needs logical_count"),
        (
            dict(to_physical_map=meta(256, 2, dtype=torch.int32), logical_count=meta(256, dtype=torch.int32)),
            ValueError,
            "to_physical_map must be of shape \\(257, 2\\), got \\(256, 2\\)",
        ),
        (
            dict(to_physical_map=meta(257, 2, dtype=torch.int64), logical_count=meta(257, dtype=torch.int32)),
            ValueError,
            "to_physical_map must be torch.int32",
        ),
        (
            dict(to_physical_map=meta(257, 2, dtype=torch.int32), logical_count=meta(256, dtype=torch.int32)),
            ValueError,
            "logical_count must be of shape \\(257,\\)",
        ),
        (dict(force_random=meta(4, dtype=torch.uint8)), ValueError, "force_random must be torch.bool"),
        (dict(scores=meta(4, 128)), ValueError, "scores must be of shape \\(4, 256\\)"),
        (dict(out=(meta(4, 8, dtype=torch.int64), meta(4, 9))), ValueError, "out\\[0\\] \\(topk_idx\\) must be of shape \\(4, 9\\)"),
        (dict(out=(meta(4, 9, dtype=torch.int64), meta(4, 9, dtype=torch.float16))), ValueError, "out\\[1\\] \\(topk_weights\\) must be"),
        (dict(out=meta(4, 9)), TypeError, "out must be None or a \\(topk_idx, topk_weights\\) pair"),
        (dict(bias=torch.zeros(256)), ValueError, "bias must be on the device of logits, got a tensor on cpu"),
        (dict(logits=[0.0] * 256), TypeError, "logits must be a torch.Tensor, got list"),
        (dict(logits=meta(2**26, 256)), ValueError, "logits must be of fewer than 67108864 tokens, got 67108864"),
        (dict(num_shared_experts=1.0), TypeError, "num_shared_experts must be an int, got float"),
        (dict(ep_rank=True), TypeError, "ep_rank must be an int, got bool"),
        (dict(logical_count=meta(257, dtype=torch.int32)), ValueError, "logical_count needs to_physical_map; give both or neither"),
        (
            dict(to_physical_map=meta(257, dtype=torch.int32), logical_count=meta(257, dtype=torch.int32)),
            ValueError,
            "to_physical_map must be 2-D \\(experts \\+ shared slots, duplicates\\), got shape \\(257,\\)",
        ),
        (
            dict(force_random=meta(3, 1, dtype=torch.bool)),
            ValueError,
            "force_random must be of 4 elements \\(one per token\\), got 3 \\(shape \\(3, 1\\)\\)",
        ),
    ],
)
def test_gate_bad_inputs_raise_before_launch(fake_cuda, change, error, match):
    kwargs = dict(GATE, logits=meta(4, 256)) | change
    with pytest.raises(error, match=match):
        tkaot.moe.moe_topk_gate_forward(**kwargs)


def test_gate_valid_input_reaches_the_registry(fake_cuda):
    everything = dict(
        mask=meta(4, 1, dtype=torch.bool),  # any shape with one element per token, as TileKernels allows
        bias=meta(256),
        image_bias=meta(256),
        image_token_mask=meta(4, dtype=torch.bool),
        fix_routing_mask=meta(4, dtype=torch.bool),
        unmapped_topk_idx=meta(4, 16, dtype=torch.int64)[:, :8],  # a row stride is allowed
        to_physical_map=meta(257, 3, dtype=torch.int32),
        logical_count=meta(257, dtype=torch.int32),
        force_random=meta(4, dtype=torch.bool),
        scores=meta(4, 256),
        out=(meta(4, 9, dtype=torch.int64), meta(4, 9)),
    )
    with pytest.raises(NoGPUError):
        tkaot.moe.moe_topk_gate_forward(meta(4, 256), **GATE, **everything)
    with pytest.raises(NoGPUError):
        tkaot.moe.moe_topk_gate(meta(4, 64), 6, False, 0, 1.0, 3)  # shared count ignored when not used


def test_gate_without_tokens_launches_nothing(fake_cuda):
    topk_idx, topk_weights = tkaot.moe.moe_topk_gate_forward(meta(0, 256), **GATE)
    assert topk_idx.shape == (0, 9) and topk_idx.dtype == torch.int64 and topk_weights.dtype == torch.float32


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: tkaot.moe.topk_gate(meta(4, 256, dtype=torch.float16), 8), "scores must be torch.float32"),
        (lambda: tkaot.moe.topk_gate(meta(4, 600), 8), "of 1 to 512 experts, got 600"),
        (lambda: tkaot.moe.topk_gate(meta(4, 6), 8), "num_topk must be in \\[1, 6\\], got 8"),
        (lambda: tkaot.moe.topk_gate(meta(4, 512)[:, :256], 8), "scores must be contiguous"),
        (lambda: tkaot.moe.normalize_weight(meta(4, 33)), "of 1 to 32 weights a token, got 33"),
        (lambda: tkaot.moe.normalize_weight(meta(8, 4).t()), "topk_weights must be contiguous"),
        (lambda: tkaot.moe.normalize_weight(meta(4, 8, dtype=torch.float64)), "topk_weights must be torch.float32"),
        (lambda: tkaot.moe.normalize_weight(meta(32)), "topk_weights must be 2-D \\(num_tokens, num_topk\\), got shape \\(32,\\)"),
        (lambda: tkaot.moe.topk_gate(meta(4, 0), 1), "scores must be of 1 to 512 experts, got 0"),
    ],
)
def test_topk_and_normalize_bad_inputs(fake_cuda, call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_topk_gate_num_topk_must_be_an_int(fake_cuda):
    with pytest.raises(TypeError, match="num_topk must be an int, got float"):
        tkaot.moe.topk_gate(meta(4, 8), 4.0)


def test_topk_and_normalize_valid_inputs_reach_the_registry(fake_cuda):
    with pytest.raises(NoGPUError):
        tkaot.moe.topk_gate(meta(4, 8), 4)
    with pytest.raises(NoGPUError):
        tkaot.moe.normalize_weight(meta(4, 9))


def test_signatures_match_tile_kernels():
    if not API.exists():
        pytest.skip("TileKernels API list not present")
    api = json.loads(API.read_text())
    for name in ("moe_topk_gate_forward", "topk_gate", "normalize_weight"):
        assert list(inspect.signature(getattr(tkaot.moe, name)).parameters) == api[f"moe.{name}"]["params"], name
    defaults = {p.name: p.default for p in inspect.signature(tkaot.moe.moe_topk_gate_forward).parameters.values()}
    assert defaults["scoring_func"] == "sqrtsoftplus" and defaults["mask"] is None and defaults["scores"] is None


# ---- references against plain formulations ----------------------------------------------------


def philox_any(counter, key):
    """Philox4x32-10 on Python ints, written from the published round function."""
    c, k = list(counter), list(key)
    for _ in range(10):
        lo0, lo1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(lo1 >> 32) ^ c[1] ^ k[0], lo1 & 0xFFFFFFFF, (lo0 >> 32) ^ c[3] ^ k[1], lo0 & 0xFFFFFFFF]
        k = [(k[0] + 0x9E3779B9) & 0xFFFFFFFF, (k[1] + 0xBB67AE85) & 0xFFFFFFFF]
    return c


def test_philox_known_answers():
    # Random123's known-answer vectors for philox4x32-10
    assert philox_any([0] * 4, [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox_any([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    pi = philox_any([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0])
    assert pi == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    sub = np.array([0, 1, 5, 2**26 + 31])
    r0, r1 = ref.philox_first_two(7, sub)
    for s, a, b in zip(sub, r0, r1):
        assert philox_any([0, 0, int(s), 0], [7, 0])[:2] == [int(a), int(b)]


def lanes_random_route(token: int, slots: int, experts: int, ep_rank: int):
    """The random route as a warp computes it, lane by lane, on Python ints."""
    lanes = range(32)
    draws = [philox_any([0, 0, token * 32 + lane, 0], [ep_rank, 0])[:2] for lane in lanes]
    big = 2**31 - 1
    pending = [draws[lane][1] % (experts - lane) if lane < slots else big for lane in lanes]
    chosen = [-1 if lane < slots else big for lane in lanes]
    for _ in range(slots):
        low = min(pending)
        low_lane = min(lane for lane in lanes if pending[lane] == low)
        for lane in lanes:
            if chosen[lane] == -1:
                if pending[lane] >= low and low_lane < lane:
                    pending[lane] += 1
                elif low_lane == lane:
                    chosen[lane], pending[lane] = pending[lane], big
    weights = [np.float32(draws[lane][0]) * np.float32(2.0**-32) + np.float32(2.0**-33) for lane in range(slots)]
    return chosen[:slots], weights


@pytest.mark.parametrize("slots, experts, ep_rank", [(9, 257, 0), (8, 64, 3), (18, 300, 12345)])
def test_random_route_matches_lane_simulation(slots, experts, ep_rank):
    tokens = torch.tensor([0, 1, 2, 77, 4096])
    idx, weights = ref.random_route(tokens, slots, experts, ep_rank)
    for row, token in enumerate(tokens.tolist()):
        want_idx, want_w = lanes_random_route(token, slots, experts, ep_rank)
        assert idx[row].tolist() == want_idx
        assert weights[row].tolist() == [float(w) for w in want_w]
        assert len(set(want_idx)) == slots and all(0 <= i < experts for i in want_idx)
        assert all(0 < w <= 1 for w in want_w)


def plain_gate(logits, num_topk, num_shared, scale, ep_rank, **opt):
    """Per-token, per-expert loops; sums in float64 (the tests allow for the order)."""
    num_tokens, num_experts = logits.shape
    slots = num_topk + num_shared
    rows_idx, rows_w, rows_unmapped, rows_scores = [], [], [], []
    for t in range(num_tokens):
        x = logits[t].tolist()
        s = [math.sqrt(v if v > 20 else math.log1p(math.exp(v))) for v in x]
        if opt.get("mask") is not None and not bool(opt["mask"].reshape(-1)[t]):
            rows_idx.append([-1] * slots), rows_w.append([0.0] * slots)
            rows_unmapped.append([-1] * num_topk), rows_scores.append([0.0] * num_experts)
            continue
        if opt.get("force_random") is not None and bool(opt["force_random"][t]):
            rows_idx.append(None), rows_w.append(None)
            rows_unmapped.append([-1] * num_topk), rows_scores.append([0.0] * num_experts)
            continue
        scores32 = ref.sqrt_softplus(logits[t]).tolist()  # ranking needs the fp32 values' exact ties
        shift = [0.0] * num_experts
        if opt.get("bias") is not None:
            shift = opt["bias"].tolist()
        if opt.get("image_token_mask") is not None and bool(opt["image_token_mask"][t]):
            shift = opt["image_bias"].tolist()
        key = (torch.tensor(scores32) + torch.tensor(shift)).tolist()
        if opt.get("fix_routing_mask") is not None and bool(opt["fix_routing_mask"][t]):
            chosen = opt["unmapped_topk_idx"][t].tolist()
        else:
            chosen = sorted(range(num_experts), key=lambda e: (-key[e], e))[:num_topk]
        picked = [s[e] if 0 <= e < num_experts else 0.0 for e in chosen]
        total = sum(picked) + 1e-20
        rows_unmapped.append(chosen)
        rows_scores.append(s)
        idx = chosen + list(range(num_experts, num_experts + num_shared))
        w = [p / total * scale for p in picked] + [1.0] * num_shared
        if opt.get("to_physical_map") is not None:
            count, table = opt["logical_count"].tolist(), opt["to_physical_map"].tolist()
            idx = [table[e][(ep_rank + t * 23333) % max(count[e], 1)] if 0 <= e < len(count) else e for e in idx]
        rows_idx.append(idx), rows_w.append(w)
    return rows_idx, rows_w, rows_unmapped, rows_scores


def gate_inputs(num_tokens, num_experts, num_topk, num_shared, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g) * 2
    logits[:, 1::7] = logits[:, 0:1]  # exact ties inside every row
    logits[0, :] = 0.5  # a row of nothing but ties
    if num_tokens > 2:
        logits[2, 3] = 30.0  # the linear branch of softplus
    bias = torch.randn(num_experts, generator=g) * 0.1
    bias[1::7] = bias[0]  # keep the ties after the bias
    logical = num_experts + num_shared
    count = torch.randint(1, 4, (logical,), generator=g, dtype=torch.int32)
    table = torch.randint(0, 1000, (logical, 3), generator=g, dtype=torch.int32)
    fixed = torch.stack([torch.randperm(num_experts, generator=g)[:num_topk] for _ in range(num_tokens)])
    fixed[-1, 0] = -1  # an index outside the experts: weight 0, passed through
    return dict(
        logits=logits,
        mask=torch.rand(num_tokens, generator=g) > 0.2,
        bias=bias,
        image_bias=torch.randn(num_experts, generator=g) * 0.1,
        image_token_mask=torch.rand(num_tokens, generator=g) > 0.5,
        fix_routing_mask=torch.rand(num_tokens, generator=g) > 0.6,
        unmapped_topk_idx=fixed,
        to_physical_map=table,
        logical_count=count,
        force_random=torch.rand(num_tokens, generator=g) > 0.7,
    )


OPTION_SETS = [
    (),
    ("bias",),
    ("mask", "bias", "image_bias", "image_token_mask"),
    ("bias", "fix_routing_mask", "unmapped_topk_idx"),
    ("to_physical_map", "logical_count"),
    ("mask", "bias", "fix_routing_mask", "unmapped_topk_idx", "to_physical_map", "logical_count", "force_random"),
]


@pytest.mark.parametrize("options", OPTION_SETS)
@pytest.mark.parametrize("num_experts, num_topk, num_shared", [(64, 6, 0), (256, 8, 1), (128, 8, 2), (4, 4, 2), (8, 2, 1), (60, 4, 0)])
def test_gate_reference_matches_plain_loops(options, num_experts, num_topk, num_shared):
    inputs = gate_inputs(13, num_experts, num_topk, num_shared, seed=num_experts + len(options))
    opt = {k: inputs[k] for k in options}
    if "unmapped_topk_idx" not in opt and "force_random" in opt:
        opt["unmapped_topk_idx"] = inputs["unmapped_topk_idx"]
    logits = inputs["logits"]
    got = ref.moe_topk_gate_forward(logits, num_topk, num_shared > 0, num_shared, 2.5, 3, **opt)
    want_idx, want_w, want_unmapped, want_scores = plain_gate(logits, num_topk, num_shared, 2.5, 3, **opt)
    slots = num_topk + num_shared
    assert got.topk_idx.shape == (13, slots) and got.topk_idx.dtype == torch.int64
    assert got.topk_weights.dtype == torch.float32
    for t in range(13):
        if want_idx[t] is None:  # random: checked by test_random_route_matches_lane_simulation
            physical = int(opt["logical_count"].sum()) if "logical_count" in opt else num_experts + num_shared
            row = got.topk_idx[t].tolist()
            assert len(set(row)) == slots and all(0 <= i < physical for i in row)
            assert ((got.topk_weights[t] > 0) & (got.topk_weights[t] <= 1)).all()
            continue
        assert got.topk_idx[t].tolist() == want_idx[t], t
        torch.testing.assert_close(got.topk_weights[t], torch.tensor(want_w[t], dtype=torch.float32), rtol=1e-6, atol=1e-7)
    if "unmapped_topk_idx" in opt:
        assert got.unmapped_topk_idx.tolist() == want_unmapped
    else:
        assert got.unmapped_topk_idx is None
    torch.testing.assert_close(got.scores, torch.tensor(want_scores, dtype=torch.float32), rtol=1e-6, atol=1e-7)


def test_gate_reference_ranks_infinite_bias_last_in_index_order():
    logits = torch.zeros(2, 64)
    bias = torch.zeros(64)
    bias[:60] = -float("inf")  # only 4 experts are finite; the rest rank by index
    got = ref.moe_topk_gate_forward(logits, 6, False, 0, 1.0, 0, bias=bias)
    assert got.topk_idx[0].tolist() == [60, 61, 62, 63, 0, 1]


def test_topk_and_normalize_references():
    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 5, (9, 40), generator=g).float()  # many ties
    idx = ref.topk_gate(scores, 7)
    for t in range(9):
        assert idx[t].tolist() == sorted(range(40), key=lambda e: (-scores[t, e].item(), e))[:7]
    weights = torch.rand(9, 9, generator=g)
    denominator, normalized = ref.normalize_weight(weights)
    torch.testing.assert_close(denominator, weights.double().sum(1).float(), rtol=1e-6, atol=0)
    torch.testing.assert_close(normalized, (weights.double() / weights.double().sum(1, keepdim=True)).float(), rtol=1e-6, atol=1e-7)
    # the fold order pairs w0 with w8 first, as a 32-lane butterfly does; a left-to-right fp32 sum loses the ones
    w = torch.tensor([[1e8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1e8]])
    assert ref.warp_order_sum(w).item() == 7.0
    left_to_right = np.float32(0)
    for v in w[0].tolist():
        left_to_right = np.float32(left_to_right + np.float32(v))
    assert left_to_right == 0.0


# ---- the generic tier: calls without a specialised variant -----------------------------------------------------


@pytest.fixture
def served(built, monkeypatch, registry, fake_cuda, driver):  # noqa: F811 (driver: the imported fixture)
    """The ops on meta tensors against the variants built above (on TKAOT_PATH); returns the fake driver."""
    serve_ops(monkeypatch, registry, [moe_ops], [moe_ops._GATE, moe_ops._NORMALIZE], built[0])
    return driver


def sent_values(fake, kernels, key_values) -> dict[str, int]:
    """The i32 parameters of the last launch, by name, through the launcher cached for key_values."""
    launcher = kernels.cache[(0, *key_values)]
    spec = getattr(launcher, "__self__", launcher).kernel.spec
    record = fake.calls[-1]
    return {p.name: struct.unpack("<i", raw)[0] for p, raw in zip(spec.params, record[6]) if p.type == "i32"}


def launched_kernel(kernels, key_values):
    launcher = kernels.cache[(0, *key_values)]
    return getattr(launcher, "__self__", launcher).kernel


# (experts, top-k, shared slots): TileKernels takes each; the built set has the 256-expert top-8 gate only
GENERIC_GATE_CALLS = [(4, 4, 0), (8, 2, 2), (16, 6, 1), (60, 4, 0), (64, 6, 0), (256, 6, 1), (384, 8, 1), (512, 32, 0)]


@pytest.mark.parametrize("experts, topk, shared", GENERIC_GATE_CALLS)
def test_gate_calls_without_a_specialised_variant_run_on_the_generic_gate(served, experts, topk, shared):
    key = f"num_experts={experts},num_topk={topk},tiling={moe_ops._GATE_TILING}"
    with pytest.warns(tkaot.GenericVariantWarning, match=rf"no specialised moe_topk_gate variant \[{key}\]") as caught:
        idx, weights = tkaot.moe.moe_topk_gate_forward(meta(37, experts), topk, shared > 0, shared, 1.0, 0)
    assert len(caught) == 1 and f"tkaot-build build --op moe_topk_gate --set num_experts={experts}" in str(caught[0].message)
    assert idx.shape == weights.shape == (37, topk + shared)
    values = (experts, topk, moe_ops._GATE_TILING)
    kernel = launched_kernel(moe_ops._GATE, values)
    assert (kernel.kernel, kernel.key) == ("moe_topk_gate_generic", f"tiling={moe_ops._GATE_TILING}")
    served.sizes = [SIZES[p.type] for p in kernel.spec.params]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per variant and process
        tkaot.moe.moe_topk_gate(meta(37, experts), topk, shared > 0, shared, 1.0, 0)
    assert served.calls[-1][2] == (10, 1, 1)  # ceil(37 / 4) blocks of 4 tokens
    sent = sent_values(served, moe_ops._GATE, values)
    assert {n: sent[n] for n in ("num_experts", "num_topk", "num_tokens", "num_physical_topk")} == {
        "num_experts": experts, "num_topk": topk, "num_tokens": 37, "num_physical_topk": topk + shared,
    }  # fmt: skip


def test_a_built_gate_stays_specialised_and_strict_mode_refuses_the_fallback(served, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tkaot.moe.moe_topk_gate_forward(meta(5, 256), 8, True, 1, 2.5, 0)
    assert launched_kernel(moe_ops._GATE, (256, 8, moe_ops._GATE_TILING)).kernel == "moe_topk_gate"
    monkeypatch.setenv("TKAOT_STRICT", "1")
    with pytest.raises(tkaot.VariantNotBuilt, match="num_experts=8,num_topk=2"):
        tkaot.moe.moe_topk_gate_forward(meta(5, 8), 2, False, 0, 1.0, 0)


@pytest.mark.parametrize("topk", [1, 3, 8, 31, 32])
def test_normalize_weight_without_a_specialised_variant_runs_on_the_generic_one(served, topk):
    with pytest.warns(tkaot.GenericVariantWarning, match=rf"no specialised normalize_weight variant \[num_topk={topk}\]"):
        denominator, normalized = tkaot.moe.normalize_weight(meta(300, topk))
    assert denominator.shape == (300,) and normalized.shape == (300, topk)
    kernel = launched_kernel(moe_ops._NORMALIZE, (topk,))
    assert (kernel.kernel, kernel.key) == ("normalize_weight_generic", "")
    served.sizes = [SIZES[p.type] for p in kernel.spec.params]
    tkaot.moe.normalize_weight(meta(300, topk))
    assert served.calls[-1][2] == (3, 1, 1)
    assert {n: v for n, v in sent_values(served, moe_ops._NORMALIZE, (topk,)).items()} == {"num_tokens": 300, "num_topk": topk}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tkaot.moe.normalize_weight(meta(4, 9))  # built: specialised
    assert launched_kernel(moe_ops._NORMALIZE, (9,)).kernel == "normalize_weight"
