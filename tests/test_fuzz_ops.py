"""Property-based checks of the declared input rules of tkaot.quant's norm and SwiGLU ops (forward and backward),
tkaot.moe and tkaot.transform, on CPU (the casts: tests/test_fuzz_casts.py; mHC and Engram:
tests/test_fuzz_mhc_engram.py; the machinery: tests/fuzz.py).

Each op is one strategy of valid calls drawn within its documented limits, the sizes from its kernels' declared axes;
a valid call must launch exactly its declared variants, and each call with one thing broken (its Signature's tensors
broken one by one, and the case's own option breaks) must raise before any launch.
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import strategies as st  # noqa: E402

import tkaot  # noqa: E402
from tests.fuzz import (  # noqa: E402, F401 (launches: the fixture)
    BF16,
    BOOL,
    F8,
    F32,
    FAMILIES,
    FLOATS,
    I32,
    I64,
    NAMES,
    Call,
    Cases,
    choices,
    default_set,
    launches,
    meta,
    padded_rows,
    prebuilt_keys,
    sizes,
    tokens,
)
from tkaot._moe import backward as moe_backward  # noqa: E402
from tkaot._moe import ops as moe_ops  # noqa: E402
from tkaot._moe.kernels import MOE_GATE_BWD_TILINGS, MOE_TOPK_GATE, MOE_TOPK_GATE_BACKWARD, NORMALIZE_WEIGHT, TOPK_GATE  # noqa: E402
from tkaot._quant import fused, norm, norm_backward, norm_cast, swiglu, swiglu_backward  # noqa: E402
from tkaot._quant.kernels import NORM_CAST, RMSNORM, RMSNORM_BACKWARD, SWIGLU, SWIGLU_BACKWARD, WEIGHT_GRAD_REDUCE  # noqa: E402
from tkaot._quant.kernels import RMSNORM_BACKWARD_PLAIN as PLAIN  # noqa: E402
from tkaot._quant.kernels import RMSNORM_BACKWARD_RESIDUAL as RESIDUAL  # noqa: E402
from tkaot._transform import rotary  # noqa: E402
from tkaot._transform.kernels import ROTARY  # noqa: E402

CASES = Cases()


def vec(dtype) -> int:
    """Elements of a 16-byte vector."""
    return 16 // dtype.itemsize


# ---- norm_forward ----


def hidden_breaks(lead: tuple, dtype, multiple: int, limit: int) -> dict:
    """x of a hidden size the kernels do not take (0, over the limit, not a multiple), without the tensors sized by it."""
    alone = {"weight": None, "residual": None, "out": None, "residual_out": None}
    return {
        f"hidden {h}": {"x": meta(*lead, h, dtype=dtype), **alone}
        for h in (0, limit + multiple, multiple + vec(dtype))
        if h % multiple or h == 0 or h > limit
    }


# eps and out_scale reach the kernel as float32: a string, None or a bool is refused before the launch
REAL_BREAKS = {
    "eps a string": {"eps": "1e-6"}, "eps None": {"eps": None}, "eps True": {"eps": True}, "out_scale a string": {"out_scale": "2"},
}  # fmt: skip


@CASES.case("quant.norm_forward", built="listed")
def norm_forward(draw):
    dtype = draw(st.sampled_from(norm.SIGNATURE.tensors[0].dtypes))
    n, hidden = draw(tokens()), draw(sizes(RMSNORM, "hidden", 8192))
    batch = draw(st.sampled_from([None, 1, 3]))
    lead = (n,) if batch is None else (batch, n)
    weight, residual, out, residual_out, with_rstd = (draw(st.booleans()) for _ in range(5))
    x = padded_rows(*lead, hidden, dtype=dtype, pad=draw(st.sampled_from([0, vec(dtype)])))
    kwargs = {
        "x": x, "weight": meta(hidden, dtype=dtype) if weight else None, "eps": 1e-6,
        "residual": meta(*lead, hidden, dtype=dtype) if residual else None, "out": meta(*lead, hidden, dtype=dtype) if out else None,
        "residual_out": meta(*lead, hidden, dtype=dtype) if residual_out else None, "with_rstd": with_rstd,
    }  # fmt: skip
    key = {"hidden": hidden, "dtype": NAMES[dtype], "with_weight": weight, "with_residual": residual, "with_rstd": with_rstd}

    def check(result):
        y, rstd, _ = result
        assert y.shape == x.shape and y.dtype == dtype and (rstd is not None) == with_rstd

    breaks = {
        "65536 batches": {"x": meta(65536, n, hidden, dtype=dtype)},
        **hidden_breaks(lead, dtype, 16, 8192),
        "residual_out of another dtype": {"residual_out": meta(*lead, hidden, dtype=F32 if dtype is BF16 else BF16)},
        **REAL_BREAKS,
    }
    return Call("quant.norm_forward", kwargs, [(RMSNORM, key)], norm.SIGNATURE, breaks=breaks, check=check)


# ---- norm_forward_and_per_token_cast ----


@CASES.case("quant.norm_forward_and_per_token_cast", built="listed")
def norm_forward_and_per_token_cast(draw):
    dtype = draw(FLOATS)
    n, hidden = draw(tokens()), draw(sizes(NORM_CAST, "hidden", 8192))
    batch = draw(st.sampled_from([None, 1, 3]))
    lead = (n,) if batch is None else (batch, n)
    weight, residual, residual_out, with_rstd = (draw(st.booleans()) for _ in range(4))
    kwargs = {
        "x": padded_rows(*lead, hidden, dtype=dtype, pad=draw(st.sampled_from([0, vec(dtype)]))),
        "weight": meta(hidden, dtype=dtype) if weight else None, "eps": 1e-6,
        "residual": meta(*lead, hidden, dtype=dtype) if residual else None,
        "residual_out": meta(*lead, hidden, dtype=dtype) if residual and residual_out else None, "with_rstd": with_rstd,
    }  # fmt: skip
    if draw(st.booleans()):  # the unquantized formats: norm_forward's output
        kwargs.update(fmt="bf16" if dtype is BF16 else "fp32", num_per_channels=None)
        key = {"hidden": hidden, "dtype": NAMES[dtype], "with_weight": weight, "with_residual": residual, "with_rstd": with_rstd}
        breaks = {
            "fmt of another dtype": {"fmt": "fp32" if dtype is BF16 else "bf16"},
            "with_out_bf16": {"with_out_bf16": True},
            "mega_moe_block_m": {"mega_moe_block_m": 128},
            **hidden_breaks(lead, dtype, 16, 8192),
            **REAL_BREAKS,
        }
        return Call("quant.norm_forward_and_per_token_cast", kwargs, [(RMSNORM, key)], norm.SIGNATURE, breaks=breaks)
    sf = draw(choices(NORM_CAST, "sf"))
    col_major = draw(st.booleans())
    out_bf16 = draw(st.sampled_from([None, "new", "given"]))
    cols = -(-hidden // 128) if sf == "ue8m0" else hidden // 32
    given_sf = not col_major and draw(st.booleans())
    out = draw(st.sampled_from([None, "data", "both"])) if not given_sf else "both"
    kwargs.update(
        fmt="e4m3", num_per_channels=32, use_tma_aligned_col_major_sf=col_major, round_sf=sf != "fp32", use_packed_ue8m0=sf == "ue8m0",
        with_out_bf16=out_bf16 is not None, out_bf16=meta(*lead, hidden) if out_bf16 == "given" else None,
        out=None if out is None else (meta(*lead, hidden, dtype=F8), meta(*lead, cols, dtype=I32 if sf == "ue8m0" else F32)
                                      if given_sf else None),
    )  # fmt: skip
    tiling = fused.NORM_CAST_TILING if not residual else fused.NORM_CAST_RESIDUAL_TILING
    key = {"hidden": hidden, "dtype": NAMES[dtype], "sf": sf, "tiling": tiling}
    breaks = {
        "num_per_channels 128": {"num_per_channels": 128},
        "fmt e2m1": {"fmt": "e2m1"},
        "packed sf without round_sf": {"round_sf": False, "use_packed_ue8m0": True},
        "mega_moe_sf": {"mega_moe_sf": meta(4, dtype=F32)},
        "out_bf16 without with_out_bf16": {"with_out_bf16": False, "out_bf16": meta(*lead, hidden)},
        "a given sf with a column-major one asked": lambda kw: {**kw, "use_tma_aligned_col_major_sf": True, "out": (
            None, meta(*lead, cols, dtype=I32 if sf == "ue8m0" else F32))},
        "hidden 8224": {"x": meta(*lead, 8224, dtype=dtype), "weight": None, "residual": None, "out": None, "out_bf16": None},
        **REAL_BREAKS,
    }  # fmt: skip
    empty = n == 0 or batch == 0
    return Call("quant.norm_forward_and_per_token_cast", kwargs, [] if empty else [(NORM_CAST, key)], norm_cast.SIGNATURE, breaks=breaks)


# ---- swiglu_forward, swiglu_forward_and_per_token_cast ----


def swiglu_call(draw, op: str, fmt: str, group: int, sf: str, col_major: bool = False) -> Call:
    """A SwiGLU call of `op` with the format drawn by the caller, its other options drawn here."""
    dtype = draw(FLOATS)
    limit = 32768 if dtype is BF16 else 18432  # the kernels' register budget, per dtype (the op's docstring)
    # half the widths the specialised kernel takes (multiples of 256), half only the generic one does (of 64)
    n = draw(tokens())
    if draw(st.booleans()):
        hidden = draw(sizes(SWIGLU, "hidden", 32768, limit=limit))
    else:
        hidden = 64 * draw(st.sampled_from([1, 3, 5, 22, 45, 111, limit // 64 - 1]))
        if group == 128 and hidden % 128:  # e4m3 groups of 128 need a multiple of 128
            hidden += 64
    experts = draw(st.sampled_from([None, 1, 7, 64]))
    clamp = draw(st.sampled_from([None, 0.0, 7.5]))
    kwargs = {
        "x": padded_rows(n, 2 * hidden, dtype=dtype, pad=draw(st.sampled_from([0, vec(dtype)]))), "fmt": fmt,
        "psum_num_tokens_per_expert": None if experts is None else meta(experts, dtype=I32),
        "topk_weights": None, "routed_scaling_factor": None, "clamp_value": clamp,
        "clamped_count": meta(4, dtype=I64) if clamp is not None and draw(st.booleans()) else None,
    }  # fmt: skip
    if draw(st.booleans()):
        kwargs["topk_weights"] = meta(n, dtype=F32, strides=(draw(st.sampled_from([1, 3])),))
        kwargs["routed_scaling_factor"] = draw(st.sampled_from([None, 2.5, 1]))
    if op.endswith("cast"):
        kwargs.update(num_per_channels=group or None, use_tma_aligned_col_major_sf=col_major, round_sf=sf in ("pow2", "ue8m0"),
                      use_packed_ue8m0=sf == "ue8m0")  # fmt: skip
    tiling = fused.SWIGLU_TILING if clamp is None else fused.SWIGLU_CLAMP_TILING
    key = {"hidden": hidden, "dtype": NAMES[dtype], "fmt": fmt, "group": group, "sf": sf, "tiling": tiling}
    breaks = {
        "an odd width": {"x": meta(n, 2 * hidden + 1, dtype=dtype)},
        "hidden not a multiple of 64": {"x": meta(n, 2 * hidden + 64, dtype=dtype)},
        f"hidden over {limit}": {"x": meta(n, 2 * (limit + 256), dtype=dtype)},
        "a negative clamp_value": {"clamp_value": -1.0},
        "clamp_value -0.0": {"clamp_value": -0.0},
        "clamp_value NaN": {"clamp_value": float("nan")},
        "clamp_value a string": {"clamp_value": "7"},
        "clamped_count without clamp_value": {"clamp_value": None, "clamped_count": meta(4, dtype=I64)},
        "routed_scaling_factor without topk_weights": {"routed_scaling_factor": 2.0, "topk_weights": None},
        "routed_scaling_factor True": {"routed_scaling_factor": True, "topk_weights": meta(n, dtype=F32)},
        "fmt e5m2": {"fmt": "e5m2"},
    }
    sig = swiglu.CAST if op.endswith("cast") else swiglu.FORWARD
    return Call(op, kwargs, [] if n == 0 else [(SWIGLU, key)], sig, breaks=breaks)


@CASES.case("quant.swiglu_forward", built="listed")
def swiglu_forward(draw):
    fmt = draw(st.sampled_from(["bf16", "fp32"]))
    return swiglu_call(draw, "quant.swiglu_forward", fmt, 0, "none")


@CASES.case("quant.swiglu_forward_and_per_token_cast", built="listed")
def swiglu_forward_and_per_token_cast(draw):
    fmt, group = draw(st.sampled_from([("e4m3", 128), ("e4m3", 32), ("bf16", 0), ("fp32", 0)]))
    sf = draw(st.sampled_from(["fp32", "pow2", "ue8m0"])) if group else "none"
    call = swiglu_call(draw, "quant.swiglu_forward_and_per_token_cast", fmt, group, sf, col_major=draw(st.booleans()))
    call.breaks.update({
        "num_per_channels 64": {"num_per_channels": 64, "fmt": "e4m3"},
        "fmt e4m3 without num_per_channels": {"num_per_channels": None, "fmt": "e4m3"},
        "packed sf without round_sf": {"fmt": "e4m3", "num_per_channels": 128, "round_sf": False, "use_packed_ue8m0": True},
    })  # fmt: skip
    return call


# ---- norm_backward ----


@CASES.case("quant.norm_backward", built="listed")
def norm_backward_(draw):
    dtype = draw(FLOATS)
    n, hidden = draw(tokens()), draw(sizes(RMSNORM_BACKWARD, "hidden", 8192))
    weight = draw(st.booleans())
    grad_dtype = draw(FLOATS) if weight and draw(st.booleans()) else None
    pad = vec(dtype) * draw(st.sampled_from([0, 1]))
    kwargs = {
        "out_grad": padded_rows(n, hidden, dtype=dtype, pad=pad), "x": padded_rows(n, hidden, dtype=dtype),
        "weight": meta(hidden, dtype=dtype) if weight else None, "rstd": meta(n, dtype=F32),
        "residual_out_grad": meta(n, hidden, dtype=dtype) if draw(st.booleans()) else None, "out_scale": 1.0,
        "weight_grad": None if grad_dtype is None else meta(hidden, dtype=grad_dtype),
    }  # fmt: skip
    pass1 = RMSNORM_BACKWARD
    key = RMSNORM_BACKWARD.key((hidden, NAMES[dtype]))
    if kwargs["residual_out_grad"] is not None and (RESIDUAL.name, key) in default_set():
        pass1 = RESIDUAL  # with a residual gradient, where it is built
    elif kwargs["residual_out_grad"] is None and not weight and (PLAIN.name, key) in default_set():
        pass1 = PLAIN  # with neither a weight nor a residual gradient, where it is built
    made = [(pass1, {"hidden": hidden, "dtype": NAMES[dtype]})]
    if weight:
        made.append((WEIGHT_GRAD_REDUCE, {"dtype": NAMES[grad_dtype or dtype]}))
    breaks = {
        "hidden 8224": lambda kw: {**kw, **{k: meta(n, 8224, dtype=dtype) for k in ("out_grad", "x")}, "weight": None,
                                   "weight_grad": None, "residual_out_grad": None},
        "hidden not a multiple of 32": lambda kw: {**kw, **{k: meta(n, hidden + 16, dtype=dtype) for k in ("out_grad", "x")},
                                                   "weight": None, "weight_grad": None, "residual_out_grad": None},
        "weight_grad without weight": {"weight": None, "weight_grad": meta(hidden, dtype=F32)},
    }  # fmt: skip
    return Call("quant.norm_backward", kwargs, [] if n == 0 else made, norm_backward.SIGNATURE, breaks=breaks)


# ---- swiglu_backward, swiglu_backward_and_per_token_cast ----


def swiglu_backward_call(draw, op: str, fmt: str, group: int, sf: str) -> Call:
    quantized = fmt == "e4m3"
    dtype = F8 if quantized else draw(FLOATS)
    grad_dtype = draw(FLOATS) if op.endswith("cast") else dtype
    rows, hidden = draw(tokens()), 64 * draw(st.integers(1, 256))
    if quantized:
        hidden = -(-hidden // group) * group
    lead = draw(st.sampled_from([(rows,), (1, rows), (3, rows)]))
    rows = lead[0] * (lead[1] if len(lead) == 2 else 1)
    data = meta(*lead, 2 * hidden, dtype=dtype)
    x = (data, meta(rows, 2 * hidden // group, dtype=F32)) if quantized else data
    weights = draw(st.booleans())
    kwargs = {
        "x": x, "act_x_grad": meta(*lead, hidden, dtype=grad_dtype) if draw(st.booleans()) else meta(rows, hidden, dtype=grad_dtype),
        "fmt": fmt, "psum_num_tokens_per_expert": meta(draw(st.sampled_from([1, 8, 64])), dtype=I32) if draw(st.booleans()) else None,
        "topk_weights": meta(rows, dtype=F32) if weights else None,
        "routed_scaling_factor": draw(st.sampled_from([None, 2.5])) if weights else None,
        "clamp_value": draw(st.sampled_from([None, 0.0, 7.5])), "do_recompute": draw(st.booleans()),
    }  # fmt: skip
    if op.endswith("cast"):
        col_major = draw(st.booleans())
        kwargs.update(num_per_channels=group or draw(st.sampled_from([32, 128])), use_tma_aligned_col_major_sf=col_major,
                      round_sf=sf in ("pow2", "ue8m0"), use_packed_ue8m0=sf == "ue8m0")  # fmt: skip
    key = {"x_dtype": "e4m3" if quantized else NAMES[dtype], "grad_dtype": NAMES[grad_dtype], "fmt": fmt, "group": group, "sf": sf}
    sig = swiglu_backward.CAST_SIGNATURE if op.endswith("cast") else swiglu_backward.SIGNATURE
    paths = {"x": ("x", 0), "x_sf": ("x", 1)} if quantized else {}
    breaks = {
        "hidden not a multiple of 64": lambda kw: {**kw, "x": meta(rows, 2 * hidden + 32, dtype=dtype) if not quantized else (
            meta(rows, 2 * hidden + 32, dtype=dtype), kw["x"][1]), "act_x_grad": meta(rows, hidden + 16, dtype=grad_dtype)},
        "act_x_grad of other rows": {"act_x_grad": meta(rows + 1, hidden, dtype=grad_dtype)},
        "act_x_grad of another width": {"act_x_grad": meta(rows, 2 * hidden, dtype=grad_dtype)},
        "routed_scaling_factor without topk_weights": {"routed_scaling_factor": 2.0, "topk_weights": None},
        "clamp_value a string": {"clamp_value": "7"},
        "fmt e5m2": {"fmt": "e5m2"},
    }  # fmt: skip
    return Call(op, kwargs, [] if rows == 0 else [(SWIGLU_BACKWARD, key)], sig, paths=paths, breaks=breaks)


@CASES.case("quant.swiglu_backward", built="listed")
def swiglu_backward_(draw):
    call = swiglu_backward_call(draw, "quant.swiglu_backward", draw(st.sampled_from(["bf16", "fp32"])), 0, "none")
    call.breaks["fmt e4m3"] = {"fmt": "e4m3"}
    call.breaks["act_x_grad of another dtype"] = lambda kw: {**kw, "act_x_grad": meta(
        *kw["act_x_grad"].shape, dtype=F32 if kw["x"].dtype is BF16 else BF16)}  # fmt: skip
    return call


@CASES.case("quant.swiglu_backward_and_per_token_cast", built="listed")
def swiglu_backward_and_per_token_cast(draw):
    fmt, group = draw(st.sampled_from([("e4m3", 128), ("e4m3", 32), ("bf16", 0), ("fp32", 0)]))
    sf = draw(st.sampled_from(["fp32", "pow2", "ue8m0"])) if group else "none"
    call = swiglu_backward_call(draw, "quant.swiglu_backward_and_per_token_cast", fmt, group, sf)
    if group:
        data, x_sf = call.kwargs["x"]
        call.breaks.update({
            "num_per_channels 64": {"num_per_channels": 64},
            "packed sf without round_sf": {"round_sf": False, "use_packed_ue8m0": True},
            "x a tensor": {"x": data},
            "x_sf of the other group": {"x": (data, meta(x_sf.shape[0], x_sf.shape[1] * (4 if group == 32 else 1) // (
                1 if group == 32 else 4) if group == 128 else x_sf.shape[1] // 4, dtype=F32))},
            "x_sf missing": {"x": (data, None)},
        })  # fmt: skip
    else:
        call.breaks["fmt e4m3 with a tensor"] = {"fmt": "e4m3", "num_per_channels": 128}
    return call


# ---- apply_rotary ----


@CASES.case("transform.apply_rotary")
def apply_rotary(draw):
    dtype = draw(FLOATS)
    rot = draw(choices(ROTARY, "rot_dim"))
    lead = draw(st.sampled_from([(1,), (3,), (127,), (4097,), (0,), (2, 5), (1, 9)]))
    heads, key_heads = draw(st.integers(1, 16)), draw(st.sampled_from([None, 1, 4]))
    seqlen = lead[-1]
    rows = seqlen + draw(st.sampled_from([0, 5]))
    positions = draw(st.sampled_from([None, I32, I64]))
    interleaved = draw(st.booleans())
    kwargs = {
        "query": meta(*lead, heads, rot, dtype=dtype), "cos_sin_cache": meta(rows, rot, dtype=F32),
        "key": None if key_heads is None else meta(*lead, key_heads, rot, dtype=dtype),
        "positions": None if positions is None else meta(*lead, dtype=positions), "interleaved": interleaved,
        "conjugate": draw(st.booleans()), "seqlen_offset": 0 if positions is not None else draw(st.sampled_from([0, rows - seqlen])),
    }  # fmt: skip
    key = {"rot_dim": rot, "dtype": NAMES[dtype], "interleaved": interleaved}
    made = [] if 0 in lead else [(ROTARY, key)]  # one launch rotates query and key
    breaks = {
        "rot_dim 96": {"cos_sin_cache": meta(rows, 96, dtype=F32), "query": meta(*lead, heads, 96, dtype=dtype), "key": None},
        "query of half the rot_dim": {"query": meta(*lead, heads, rot // 2, dtype=dtype)},
        "positions float": {"positions": meta(*lead, dtype=F32)},
        "seqlen_offset past the cache": {"positions": None, "seqlen_offset": rows - seqlen + 1},
        "seqlen_offset a float": {"positions": None, "seqlen_offset": 0.0},
        "65536 batches": {"query": meta(65536, 1, heads, rot, dtype=dtype), "key": None, "positions": None},
        # each within int32 alone (zero token and head strides), not together: one launch takes both's head rows
        "query and key head rows past int32": {
            "query": meta(2**16, 2**15 - 1, rot, dtype=dtype, strides=(0, 0, 1)),
            "key": meta(2**16, 1, rot, dtype=dtype, strides=(0, 0, 1)),
            "cos_sin_cache": meta(2**16, rot, dtype=F32),
            "positions": None,
            "seqlen_offset": 0,
        },
    }
    if seqlen == 0:
        del breaks["seqlen_offset past the cache"]
    return Call("transform.apply_rotary", kwargs, made, rotary.SIGNATURE, breaks=breaks)


# ---- tkaot.moe ----

EXPERTS = sizes(MOE_TOPK_GATE, "num_experts", 512)


@CASES.case("moe.moe_topk_gate_forward")  # every valid call: specialised or generic
def moe_topk_gate_forward(draw):
    n, experts = draw(tokens()), draw(EXPERTS)
    shared = draw(st.sampled_from([0, 1, 2]))
    topk = draw(st.integers(1, min(experts, 32 - shared)))
    slots = topk + shared
    options = draw(st.lists(st.sampled_from(["mask", "bias", "image", "fix", "physical", "random", "out", "scores"]), unique=True))
    duplicates = draw(st.sampled_from([1, 3]))
    kwargs = {
        "logits": meta(n, experts, dtype=F32), "num_topk": topk, "use_shared_as_routed": shared > 0,
        "num_shared_experts": max(shared, 1), "routed_scaling_factor": 2.5, "ep_rank": draw(st.sampled_from([0, 7])),
        "mask": meta(n, dtype=BOOL) if "mask" in options else None, "bias": meta(experts, dtype=F32) if "bias" in options else None,
        "image_bias": meta(experts, dtype=F32) if "image" in options else None,
        "image_token_mask": meta(n, dtype=BOOL) if "image" in options else None,
        "fix_routing_mask": meta(n, dtype=BOOL) if "fix" in options else None,
        "unmapped_topk_idx": meta(n, topk, dtype=I64) if "fix" in options or draw(st.booleans()) else None,
        "to_physical_map": meta(experts + shared, duplicates, dtype=I32) if "physical" in options else None,
        "logical_count": meta(experts + shared, dtype=I32) if "physical" in options else None,
        "force_random": meta(n, dtype=BOOL) if "random" in options else None,
        "out": (meta(n, slots, dtype=I64), meta(n, slots, dtype=F32)) if "out" in options else None,
        "scores": meta(n, experts, dtype=F32) if "scores" in options else None,
    }  # fmt: skip

    def check(result):
        idx, weights = result
        assert idx.shape == weights.shape == (n, slots) and idx.dtype == I64 and weights.dtype == F32

    breaks = {
        "experts not a multiple of 4": {"logits": meta(n, experts + 1, dtype=F32), "bias": None, "image_bias": None, "scores": None,
                                        "to_physical_map": None, "logical_count": None},
        "no experts": {"logits": meta(n, 0, dtype=F32), "bias": None, "image_bias": None, "scores": None, "to_physical_map": None,
                       "logical_count": None},
        "more experts than 512": {"logits": meta(n, 516, dtype=F32), "bias": None, "image_bias": None, "scores": None,
                                  "to_physical_map": None, "logical_count": None},
        "num_topk 0": {"num_topk": 0, "unmapped_topk_idx": None, "fix_routing_mask": None, "out": None},
        "num_topk + shared over 32": {"num_topk": 33 - shared, "unmapped_topk_idx": None, "fix_routing_mask": None, "out": None},
        "num_topk over the experts": {"logits": meta(n, 4, dtype=F32), "num_topk": 5, "bias": None, "image_bias": None, "scores": None,
                                      "to_physical_map": None, "logical_count": None, "unmapped_topk_idx": None,
                                      "fix_routing_mask": None, "out": None},
        "num_topk a float": {"num_topk": float(topk)},
        "3 shared experts": {"use_shared_as_routed": True, "num_shared_experts": 3},
        "ep_rank -1": {"ep_rank": -1},
        "scoring_func softmax": {"scoring_func": "softmax"},
        "image_bias alone": {"image_bias": meta(experts, dtype=F32), "image_token_mask": None},
        "image_token_mask alone": {"image_bias": None, "image_token_mask": meta(n, dtype=BOOL)},
        "fix_routing_mask without unmapped_topk_idx": {"fix_routing_mask": meta(n, dtype=BOOL), "unmapped_topk_idx": None},
        "to_physical_map alone": {"to_physical_map": meta(experts + shared, 2, dtype=I32), "logical_count": None},
        "logical_count alone": {"to_physical_map": None, "logical_count": meta(experts + shared, dtype=I32)},
        "mask of another length": {"mask": meta(n + 1, dtype=BOOL)},
        "force_random of another length": {"force_random": meta(n + 1, dtype=BOOL)},
        "unmapped_topk_idx column-strided": {"unmapped_topk_idx": meta(n, topk, dtype=I64, strides=(2 * topk, 2))} if topk > 1 else {
            "unmapped_topk_idx": meta(n, topk + 1, dtype=I64)},
        "out a tensor": {"out": meta(n, slots, dtype=I64)},
    }  # fmt: skip
    key = {"num_experts": experts, "num_topk": topk, "tiling": moe_ops._GATE_TILING}
    return Call("moe.moe_topk_gate_forward", kwargs, [] if n == 0 else [(MOE_TOPK_GATE, key)], moe_ops.GATE_SIGNATURE,
                breaks=breaks, check=check)  # fmt: skip


@CASES.case("moe.moe_topk_gate")
def moe_topk_gate(draw):
    call = moe_topk_gate_forward(draw)
    call.op = "moe.moe_topk_gate"
    return call


@CASES.case("moe.topk_gate")
def topk_gate(draw):
    n, experts = draw(tokens()), draw(sizes(TOPK_GATE, "num_experts", 512))
    topk = draw(st.integers(1, min(experts, 32)))
    # a row of experts a multiple of 4 is read as 16-byte vectors: its tensor 16-byte aligned; else 4 bytes will do
    offset = 0 if experts % 4 == 0 else draw(st.sampled_from([0, 1]))
    kwargs = {"scores": meta(n, experts, dtype=F32, offset=offset), "num_topk": topk}

    def check(idx):
        assert idx.shape == (n, topk) and idx.dtype == I64

    breaks = {
        "num_topk 0": {"num_topk": 0},
        "num_topk over the experts": {"num_topk": min(experts, 32) + 1},
        "num_topk True": {"num_topk": True},
        "513 experts": {"scores": meta(n, 513, dtype=F32)},
        "0 experts": {"scores": meta(n, 0, dtype=F32)},
    }
    key = {"num_experts": experts, "num_topk": topk, "tiling": moe_ops._TOPK_TILING}
    return Call("moe.topk_gate", kwargs, [] if n == 0 else [(TOPK_GATE, key)], moe_ops.TOPK_SIGNATURE, breaks=breaks, check=check)


@CASES.case("moe.normalize_weight")  # every valid call: specialised or generic
def normalize_weight(draw):
    n, topk = draw(tokens()), draw(sizes(NORMALIZE_WEIGHT, "num_topk", 32))
    kwargs = {"topk_weights": meta(n, topk, dtype=F32)}
    breaks = {"33 weights a token": {"topk_weights": meta(n, 33, dtype=F32)}, "0 weights a token": {"topk_weights": meta(n, 0, dtype=F32)}}
    made = [] if n == 0 else [(NORMALIZE_WEIGHT, {"num_topk": topk})]
    return Call("moe.normalize_weight", kwargs, made, moe_ops.NORMALIZE_SIGNATURE, breaks=breaks)


@CASES.case("moe.moe_topk_gate_backward")
def moe_topk_gate_backward(draw):
    n, experts = draw(tokens()), draw(st.integers(1, 512))
    topk = draw(st.integers(0, min(experts, 32)))
    seqs = draw(st.sampled_from([d for d in (1, 3, 127) if n % d == 0])) if draw(st.booleans()) else None
    kwargs = {
        "scores": meta(n, experts, dtype=F32), "topk_idx": meta(n, topk, dtype=I64), "topk_weights": meta(n, topk, dtype=F32),
        "grad_topk_weights": meta(n, topk, dtype=F32), "routed_scaling_factor": 2.5,
        "mask": None if seqs is None else meta(n, dtype=BOOL), "grad_scores_sum": None if seqs is None else meta(seqs, experts, dtype=F32),
        "out": meta(n, experts, dtype=F32) if draw(st.booleans()) else None,
    }  # fmt: skip
    breaks = {
        "513 experts": {"scores": meta(n, 513, dtype=F32), "grad_scores_sum": None, "mask": None, "out": None},
        "slots over min(experts, 32)": lambda kw: {**kw, **{k: meta(n, min(experts, 32) + 1, dtype=kw[k].dtype) for k in (
            "topk_idx", "topk_weights", "grad_topk_weights")}},
        "mask without grad_scores_sum": {"mask": meta(n, dtype=BOOL), "grad_scores_sum": None},
        "grad_scores_sum without mask": {"mask": None, "grad_scores_sum": meta(1, experts, dtype=F32)},
        "grad_scores_sum of 0 rows": {"mask": meta(n, dtype=BOOL), "grad_scores_sum": meta(0, experts, dtype=F32)},
        "scoring_func softmax": {"scoring_func": "softmax"},
    }  # fmt: skip
    if n > 1:
        breaks["grad_scores_sum rows not dividing the tokens"] = {
            "mask": meta(n, dtype=BOOL),
            "grad_scores_sum": meta(n - 1 if n > 2 else 3, experts, dtype=F32),
        }  # noqa: E501
    made = [] if n == 0 else [(MOE_TOPK_GATE_BACKWARD, {"tiling": MOE_GATE_BWD_TILINGS["default"]})]
    return Call("moe.moe_topk_gate_backward", kwargs, made, moe_backward.SIGNATURE, breaks=breaks)


# ---- what the fuzzing covers


def test_every_public_op_has_a_strategy():
    """Every public op of the kernel families is fuzzed here or in tests/test_fuzz_casts.py / test_fuzz_mhc_engram.py."""
    from tests import test_fuzz_casts, test_fuzz_mhc_engram

    covered = {*CASES.strategies, *test_fuzz_casts.CASES.strategies, *test_fuzz_mhc_engram.CASES.strategies}
    public = {f"{family}.{name}" for family in FAMILIES for name in getattr(tkaot, family).__all__}
    assert not public - covered, f"ops without a strategy: {sorted(public - covered)}"


def test_the_default_set_stands_for_prebuilt():
    """Valid calls resolve against the default shape set: prebuilt/sm90 holds a part of it (all of it once rebuilt)."""
    assert prebuilt_keys() <= default_set()


test_valid_calls = CASES.valid_test()
test_invalid_calls = CASES.invalid_test()
