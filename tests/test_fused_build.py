"""Fused inference ops on CPU: their kernels build (one variant each), their LaunchSpecs bind to
the ops' argument lists, bad input is refused before launch, and the references agree with
independent formulations."""

import json
from pathlib import Path

import pytest
import torch

import tkaot
from build_tools.artifacts import BuildCache
from build_tools.build import build_variants
from build_tools.ops import Variant
from build_tools.sweep import load_shapeset
from tests.helpers import assert_each_reaches_the_registry, meta, refusals
from tkaot import reference
from tkaot._kernel import Kernel
from tkaot._quant import fused as _fused
from tkaot._quant import norm_cast as _norm_cast
from tkaot._quant import swiglu as _swiglu
from tkaot._spec import LaunchSpec
from tkaot._transform import rotary as rotary_ops
from tkaot.errors import NoGPUError

BUILT = {
    "rotary": Variant.make("rotary", dict(rot_dim=64, dtype="bfloat16", interleaved=True)),
    "swiglu": Variant.make("swiglu", dict(hidden=768, dtype="bfloat16", fmt="e4m3", group=128, sf="ue8m0", tiling="wscc2v9b1gkm")),
    "norm_cast": Variant.make("norm_cast", dict(hidden=7168, dtype="bfloat16", sf="pow2", tiling="lean8nlbwdgw")),
    "norm_cast_residual": Variant.make("norm_cast", dict(hidden=7168, dtype="bfloat16", sf="pow2", tiling="lean6plbwdgwRL")),
}
OP_KERNELS = {
    "rotary": rotary_ops._ROTARY,
    "swiglu": _swiglu._SWIGLU,
    "norm_cast": _norm_cast._NORM_CAST,
    "norm_cast_residual": _norm_cast._NORM_CAST,
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, build_cache):
    out = tmp_path_factory.mktemp("fused")
    build_variants(list(BUILT.values()), out, "sm90", jobs=1, cache=BuildCache(build_cache))
    manifest = json.loads((out / "manifest.json").read_text())
    by_key = {e["key"]: e for e in manifest["variants"]}
    return out, {name: by_key[variant.key] for name, variant in BUILT.items()}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_launch_spec_binds_to_the_op(built, name):
    out, entries = built
    entry, kernel = entries[name], BUILT[name].kernel
    assert entry["key"] == BUILT[name].key
    spec = LaunchSpec.from_json(entry["launch"])
    ops = OP_KERNELS[name]
    assert ops.key(tuple(BUILT[name].params.values())) == entry["key"]
    # Binding checks that every kernel parameter is supplied by the op's argument list
    Kernel(kernel, entry["key"], spec, out / "cubins" / f"{entry['cubin']}.cubin", entry["cubin"], "test").bind(ops.args)


def test_rotary_launch_spec(built):
    spec = LaunchSpec.from_json(built[1]["rotary"]["launch"])
    # 4 threads a head row, 256 threads; query's and key's head rows in one grid
    assert spec.grid == ("(((seqlen * (q_heads + k_heads)) + 63) // 64)", "batch", "1")
    assert spec.block == (256, 1, 1)
    types = {p.name: p.type for p in spec.params}
    assert types["query"] == types["key"] == "ptr" and types["seqlen_offset"] == "i32"
    assert types["q_heads"] == types["k_heads"] == "i32"


def test_swiglu_launch_spec(built):
    spec = LaunchSpec.from_json(built[1]["swiglu"]["launch"])
    # 768 bf16, tiling wscc2v9b1: 32 threads a row (3 vectors each), a row a block, blocks striding over
    # rows; 1152 threads an SM would be 36 blocks, capped at the 32 an SM holds
    assert spec.grid == ("min(num_rows, 4224)", "1", "1")
    assert spec.block == (32, 1, 1) and spec.smem == 3 * 4 * 1  # three clamp counts, per warp
    types = {p.name: p.type for p in spec.params}
    assert types["clamp_value"] == "f32" and types["out_sf"] == "ptr" and types["sf_group_stride"] == "i32"


def test_norm_cast_launch_spec(built):
    spec = LaunchSpec.from_json(built[1]["norm_cast"]["launch"])
    assert spec.grid == ("num_tokens", "batch", "1")  # 7168 bf16, tiling lean8nlbwdgw: a row per block of 4 warps
    assert spec.block == (128, 1, 1)
    types = {p.name: p.type for p in spec.params}
    assert types["eps"] == "f32" and types["has_residual"] == "i32" and types["out_sf"] == "ptr"


def test_norm_cast_residual_tiling_takes_the_residual_as_given(built):
    """The residual tiling ("R") reads residual without asking has_residual: the kernel drops the flag, so the op
    must launch it for calls with a residual only (test_tiling_knobs_take_effect_on_the_next_call)."""
    spec = LaunchSpec.from_json(built[1]["norm_cast_residual"]["launch"])
    names = {p.name for p in spec.params}
    assert "has_residual" not in names and {"residual", "residual_out", "has_weight"} <= names
    assert spec.pdl and spec.grid == ("num_tokens", "batch", "1")


@pytest.mark.parametrize(
    "static, match",
    [
        (dict(fmt="e4m3", group=0, sf="fp32"), "needs group"),
        (dict(fmt="bf16", group=128, sf="none"), "takes group=0"),
        (dict(fmt="e4m3", group=128, sf="none"), "needs group"),
    ],
)
def test_swiglu_refuses_invalid_static_combinations(static, match):
    from kernels_src.fused import swiglu

    with pytest.raises(ValueError, match=match):
        swiglu.check_static(2048, "bfloat16", **static)
    with pytest.raises(ValueError, match="float32 input"):
        swiglu.check_static(32768, "float32", "bf16", 0, "none")


def test_fused_shapeset_expands():
    variants = load_shapeset("fused")
    kernels = {v.kernel for v in variants}
    assert kernels == {"rotary", "swiglu", "swiglu_generic", "swiglu_backward", "norm_cast", "norm_cast_generic"}
    # rotary 8, norm_cast 42 and swiglu 52 in each of their two tilings (without and with a residual; a clamp),
    # swiglu_generic's 10 (each dtype: bf16, fp32 and e4m3 with each sf kind) in each tiling, swiglu_backward 20
    # (every dtype combination TileKernels takes), norm_cast_generic's 6 (each dtype with each sf kind) in each tiling
    counts = {k: sum(v.kernel == k for v in variants) for k in kernels}
    assert counts == {"rotary": 8, "norm_cast": 84, "swiglu": 104, "swiglu_generic": 20, "swiglu_backward": 20, "norm_cast_generic": 12}
    norm_cast_tilings = {dict(v.static)["tiling"] for v in variants if v.kernel == "norm_cast"}
    assert norm_cast_tilings == {_fused.NORM_CAST_TILING, _fused.NORM_CAST_RESIDUAL_TILING}
    for kernel in ("swiglu", "swiglu_generic"):
        swiglu_tilings = {dict(v.static)["tiling"] for v in variants if v.kernel == kernel}
        assert swiglu_tilings == {_fused.SWIGLU_TILING, _fused.SWIGLU_CLAMP_TILING}
    assert len({(v.kernel, v.key) for v in variants}) == len(variants)


def _fma32(a, b, c):
    """fp32 fused multiply-add, exact: the float64 sum corrected where it sits on an fp32 tie."""
    import numpy as np

    a, b, c = (np.asarray(t, np.float32).astype(np.float64) for t in (a, b, c))
    p = a * b  # exact: 48 bits
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # TwoSum: s + err == p + c
    tie = ((s.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)) & (err != 0)
    return np.where(tie, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s).astype(np.float32)


def test_swiglu_lean_division_is_ieee_division_for_every_bf16_gate():
    """kernels_src/fused/swiglu.py's tkaot_div_normal equals RN(g / den) for g in the range below (whose mantissa test admits den), for
    every bf16 gate, any den within 4 ulp of 1 + exp(-g) (the GPU's expf differs from numpy's) and any
    reciprocal estimate within 4 ulp of 1 / den (rcp.approx's error is below 1 ulp)."""
    import numpy as np

    def ulps(v, k):
        for _ in range(abs(k)):
            v = np.nextafter(v, np.float32(np.inf if k > 0 else -np.inf))
        return v

    g = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    g = g[np.isfinite(g) & (np.abs(g) >= 2.0**-60) & (g > -64) & (g < 3.0e38)]  # lean_exact's range
    with np.errstate(over="ignore"):
        den0 = (1.0 + np.exp(-g.astype(np.float64))).astype(np.float32)
    for kd in range(-4, 5):
        den = np.maximum(ulps(den0, kd), np.float32(1.0))
        admitted = (den.view(np.uint32) & 0x7FFFFF) != 0x7FFFFF  # lean_exact's mantissa test
        gate, den = g[admitted], den[admitted]
        want = (gate.astype(np.float64) / den.astype(np.float64)).astype(np.float32)
        for kr in range(-4, 5):
            r = ulps((1.0 / den.astype(np.float64)).astype(np.float32), kr)
            r = _fma32(r, _fma32(-den, r, 1.0), r)
            q = (gate.astype(np.float64) * r.astype(np.float64)).astype(np.float32)
            got = _fma32(_fma32(-den, q, gate), r, q)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (kd, kr)


def test_swiglu_gate_division_differs_from_div_normal_only_in_the_sign_of_zero():
    """tkaot_div_gate takes the remainder as b * q - a: the same quotient as tkaot_div_normal wherever it
    is not zero, and -0 / den stays -0 (tkaot_div_normal gives +0)."""
    import numpy as np

    g = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    g = g[np.isfinite(g) & (g > -64)]
    with np.errstate(over="ignore"):
        den = (1.0 + np.exp(-g.astype(np.float64))).astype(np.float32)
    r = (1.0 / den.astype(np.float64)).astype(np.float32)
    r = _fma32(r, _fma32(-den, r, 1.0), r)
    q = (g.astype(np.float64) * r.astype(np.float64)).astype(np.float32)
    normal = _fma32(_fma32(-den, q, g), r, q)
    gate = _fma32(-_fma32(den, q, -g), r, q)
    nonzero = normal != 0
    assert np.array_equal(normal[nonzero].view(np.uint32), gate[nonzero].view(np.uint32))
    want_zero = (g[~nonzero].astype(np.float64) / den[~nonzero].astype(np.float64)).astype(np.float32)
    assert np.array_equal(gate[~nonzero].view(np.uint32), want_zero.view(np.uint32))  # +0 and -0


def test_swiglu_gates_ok_admits_exactly_the_vectors_of_finite_gates_above_the_floor():
    """kernels_src/fused/swiglu.py's tkaot_gates_ok, emulated on the bit patterns (max.u16x2 / max.s16x2
    per pair, then across the pair's halves): a vector of eight bf16 gates is admitted exactly when every
    gate is above -87.5 and at most the limit (not NaN)."""
    import numpy as np

    from kernels_src.fused.swiglu_math import FLT_MAX

    rng = np.random.default_rng(5)
    pats = np.arange(1 << 16, dtype=np.uint16)
    vectors = np.concatenate([pats.reshape(-1, 8), rng.permutation(pats).reshape(-1, 8)])
    vectors = np.concatenate([vectors, rng.choice(np.arange(0x0000, 0x4300, dtype=np.uint16), (8192, 8))])
    for limit in (np.float32(FLT_MAX), np.float32(6.0), np.float32(-1.0)):
        most_negative = vectors.max(axis=1).astype(np.uint32)  # unsigned maximum
        largest_bits = vectors.view(np.int16).max(axis=1).astype(np.int32)  # signed maximum
        largest = (largest_bits.astype(np.uint32) << 16).view(np.float32)
        got = (most_negative < 0xC2AF) & (largest <= limit)
        gates = (vectors.astype(np.uint32) << 16).view(np.float32)
        with np.errstate(invalid="ignore"):
            want = np.all((gates > -87.5) & (gates <= limit), axis=1)
        assert np.array_equal(got, want), limit


def _div_normal(a, b, kr):
    """tkaot_div_normal(a, b) (fp32 numpy arrays) with a reciprocal estimate kr ulp off RN(1 / b)."""
    import numpy as np

    r = (1.0 / b.astype(np.float64)).astype(np.float32)
    for _ in range(abs(kr)):
        r = np.nextafter(r, np.float32(np.inf if kr > 0 else -np.inf))
    r = _fma32(r, _fma32(-b, r, 1.0), r)
    q = (a.astype(np.float64) * r.astype(np.float64)).astype(np.float32)
    return _fma32(_fma32(-b, q, a), r, q)


def test_norm_cast_lean_scale_factor_is_ieee_division_for_every_bf16_amax():
    """kernels_src/fused/norm_cast.py's lean "fp32" scale factor (amax / 448, 448 / amax by tkaot_div_normal)
    equals IEEE division for every clamped bf16 amax below LEAN_SF_LIMIT and the floor 1e-4, with any
    reciprocal estimate within 4 ulp (rcp.approx's error is below 1 ulp)."""
    import numpy as np

    from kernels_src.fused.division import LEAN_SF_LIMIT
    from kernels_src.quant.common import amax_floor

    floor = np.float32(amax_floor("e4m3", "fp32"))
    c = (np.arange(1 << 15, dtype=np.uint32) << 16).view(np.float32)  # non-negative bf16 values
    c = np.append(c[np.isfinite(c) & (c >= floor) & (c < LEAN_SF_LIMIT)], floor)
    fmax = np.full_like(c, 448.0)
    for a, b in ((c, fmax), (fmax, c)):
        want = (a.astype(np.float64) / b.astype(np.float64)).astype(np.float32)
        for kr in range(-4, 5):
            got = _div_normal(a, b, kr)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), kr


def test_lean_scale_factor_is_ieee_division_for_every_fp32_mantissa():
    """kernels_src/fused/division.py's lean_e4m3_scale_factor (amax / 448, 448 / amax by tkaot_div_normal, as
    swiglu's "lean_sf" tilings take it for any fp32 amax) equals IEEE division for every fp32 mantissa, in the
    lowest, a middle and the highest binade it admits, with reciprocal estimates within 1 ulp. Scaling an
    operand by a power of two scales every step exactly while all stay normal, so the binades between follow."""
    import numpy as np

    from kernels_src.fused.division import LEAN_SF_LIMIT
    from kernels_src.quant.common import amax_floor

    floor = np.float32(amax_floor("e4m3", "fp32"))
    mantissas = np.arange(1 << 23, dtype=np.uint32)
    for exponent in (int(np.floor(np.log2(floor))), 0, int(np.log2(LEAN_SF_LIMIT)) - 1):
        c = (mantissas | np.uint32((127 + exponent) << 23)).view(np.float32)
        c = c[(c >= floor) & (c < LEAN_SF_LIMIT)]
        fmax = np.full_like(c, 448.0)
        for a, b in ((c, fmax), (fmax, c)):
            want = (a.astype(np.float64) / b.astype(np.float64)).astype(np.float32)
            for kr in (-1, 0, 1):
                got = _div_normal(a, b, kr)
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (exponent, kr)


def test_swiglu_gates_ok2_admits_exactly_the_chunks_of_finite_gates_above_the_floor():
    """tkaot_gates_ok2 (sixteen gates, two adjacent vectors, of the "per_chunk" tilings), emulated on the bit
    patterns: admitted exactly when every gate is above -87.5 and at most the limit (not NaN)."""
    import numpy as np

    from kernels_src.fused.swiglu_math import FLT_MAX

    rng = np.random.default_rng(7)
    pats = np.arange(1 << 16, dtype=np.uint16)
    chunks = np.concatenate([pats.reshape(-1, 16), rng.permutation(pats).reshape(-1, 16)])
    chunks = np.concatenate([chunks, rng.choice(np.arange(0x0000, 0x4300, dtype=np.uint16), (8192, 16))])
    for limit in (np.float32(FLT_MAX), np.float32(6.0), np.float32(-1.0)):
        # max.u16x2 / max.s16x2 over the eight words pairwise (lanes stay apart), then across the two lanes
        most_negative = chunks.max(axis=1).astype(np.uint32)
        largest = (chunks.view(np.int16).max(axis=1).astype(np.int32).astype(np.uint32) << 16).view(np.float32)
        got = (most_negative < 0xC2AF) & (largest <= limit)
        gates = (chunks.astype(np.uint32) << 16).view(np.float32)
        with np.errstate(invalid="ignore"):
            want = np.all((gates > -87.5) & (gates <= limit), axis=1)
        assert np.array_equal(got, want), limit


# --- validation, with meta tensors standing in for CUDA ones (the fake_cuda fixture, tests/conftest.py)


def cache(rows=64, rot_dim=64):
    return meta(rows, rot_dim, dtype=torch.float32)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: dict(query=meta(4, 2, 64, dtype=torch.float16)), ValueError, "query must be bfloat16 or float32"),
        (lambda: dict(query=meta(4, 64)), ValueError, "query must be 3-D"),
        (lambda: dict(query=meta(4, 2, 64), cos_sin_cache=meta(64, 64)), ValueError, "cos_sin_cache must be torch.float32"),
        (lambda: dict(query=meta(4, 2, 96), cos_sin_cache=cache(64, 96)), ValueError, "rot_dim 64 or 128"),
        (lambda: dict(query=meta(4, 2, 128)), ValueError, "rot_dim=64"),
        (lambda: dict(query=meta(4, 2, 128)[..., ::2]), ValueError, "contiguous in its last dimension"),
        (lambda: dict(query=meta(4, 2, 68)[..., 4:]), ValueError, "16-byte aligned"),
        (lambda: dict(query=meta(4, 2, 76)[..., 8:72]), ValueError, "multiples of 8"),
        (lambda: dict(query=meta(4, 2, 64), key=meta(4, 2, 64, dtype=torch.float32)), ValueError, "key must be torch.bfloat16"),
        (lambda: dict(query=meta(4, 2, 64), key=meta(5, 2, 64)), ValueError, "key must be of shape"),
        (
            lambda: dict(query=meta(4, 2, 64), positions=meta(4, dtype=torch.float32)),
            ValueError,
            "positions must be int32 or int64, got torch.float32",
        ),
        (lambda: dict(query=meta(2, 4, 2, 64), positions=meta(4, dtype=torch.int32)), ValueError, r"positions must be of shape \(2, 4\)"),
        (lambda: dict(query=meta(4, 2, 64), seqlen_offset=61), ValueError, "seqlen_offset must be"),
        (lambda: dict(query=meta(4, 2, 64), seqlen_offset=1.0), TypeError, "seqlen_offset must be an int"),
        (lambda: dict(query=[1.0]), TypeError, "query must be a torch.Tensor"),
        (lambda: dict(query=meta(4, 2, 64), key=meta(1, 4, 1, 64)), ValueError, r"key must be 3-D like query, got shape \(1, 4, 1, 64\)"),
        (
            lambda: dict(query=meta(4, 2, 64), positions=meta(1, 4, dtype=torch.int32)),
            ValueError,
            r"positions must be of shape \(4,\), got \(1, 4\)",
        ),
        (lambda: dict(query=meta(65536, 1, 1, 64)), ValueError, "query must be at most 65535 batches"),
        (lambda: dict(query=meta(4, 2, 64), seqlen_offset=2**31), ValueError, "seqlen_offset must be within int32, got 2147483648"),
        (
            lambda: dict(query=torch.empty_strided((3, 2, 64), (2**30, 8, 1), dtype=torch.bfloat16, device="meta")),
            ValueError,
            "query must be at most 2\\*\\*31-1 elements apart",
        ),
        (
            lambda: dict(query=meta(4, 2, 64), cos_sin_cache=torch.empty_strided((64, 64), (66, 1), dtype=torch.float32, device="meta")),
            ValueError,
            "cos_sin_cache must be strided in multiples of 4 elements",
        ),
    ],
)
def test_apply_rotary_refuses_bad_input(fake_cuda, make, error, match):
    kwargs = make()
    kwargs.setdefault("cos_sin_cache", cache())
    with pytest.raises(error, match=match):
        tkaot.transform.apply_rotary(**kwargs)


def test_apply_rotary_valid_input_reaches_the_registry(fake_cuda):
    with pytest.raises(NoGPUError):
        tkaot.transform.apply_rotary(meta(4, 2, 192)[..., 128:], cache(), meta(4, 1, 64), meta(4, dtype=torch.int64), seqlen_offset=3)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: dict(x=meta(4, 4096, dtype=torch.float16)), ValueError, "x must be bfloat16 or float32"),
        (lambda: dict(x=meta(4096)), ValueError, "x must be 2-D"),
        (lambda: dict(x=meta(4, 4097)), ValueError, "x must be 2-D"),
        (lambda: dict(x=meta(4, 2 * 608)), ValueError, "hidden a multiple of 64"),
        (lambda: dict(x=meta(4, 2 * 192)), ValueError, "hidden a multiple of num_per_channels"),
        (lambda: dict(x=meta(4, 2 * 32768, dtype=torch.float32)), ValueError, r"\(0, 18432\]"),
        (lambda: dict(x=meta(4, 8192)[:, :4096:2]), ValueError, "contiguous in its last dimension"),
        (lambda: dict(x=meta(4, 4100)[:, :4096]), ValueError, "multiples of 8"),
        (lambda: dict(fmt="e4m3", num_per_channels=64), ValueError, "num_per_channels"),
        (lambda: dict(fmt="e2m1", num_per_channels=32), ValueError, "num_per_channels"),
        (lambda: dict(use_packed_ue8m0=True), ValueError, "use_packed_ue8m0 must be used with round_sf=True"),
        (lambda: dict(psum_num_tokens_per_expert=meta(4, dtype=torch.int64)), ValueError, "psum_num_tokens_per_expert must be torch.int32"),
        (lambda: dict(psum_num_tokens_per_expert=meta(2, 2, dtype=torch.int32)), ValueError, "1-D"),
        (lambda: dict(topk_weights=meta(5, dtype=torch.float32)), ValueError, r"topk_weights must be of shape \(4,\)"),
        (lambda: dict(topk_weights=meta(4)), ValueError, "topk_weights must be torch.float32"),
        (lambda: dict(routed_scaling_factor=2.0), ValueError, "routed_scaling_factor must be None without topk_weights"),
        (lambda: dict(clamped_count=meta(4, dtype=torch.int64)), ValueError, "clamped_count must be None without clamp_value"),
        (lambda: dict(clamp_value=1.0, clamped_count=meta(4, dtype=torch.int32)), ValueError, "clamped_count must be torch.int64"),
        (lambda: dict(clamp_value=1.0, clamped_count=meta(3, dtype=torch.int64)), ValueError, r"clamped_count must be of shape \(4,\)"),
        (lambda: dict(clamp_value="1"), TypeError, "clamp_value must be a float"),
        (lambda: dict(clamp_value=-1.0), ValueError, "clamp_value must be a non-negative number"),
        (lambda: dict(clamp_value=-0.0), ValueError, "clamp_value must be a non-negative number"),
        (lambda: dict(clamp_value=float("nan")), ValueError, "clamp_value must be a non-negative number"),
    ],
)
def test_swiglu_cast_refuses_bad_input(fake_cuda, make, error, match):
    kwargs = dict(fmt="e4m3", num_per_channels=128)
    kwargs.update(make())
    x = kwargs.pop("x", meta(4, 4096))
    with pytest.raises(error, match=match):
        tkaot.quant.swiglu_forward_and_per_token_cast(x, **kwargs)


def test_swiglu_forward_refuses_quantized_format(fake_cuda):
    with pytest.raises(ValueError, match="fmt must be 'bf16' or 'fp32'"):
        tkaot.quant.swiglu_forward(meta(4, 4096), "e4m3")


def test_swiglu_valid_input_reaches_the_registry(fake_cuda):
    w = meta(4, dtype=torch.float32)
    with pytest.raises(NoGPUError):
        tkaot.quant.swiglu_forward(meta(4, 4096), "bf16", meta(3, dtype=torch.int32), w, 2.0, 10.0, meta(4, dtype=torch.int64))
    with pytest.raises(NoGPUError):
        tkaot.quant.swiglu_forward_and_per_token_cast(meta(4, 4096), "e4m3", 32, use_tma_aligned_col_major_sf=True, round_sf=True)
    for clamp in (0.0, 0, float("inf")):  # the edges of the clamp values taken
        with pytest.raises(NoGPUError):
            tkaot.quant.swiglu_forward_and_per_token_cast(meta(4, 4096), "e4m3", 128, clamp_value=clamp)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: dict(x=meta(4, 512, dtype=torch.float16)), ValueError, "x must be bfloat16 or float32"),
        (lambda: dict(x=meta(512)), ValueError, "x must be 2-D"),
        (lambda: dict(x=meta(4, 528)), ValueError, "multiple of 32"),
        (lambda: dict(x=meta(4, 16384)), ValueError, "multiple of 32"),
        (lambda: dict(x=meta(4, 1024)[:, :512:2]), ValueError, "contiguous in its last dimension"),
        (lambda: dict(x=meta(4, 516)[:, :512]), ValueError, "multiples of 8"),
        (lambda: dict(weight=meta(256)), ValueError, "weight must be of shape"),
        (lambda: dict(residual=meta(4, 256)), ValueError, "residual must be of shape"),
        (lambda: dict(residual=meta(4, 512), residual_out=meta(4, 512, dtype=torch.float32)), ValueError, "residual_out must be"),
        (lambda: dict(num_per_channels=128), ValueError, "num_per_channels"),
        (lambda: dict(fmt="fp32", num_per_channels=None), ValueError, "fmt must be the format of x's dtype"),
        (lambda: dict(use_packed_ue8m0=True), ValueError, "round_sf=True"),
        (lambda: dict(out_bf16=meta(4, 512)), ValueError, "out_bf16 must be None unless with_out_bf16"),
        (lambda: dict(with_out_bf16=True, out_bf16=meta(4, 512, dtype=torch.float32)), ValueError, "out_bf16 must be torch.bfloat16"),
        (lambda: dict(out=(meta(4, 512, dtype=torch.float8_e4m3fn),)), TypeError, r"out must be None or a \(data, sf\) pair"),
        (lambda: dict(out=(meta(4, 512), meta(4, 16, dtype=torch.float32))), ValueError, r"out\[0\] must be torch.float8_e4m3fn"),
        (
            lambda: dict(out=(meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 4, dtype=torch.int32))),
            ValueError,
            r"out\[1\] must be torch.float32",
        ),
        (
            lambda: dict(out=(meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 8, dtype=torch.float32))),
            ValueError,
            r"out\[1\] must be of shape \(4, 16\)",
        ),
        (
            lambda: dict(
                out=(meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 16, dtype=torch.float32)), use_tma_aligned_col_major_sf=True
            ),
            ValueError,
            "row-major",
        ),
        (lambda: dict(mega_moe_sf=meta(4, 4, dtype=torch.int32), mega_moe_block_m=64), ValueError, "mega MoE"),
        (lambda: dict(x=meta(70000, 1, 512)), ValueError, "65535"),
    ],
)
def test_norm_cast_refuses_bad_input(fake_cuda, make, error, match):
    kwargs = dict(x=meta(4, 512), weight=None, eps=1e-6, fmt="e4m3", num_per_channels=32)
    kwargs.update(make())
    with pytest.raises(error, match=match):
        tkaot.quant.norm_forward_and_per_token_cast(**kwargs)


def test_norm_cast_valid_input_reaches_the_registry(fake_cuda):
    x = meta(2, 4, 7168)
    with pytest.raises(NoGPUError):
        tkaot.quant.norm_forward_and_per_token_cast(
            x, meta(7168), 1e-6, "e4m3", 32, residual=meta(2, 4, 7168), round_sf=True, use_packed_ue8m0=True,
            use_tma_aligned_col_major_sf=True, with_out_bf16=True, with_rstd=True,
        )  # fmt: skip
    packed = (meta(4, 512, dtype=torch.float8_e4m3fn), meta(4, 4, dtype=torch.int32))
    with pytest.raises(NoGPUError):
        tkaot.quant.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "e4m3", 32, round_sf=True, use_packed_ue8m0=True, out=packed)


test_fused_options_refused = refusals(
    [
        (lambda q: q.swiglu_forward_and_per_token_cast(meta(2**30, 4096), "e4m3", 128), ValueError, r"x must be below 2\*\*30 rows"),
        (lambda q: q.swiglu_forward(meta(4, 4096), "bf16", topk_weights=meta(4, dtype=torch.float32), routed_scaling_factor="2"),
         TypeError, "routed_scaling_factor must be a float or None, got str"),
        (lambda q: q.swiglu_forward(meta(2**25 + 1, 4096), "bf16", clamp_value=1.0, clamped_count=meta(4, dtype=torch.int64)),
         ValueError, "x must be small enough for int32 clamp counts"),
        (lambda q: q.swiglu_forward(meta(4, 4096), "bf16", psum_num_tokens_per_expert=meta(8, dtype=torch.int32)[::2]),
         ValueError, "psum_num_tokens_per_expert must be contiguous"),
        (lambda q: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "e4m3", None), ValueError, r"\(fmt, num_per_channels\)"),
        (lambda q: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "bf16", None, with_out_bf16=True),
         ValueError, "with_out_bf16 must be False for an unquantized output"),
        (lambda q: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "bf16", None, mega_moe_block_m=64),
         ValueError, "mega_moe_sf must be None .*got mega_moe_block_m=64"),
        (lambda q: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "e4m3", 32,
                                                     out=(meta(4, 512, dtype=torch.float8_e4m3fn), meta(1, 4, 16, dtype=torch.float32))),
         ValueError, r"out\[1\] must be of shape \(4, 16\), got \(1, 4, 16\)"),
        (lambda q: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "e4m3", 32,
                                                     out=[meta(4, 512, dtype=torch.float8_e4m3fn),
                                                          meta(4, 32, dtype=torch.float32)[:, ::2]]),
         ValueError, r"out\[1\] must be contiguous in its last dimension \(row-major sf\)"),
        (lambda q: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "e4m3", 32,
                                                     out=(meta(4, 512, dtype=torch.float8_e4m3fn),
                                                          meta(4, 2**31, dtype=torch.float32)[:, :16])),
         ValueError, r"out\[1\] must be strided below 2\*\*31"),
        (lambda q: q.norm_forward_and_per_token_cast(meta(2**23 + 1, 8192), None, 1e-6, "e4m3", 32),
         ValueError, r"out\[1\] must be strided below 2\*\*31, got a batch stride of"),
        (lambda q: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "e4m3", 32,
                                                     out=(meta(4, 512, dtype=torch.float8_e4m3fn), [1])),
         TypeError, r"out\[1\] must be a torch.Tensor"),
    ],
    "The fused ops' Signature rules beyond the argument-by-argument table above: limits, option pairs, given sf layouts.",
)  # fmt: skip


def test_fused_valid_edges_reach_the_registry(fake_cuda):
    """residual_out is not checked without a residual; an unquantized format goes to norm_forward; a float subclass is a float."""
    q = tkaot.quant
    assert_each_reaches_the_registry(
        lambda: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "e4m3", 32, residual_out=meta(3, 7)),
        lambda: q.norm_forward_and_per_token_cast(meta(4, 512), None, 1e-6, "bf16", None, out=(meta(4, 512),)),
        lambda: q.swiglu_forward(meta(4, 4096), "bf16", topk_weights=meta(4, dtype=torch.float32), routed_scaling_factor=_Float(2.0)),
        lambda: q.swiglu_forward_and_per_token_cast(meta(4, 4096), "e4m3", 128.0),  # the group read from the table: 128
    )


class _Float(float):
    pass


def test_norm_cast_sf_layouts():
    x = torch.empty(3, 5, 7168)
    sf, strides = _norm_cast._alloc_norm_sf(x, 224, "ue8m0", col_major=True)
    assert sf.shape == (3, 5, 56) and sf.dtype == torch.int32 and sf.stride() == (56 * 8, 1, 8)
    assert strides == (56 * 8 * 4, 4, 32)  # bytes
    sf, strides = _norm_cast._alloc_norm_sf(x[0], 224, "fp32", col_major=False)
    assert sf.shape == (5, 224) and sf.is_contiguous() and strides == (5 * 224, 224, 1)
    sf, token_stride, group_stride = _swiglu.alloc_token_sf(5, 6, "ue8m0", col_major=False, device="cpu")
    assert sf.shape == (5, 2) and (token_stride, group_stride) == (8, 4)


class _Launched(Exception):
    pass


class _OnDevice0:
    """A meta tensor as the ops' hot paths see a valid one on cuda:0 (the only properties they read before the launch)."""

    def __init__(self, t: torch.Tensor):
        self.t, self.dtype, self.shape = t, t.dtype, t.shape

    def get_device(self) -> int:
        return 0

    def stride(self) -> tuple[int, ...]:
        return self.t.stride()

    def data_ptr(self) -> int:
        return 0


def test_tiling_knobs_take_effect_on_the_next_call(fake_cuda, monkeypatch):
    """bench/tuning/tune_fused.py and bench/tuning/profile_fused.py set tkaot._quant.fused's tilings at run time: both paths of
    both ops read them at each call (meta tensors take the checked path, _OnDevice0 the hot one)."""
    tilings = []

    def record(device, *values, general_tiling=None):
        tilings.append(values[-1])  # tiling is the last static axis of both kernels
        raise _Launched

    for kernels in (_swiglu._SWIGLU, _norm_cast._NORM_CAST):
        monkeypatch.setattr(kernels, "get", record)
        monkeypatch.setattr(kernels, "cache", {})
    shipped = [_fused.SWIGLU_TILING, _fused.SWIGLU_CLAMP_TILING, _fused.NORM_CAST_TILING, _fused.NORM_CAST_RESIDUAL_TILING]
    assert _fused.SWIGLU_TILING != _fused.SWIGLU_CLAMP_TILING
    assert "R" not in _fused.NORM_CAST_TILING  # "R" tilings take a residual as given
    others = ["lean", "bits2v5w", "base", "pre"]
    for swiglu_tiling, clamp_tiling, norm_cast_tiling, residual_tiling in (shipped, others):
        monkeypatch.setattr(_fused, "SWIGLU_TILING", swiglu_tiling)
        monkeypatch.setattr(_fused, "SWIGLU_CLAMP_TILING", clamp_tiling)
        monkeypatch.setattr(_fused, "NORM_CAST_TILING", norm_cast_tiling)
        monkeypatch.setattr(_fused, "NORM_CAST_RESIDUAL_TILING", residual_tiling)
        for wrap in (lambda t: t, _OnDevice0):
            with pytest.raises(_Launched):
                tkaot.quant.swiglu_forward_and_per_token_cast(wrap(meta(4, 4096)), "e4m3", 128)
            with pytest.raises(_Launched):  # a call with a clamp takes the clamp tiling
                tkaot.quant.swiglu_forward_and_per_token_cast(wrap(meta(4, 4096)), "e4m3", 128, clamp_value=7.0)
            with pytest.raises(_Launched):
                tkaot.quant.norm_forward_and_per_token_cast(wrap(meta(4, 512)), None, 1e-6, "e4m3", 32)
            with pytest.raises(_Launched):  # a call with a residual takes the residual tiling
                tkaot.quant.norm_forward_and_per_token_cast(wrap(meta(4, 512)), None, 1e-6, "e4m3", 32, residual=wrap(meta(4, 512)))
    assert tilings == shipped * 2 + others * 2


def test_apply_rotary_cpu_tensor_is_refused():
    with pytest.raises(ValueError, match="query must be a CUDA tensor"):
        tkaot.transform.apply_rotary(torch.randn(4, 2, 64), torch.randn(8, 64))


def test_signatures_match_tile_kernels():
    import inspect
    from pathlib import Path

    path = Path(__file__).resolve().parent / "data" / "tile_kernels_2.1.0_api.json"
    if not path.exists():
        pytest.skip("TileKernels API list not present")
    api = json.loads(path.read_text())
    ops = [
        ("transform.apply_rotary", tkaot.transform.apply_rotary),
        ("quant.swiglu_forward", tkaot.quant.swiglu_forward),
        ("quant.swiglu_forward_and_per_token_cast", tkaot.quant.swiglu_forward_and_per_token_cast),
        ("quant.norm_forward_and_per_token_cast", tkaot.quant.norm_forward_and_per_token_cast),
    ]
    for name, fn in ops:
        assert list(inspect.signature(fn).parameters) == api[name]["params"], name


# --- references against independent formulations


def _angles(rows, rot_dim, generator):
    theta = torch.rand(rows, rot_dim // 2, generator=generator, dtype=torch.float64) * 6.3
    return torch.cat((theta.cos(), theta.sin()), dim=-1).float(), theta


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("conjugate", [False, True])
@pytest.mark.parametrize("four_d", [False, True])
def test_rotary_reference_is_a_complex_rotation(interleaved, conjugate, four_d):
    g = torch.Generator().manual_seed(int(interleaved) * 4 + int(conjugate) * 2 + int(four_d))
    rot_dim, half = 64, 32
    cache_, theta = _angles(40, rot_dim, g)
    shape = (2, 5, 3, rot_dim) if four_d else (5, 3, rot_dim)
    x = torch.randn(shape, generator=g)
    positions = torch.randint(0, 30, shape[:-2], generator=g)
    got = reference.rope.rotate(x, cache_, positions, interleaved, conjugate, seqlen_offset=4)
    # x as complex numbers, multiplied by e^{±i theta}
    pairs = x.double().unflatten(-1, (half, 2)) if interleaved else torch.stack((x[..., :half], x[..., half:]), -1).double()
    z = torch.view_as_complex(pairs.contiguous())
    angle = theta[positions + 4].unsqueeze(-2) * (-1 if conjugate else 1)
    r = torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle))
    want = r.flatten(-2) if interleaved else torch.cat((r[..., 0], r[..., 1]), -1)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    # Without positions, token t of every batch takes row t + offset
    plain = reference.rope.rotate(x, cache_, None, interleaved, conjugate, seqlen_offset=4)
    rows = torch.arange(shape[-3]).expand(shape[:-2])
    torch.testing.assert_close(plain, reference.rope.rotate(x, cache_, rows, interleaved, conjugate, 4), rtol=0, atol=0)


def test_swiglu_reference_is_silu_times_up():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(37, 2 * 256, generator=g) * 4
    w = torch.rand(37, generator=g)
    got = reference.fused.swiglu_forward(x, "fp32", topk_weights=w, routed_scaling_factor=3.0)
    want = torch.nn.functional.silu(x[:, :256].double()) * x[:, 256:].double() * (w.double() * 3)[:, None]
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-6)
    # clamping: gate from above only, up on both sides; counts over the rows psum selects
    count = torch.zeros(4, dtype=torch.int64)
    psum = torch.tensor([3, 20], dtype=torch.int32)  # rows 0-2 and (128-aligned start) none of 128..20
    clamped = reference.fused.swiglu_forward(x, "bf16", psum, clamp_value=2.0, clamped_count=count)
    gate, up = x[:, :256].clamp(max=2.0), x[:, 256:].clamp(-2.0, 2.0)
    torch.testing.assert_close(clamped.float(), (torch.nn.functional.silu(gate) * up).bfloat16().float(), rtol=2**-7, atol=1e-6)
    rows = x[:3]
    assert count.tolist() == [int((rows[:, :256] > 2).sum()), int((rows[:, 256:] > 2).sum()), int((rows[:, 256:] < -2).sum()), 3 * 256]


@pytest.mark.parametrize("round_sf, packed", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("col_major", [False, True])
def test_per_token_cast_reference_dequantises_to_its_input(round_sf, packed, col_major):
    g = torch.Generator().manual_seed(11)
    v = torch.randn(9, 768, generator=g) * torch.logspace(-3, 3, 9)[:, None]
    v[4] = 0
    kind = "ue8m0" if packed else ("pow2" if round_sf else "fp32")
    q, sf = reference.fused.per_token_cast(v, 128, kind, col_major)
    assert sf.stride()[0] == (1 if col_major else sf.shape[1])
    scale = reference.quant.sf_to_float(sf.contiguous())[:, : 768 // 128] if packed else sf
    # every value dequantises within E4M3's half-step: relative 2**-4, or 2**-10 * sf among subnormals
    expanded = scale.repeat_interleave(128, dim=1)
    error = (q.float() * expanded - v).abs()
    assert bool((error <= v.abs() * 2**-4 + expanded * 2**-10).all())
    # the group's largest value lands near 448 (within 2x below it when sf is a power of two)
    top = q.float().abs().unflatten(1, (-1, 128)).amax(-1)[torch.arange(9) != 4]
    assert bool(((top > 448 / 2 - 1e-3) & (top <= 448)).all())
    # an all-zero row keeps a tiny positive sf (the amax floor), never 0
    zero_q, zero_sf = reference.fused.per_token_cast(torch.zeros(2, 256), 128, "pow2")
    assert bool((zero_sf > 0).all()) and not zero_q.float().any()


@pytest.mark.parametrize("round_sf, packed", [(False, False), (True, False), (True, True)])
def test_norm_cast_reference_is_per_token_cast_of_norm_forward(round_sf, packed):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 512, generator=g).bfloat16()
    w = torch.randn(512, generator=g).bfloat16()
    r = torch.randn(2, 7, 512, generator=g).bfloat16()
    (q, sf), y, rstd, s = reference.fused.norm_forward_and_per_token_cast(x, w, 1e-6, r, 0.5, round_sf, packed)
    want_y, want_rstd, want_s = reference.norm_forward(x, w, 1e-6, r, 0.5, with_rstd=True)
    assert torch.equal(y, want_y) and torch.equal(s, want_s)
    torch.testing.assert_close(rstd, want_rstd)
    kind = "ue8m0" if packed else ("pow2" if round_sf else "fp32")
    want_q, want_sf = reference.fused.per_token_cast(want_y.float().flatten(0, 1), 32, kind)
    assert q.shape == x.shape and sf.shape == (2, 7, want_sf.shape[-1])
    assert torch.equal(q.flatten(0, 1).view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(sf.flatten(0, 1), want_sf)


def test_every_kernel_waits_at_entry_for_pdl(built):
    """Every kernel runs kernels_src/pdl.py's wait first, so every spec allows PDL launches: the three built
    here and every variant of the prebuilt set."""
    for kernel in BUILT:
        assert LaunchSpec.from_json(built[1][kernel]["launch"]).pdl is True
    manifest = json.loads((Path(__file__).resolve().parent.parent / "prebuilt" / "sm90" / "manifest.json").read_text())
    assert [e["key"] for e in manifest["variants"] if not e["launch"].get("pdl")] == []


def test_a_late_wait_is_refused():
    from build_tools.compile import BuildError, waits_at_entry

    head = '__device__ int tkaot_pdl_wait() { asm volatile("griddepcontrol.wait;"); return 0; }\n'
    head += 'extern "C" __global__ void k(float* x, float* out);\nextern "C" __global__ void k(float* x, float* out) {\n'
    assert waits_at_entry(head + "  float r[4];\n  tkaot_pdl_wait();\n  out[0] = x[0];\n}\n", ["x", "out"], "k") is True
    assert waits_at_entry('extern "C" __global__ void k(float* x) {\n  x[0] = 1;\n}\n', ["x"], "k") is False
    with pytest.raises(BuildError, match=r"not before it touches \['x'\]"):
        waits_at_entry(head + "  float r = x[0];\n  tkaot_pdl_wait();\n  out[0] = r;\n}\n", ["x", "out"], "k")


def test_a_specialised_tiling_not_built_falls_back_to_the_general_one(monkeypatch):
    """A set built without the residual or clamp tiling (older, or hand-written) still serves those calls, on the
    general tiling, which handles them; with neither built the error names the tiling asked for."""
    from tkaot import _op
    from tkaot.errors import VariantNotBuilt

    class Found:
        def __init__(self, key):
            self.key = key

        def bind(self, args):
            return ("launcher", self.key)

    built = {"hidden=7168,dtype=bfloat16,sf=fp32,tiling=lean8nlbwdgw"}

    def kernel(op, kernel, key, device):
        if key not in built:
            raise VariantNotBuilt(op, kernel, key, [], "tkaot-build ...", [])
        return Found(key)

    monkeypatch.setattr(_op.REGISTRY, "kernel", kernel)
    from tkaot._quant.kernels import NORM_CAST

    ops = _op.OpKernels("tkaot.quant.norm_forward_and_per_token_cast", NORM_CAST)
    asked = (7168, "bfloat16", "fp32", _fused.NORM_CAST_RESIDUAL_TILING)
    general = _fused.NORM_CAST_TILING
    assert ops.get(0, *asked, general_tiling=general) == ("launcher", "hidden=7168,dtype=bfloat16,sf=fp32,tiling=lean8nlbwdgw")
    assert ops.cache[(0, *asked)] == ("launcher", "hidden=7168,dtype=bfloat16,sf=fp32,tiling=lean8nlbwdgw")
    with pytest.raises(VariantNotBuilt, match=f"tiling={_fused.NORM_CAST_RESIDUAL_TILING}"):
        ops.get(0, 4096, "bfloat16", "fp32", _fused.NORM_CAST_RESIDUAL_TILING, general_tiling=general)  # neither built
    with pytest.raises(VariantNotBuilt):
        ops.get(1, *asked)  # no general tiling named: no fallback
