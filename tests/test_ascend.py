"""Ascend 950 without an NPU: every Ascend kernel lowers and its launch spec matches its declaration; the
two-stage build with a fake bisheng / ld.lld; the launcher against a fake libascendcl (a small C library
built here with the system cc, which records every call and its arguments)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tkaot._spec import LaunchSpec

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("tilelang")

from build_tools import ascend  # noqa: E402
from build_tools.ops import Variant  # noqa: E402
from kernels_src.ascend import ASCEND_SOURCES  # noqa: E402

# One variant of each Ascend kernel, with its options on (residual, rstd, weights, E4M3 cast), and (MORE) variants
# whose static values change the kernel's shape: layouts, modes, formats, row segments. LAUNCH holds each one's
# block count (the host module's expression in the dynamic dims) and UB bytes (the tiles the module's sizing asks
# for, kernels_src/ascend/tile.py), so a change in either is seen here.
_PTC = dict(
    hidden=7168,
    in_dtype="bfloat16",
    in_block="none",
    in_sf="none",
    fmt="e4m3",
    group=128,
    sf="pow2",
    sf_layout="row",
    mode="cast",
    stochastic=False,
)
_PTCG = {k: v for k, v in _PTC.items() if k != "hidden"}  # the generic kernel's axes
CASES = {
    "rmsnorm": dict(hidden=7168, dtype="bfloat16", with_weight=True, with_residual=True, with_rstd=True),
    "per_token_cast": _PTC,
    "swiglu": dict(hidden=2048, dtype="bfloat16", fmt="e4m3", group=128, sf="fp32", tiling="wscc2v9b1g"),
    "topk_gate": dict(num_experts=256, num_topk=8, tiling="ballot4"),
    "norm_cast": dict(hidden=7168, dtype="bfloat16", sf="ue8m0", tiling="lean8nlbwdgw"),
    "moe_topk_gate": dict(num_experts=256, num_topk=8, tiling="ballot4"),
    "normalize_weight": dict(num_topk=8),
    "rotary": dict(rot_dim=128, dtype="bfloat16", interleaved=False),
    "cast": dict(in_dtype="float32", out_dtype="bfloat16", stochastic=False),
    "cast_back": dict(hidden=7168, in_dtype="e4m3", in_block="128x128", in_sf="ue8m0_col", out_dtype="bfloat16"),
    "per_block_cast": dict(hidden=7168, in_dtype="bfloat16", fmt="e4m3", block_m=128, block_k=128, sf="fp32", sf_layout="row", mode="cast"),
    "per_channel_cast": dict(hidden=7168, in_dtype="bfloat16", in_block="none", in_sf="none", block_m=128, sf="ue8m0"),
    "engram_hash": dict(max_ngram_size=3),
    "engram_fused_weight": dict(dtype="bfloat16"),
    "engram_grad_w_reduce": dict(dtype="bfloat16", tiling="t32r44d"),
    "engram_sinkhorn_momentum": dict(grad_dtype="bfloat16", momentum_dtype="float32", tiling="t128v4x1"),
    "engram_sinkhorn_step": dict(head_dim=1024),
    "engram_sinkhorn_step_reduce": dict(dtype="float32", tiling="t24r200d"),
    "engram_sinkhorn_finalize": dict(head_dim=8192),
    "mhc_normw_merge_fwd": dict(dtype="float32"),
    "mhc_normw_merge_bwd": dict(dtype="float32"),
    "mhc_head_mix_fwd": dict(dtype="float32"),
    # casts, backward, generic tiers, engram gate
    "per_block_cast_lossless": dict(hidden=7168, in_block="1x32", in_sf="ue8m0_col", out_block="32x32", sf="ue8m0", sf_layout="col"),
    "batched_transpose_weight_sf": dict(block_size=128),
    "cast_back_generic": dict(in_dtype="e4m3", in_block="128x128", in_sf="ue8m0_col", out_dtype="bfloat16"),
    "per_token_cast_generic": _PTCG,
    "rmsnorm_backward": dict(hidden=7168, dtype="bfloat16"),
    "weight_grad_reduce": dict(dtype="float32"),
    "swiglu_backward": dict(x_dtype="e4m3", grad_dtype="bfloat16", fmt="e4m3", group=128, sf="ue8m0"),
    "moe_topk_gate_backward": dict(tiling="scatter4"),
    "rmsnorm_generic": dict(dtype="bfloat16", with_weight=True, with_residual=True, with_rstd=True),
    "norm_cast_generic": dict(dtype="bfloat16", sf="ue8m0", tiling="lean8nlbwdgw"),
    "swiglu_generic": dict(dtype="bfloat16", fmt="e4m3", sf="fp32", tiling="wscc2v9b1g"),
    "topk_gate_generic": dict(tiling="ballot4"),
    "moe_topk_gate_generic": dict(tiling="ballot4"),
    "normalize_weight_generic": dict(),
    "engram_gate_fwd": dict(tiling="c1584s2x28w"),
    "engram_gate_bwd": dict(tiling="k28d14v16xw"),
    "rmsnorm_backward_generic": dict(dtype="bfloat16"),
    "per_block_cast_generic": dict(in_dtype="bfloat16", fmt="e4m3", sf="fp32", mode="cast"),
    "per_channel_cast_generic": dict(in_dtype="e4m3", in_sf="fp32_col", sf="fp32"),
    "per_block_cast_lossless_generic": dict(in_sf="ue8m0_col", sf="ue8m0"),
    "rmsnorm_backward_residual": dict(hidden=7168, dtype="bfloat16"),  # rmsnorm_backward's Ascend kernel
    "rmsnorm_backward_plain": dict(hidden=7168, dtype="bfloat16"),  # rmsnorm_backward's Ascend kernel
}  # fmt: skip
MORE = [
    ("per_token_cast", {**_PTC, "in_dtype": "float32", "fmt": "e2m1", "group": 32, "sf": "ue8m0", "sf_layout": "col"}),
    ("per_token_cast", {**_PTC, "mode": "round_trip", "sf": "e4m3"}),
    ("per_token_cast", {**_PTC, "mode": "sf_only", "hidden": 65536, "in_dtype": "float32"}),
    ("per_token_cast", {**_PTC, "mode": "precomputed_sf", "fmt": "e2m1", "group": 32}),
    ("per_token_cast", {**_PTC, "stochastic": True, "in_dtype": "float32"}),
    ("per_token_cast", {**_PTC, "in_dtype": "e2m1", "in_block": "1x32", "in_sf": "ue8m0_col", "group": 64}),
    ("norm_cast", dict(hidden=8192, dtype="float32", sf="fp32", tiling="lean6plbwdgwRL")),
    ("rotary", dict(rot_dim=64, dtype="float32", interleaved=True)),
    ("cast", dict(in_dtype="bfloat16", out_dtype="e4m3", stochastic=True)),
    ("cast", dict(in_dtype="e4m3", out_dtype="float32", stochastic=False)),
    ("cast_back", dict(hidden=4096, in_dtype="e2m1", in_block="1x32", in_sf="fp32", out_dtype="float32")),
    ("per_block_cast", dict(hidden=7168, in_dtype="float32", fmt="e2m1", block_m=32, block_k=32, sf="ue8m0", sf_layout="col", mode="cast")),
    ("per_block_cast", dict(hidden=4096, in_dtype="bfloat16", fmt="e4m3", block_m=128, block_k=128, sf="pow2", sf_layout="row",
                            mode="precomputed_sf")),
    ("per_channel_cast", dict(hidden=7168, in_dtype="e4m3", in_block="1x128", in_sf="fp32_col", block_m=32, sf="fp32")),
    # casts, backward, generic tiers, engram gate
    ("per_token_cast_generic", {**_PTCG, "in_dtype": "float32", "fmt": "e2m1", "group": 32, "sf": "ue8m0", "sf_layout": "col"}),
    ("per_token_cast_generic", {**_PTCG, "mode": "round_trip", "sf": "e4m3"}),
    ("per_token_cast_generic", {**_PTCG, "in_dtype": "e2m1", "in_block": "1x32", "in_sf": "ue8m0_col", "group": 64, "stochastic": True}),
    ("per_block_cast_lossless", dict(hidden=4096, in_block="1x16", in_sf="fp32", out_block="128x128", sf="pow2", sf_layout="row")),
    ("cast_back_generic", dict(in_dtype="e2m1", in_block="1x32", in_sf="fp32", out_dtype="float32")),
    ("swiglu_backward", dict(x_dtype="bfloat16", grad_dtype="float32", fmt="fp32", group=0, sf="none")),
    ("swiglu_generic", dict(dtype="float32", fmt="fp32", sf="none", tiling="wscc2v9b1gkm")),
    ("norm_cast_generic", dict(dtype="float32", sf="fp32", tiling="lean6plbwdgwRL")),
    ("rmsnorm_backward_generic", dict(dtype="float32")),
    ("per_block_cast_generic", dict(in_dtype="float32", fmt="e2m1", sf="ue8m0", mode="cast")),
    ("per_block_cast_generic", dict(in_dtype="bfloat16", fmt="e4m3", sf="pow2", mode="precomputed_sf")),
    ("per_block_cast_generic", dict(in_dtype="bfloat16", fmt="e2m1", sf="ue8m0", mode="sf_only")),
    ("per_channel_cast_generic", dict(in_dtype="bfloat16", in_sf="none", sf="ue8m0")),
    ("per_block_cast_lossless_generic", dict(in_sf="fp32", sf="pow2")),
]  # fmt: skip
LAUNCH = [  # (block count, UB bytes) of each case, CASES then MORE
    ("(batch * ((num_tokens + 1) // 2))", 100896),
    ("((num_tokens + 3) // 4)", 86912),
    ("((num_rows + 3) // 4)", 74272),
    ("((num_tokens + 63) // 64)", 69632),
    ("(batch * ((num_tokens + 1) // 2))", 89248),
    ("((num_tokens + 7) // 8)", 16384),
    ("((num_tokens + 63) // 64)", 4352),
    ("(batch * (((seqlen * (q_heads + k_heads)) + 31) // 32))", 24576),
    ("((n + 8191) // 8192)", 49152),
    ("((num_tokens + 3) // 4)", 86912),
    ("(((num_tokens + 127) // 128) * 56)", 49696),
    ("(((num_tokens + 127) // 128) * 28)", 99328),
    ("(num_layers * (((num_tokens * num_tables) + 1023) // 1024))", 8192),
    ("((numel + 8191) // 8192)", 65536),
    ("((numel + 1023) // 1024)", 12288),
    ("((numel + 4095) // 4096)", 40960),
    ("num_partials", 12800),
    ("((head_dim + 1023) // 1024)", 4096),
    ("num_rows", 66080),
    ("(m * ((n + 4095) // 4096))", 32768),
    ("((n + 1023) // 1024)", 8192),
    ("(((num_tokens * mhc_mult) + 4095) // 4096)", 16384),
    ("(((num_tokens + 31) // 32) * 4)", 93408),
    ("(num_groups * ((((num_sf_k + 3) // 4) * ((num_sf_n + 15) // 16)) + (((num_sf_n + 3) // 4) * ((num_sf_k + 15) // 16))))", 8192),
    ("(((num_tokens + 7) // 8) * ((hidden + 1023) // 1024))", 90112),
    ("(((num_tokens + 15) // 16) * ((hidden + 1023) // 1024))", 53248),
    ("num_blocks", 129568),
    ("((hidden + 1023) // 1024)", 4096),
    ("((num_rows + 7) // 8)", 82528),
    ("((num_tokens + 7) // 8)", 32768),
    ("(batch * ((num_tokens + 1) // 2))", 115232),
    ("(batch * ((num_tokens + 1) // 2))", 101920),
    ("(((num_rows + 7) // 8) * ((hidden + 1023) // 1024))", 75808),
    ("((num_tokens + 31) // 32)", 73728),
    ("((num_tokens + 7) // 8)", 32768),
    ("((num_tokens + 63) // 64)", 16640),
    ("(num_tokens * hc_mult)", 22048),
    ("num_partials", 59936),
    ("num_blocks", 148000),
    ("(((num_tokens + 127) // 128) * (hidden // 128))", 51264),
    ("((((num_tokens - 1) // block_m) + 1) * (hidden // 128))", 35328),
    ("(((num_tokens + 127) // 128) * (hidden // 128))", 36864),
    ("num_blocks", 129568),  # rmsnorm_backward_residual: rmsnorm_backward's kernel
    ("num_blocks", 129568),  # rmsnorm_backward_plain: rmsnorm_backward's kernel
    ("((num_tokens + 1) // 2)", 66304),
    ("((num_tokens + 3) // 4)", 58240),
    ("(num_tokens * 4)", 66048),
    ("((num_tokens + 3) // 4)", 75264),
    ("((num_tokens + 1) // 2)", 72128),
    ("((num_tokens + 7) // 8)", 96768),
    ("(batch * num_tokens)", 126496),
    ("(batch * (((seqlen * (q_heads + k_heads)) + 31) // 32))", 16384),
    ("((n + 8191) // 8192)", 24576),
    ("((n + 8191) // 8192)", 40960),
    ("((num_tokens + 3) // 4)", 75776),
    ("(((num_tokens + 31) // 32) * 14)", 75840),
    ("(((num_tokens + 127) // 128) * 32)", 49184),
    ("(((num_tokens + 31) // 32) * 7)", 70656),
    ("(((num_tokens + 15) // 16) * ((hidden + 1023) // 1024))", 77824),
    ("(((num_tokens + 15) // 16) * ((hidden + 1023) // 1024))", 69632),
    ("(((num_tokens + 15) // 16) * ((hidden + 1023) // 1024))", 30720),
    ("(((num_tokens + 127) // 128) * 16)", 57376),
    ("(((num_tokens + 3) // 4) * ((hidden + 1023) // 1024))", 51200),
    ("((num_rows + 3) // 4)", 57952),
    ("(((num_rows + 3) // 4) * ((hidden + 1023) // 1024))", 65568),
    ("(batch * num_tokens)", 126496),
    ("num_blocks", 164384),
    ("(((num_tokens + 127) // 128) * (hidden // 128))", 75840),
    ("(((num_tokens + 127) // 128) * (hidden // 128))", 49216),
    ("(((num_tokens + 127) // 128) * (hidden // 128))", 34880),
    ("((((num_tokens - 1) // block_m) + 1) * (hidden // 128))", 49664),
    ("(((num_tokens + 127) // 128) * (hidden // 128))", 36864),
]


# mHC (kernels_src/ascend/mhc_*.py): (kernel, static values, (block count, UB bytes)), the default set's variant of
# each, then expansion rates that change a kernel's segment width or layout
_SEGMENTS = "(num_tokens * ((hidden + 4095) // 4096))"
MHC = [
    ("mhc_expand_fwd", dict(mhc_mult=4), (_SEGMENTS, 8192)),
    ("mhc_expand_bwd", dict(mhc_mult=4), (_SEGMENTS, 40960)),
    ("mhc_head_mix_bwd", dict(dtype="float32"), ("num_sms", 1024)),
    ("mhc_multilayer_recompute", dict(mhc_mult=4), (_SEGMENTS, 49152)),
    ("mhc_post_fwd", dict(mhc_mult=4), (_SEGMENTS, 73728)),
    ("mhc_post_bwd", dict(mhc_mult=4), ("num_tokens", 67584)),
    ("mhc_pre_apply_mix_fwd", dict(mhc_mult=4), (_SEGMENTS, 40960)),
    ("mhc_pre_apply_mix_bwd", dict(mhc_mult=4, tiling="u3"), ("num_tokens", 75776)),
    ("mhc_pre_big_fuse", dict(mhc_mult=4), ("num_tokens", 41120)),
    ("mhc_pre_big_fuse_split", dict(mhc_mult=4), ("num_tokens", 41120)),  # the one-block kernel
    ("mhc_reduce_partials_fwd", dict(dtype="float32"), ("(((num_tokens * mhc_mult3) + 1023) // 1024)", 4096)),
    ("mhc_reduce_partials_bwd", dict(dtype="float32"), ("(((num_tokens * n_rms_group) + 255) // 256)", 1024)),
    ("mhc_sinkhorn_fwd", dict(mhc_mult=4), ("((num_tokens + 63) // 64)", 4096)),
    ("mhc_sinkhorn_bwd", dict(mhc_mult=4), ("((num_tokens + 63) // 64)", 8192)),
    ("mhc_split_mixes_fwd", dict(mhc_mult=4), ("((num_tokens + 63) // 64)", 12288)),
    ("mhc_split_mixes_bwd", dict(mhc_mult=4), ("num_partials", 13952)),
    ("mhc_split_mixes_bwd_reduce", dict(mhc_mult=4), ("1", 128)),
    ("mhc_post_fwd", dict(mhc_mult=8), ("(num_tokens * ((hidden + 2047) // 2048))", 69632)),
    ("mhc_post_bwd", dict(mhc_mult=3), ("num_tokens", 96256)),
    ("mhc_split_mixes_fwd", dict(mhc_mult=3), ("((num_tokens + 63) // 64)", 7680)),
    ("mhc_sinkhorn_bwd", dict(mhc_mult=8), ("((num_tokens + 63) // 64)", 32768)),
    ("mhc_pre_big_fuse", dict(mhc_mult=1), ("num_tokens", 16544)),
    ("mhc_multilayer_recompute", dict(mhc_mult=1), (_SEGMENTS, 24576)),
]
ALL_CASES = [*CASES.items(), *MORE, *((kernel, static) for kernel, static, _ in MHC)]
ALL_LAUNCH = [*LAUNCH, *(launch for *_, launch in MHC)]


@pytest.mark.parametrize("n", range(len(ALL_CASES)), ids=lambda n: f"{ALL_CASES[n][0]}-{n}")
def test_every_ascend_kernel_lowers_to_its_declared_contract(n):
    kernel, static = ALL_CASES[n]
    v = Variant.make(kernel, static)
    low = ascend.lower(v)
    spec = low.spec
    decl = ascend.declaration(kernel)
    assert f'extern "C" __global__ __vector__ void {spec.symbol}(' in low.source
    signature = low.source.split(f"void {spec.symbol}(", 1)[1].split(")", 1)[0]
    # the kernel's own parameter order, each an op argument of the declared type
    assert [p.split()[-1].lstrip("*") for p in signature.split(", ")] == [p.name for p in spec.params]
    runtime = set(ascend.runtime_axes(kernel))  # static axes the Ascend kernel takes at run time, as dims
    assert {a.name for a in spec.args} == set(decl.args) | runtime
    assert {a.name for a in spec.args if a.role == "dim"} == set(decl.dims) | runtime
    assert {p.name for p in spec.params} <= set(decl.args) | runtime and set(low.fixed) == runtime
    by_name = {a.name: a for a in spec.args}
    assert all(by_name[p.name].type == p.type for p in spec.params)
    assert spec.block == (1, 1, 1) and 0 < spec.smem <= ascend.UB_LIMIT
    assert set(low.requires) <= {a.name for a in spec.args}
    assert (spec.grid[0], spec.smem) == ALL_LAUNCH[n]
    LaunchSpec.from_json(spec.to_json())  # the grid is in the manifest grammar


def test_grid_is_the_host_modules_block_count():
    low = ascend.lower(Variant.make("topk_gate", CASES["topk_gate"]))
    assert low.spec.grid == ("((num_tokens + 63) // 64)", "1", "1") and low.spec.smem == 256 * 64 * 4 + 8 * 64 * 8


def test_unsupported_values_are_left_out_with_a_reason(monkeypatch):
    kept, left = ascend.select([Variant.make("swiglu", {**CASES["swiglu"], "sf": "ue8m0"})])
    assert kept == [] and list(left) == ["swiglu: E4M3 output with fp32 or pow2 scale factors only"]
    monkeypatch.delitem(ASCEND_SOURCES, "cast")
    kept, left = ascend.select([Variant.make("cast", CASES["cast"])])
    assert kept == [] and list(left) == ["cast: cast has no Ascend kernel yet"]


def test_variants_differing_only_in_runtime_axes_share_one_lowering(tmp_path, fake_acl):
    """per_token_cast_generic takes group and sf_layout at run time: variants that differ only in them are lowered once,
    each entry fixes its values, and the launcher passes them with the op's values and the generic call's hidden."""
    from tkaot._ascend import pack_plan
    from tkaot._quant.kernels import PER_TOKEN_CAST
    from tkaot.registry import ArtifactSet

    a = Variant.make("per_token_cast_generic", {**_PTCG, "group": 32, "sf_layout": "col"})
    b = Variant.make("per_token_cast_generic", {**_PTCG, "group": 128, "sf_layout": "row"})
    assert ascend.cache_key(a) == ascend.cache_key(b) != ascend.cache_key(Variant.make("per_token_cast_generic", {**_PTCG, "sf": "fp32"}))
    lowered, fresh = ascend.lower_all([a, b], 1, ascend.LoweringCache(tmp_path / "cache"))
    assert fresh == 1 and [low.fixed for low in lowered] == [{"group": 32, "sf_layout": 1}, {"group": 128, "sf_layout": 0}]
    assert lowered[0].source == lowered[1].source
    root = ascend_set(tmp_path, lowered)
    entries = {e["key"]: e for e in json.loads((root / "manifest.json").read_text())["variants"]}
    assert entries[a.key]["fixed"] == {"group": 32, "sf_layout": 1} and entries[a.key]["source"] == entries[b.key]["source"]
    again, fresh = ascend.lower_all([b, a], 1, ascend.LoweringCache(tmp_path / "cache"))
    assert fresh == 0 and [low.fixed for low in again] == [{"group": 128, "sf_layout": 0}, {"group": 32, "sf_layout": 1}]

    # the op binds the specialised kernel's arguments and fixes the generic one's runtime axis (hidden)
    launch = ArtifactSet(root, "test").kernel("per_token_cast_generic", a.key).bind(PER_TOKEN_CAST.args, fixed={"hidden": 4160})
    values = dict(x=0x10, x_sf=0x20, out=0x30, out_sf=0x40, num_tokens=37, x_stride=4160, in_sf_stride=1, sf_stride=64)
    launch(0, 0xABC, *(values[n] for n in PER_TOKEN_CAST.args))
    fields = dict(f.split("=", 1) for f in fake_acl.read_text().splitlines()[-1].split()[1:])
    every = {**values, "hidden": 4160, "group": 32, "sf_layout": 1}
    assert int(fields["blocks"]) == eval(lowered[0].spec.grid[0], {}, dict(every))  # the grammar is Python's
    packed, (plan, _) = bytes.fromhex(fields["args"]), pack_plan(lowered[0].spec.params)
    for (code, offset), p in zip(plan, lowered[0].spec.params):
        assert struct.unpack_from("<" + code, packed, offset)[0] == every[p.name], p.name


def test_every_kernel_has_an_ascend_source():
    from tkaot._decl import all_kernels

    assert set(ASCEND_SOURCES) == set(all_kernels())
    assert set(CASES) | {kernel for kernel, *_ in MHC} == set(ASCEND_SOURCES)  # each lowers in the contract test


def test_the_default_sets_mhc_variants_have_an_ascend_kernel_but_a_cuda_tiling():
    from build_tools.sweep import load_shapeset
    from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD_TILINGS

    mhc = [v for v in load_shapeset("default") if v.kernel.startswith("mhc_")]
    kept, left = ascend.select(mhc)
    # mhc_pre_apply_mix_bwd's one-vector walk is a CUDA tiling: the op's fallback to the default tiling serves its calls
    narrow, default = PRE_APPLY_MIX_BWD_TILINGS["narrow"], PRE_APPLY_MIX_BWD_TILINGS["default"]
    assert left == {f"mhc_pre_apply_mix_bwd: tiling={narrow} is a CUDA form (the tiling={default} kernel serves its calls)": 1}
    assert len(kept) == len(mhc) - 1 == 20
    assert all(ascend.ascend_module(v.kernel).REQUIRES == {} for v in kept)  # every runtime value served


def test_generic_ascend_kernels_build_through_the_specialised_builder():
    """A generic tier's Ascend module builds with its specialised kernel's builder (the width a runtime value), so the
    math is written once; the specialised kernels' lowered sources stayed byte-identical when it was shared."""
    import importlib
    import inspect

    from tkaot._decl import all_kernels

    generics = {name: d.generic_of for name, d in all_kernels().items() if d.generic_of}
    assert generics and set(generics) <= set(ASCEND_SOURCES)
    for name, specialised in generics.items():
        source = inspect.getsource(importlib.import_module(ASCEND_SOURCES[name]))
        assert f"from {ASCEND_SOURCES[specialised]} import" in source and f"{specialised}_kernel(" in source, name


FAKE_TOOL = """#!/bin/sh
# records its arguments, then writes its output (-o) with bytes derived from its input
echo "$(basename $0) $*" >> "$FAKE_TOOL_LOG"
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
for a in "$@"; do case "$a" in *.asc|*.rel.o) cat "$a" | sha256sum | cut -c1-64 > "$out"; echo ELF >> "$out";; esac; done
"""


def cli(*args, env):
    return subprocess.run([sys.executable, "-m", "build_tools.cli", *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.fixture
def tools_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TKAOT_PATH", "BISHENG_HOME")}
    env["TKAOT_CACHE_DIR"] = str(tmp_path / "cache")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "bisheng").exists())
    return env


def test_two_stage_build_with_a_fake_bisheng(tmp_path, tools_env):
    out = tmp_path / "set"
    select = ["--op", "topk_gate", "--set", "num_experts=256|64", "--set", "num_topk=8", "--set", "tiling=ballot4"]
    first = cli("build", "--arch", "ascend950", *select, "--out", out, env=tools_env)
    assert first.returncode == 0, first.stderr
    assert "binaries not built: bisheng and ld.lld not found" in first.stderr and f"--sources {out} --out {out}" in first.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["arch"] == "ascend950" and len(manifest["variants"]) == 2
    assert all("binary" not in e and (out / "sources" / f"{e['source']}.asc").is_file() for e in manifest["variants"])
    assert (out / "include" / "tl_templates" / "ascend" / "common.h").is_file()
    text = (out / "manifest.json").read_bytes()
    again = cli("build", "--arch", "ascend950", *select, "--out", tmp_path / "again", env=tools_env)
    assert again.returncode == 0 and (tmp_path / "again" / "manifest.json").read_bytes() == text  # reproducible
    strict = cli("build", "--arch", "ascend950", *select, "--out", out, "--require-binaries", env=tools_env)
    assert strict.returncode == 1 and "bisheng and ld.lld not found" in strict.stderr

    bin_dir = tmp_path / "cann" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("bisheng", "ld.lld"):
        (bin_dir / tool).write_text(FAKE_TOOL)
        (bin_dir / tool).chmod(0o755)
    env = {**tools_env, "BISHENG_HOME": str(tmp_path / "cann"), "FAKE_TOOL_LOG": str(tmp_path / "tools.log")}
    built = cli("build", "--arch", "ascend950", "--sources", out, "--out", tmp_path / "bins", env=env)
    assert built.returncode == 0, built.stderr
    log = [line for line in (tmp_path / "tools.log").read_text().splitlines() if not line.endswith("--version")]
    assert len(log) == 4 and log[0].startswith("bisheng ") and "--npu-arch=dav-3510" in log[0] and "--cce-aicore-only" in log[0]
    assert log[1].startswith("ld.lld -m aicorelinux")
    done = json.loads((tmp_path / "bins" / "manifest.json").read_text())
    assert [e["source"] for e in done["variants"]] == [e["source"] for e in manifest["variants"]]
    assert all((tmp_path / "bins" / "binaries" / f"{e['binary']}.o").is_file() for e in done["variants"])
    assert done["provenance"]["bisheng_flags"] == list(ascend.BISHENG_FLAGS)


FAKE_ACL = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
typedef struct { int id; union { unsigned char m; unsigned int ub; unsigned int r[4]; } value; } attr_t;
typedef struct { attr_t *attrs; size_t num; } cfg_t;
static FILE *log_file(void) { static FILE *f; if (!f) f = fopen(getenv("FAKE_ACL_LOG"), "a"); return f; }
int aclrtBinaryLoadFromData(const void *data, size_t n, const void *opt, void **h) {
    fprintf(log_file(), "load %zu %.*s\n", n, (int)(n < 8 ? n : 8), (const char *)data); fflush(log_file());
    *h = (void *)0x1000; return 0;
}
int aclrtBinaryGetFunction(void *h, const char *name, void **f) {
    fprintf(log_file(), "function %s\n", name); fflush(log_file()); *f = (void *)0x2000; return 0;
}
int aclrtBinaryUnLoad(void *h) { return 0; }
int aclrtLaunchKernelWithHostArgs(void *f, unsigned int blocks, void *stream, cfg_t *cfg, void *args, size_t size, void *p, size_t pn) {
    fprintf(log_file(), "launch fn=%p blocks=%u stream=%p attrs=%zu id=%d ub=%u size=%zu args=", f, blocks, stream,
            cfg ? cfg->num : 0, cfg ? cfg->attrs[0].id : -1, cfg ? cfg->attrs[0].value.ub : 0, size);
    for (size_t i = 0; i < size; i++) fprintf(log_file(), "%02x", ((unsigned char *)args)[i]);
    fprintf(log_file(), "\n"); fflush(log_file());
    return getenv("FAKE_ACL_FAIL") ? 507011 : 0;
}
const char *aclGetRecentErrMsg(void) { return "fake failure"; }
"""


@pytest.fixture
def fake_acl(tmp_path, monkeypatch):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "acl.c").write_text(FAKE_ACL)
    lib = tmp_path / "libfakeascendcl.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", lib, tmp_path / "acl.c"], check=True)
    import tkaot._ascend as runtime

    monkeypatch.setenv("TKAOT_ASCENDCL", str(lib))
    monkeypatch.setenv("FAKE_ACL_LOG", str(tmp_path / "acl.log"))
    monkeypatch.setattr(runtime, "_LIB", None)
    return tmp_path / "acl.log"


def ascend_set(tmp_path, lowered: list, binary: bool = True) -> Path:
    root = tmp_path / "ascend950"
    ascend.write_sources(root, lowered)
    manifest = json.loads((root / "manifest.json").read_text())
    if binary:
        for e in manifest["variants"]:
            data = b"FAKEELF-" + e["source"].encode()
            e["binary"] = ascend.sha256(data)
            (root / "binaries").mkdir(exist_ok=True)
            (root / "binaries" / f"{e['binary']}.o").write_bytes(data)
        (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_launcher_packs_arguments_ub_blocks_and_stream(tmp_path, fake_acl, monkeypatch):
    from tkaot import _ascend
    from tkaot._quant.kernels import RMSNORM
    from tkaot.registry import ArtifactSet

    low = ascend.lower(Variant.make("rmsnorm", CASES["rmsnorm"]))
    root = ascend_set(tmp_path, [low])
    key = Variant.make("rmsnorm", CASES["rmsnorm"]).key
    kernel = ArtifactSet(root, "test").kernel("rmsnorm", key)
    assert isinstance(kernel, _ascend.AscendKernel)
    launch = kernel.bind(RMSNORM.args)
    values = dict(
        x=0x10, weight=0x20, residual=0x30, out=0x40, residual_out=0x50, rstd=0x60, eps=1e-6, out_scale=2.0, batch=3,
        num_tokens=5, x_batch_stride=7 * 7168, x_stride=7168, residual_batch_stride=1, residual_stride=2,
        out_batch_stride=3, out_stride=4, residual_out_batch_stride=5, residual_out_stride=6,
    )  # fmt: skip
    launch(0, 0xABC, *(values[n] for n in RMSNORM.args))
    lines = fake_acl.read_text().splitlines()
    assert lines[0].startswith("load ") and lines[0].endswith("FAKEELF-") and lines[1] == f"function {low.spec.symbol}"
    fields = dict(f.split("=", 1) for f in lines[2].split()[1:])
    rows = 2  # kernels_src/ascend/tile.py: two 7168-wide bf16 rows with a residual
    assert int(fields["blocks"]) == 3 * -(-5 // rows) and int(fields["stream"], 16) == 0xABC
    assert (fields["attrs"], fields["id"], int(fields["ub"])) == ("1", "2", low.spec.smem)
    packed = bytes.fromhex(fields["args"])
    assert len(packed) == int(fields["size"]) and len(packed) % 8 == 0
    offset = 0
    for p in low.spec.params:  # pointers 8 bytes, scalars 4 and 4-aligned, in the kernel's order
        code = {"ptr": "<Q", "i32": "<i", "f32": "<f"}[p.type]
        offset = -(-offset // struct.calcsize(code)) * struct.calcsize(code)
        (got,) = struct.unpack_from(code, packed, offset)
        assert got == pytest.approx(values[p.name], rel=1e-7), p.name
        offset += struct.calcsize(code)
    launch(0, 0xABC, *(values[n] if n != "num_tokens" else 0 for n in RMSNORM.args))  # no tokens: no launch
    assert len(fake_acl.read_text().splitlines()) == 3


def test_launcher_refuses_what_the_ascend_kernel_cannot_take_and_reports_acl_errors(tmp_path, fake_acl, monkeypatch):
    from tkaot._ascend import AscendError
    from tkaot._quant.kernels import SWIGLU
    from tkaot.registry import ArtifactSet

    v = Variant.make("swiglu", CASES["swiglu"])
    root = ascend_set(tmp_path, [ascend.lower(v)])
    launch = ArtifactSet(root, "test").kernel("swiglu", v.key).bind(SWIGLU.args)
    values = {n: 0 for n in SWIGLU.args} | {"num_rows": 4, "sf_group_stride": 1, "x": 0x10}
    with pytest.raises(ValueError, match="has_psum=1 is not supported yet"):
        launch(0, 0, *((values | {"has_psum": 1})[n] for n in SWIGLU.args))
    launch(0, 0, *(values[n] for n in SWIGLU.args))
    monkeypatch.setenv("FAKE_ACL_FAIL", "1")
    with pytest.raises(AscendError, match="aclrtLaunchKernelWithHostArgs.*507011: fake failure"):
        launch(0, 0, *(values[n] for n in SWIGLU.args))


def test_sources_only_set_names_the_command_that_builds_binaries(tmp_path):
    from tkaot.errors import ArtifactError
    from tkaot.registry import ArtifactSet

    v = Variant.make("topk_gate", CASES["topk_gate"])
    root = ascend_set(tmp_path, [ascend.lower(v)], binary=False)
    kernel = ArtifactSet(root, "test").kernel("topk_gate", v.key)
    with pytest.raises(ArtifactError, match=f"tkaot-build build --arch ascend950 --sources {root} --out ./tkaot-artifacts"):
        kernel.bind(("scores", "topk_idx", "num_tokens"))


def test_import_tkaot_stays_free_of_the_ascend_runtime():
    code = (
        "import sys, tkaot, tkaot.registry; print(sorted(m for m in sys.modules if m.split('.')[0] in ('cffi', 'torch_npu', 'tilelang')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "torch_npu" not in out.stdout and "tilelang" not in out.stdout, out.stderr


def test_ascend950_wheel_packs_sources_headers_and_binaries(tmp_path):
    import zipfile

    from build_tools.wheel import artifact_wheel

    v = Variant.make("topk_gate", CASES["topk_gate"])
    root = ascend_set(tmp_path, [ascend.lower(v)])
    wheel = artifact_wheel(root, tmp_path / "dist")
    assert wheel.name.startswith("tkaot_ascend950-")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    entry = json.loads((root / "manifest.json").read_text())["variants"][0]
    assert f"tkaot_ascend950/sources/{entry['source']}.asc" in names and f"tkaot_ascend950/binaries/{entry['binary']}.o" in names
    assert "tkaot_ascend950/include/tl_templates/ascend/common.h" in names and "tkaot_ascend950/manifest.json" in names
    import tkaot

    assert f"Requires-Dist: tkaot=={tkaot.__version__}" in metadata  # version-locked like tkaot-sm90
    (root / "binaries" / f"{entry['binary']}.o").write_bytes(b"altered")
    with pytest.raises(Exception, match="does not match its sha256"):
        artifact_wheel(root, tmp_path / "dist2")


def test_pip_install_tkaot_ascend950_from_built_wheels_offline(tmp_path):
    """Issue 20: `pip install tkaot[ascend950]` from the wheels `make wheels` builds, with no index: the extra pulls
    the Ascend set's wheel, and the installed runtime finds its kernels (sources and binaries) without TileLang."""
    from build_tools.wheel import artifact_wheel, runtime_wheel
    from tests.test_wheels import _dependency_site, _fresh_venv

    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("pip is not available here")
    deps = _dependency_site(tmp_path)
    if deps is None:
        pytest.skip("torch is not in this environment's purelib to lend the fresh venv")
    dist = tmp_path / "dist"
    runtime_wheel(dist)
    v = Variant.make("topk_gate", CASES["topk_gate"])
    artifact_wheel(ascend_set(tmp_path, [ascend.lower(v)]), dist)
    try:
        python = _fresh_venv(tmp_path / "venv", deps)
    except subprocess.CalledProcessError:
        pytest.skip("cannot make a virtual environment here")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--find-links", str(dist)]
    proc = subprocess.run([*pip, "tkaot[ascend950]"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = (
        "import sys, importlib.util, tkaot_ascend950; from tkaot import registry;"
        "assert importlib.util.find_spec('tilelang') is None and tkaot_ascend950.__file__.startswith(sys.prefix);"
        f"k = registry.discover('ascend950')[0].kernel('topk_gate', {v.key!r});"
        "print(type(k).__name__, k.read_binary()[:8].decode(), tkaot_ascend950.__version__)"
    )
    env = {k: val for k, val in os.environ.items() if k not in ("TKAOT_PATH", "PYTHONPATH")}
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    import tkaot

    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == ["AscendKernel", "FAKEELF-", tkaot.__version__]


def test_the_committed_ascend950_set_serves_every_default_variant_an_ascend_module_builds():
    """prebuilt/ascend950 (stage 1, committed): the sm90 default set's variants less exactly those the Ascend modules
    refuse (with their reason), each entry's AscendC source present under its sha256 and its spec well formed."""
    import hashlib

    root = ROOT / "prebuilt" / "ascend950"
    entries = json.loads((root / "manifest.json").read_text())["variants"]
    default = json.loads((ROOT / "prebuilt" / "sm90" / "manifest.json").read_text())["variants"]
    served = {(e["kernel"], e["key"]) for e in entries}
    assert len(served) == len(entries)
    for e in default:
        why = ascend.unsupported(Variant.make(e["kernel"], e["static"]))
        assert ((e["kernel"], e["key"]) in served) == (why is None), (e["kernel"], e["key"], why)
    assert served <= {(e["kernel"], e["key"]) for e in default}
    for digest in {e["source"] for e in entries}:
        assert hashlib.sha256((root / "sources" / f"{digest}.asc").read_bytes()).hexdigest() == digest
    for e in entries:
        LaunchSpec.from_json(e["launch"])
