"""Property-based checks of the declared input rules of tkaot.mhc and tkaot.engram, on CPU (machinery: tests/fuzz.py).

Each op is one strategy of valid calls drawn within its documented limits; a valid call must launch exactly its
declared variant, and each call with one thing broken (its Signature's tensors broken one by one, and the case's own
breaks) must raise before any launch. Adding an op: one `@CASES.case` strategy returning a `Call`.
"""

from __future__ import annotations

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz import BF16, BOOL, F32, I32, I64, Call, Cases, choices, dense, launches, meta, tokens  # noqa: E402, F401
from tkaot._engram import gate, hash, sinkhorn  # noqa: E402
from tkaot._engram.kernels import (  # noqa: E402
    ENGRAM_HASH,
    FUSED_WEIGHT,
    GATE_BWD,
    GATE_BWD_TILINGS,
    GATE_FWD,
    GATE_FWD_DECODE_HIDDEN,
    GATE_FWD_DECODE_TOKENS,
    GATE_FWD_TILINGS,
    GRAD_W_REDUCE,
    GRAD_W_REDUCE_TILINGS,
    MAX_GATE_HIDDEN,
    SINKHORN_FINALIZE,
    SINKHORN_MOMENTUM,
    SINKHORN_MOMENTUM_TILINGS,
    SINKHORN_STEP,
    SINKHORN_STEP_REDUCE,
    SINKHORN_STEP_REDUCE_TILINGS,
)
from tkaot._mhc import big_fuse, expand, head_mix, norm_fn, post, pre_apply_mix, split_mixes  # noqa: E402
from tkaot._mhc import sinkhorn as mhc_sinkhorn  # noqa: E402
from tkaot._mhc.kernels import (  # noqa: E402
    EXPAND_BWD,
    EXPAND_FWD,
    HEAD_MIX_BWD,
    HEAD_MIX_FWD,
    MAX_MHC,
    MULTILAYER_RECOMPUTE,
    NORMW_MERGE_BWD,
    NORMW_MERGE_FWD,
    POST_BWD,
    POST_FWD,
    PRE_APPLY_MIX_BWD,
    PRE_APPLY_MIX_FWD,
    PRE_BIG_FUSE,
    PRE_BIG_FUSE_SPLIT,
    REDUCE_PARTIALS_BWD,
    REDUCE_PARTIALS_FWD,
    SINKHORN_BWD,
    SINKHORN_FWD,
    SPLIT_MIXES_BWD,
    SPLIT_MIXES_BWD_REDUCE,
    SPLIT_MIXES_FWD,
    pre_apply_mix_bwd_tiling,
)
from tkaot._validate import MAX_I32  # noqa: E402

CASES = Cases()
MULTS = (1, 2, 3, 4, 8, 24)  # mhc_mult: 4 in DeepSeek's models


def f32(*shape):
    return meta(*shape, dtype=F32)


def float_breaks(*names: str) -> dict:
    """A float argument given a string, and a bool (each travels to the kernel as float32)."""
    return {**{f"{n} a string": {n: "1e-6"} for n in names}, **{f"{n} True": {n: True} for n in names}}


def int_breaks(name: str, low: int) -> dict:
    return {f"{name} {low - 1}": {name: low - 1}, f"{name} a float": {name: float(low)}, f"{name} True": {name: True}}


# ---- tkaot.mhc ----


@CASES.case("mhc.mhc_head_compute_mix_fwd")
def mhc_head_compute_mix_fwd(draw):
    n, m = draw(tokens()), draw(st.sampled_from(MULTS))
    kwargs = {"input_mix": f32(n, m), "mhc_scale": f32(1), "mhc_base": f32(m), "output_mix": f32(n, m), "mhc_pre_eps": 1e-2,
              "token_block_size": draw(st.sampled_from([0, 32, 64]))}  # fmt: skip
    breaks = {**float_breaks("mhc_pre_eps"), **int_breaks("token_block_size", 0), "mhc_scale of 3": {"mhc_scale": f32(3)}}
    made = [] if n == 0 else [(HEAD_MIX_FWD, {"dtype": "float32"})]
    return Call("mhc.mhc_head_compute_mix_fwd", kwargs, made, head_mix.FWD_SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_head_compute_mix_bwd")
def mhc_head_compute_mix_bwd(draw):
    n, m = draw(tokens()), draw(st.sampled_from([1, 2, 4, 8, 128]))
    sms = draw(st.sampled_from([1, 132, 264]))
    kwargs = {
        "output_mix_grad": f32(n, m), "input_mix": f32(n, m), "mhc_scale": f32(1), "mhc_base": f32(m), "input_mix_grad": f32(n, m),
        "mhc_scale_grad_partial": f32(sms, 1), "mhc_base_grad_partial": f32(sms, m), "num_sms": sms,
        "token_block_size": draw(st.sampled_from([0, 1, 32])),
    }  # fmt: skip
    breaks = {
        **int_breaks("num_sms", 1), **int_breaks("token_block_size", 0),
        "mhc_mult 3": {k: f32(n, 3) for k in ("output_mix_grad", "input_mix", "input_mix_grad")} | {
            "mhc_base": f32(3), "mhc_base_grad_partial": f32(sms, 3)},
        "mhc_mult 256": {k: f32(n, 256) for k in ("output_mix_grad", "input_mix", "input_mix_grad")} | {
            "mhc_base": f32(256), "mhc_base_grad_partial": f32(sms, 256)},
        "num_sms unlike the partials": {"num_sms": sms + 1},
    }  # fmt: skip
    return Call("mhc.mhc_head_compute_mix_bwd", kwargs, [(HEAD_MIX_BWD, {"dtype": "float32"})], head_mix.BWD_SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_fn_normw_merge_fwd")
def mhc_fn_normw_merge_fwd(draw):
    m, n = draw(st.sampled_from([0, 1, 24, 65535])), draw(st.sampled_from([0, 1, 7, 4096, 28672]))
    kwargs = {"fn": f32(m, n), "normw": f32(n), "out_fn": f32(m, n)}
    breaks = {"65536 rows": {"fn": f32(65536, n), "out_fn": f32(65536, n)}}
    made = [(NORMW_MERGE_FWD, {"dtype": "float32"})] if m and n else []
    return Call("mhc.mhc_fn_normw_merge_fwd", kwargs, made, norm_fn.MERGE_FWD_SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_fn_normw_merge_bwd")
def mhc_fn_normw_merge_bwd(draw):
    m, n = draw(st.sampled_from([0, 1, 24, 70000])), draw(st.sampled_from([0, 1, 7, 4096, 28672]))
    kwargs = {"fn": f32(m, n), "normw": f32(n), "out_fn_grad": f32(m, n), "fn_grad": f32(m, n), "normw_grad": f32(n)}
    made = [(NORMW_MERGE_BWD, {"dtype": "float32"})] if n else []
    return Call("mhc.mhc_fn_normw_merge_bwd", kwargs, made, norm_fn.MERGE_BWD_SIGNATURE)


def reduce_sizes(draw) -> tuple[int, int, int]:
    return draw(tokens()), draw(st.sampled_from([1, 2, 16])), draw(st.sampled_from([0, 1, 24, 80]))


@CASES.case("mhc.mhc_reduce_partials_and_rmsnorm_fwd")
def mhc_reduce_partials_and_rmsnorm_fwd(draw):
    n, groups, cols = reduce_sizes(draw)
    splits = draw(st.sampled_from([1, 4, 16]))
    kwargs = {
        "out_mul_splitted": f32(splits, n, groups, cols), "sqrsum_splitted": f32(splits, n, groups), "out_mul": f32(n, groups, cols),
        "sqrsum": f32(n, groups), "out": f32(n, cols), "rms_group_size": draw(st.sampled_from([1, 7168, 2**24])), "rms_eps": 1e-6,
        "n_splits": splits,
    }  # fmt: skip
    breaks = {**float_breaks("rms_eps"), **int_breaks("rms_group_size", 1), "rms_group_size 2**24 + 1": {"rms_group_size": 2**24 + 1},
              "n_splits unlike the partials": {"n_splits": splits + 1}, "n_splits a float": {"n_splits": float(splits)}}  # fmt: skip
    made = [(REDUCE_PARTIALS_FWD, {"dtype": "float32"})] if n and cols else []
    return Call("mhc.mhc_reduce_partials_and_rmsnorm_fwd", kwargs, made, norm_fn.REDUCE_FWD_SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_reduce_partials_and_rmsnorm_bwd")
def mhc_reduce_partials_and_rmsnorm_bwd(draw):
    n, groups, cols = reduce_sizes(draw)
    kwargs = {
        "out_grad": f32(n, cols), "out_mul": f32(n, groups, cols), "sqrsum": f32(n, groups), "out_mul_grad": f32(n, groups, cols),
        "sqrsum_grad": f32(n, groups), "rms_group_size": draw(st.sampled_from([1, 7168])), "rms_eps": 1e-6,
    }  # fmt: skip
    breaks = {**float_breaks("rms_eps"), **int_breaks("rms_group_size", 1)}
    made = [(REDUCE_PARTIALS_BWD, {"dtype": "float32"})] if n and groups else []
    return Call("mhc.mhc_reduce_partials_and_rmsnorm_bwd", kwargs, made, norm_fn.REDUCE_BWD_SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_pre_big_fuse_fwd", built="listed")
def mhc_pre_big_fuse_fwd(draw):
    n, m = draw(tokens()), draw(st.sampled_from(big_fuse.RATES))
    hidden = 8 * draw(st.integers(1, min(2**24 // (8 * m), 4096)))
    splits = draw(st.sampled_from([1, 16]))
    m3 = m * (m + 2)
    kwargs = {
        "gemm_out_mul": f32(splits, n, m3), "gemm_out_sqrsum": f32(splits, n), "mhc_scale": f32(3), "mhc_base": f32(m3),
        "residual": meta(n, m, hidden), "post_mix": f32(n, m), "comb_mix": f32(n, m * m), "layer_input": meta(n, hidden),
        "rms_eps": 1e-6, "mhc_pre_eps": 1e-2, "mhc_sinkhorn_eps": 1e-6, "mhc_post_mult_value": 2.0,
        "sinkhorn_repeat": draw(st.sampled_from([0, 1, 20])), "n_splits": splits,
    }  # fmt: skip
    breaks = {
        **float_breaks("rms_eps", "mhc_pre_eps", "mhc_sinkhorn_eps", "mhc_post_mult_value"),
        **int_breaks("sinkhorn_repeat", 0), **int_breaks("n_splits", 1),
        "mhc_mult 3": {"gemm_out_mul": f32(splits, n, 15), "mhc_base": f32(15), "residual": meta(n, 3, hidden), "post_mix": f32(n, 3),
                       "comb_mix": f32(n, 9)},
        "hidden not a multiple of 8": {"residual": meta(n, m, hidden + 4), "layer_input": meta(n, hidden + 4)},
        "mhc_mult * hidden over 2**24": {"residual": meta(n, m, 2**24 // m + 8), "layer_input": meta(n, 2**24 // m + 8)},
        "n_splits unlike the partials": {"n_splits": splits + 1},
    }  # fmt: skip
    kernel = PRE_BIG_FUSE_SPLIT if n <= big_fuse.SPLIT_MAX_TOKENS else PRE_BIG_FUSE  # few tokens: a token over several blocks
    made = [] if n == 0 else [(kernel, {"mhc_mult": m})]
    return Call("mhc.mhc_pre_big_fuse_fwd", kwargs, made, big_fuse.SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_multilayer_recompute", built="listed")
def mhc_multilayer_recompute(draw):
    m = draw(st.integers(1, 8))
    lead = draw(st.sampled_from([(0,), (1,), (127,), (2, 3)]))
    hidden, layers = 8 * draw(st.integers(1, 512)), draw(st.integers(1, 4))
    post = draw(st.sampled_from([layers - 1, layers]))
    n = 1
    for d in lead:
        n *= d
    lists = {
        "pre_mix_list": [f32(*lead, m, 1) for _ in range(layers)], "layer_output_list": [meta(*lead, hidden) for _ in range(post)],
        "post_mix_list": [f32(*lead, m) for _ in range(post)], "comb_mix_list": [f32(*lead, m, m) for _ in range(post)],
        "layer_input_list": [meta(*lead, hidden) for _ in range(layers)], "residual_list": [meta(*lead, m, hidden) for _ in range(post)],
    }  # fmt: skip
    kwargs = {"initial_residual": meta(*lead, m, hidden), **lists}
    breaks = {
        "initial_residual fp32": {"initial_residual": f32(*lead, m, hidden)},
        "initial_residual on the CPU": {"initial_residual": _cpu(*lead, m, hidden)},
        "initial_residual 1-D": {"initial_residual": meta(hidden)},
        "initial_residual a list": {"initial_residual": [0.0]},
        "mhc_mult 9": {"initial_residual": meta(*lead, 9, hidden)},
        "hidden not a multiple of 8": {"initial_residual": meta(*lead, m, hidden + 4)},
        "initial_residual misaligned": {"initial_residual": meta(*lead, m, hidden, offset=1)} if n else {"pre_mix_list": []},
        "no layer": {name: [] for name in lists},
        "one layer input too few": {"layer_input_list": lists["layer_input_list"][:-1]},
        "post lists of two lengths": {"post_mix_list": [*lists["post_mix_list"], f32(*lead, m)]},
        "a tuple of lists": {"pre_mix_list": "not a list"},
        "a pre mix of bf16": {"pre_mix_list": [meta(*lead, m, 1), *lists["pre_mix_list"][1:]]},
        "a pre mix of one more element": {"pre_mix_list": [f32(n * m + 1), *lists["pre_mix_list"][1:]]},
        "a layer input on the CPU": {"layer_input_list": [_cpu(*lead, hidden), *lists["layer_input_list"][1:]]},
        "a layer input a list": {"layer_input_list": [[0.0], *lists["layer_input_list"][1:]]},
        "a layer input misaligned": {"layer_input_list": [meta(*lead, hidden, offset=1), *lists["layer_input_list"][1:]]} if n else {
            "layer_input_list": []},
        "a layer input strided": {"layer_input_list": [meta(n, hidden, strides=(2 * hidden, 2)), *lists["layer_input_list"][1:]]} if n
        else {"layer_input_list": []},
    }  # fmt: skip
    if n:  # (an empty tensor is contiguous whatever its strides)
        breaks["initial_residual strided"] = {
            "initial_residual": meta(*lead, m, hidden, strides=tuple(2 * s for s in dense((*lead, m, hidden))))
        }
    if n and m % 4 == 0:  # (mix rows read in 16-byte pieces)
        breaks["a pre mix one float in"] = {"pre_mix_list": [meta(*lead, m, 1, dtype=F32, offset=1), *lists["pre_mix_list"][1:]]}
    if post:
        breaks["a residual of fp32"] = {"residual_list": [f32(*lead, m, hidden), *lists["residual_list"][1:]]}
        breaks["a comb mix of one more element"] = {"comb_mix_list": [f32(n * m * m + 1), *lists["comb_mix_list"][1:]]}
    if layers > 1:
        breaks["two post lists fewer"] = {name: lists[name][: layers - 2] for name in ("layer_output_list", "post_mix_list",
                                                                                      "comb_mix_list", "residual_list")}  # fmt: skip
    made = [] if n == 0 else [(MULTILAYER_RECOMPUTE, {"mhc_mult": m})]
    return Call("mhc.mhc_multilayer_recompute", kwargs, made, breaks=breaks)


# ---- the mHC ops keyed by the expansion rate alone (expand, pre-apply mix, post, split mixes, Sinkhorn): the token
# count, the hidden size and the Sinkhorn repeat count are runtime values; the default set builds mhc_mult 4


def rate_and_hidden(draw) -> tuple[int, int, int]:
    """(num_tokens, mhc_mult in [1, MAX_MHC], a hidden size that is a multiple of 8, 0 included)."""
    return draw(tokens()), draw(st.integers(1, MAX_MHC)), 8 * draw(st.sampled_from([0, 1, 3, 16, 512, 896, 2048]))


def streams_breaks(n: int, m: int, hidden: int, row: str, streams: str) -> dict:
    """(row (num_tokens, hidden), streams (num_tokens, mhc, hidden)) ops: a rate over MAX_MHC, a hidden size that is not a
    multiple of 8, rows of 2**31 elements."""
    found = {
        f"mhc_mult {MAX_MHC + 1}": {streams: meta(n, MAX_MHC + 1, hidden)},
        "mhc_mult 0": {streams: meta(n, 0, hidden)},
        "hidden not a multiple of 8": {row: meta(n, hidden + 4), streams: meta(n, m, hidden + 4)},
    }
    if hidden:
        big = MAX_I32 // hidden + 1
        found["2**31 elements"] = {row: meta(big, hidden), streams: meta(big, m, hidden)}
    return found


@CASES.case("mhc.expand_to_mhc_fwd", built="listed")
def expand_to_mhc_fwd(draw):
    n, m, hidden = rate_and_hidden(draw)
    kwargs = {"x": meta(n, hidden), "o": meta(n, m, hidden)}
    made = [(EXPAND_FWD, {"mhc_mult": m})] if n and hidden else []
    return Call("mhc.expand_to_mhc_fwd", kwargs, made, expand.FWD_SIGNATURE, breaks=streams_breaks(n, m, hidden, "x", "o"))


@CASES.case("mhc.expand_to_mhc_bwd", built="listed")
def expand_to_mhc_bwd(draw):
    n, m, hidden = rate_and_hidden(draw)
    kwargs = {"o_grad": meta(n, m, hidden), "x_grad": meta(n, hidden)}
    made = [(EXPAND_BWD, {"mhc_mult": m})] if n and hidden else []
    return Call("mhc.expand_to_mhc_bwd", kwargs, made, expand.BWD_SIGNATURE, breaks=streams_breaks(n, m, hidden, "x_grad", "o_grad"))


@CASES.case("mhc.mhc_pre_apply_mix_fwd", built="listed")
def mhc_pre_apply_mix_fwd(draw):
    n, m, hidden = rate_and_hidden(draw)
    kwargs = {"x": meta(n, m, hidden), "mix": f32(n, m), "o": meta(n, hidden)}
    breaks = streams_breaks(n, m, hidden, "o", "x")
    breaks[f"mhc_mult {MAX_MHC + 1}"]["mix"] = f32(n, MAX_MHC + 1)
    breaks["mhc_mult 0"]["mix"] = f32(n, 0)
    made = [(PRE_APPLY_MIX_FWD, {"mhc_mult": m})] if n and hidden else []
    return Call("mhc.mhc_pre_apply_mix_fwd", kwargs, made, pre_apply_mix.FWD_SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_pre_apply_mix_bwd", built="listed")
def mhc_pre_apply_mix_bwd(draw):
    n, m, hidden = rate_and_hidden(draw)
    kwargs = {"o_grad": meta(n, hidden), "x": meta(n, m, hidden), "mix": f32(n, m), "x_grad": meta(n, m, hidden)}
    breaks = streams_breaks(n, m, hidden, "o_grad", "x")
    for rate, label in ((MAX_MHC + 1, f"mhc_mult {MAX_MHC + 1}"), (0, "mhc_mult 0")):
        breaks[label].update(mix=f32(n, rate), x_grad=meta(n, rate, hidden))
    breaks["hidden not a multiple of 8"]["x_grad"] = meta(n, m, hidden + 4)
    if "2**31 elements" in breaks:
        big = MAX_I32 // hidden + 1
        breaks["2**31 elements"].update(mix=f32(big, m), x_grad=meta(big, m, hidden))

    def check(mix_grad):
        assert mix_grad.shape == (n, m) and mix_grad.dtype == F32

    made = [(PRE_APPLY_MIX_BWD, {"mhc_mult": m, "tiling": pre_apply_mix_bwd_tiling(hidden)})] if n and hidden else []
    return Call("mhc.mhc_pre_apply_mix_bwd", kwargs, made, pre_apply_mix.BWD_SIGNATURE, breaks=breaks, check=check)


def post_inputs(draw) -> tuple[int, int, int, dict]:
    """mhc_post's inputs: (num_seqs, num_tokens, ...) tensors, and the row count they make."""
    n, m, hidden = rate_and_hidden(draw)
    seqs = draw(st.sampled_from([1, 2]))
    lead = (seqs, n)
    tensors = {"x": meta(*lead, hidden), "residual": meta(*lead, m, hidden), "post_layer_mix": f32(*lead, m, 1),
               "comb_res_mix": f32(*lead, m, m)}  # fmt: skip
    return seqs * n, m, hidden, tensors


def post_breaks(tensors: dict, streams: str) -> dict:
    seqs, n, m, hidden = tensors[streams].shape
    lead = (seqs, n)

    def rate(r: int) -> dict:
        return {streams: meta(*lead, r, hidden), "residual": meta(*lead, r, hidden), "post_layer_mix": f32(*lead, r, 1),
                "comb_res_mix": f32(*lead, r, r)}  # fmt: skip

    found = {
        f"mhc_mult {MAX_MHC + 1}": rate(MAX_MHC + 1),
        "hidden not a multiple of 8": {"x": meta(*lead, hidden + 4), streams: meta(*lead, m, hidden + 4),
                                       "residual": meta(*lead, m, hidden + 4)},
        "post_layer_mix of 2 columns": {"post_layer_mix": f32(*lead, m, 2)},
        "comb_res_mix not square": {"comb_res_mix": f32(*lead, m, m + 1)},
    }  # fmt: skip
    if seqs * n * m > 1 and hidden:  # (TileKernels copies it; tkaot copies no user tensor silently)
        rows_apart = (n * m * 2 * hidden, m * 2 * hidden, 2 * hidden, 1)
        found["a residual not contiguous"] = {"residual": meta(*lead, m, hidden, strides=rows_apart)}
    if hidden:
        big = MAX_I32 // hidden + 1
        found["2**31 elements"] = {"x": meta(1, big, hidden), streams: meta(1, big, m, hidden), "residual": meta(1, big, m, hidden),
                                   "post_layer_mix": f32(1, big, m, 1), "comb_res_mix": f32(1, big, m, m)}  # fmt: skip
    return found


@CASES.case("mhc.mhc_post_fwd", built="listed")
def mhc_post_fwd(draw):
    rows, m, hidden, kwargs = post_inputs(draw)
    given = draw(st.booleans())
    kwargs["out"] = meta(*kwargs["residual"].shape) if given else None
    breaks = {k: {**v, "out": None} for k, v in post_breaks(kwargs, "residual").items()}
    shape = kwargs["residual"].shape

    def check(out):
        assert out.shape == shape and out.dtype == BF16 and (out is kwargs["out"] or not given)

    made = [(POST_FWD, {"mhc_mult": m})] if rows and hidden else []
    return Call("mhc.mhc_post_fwd", kwargs, made, post.FWD_SIGNATURE, breaks=breaks, check=check)


@CASES.case("mhc.mhc_post_bwd", built="listed")
def mhc_post_bwd(draw):
    rows, m, hidden, kwargs = post_inputs(draw)
    kwargs["d_o"] = meta(*kwargs["residual"].shape)
    shapes = [(kwargs[k].shape, kwargs[k].dtype) for k in ("x", "residual", "post_layer_mix", "comb_res_mix")]

    def check(grads):
        assert [(g.shape, g.dtype) for g in grads] == shapes

    made = [(POST_BWD, {"mhc_mult": m})] if rows and hidden else []
    return Call("mhc.mhc_post_bwd", kwargs, made, post.BWD_SIGNATURE, breaks=post_breaks(kwargs, "d_o"), check=check)


def split_sizes(draw) -> tuple[int, int, int]:
    n, m = draw(tokens()), draw(st.integers(1, MAX_MHC))
    return n, m, m * (m + 2)


def split_rate_break(n: int, rate: int, names: dict) -> dict:
    """Every tensor of `names` (name -> "token", "mixes", "comb" or "base") sized for another expansion rate."""
    cols = {"token": rate, "mixes": rate * (rate + 2), "comb": rate * rate}
    return {k: f32(rate * (rate + 2)) if kind == "base" else f32(n, cols[kind]) for k, kind in names.items()}


@CASES.case("mhc.mhc_pre_split_mixes_fwd", built="listed")
def mhc_pre_split_mixes_fwd(draw):
    n, m, m3 = split_sizes(draw)
    kwargs = {
        "input_mixes": f32(n, m3), "mhc_scale": f32(3), "mhc_base": f32(m3), "pre_layer_mix": f32(n, m), "post_layer_mix": f32(n, m),
        "comb_res_mix": f32(n, m * m), "mhc_post_mult_value": 2.0, "mhc_pre_eps": 1e-2,
    }  # fmt: skip
    names = {"input_mixes": "mixes", "mhc_base": "base", "pre_layer_mix": "token", "post_layer_mix": "token", "comb_res_mix": "comb"}
    breaks = {
        **float_breaks("mhc_post_mult_value", "mhc_pre_eps"),
        f"mhc_mult {MAX_MHC + 1}": split_rate_break(n, MAX_MHC + 1, names),
        "input_mixes of one column more": {"input_mixes": f32(n, m3 + 1)},
        "mhc_base of one more": {"mhc_base": f32(m3 + 1)},
        "comb_res_mix of one column more": {"comb_res_mix": f32(n, m * m + 1)},
    }
    made = [(SPLIT_MIXES_FWD, {"mhc_mult": m})] if n else []
    return Call("mhc.mhc_pre_split_mixes_fwd", kwargs, made, split_mixes.FWD_SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_pre_split_mixes_bwd", built="listed")
def mhc_pre_split_mixes_bwd(draw):
    n, m, m3 = split_sizes(draw)
    kwargs = {
        "pre_layer_mix_grad": f32(n, m), "post_layer_mix_grad": f32(n, m), "comb_res_mix_grad": f32(n, m * m), "input_mixes": f32(n, m3),
        "post_layer_mix": f32(n, m), "mhc_scale": f32(3), "mhc_base": f32(m3), "input_mixes_grad": f32(n, m3), "mhc_scale_grad": f32(3),
        "mhc_base_grad": f32(m3), "mhc_post_mult_value": 2.0,
    }  # fmt: skip
    names = {"pre_layer_mix_grad": "token", "post_layer_mix_grad": "token", "comb_res_mix_grad": "comb", "input_mixes": "mixes",
             "post_layer_mix": "token", "mhc_base": "base", "input_mixes_grad": "mixes", "mhc_base_grad": "base"}  # fmt: skip
    breaks = {
        **float_breaks("mhc_post_mult_value"),
        f"mhc_mult {MAX_MHC + 1}": split_rate_break(n, MAX_MHC + 1, names),
        "input_mixes of one column more": {"input_mixes": f32(n, m3 + 1), "input_mixes_grad": f32(n, m3 + 1)},
        "mhc_base of one more": {"mhc_base": f32(m3 + 1), "mhc_base_grad": f32(m3 + 1)},
    }
    # per-block partial sums over the tokens, then their sum (launched with no token too: it writes zeros)
    made = ([(SPLIT_MIXES_BWD, {"mhc_mult": m})] if n else []) + [(SPLIT_MIXES_BWD_REDUCE, {"mhc_mult": m})]
    return Call("mhc.mhc_pre_split_mixes_bwd", kwargs, made, split_mixes.BWD_SIGNATURE, breaks=breaks)


def sinkhorn_breaks(n: int, m: int, names: tuple, low: int) -> dict:
    return {
        **float_breaks("eps"), **int_breaks("repeat", low), "repeat 2**31": {"repeat": 2**31},
        "matrices not square": {k: f32(n, m, m + 1) for k in names},
        f"mhc_mult {MAX_MHC + 1}": {k: f32(n, MAX_MHC + 1, MAX_MHC + 1) for k in names},
    }  # fmt: skip


@CASES.case("mhc.mhc_sinkhorn_fwd", built="listed")
def mhc_sinkhorn_fwd(draw):
    n, m = draw(tokens()), draw(st.integers(1, MAX_MHC))
    matrices = f32(n, m, m)
    out = matrices if draw(st.booleans()) else f32(n, m, m)  # in place, or into another buffer
    kwargs = {"comb_res_mix": matrices, "comb_res_mix_out": out, "repeat": draw(st.sampled_from([0, 1, 20])), "eps": 1e-6}
    breaks = sinkhorn_breaks(n, m, ("comb_res_mix", "comb_res_mix_out"), 0)
    made = [(SINKHORN_FWD, {"mhc_mult": m})] if n else []
    return Call("mhc.mhc_sinkhorn_fwd", kwargs, made, mhc_sinkhorn.FWD_SIGNATURE, breaks=breaks)


@CASES.case("mhc.mhc_sinkhorn_bwd", built="listed")
def mhc_sinkhorn_bwd(draw):
    n, m = draw(tokens()), draw(st.integers(1, MAX_MHC))
    kwargs = {"grad_output": f32(n, m, m), "x": f32(n, m, m), "grad_input": f32(n, m, m), "repeat": draw(st.sampled_from([1, 20])),
              "eps": 1e-6}  # fmt: skip
    breaks = sinkhorn_breaks(n, m, ("grad_output", "x", "grad_input"), 1)
    made = [(SINKHORN_BWD, {"mhc_mult": m})] if n else []
    return Call("mhc.mhc_sinkhorn_bwd", kwargs, made, mhc_sinkhorn.BWD_SIGNATURE, breaks=breaks)


def _cpu(*shape):
    import torch

    return torch.zeros((), dtype=BF16).expand(*shape)


# ---- tkaot.engram ----


@CASES.case("engram.engram_hash", built="listed")
def engram_hash(draw):
    n, order = draw(tokens()), draw(st.integers(2, 8))
    layers, tables = draw(st.sampled_from([0, 1, 2, 30])), draw(st.sampled_from([1, 4]))
    cols = (order - 1) * tables
    kwargs = {
        "ngram_token_ids": meta(n, order, dtype=I32), "multipliers": meta(layers, order, dtype=I64),
        "vocab_sizes": meta(layers, order - 1, tables, dtype=I32), "offsets": meta(layers, cols, dtype=I32),
        "image_token_mask": meta(n, dtype=BOOL) if draw(st.booleans()) else None,
    }  # fmt: skip
    breaks = {
        "n-grams of 9": {"ngram_token_ids": meta(n, 9, dtype=I32), "multipliers": meta(layers, 9, dtype=I64),
                         "vocab_sizes": meta(layers, 8, tables, dtype=I32), "offsets": meta(layers, 8 * tables, dtype=I32)},
        "n-grams of 1": {"ngram_token_ids": meta(n, 1, dtype=I32), "multipliers": meta(layers, 1, dtype=I64),
                         "vocab_sizes": meta(layers, 0, tables, dtype=I32), "offsets": meta(layers, 0, dtype=I32)},
        "vocab_sizes of one order more": {"vocab_sizes": meta(layers, order, tables, dtype=I32)},
        "offsets of one column more": {"offsets": meta(layers, cols + 1, dtype=I32)},
        "65536 layers": {"multipliers": meta(65536, order, dtype=I64), "vocab_sizes": meta(65536, order - 1, tables, dtype=I32),
                         "offsets": meta(65536, cols, dtype=I32)},
    }  # fmt: skip
    made = [(ENGRAM_HASH, {"max_ngram_size": order})] if n and layers else []
    return Call("engram.engram_hash", kwargs, made, hash.SIGNATURE, breaks=breaks)


@CASES.case("engram.fused_weight")
def fused_weight(draw):
    hc, hidden = draw(st.sampled_from([0, 1, 4])), 8 * draw(st.integers(0, 2048))
    kwargs = {"weight_hidden": meta(hc, hidden), "weight_embed": meta(hc, hidden)}
    breaks = {"hidden not a multiple of 8": {"weight_hidden": meta(hc or 1, hidden + 4), "weight_embed": meta(hc or 1, hidden + 4)}}
    made = [(FUSED_WEIGHT, {"dtype": "bfloat16"})] if hc * hidden else []
    return Call("engram.fused_weight", kwargs, made, gate.FUSED_SIGNATURE, breaks=breaks)


WIDE = MAX_GATE_HIDDEN + 256


def gate_sizes(draw, heads) -> tuple[int, int, int]:
    return draw(tokens()), draw(heads), 256 * draw(st.integers(1, MAX_GATE_HIDDEN // 256))


@CASES.case("engram.engram_gate_fwd")
def engram_gate_fwd(draw):
    n, hc, hidden = gate_sizes(draw, st.sampled_from([1, 4, 16]))
    save = draw(st.booleans())
    kwargs = {
        "hidden_states": meta(n, hc, hidden), "kv": meta(n, hc + 1, hidden), "weight_fused": f32(hc, hidden), "eps": 1e-6,
        "clamp_value": 1e-6, "save_for_backward": save, "image_token_mask": meta(n, dtype=BOOL) if draw(st.booleans()) else None,
        "inplace": not save and draw(st.booleans()),
    }  # fmt: skip
    breaks = {
        "inplace with save_for_backward": {"inplace": True, "save_for_backward": True},
        f"hidden {WIDE}": {"hidden_states": meta(n, hc, WIDE), "kv": meta(n, hc + 1, WIDE), "weight_fused": f32(hc, WIDE)},
        "hidden 128": {"hidden_states": meta(n, hc, 128), "kv": meta(n, hc + 1, 128), "weight_fused": f32(hc, 128)},
        "kv of hc_mult rows": {"kv": meta(n, hc, hidden)},
        "32 * 65535 + 1 tokens": {"hidden_states": meta(32 * 65535 + 1, hc, hidden), "kv": meta(32 * 65535 + 1, hc + 1, hidden),
                                  "image_token_mask": None},
    }  # fmt: skip
    decode = not save and n <= GATE_FWD_DECODE_TOKENS and hidden <= GATE_FWD_DECODE_HIDDEN
    made = [] if n == 0 else [(GATE_FWD, {"tiling": GATE_FWD_TILINGS["decode" if decode else "default"]})]
    return Call("engram.engram_gate_fwd", kwargs, made, gate.FWD_SIGNATURE, breaks=breaks)


@CASES.case("engram.engram_gate_bwd")
def engram_gate_bwd(draw):
    n, hc, hidden = gate_sizes(draw, st.just(gate.BWD_HC))
    per_token = {name: f32(n, hc) for name in ("dot", "gate_score", "rstd_x", "rstd_k")}
    kwargs = {
        "grad_out": meta(n, hc, hidden), "hidden_states": meta(n, hc, hidden), "kv": meta(n, hc + 1, hidden),
        "weight_fused": f32(hc, hidden), **per_token, "clamp_value": 1e-6,
        "image_token_mask": meta(n, dtype=BOOL) if draw(st.booleans()) else None,
    }  # fmt: skip
    three = {"grad_out": meta(n, 3, hidden), "hidden_states": meta(n, 3, hidden), "kv": meta(n, 4, hidden), "weight_fused": f32(3, hidden),
             **{name: f32(n, 3) for name in per_token}}  # fmt: skip
    breaks = {"3 heads": three, "hidden 128": {k: meta(*v.shape[:-1], 128, dtype=v.dtype) for k, v in kwargs.items() if k in (
        "grad_out", "hidden_states", "kv", "weight_fused")}}  # fmt: skip
    return Call("engram.engram_gate_bwd", kwargs, [(GATE_BWD, {"tiling": GATE_BWD_TILINGS["default"]})], gate.BWD_SIGNATURE, breaks=breaks)


@CASES.case("engram.grad_w_reduce")
def grad_w_reduce(draw):
    partials, hc, hidden = draw(st.sampled_from([1, 132])), draw(st.sampled_from([0, 4])), draw(st.sampled_from([0, 256, 7168]))
    kwargs = {
        "grad_w_partial": f32(partials, hc, hidden), "weight_hidden": meta(hc, hidden), "weight_embed": meta(hc, hidden),
        "grad_weight_hidden": f32(hc, hidden), "grad_weight_embed": f32(hc, hidden),
    }  # fmt: skip
    made = [(GRAD_W_REDUCE, {"dtype": "bfloat16", "tiling": GRAD_W_REDUCE_TILINGS["default"]})] if hc * hidden else []
    return Call("engram.grad_w_reduce", kwargs, made, gate.REDUCE_SIGNATURE)


@CASES.case("engram.engram_sinkhorn_momentum_update")
def engram_sinkhorn_momentum_update(draw):
    grad_dtype, momentum_dtype = draw(choices(SINKHORN_MOMENTUM, "grad_dtype")), draw(choices(SINKHORN_MOMENTUM, "momentum_dtype"))
    torch_dtypes = {"bfloat16": BF16, "float32": F32}
    shape = draw(st.sampled_from([(0,), (8,), (3, 4096), (2, 5, 8)]))
    numel = 1
    for d in shape:
        numel *= d
    kwargs = {"grad": meta(*shape, dtype=torch_dtypes[grad_dtype]), "momentum_buffer": meta(numel, dtype=torch_dtypes[momentum_dtype]),
              "beta1": 0.9, "nesterov": draw(st.booleans())}  # fmt: skip
    breaks = {"12 elements": {"grad": meta(12, dtype=BF16), "momentum_buffer": meta(12, dtype=BF16)},
              "momentum of 8 more elements": {"momentum_buffer": meta(numel + 8, dtype=torch_dtypes[momentum_dtype])}}  # fmt: skip
    static = {"grad_dtype": grad_dtype, "momentum_dtype": momentum_dtype, "tiling": SINKHORN_MOMENTUM_TILINGS["default"]}
    made = [(SINKHORN_MOMENTUM, static)] if numel else []
    return Call("engram.engram_sinkhorn_momentum_update", kwargs, made, sinkhorn.MOMENTUM_SIGNATURE, breaks=breaks)


def sinkhorn_matrix(draw) -> tuple[int, int, dict]:
    rows, head_dim = draw(tokens()), draw(st.sampled_from([d for d in range(256, 8193, 256) if SINKHORN_STEP.axis("head_dim").allows(d)]))
    return rows, head_dim, {"matrix": f32(rows, head_dim), "row_scale": f32(rows), "col_scale": f32(head_dim)}


def head_dim_breaks(rows: int) -> dict:
    return {f"head_dim {d}": {"matrix": f32(rows, d), "col_scale": f32(d)} for d in (128, 8448, 384)}


@CASES.case("engram.engram_sinkhorn_step", built="listed")
def engram_sinkhorn_step(draw):
    rows, head_dim, kwargs = sinkhorn_matrix(draw)
    kwargs["eps"] = 1e-6
    made = [(SINKHORN_STEP, {"head_dim": head_dim})]
    return Call("engram.engram_sinkhorn_step", kwargs, made, sinkhorn.STEP_SIGNATURE, breaks=head_dim_breaks(rows))


@CASES.case("engram.engram_sinkhorn_step_reduce")
def engram_sinkhorn_step_reduce(draw):
    partials, head_dim = draw(st.sampled_from([1, 396])), draw(st.sampled_from([0, 256, 7168]))
    kwargs = {"col_sumsq_partial": f32(partials, head_dim), "col_sumsq": f32(head_dim)}
    made = [(SINKHORN_STEP_REDUCE, {"dtype": "float32", "tiling": SINKHORN_STEP_REDUCE_TILINGS["default"]})] if head_dim else []
    return Call("engram.engram_sinkhorn_step_reduce", kwargs, made, sinkhorn.REDUCE_SIGNATURE)


@CASES.case("engram.engram_sinkhorn_finalize", built="listed")
def engram_sinkhorn_finalize(draw):
    rows, head_dim, kwargs = sinkhorn_matrix(draw)
    kwargs.update(eps=1e-6, alpha=2.0, out=f32(rows, head_dim) if draw(st.booleans()) else None)
    breaks = {k: {**v, "out": None} for k, v in head_dim_breaks(rows).items()}
    made = [(SINKHORN_FINALIZE, {"head_dim": head_dim})] if rows else []
    return Call("engram.engram_sinkhorn_finalize", kwargs, made, sinkhorn.FINALIZE_SIGNATURE, breaks=breaks)


test_valid_calls = CASES.valid_test()
test_invalid_calls = CASES.invalid_test()
