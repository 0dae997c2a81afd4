"""tkaot.mhc (expand, pre-apply mix, split mixes, Sinkhorn, post; forward and backward) on the CPU.

Real builds of every mHC kernel of the default set (one -j 1 build a session, checked against the declarations by
the build itself), each bound with the arguments its op passes; every key a valid call asks for is a variant of the
shape set; every invalid call (expansion rate, dtype, shape, contiguity, alignment, device, scalar type) raises
before any launch. Meta tensors stand in for CUDA ones (device 0) and a recorder stands in for the launcher.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tkaot
from build_tools.sweep import read_shapeset, resolve_shapeset, sweep
from tests.helpers import build_by_kernel, meta, record_launches, registry_holding
from tkaot import _model_shapes, _op
from tkaot._kernel import Kernel
from tkaot._mhc import expand, post, pre_apply_mix, sinkhorn, split_mixes
from tkaot._mhc.kernels import KERNELS as ALL_KERNELS
from tkaot._mhc.kernels import PRE_APPLY_MIX_BWD, PRE_APPLY_MIX_BWD_NARROW_HIDDEN, PRE_APPLY_MIX_BWD_TILINGS
from tkaot._spec import LaunchSpec

BF16, F32 = torch.bfloat16, torch.float32
MODULES = (expand, pre_apply_mix, split_mixes, sinkhorn, post)
KERNELS = tuple(d for d in ALL_KERNELS if d.ops[0].removeprefix("tkaot.mhc.") in {n for m in MODULES for n in m.__all__})
DEFAULT = [v for v in sweep(read_shapeset(resolve_shapeset("mhc"))) if v.kernel in {d.name for d in KERNELS}]


def op_kernels() -> dict[str, _op.OpKernels]:
    """Every OpKernels of the mHC op modules, by kernel name."""
    return {v.kernel: v for m in MODULES for v in vars(m).values() if isinstance(v, _op.OpKernels)}


# ---- builds


@pytest.fixture(scope="module")
def built(tmp_path_factory, build_cache):
    return build_by_kernel(tmp_path_factory.mktemp("mhc-art"), DEFAULT, build_cache)


SPLIT_ROWS = ("pre_layer_mix_grad", "post_layer_mix_grad", "comb_res_mix_grad", "input_mixes", "post_layer_mix", "input_mixes_grad")


@pytest.mark.parametrize("mhc", [4, 8, 2])
def test_split_mixes_bwd_moves_aligned_rows_as_16_byte_vectors(mhc):
    """At expansion rates whose rows are whole 16-byte vectors (4, 8), split_mixes_bwd tests every row tensor's
    address in the kernel and moves the rows as float4 when all are aligned, as scalars otherwise (the op does
    not require alignment); at other rates it has only the scalar path."""
    from build_tools.compile import lower
    from build_tools.ops import Variant

    source = lower(Variant.make("mhc_split_mixes_bwd", {"mhc_mult": mhc}), "sm90")[2]
    for name in SPLIT_ROWS:
        scalar = f"{name}[((((int64_t)token) * (int64_t)"
        assert (f"tkaot_aligned16((&({name}[0])))" in source) == (mhc % 4 == 0), name
        assert (f"*(float4*)({name} + " in source) == (mhc % 4 == 0), name
        assert scalar in source, name  # the scalar path: misaligned tensors, or every call at mhc 2
    if mhc % 4 == 0:  # the vectors sit in the branch the test takes, the scalars in the other
        vector = source.index("if (aligned_all != 0) {")
        assert vector < source.index("*(float4*)(input_mixes + ") < source.index("} else {", vector) < source.index("= input_mixes[(")
        assert source.count("if (aligned_all != 0) {") == 2  # the loads and the store
    else:
        assert "float4" not in source and "tkaot_aligned16" not in source


def test_the_default_set_builds_every_kernel_once_at_expansion_4_and_each_tiling():
    tilings = {PRE_APPLY_MIX_BWD.name: PRE_APPLY_MIX_BWD_TILINGS.values()}
    expected = [(d.name, d.key((4, *t))) for d in KERNELS for t in ([(t,) for t in tilings[d.name]] if d.name in tilings else [()])]
    assert sorted((v.kernel, v.key) for v in DEFAULT) == sorted(expected)


def test_every_kernel_binds_the_arguments_its_op_passes(built):
    out, entries = built
    ops = op_kernels()
    assert set(entries) == set(ops) == {d.name for d in KERNELS}
    for name, entry in entries.items():
        spec = LaunchSpec.from_json(entry["launch"])
        kernel = Kernel(name, entry["key"], spec, out / "cubins" / f"{entry['cubin']}.cubin", entry["cubin"], "test")
        kernel.bind(ops[name].args)  # raises unless the op supplies every kernel parameter
        assert spec.pdl, name  # every kernel waits for the one before it (kernels_src/pdl.py)
        assert all(a.role != "dim" or a.type == "i32" for a in spec.args), name
    walks = [e for e in json.loads((out / "manifest.json").read_text())["variants"] if e["kernel"] == PRE_APPLY_MIX_BWD.name]
    assert len(walks) == 2 and walks[0]["launch"] == walks[1]["launch"]  # the two tilings differ in their cubins alone


def test_launch_shapes(built):
    _, entries = built
    grids = {name: tuple(e["launch"]["grid"]) for name, e in entries.items()}
    assert grids["mhc_expand_fwd"] == ("(((num_tokens * (hidden // 8)) + 511) // 512)", "1", "1")
    assert grids["mhc_post_bwd"] == grids["mhc_pre_apply_mix_bwd"] == ("num_tokens", "1", "1")
    assert grids["mhc_split_mixes_bwd"] == ("num_partials", "1", "1")
    assert grids["mhc_sinkhorn_bwd"] == ("((num_tokens + 7) // 8)", "1", "1")  # 8 matrices a block
    assert grids["mhc_sinkhorn_fwd"] == ("((num_tokens + 15) // 16)", "1", "1")  # 16
    args = {a[0]: a[1] for a in entries["mhc_sinkhorn_fwd"]["launch"]["args"]}
    assert args["repeat"] == "scalar"  # the repeat count is a runtime value, not a variant
    assert {a[0] for a in entries["mhc_sinkhorn_bwd"]["launch"]["args"] if a[1] == "dim"} == {"num_tokens", "repeat"}


# ---- valid calls: the declared variants, all in the shape set


@pytest.fixture
def launches(monkeypatch):
    """Meta tensors read as device 0; each launcher records (kernel, key, {argument: value})."""
    return record_launches(monkeypatch, MODULES, with_args=True)


def f32(*shape):
    return meta(*shape, dtype=F32)


def valid_calls(n: int, mhc: int = 4, hidden: int = 7168, seqs: int = 1) -> dict[str, tuple]:
    """One valid call of each op (the public name -> (args...)), for n tokens."""
    mixes = mhc * (mhc + 2)
    split_fwd = (f32(n, mixes), f32(3), f32(mixes), f32(n, mhc), f32(n, mhc), f32(n, mhc * mhc), 2.0, 1e-6)
    split_bwd = (
        f32(n, mhc), f32(n, mhc), f32(n, mhc * mhc), f32(n, mixes), f32(n, mhc), f32(3), f32(mixes), f32(n, mixes),
        f32(3), f32(mixes), 2.0,
    )  # fmt: skip
    lead = (seqs, n)
    return {
        "expand_to_mhc_fwd": (meta(n, hidden), meta(n, mhc, hidden)),
        "expand_to_mhc_bwd": (meta(n, mhc, hidden), meta(n, hidden)),
        "mhc_pre_apply_mix_fwd": (meta(n, mhc, hidden), f32(n, mhc), meta(n, hidden)),
        "mhc_pre_apply_mix_bwd": (meta(n, hidden), meta(n, mhc, hidden), f32(n, mhc), meta(n, mhc, hidden)),
        "mhc_pre_split_mixes_fwd": split_fwd,
        "mhc_pre_split_mixes_bwd": split_bwd,
        "mhc_sinkhorn_fwd": (f32(n, mhc, mhc), f32(n, mhc, mhc), 20, 1e-6),
        "mhc_sinkhorn_bwd": (f32(n, mhc, mhc), f32(n, mhc, mhc), f32(n, mhc, mhc), 20, 1e-6),
        "mhc_post_fwd": (meta(*lead, hidden), meta(*lead, mhc, hidden), f32(*lead, mhc, 1), f32(*lead, mhc, mhc)),
        "mhc_post_bwd": (
            meta(*lead, hidden), meta(*lead, mhc, hidden), f32(*lead, mhc, 1), f32(*lead, mhc, mhc), meta(*lead, mhc, hidden),
        ),
    }  # fmt: skip


LAUNCHED = {
    "expand_to_mhc_fwd": ["mhc_expand_fwd"], "expand_to_mhc_bwd": ["mhc_expand_bwd"],
    "mhc_pre_apply_mix_fwd": ["mhc_pre_apply_mix_fwd"], "mhc_pre_apply_mix_bwd": ["mhc_pre_apply_mix_bwd"],
    "mhc_pre_split_mixes_fwd": ["mhc_split_mixes_fwd"],
    "mhc_pre_split_mixes_bwd": ["mhc_split_mixes_bwd", "mhc_split_mixes_bwd_reduce"],
    "mhc_sinkhorn_fwd": ["mhc_sinkhorn_fwd"], "mhc_sinkhorn_bwd": ["mhc_sinkhorn_bwd"],
    "mhc_post_fwd": ["mhc_post_fwd"], "mhc_post_bwd": ["mhc_post_bwd"],
}  # fmt: skip


def test_every_op_of_these_modules_is_here():
    assert sorted(n for m in MODULES for n in m.__all__) == sorted(LAUNCHED)
    assert set(LAUNCHED) < set(tkaot.mhc.__all__)


@pytest.mark.parametrize("tokens", [1, 3, 127, 4097, 8191])
@pytest.mark.parametrize("op", sorted(LAUNCHED))
def test_valid_calls_launch_variants_of_the_shape_set(launches, op, tokens):
    getattr(tkaot.mhc, op)(*valid_calls(tokens)[op])
    assert [kernel for kernel, _, _ in launches] == LAUNCHED[op]
    shipped = {(v.kernel, v.key) for v in DEFAULT}
    assert {(kernel, key) for kernel, key, _ in launches} <= shipped


def test_runtime_values_reach_the_kernels(launches):
    tkaot.mhc.mhc_sinkhorn_fwd(*valid_calls(5)["mhc_sinkhorn_fwd"][:2], 7, 0.5)
    tkaot.mhc.mhc_sinkhorn_bwd(*valid_calls(5)["mhc_sinkhorn_bwd"][:3], 9, 0.25)
    tkaot.mhc.mhc_post_fwd(*valid_calls(6, hidden=512, seqs=3)["mhc_post_fwd"])
    tkaot.mhc.mhc_pre_split_mixes_bwd(*valid_calls(1000)["mhc_pre_split_mixes_bwd"])
    (_, _, fwd), (_, _, bwd), (_, _, post_args), (_, _, stage1), (_, _, stage2) = launches
    assert (fwd["repeat"], fwd["eps"], fwd["num_tokens"]) == (7, 0.5, 5)
    assert (bwd["repeat"], bwd["eps"]) == (9, 0.25)
    assert (post_args["num_tokens"], post_args["hidden"]) == (18, 512)  # (num_seqs, num_tokens) flattened
    assert stage1["num_partials"] == stage2["num_partials"] == split_mixes.partial_count(1000) == 8


def test_empty_inputs_launch_nothing_but_the_gradient_sums(launches):
    for op, args in valid_calls(0).items():
        getattr(tkaot.mhc, op)(*args)
    # no tokens: the parameter gradients are sums over nothing, written as zeros by the reduction
    assert [(k, a["num_partials"]) for k, _, a in launches] == [("mhc_split_mixes_bwd_reduce", 0)]


def test_post_returns_new_tensors_shaped_like_the_inputs(launches):
    x, residual, post_mix, comb = valid_calls(3, hidden=64, seqs=2)["mhc_post_fwd"]
    out = tkaot.mhc.mhc_post_fwd(x, residual, post_mix, comb)
    assert out.shape == residual.shape and out.dtype == BF16 and out.is_contiguous()
    given = meta(*residual.shape)
    assert tkaot.mhc.mhc_post_fwd(x, residual, post_mix, comb, out=given) is given
    grads = tkaot.mhc.mhc_post_bwd(x, residual, post_mix, comb, meta(*residual.shape))
    assert [(g.shape, g.dtype) for g in grads] == [(t.shape, t.dtype) for t in (x, residual, post_mix, comb)]
    mix_grad = tkaot.mhc.mhc_pre_apply_mix_bwd(*valid_calls(3)["mhc_pre_apply_mix_bwd"])
    assert mix_grad.shape == (3, 4) and mix_grad.dtype == F32


def test_tensors_tile_kernels_copies_are_refused_when_strided(launches):
    """TileKernels reads post's residual and d_o through .contiguous(); tkaot copies no user tensor silently, so a
    non-contiguous one is refused (before any launch), naming its layout."""
    x, residual, post_mix, comb = valid_calls(3, hidden=64)["mhc_post_fwd"]
    strided = meta(1, 3, 64, 4).transpose(2, 3)
    with pytest.raises(ValueError, match="residual"):
        tkaot.mhc.mhc_post_fwd(x, strided, post_mix, comb)
    with pytest.raises(ValueError, match="d_o"):
        tkaot.mhc.mhc_post_bwd(x, residual, post_mix, comb, strided)
    assert not launches


@pytest.mark.parametrize("mhc", [1, 2, 3, 8])
def test_other_expansion_rates_ask_for_their_own_variant(launches, mhc):
    for op, args in valid_calls(5, mhc=mhc, hidden=64).items():
        getattr(tkaot.mhc, op)(*args)
    narrow = f"mhc_mult={mhc},tiling={PRE_APPLY_MIX_BWD_TILINGS['narrow']}"
    assert {key for kernel, key, _ in launches if kernel != PRE_APPLY_MIX_BWD.name} == {f"mhc_mult={mhc}"}
    assert [key for kernel, key, _ in launches if kernel == PRE_APPLY_MIX_BWD.name] == [narrow]


U1, U3 = (f"mhc_mult=4,tiling={PRE_APPLY_MIX_BWD_TILINGS[role]}" for role in ("narrow", "default"))


@pytest.mark.parametrize("hidden, expected", [(8, U1), (1024, U1), (2048, U1), (2560, U1), (4088, U1), (4096, U3), (7168, U3), (16384, U3)])
def test_pre_apply_mix_bwd_takes_the_one_vector_walk_below_4096(launches, hidden, expected):
    assert PRE_APPLY_MIX_BWD_NARROW_HIDDEN == 4096
    for tokens in (1, 8192):
        tkaot.mhc.mhc_pre_apply_mix_bwd(*valid_calls(tokens, hidden=hidden)["mhc_pre_apply_mix_bwd"])
    assert [(kernel, key) for kernel, key, _ in launches] == [(PRE_APPLY_MIX_BWD.name, expected)] * 2
    assert (launches[0][2]["hidden"], launches[1][2]["num_tokens"]) == (hidden, 8192)


@pytest.mark.parametrize("narrow_built", [False, True])
def test_pre_apply_mix_bwd_without_the_narrow_variant_launches_the_default_one(monkeypatch, narrow_built):
    """A set built without the one-vector variant (one from before it shipped, or a hand-written one): narrow rows
    launch the three-vector variant, no error and no warning; later calls take the cached launcher."""
    import warnings

    looked_up, launched = registry_holding(monkeypatch, pre_apply_mix, pre_apply_mix._BWD, {U1, U3} if narrow_built else {U3})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            tkaot.mhc.mhc_pre_apply_mix_bwd(*valid_calls(3, hidden=1024)["mhc_pre_apply_mix_bwd"])
        tkaot.mhc.mhc_pre_apply_mix_bwd(*valid_calls(3, hidden=7168)["mhc_pre_apply_mix_bwd"])
    served = U1 if narrow_built else U3
    assert launched == [served, served, U3]
    assert looked_up == ([U1, U3] if narrow_built else [U1, U3, U3])


# ---- invalid calls: refused before any launch


def _swap(args: tuple, i: int, value) -> tuple:
    return (*args[:i], value, *args[i + 1 :])


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """t's shape and dtype at an address 4 bytes past a 16-byte boundary (a view into a larger buffer)."""
    flat = meta(t.numel() + 8, dtype=t.dtype)
    return flat[4 // t.element_size() :][: t.numel()].view(t.shape)


def breaks(op: str) -> list[tuple[str, tuple]]:
    """(what is wrong, args) for one op: each a valid call with one thing broken."""
    n, hidden = 5, 64
    good = valid_calls(n, hidden=hidden)[op]
    calls = valid_calls(n, mhc=9, hidden=hidden)[op], valid_calls(n, hidden=hidden - 4)[op]
    out = [("expansion rate 9", calls[0])]
    if "sinkhorn" not in op and "split" not in op:
        out.append(("hidden not a multiple of 8", calls[1]))
    for i, t in enumerate(good):
        if not isinstance(t, torch.Tensor):
            continue
        other = F32 if t.dtype is BF16 else BF16
        out.append((f"arg {i} dtype", _swap(good, i, t.to(other))))
        out.append((f"arg {i} on the CPU", _swap(good, i, torch.empty(t.shape, dtype=t.dtype))))
        out.append((f"arg {i} a list", _swap(good, i, [1.0])))
        out.append((f"arg {i} one more row", _swap(good, i, meta(t.shape[0] + 1, *t.shape[1:], dtype=t.dtype))))
        out.append((f"arg {i} one dim less", _swap(good, i, t[0] if t.dim() > 1 else t.unsqueeze(0))))
        if t.dim() > 1 and not (op in ("mhc_post_fwd", "mhc_post_bwd") and i == (1 if op == "mhc_post_fwd" else 4)):
            wide = meta(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)[..., : t.shape[-1]]
            out.append((f"arg {i} not contiguous", _swap(good, i, wide)))
        if t.dtype is BF16 or "sinkhorn" in op:
            out.append((f"arg {i} misaligned", _swap(good, i, _misaligned(t))))
    if "sinkhorn" in op:
        repeat = 2 if op.endswith("fwd") else 3
        out += [
            ("repeat a float", _swap(good, repeat, 2.0)),
            ("repeat a bool", _swap(good, repeat, True)),
            ("repeat too small", _swap(good, repeat, -1 if op.endswith("fwd") else 0)),
            ("eps a string", _swap(good, repeat + 1, "1e-6")),
            ("not square", tuple(f32(n, 4, 3) if isinstance(t, torch.Tensor) else t for t in good)),
        ]
    if "split" in op:
        out.append(("post_mult a string", _swap(good, len(good) - 1 if op.endswith("bwd") else 6, "2")))
        comb = 2
        out.append(("comb of the wrong width", _swap(good, 5 if op.endswith("fwd") else comb, f32(n, 9))))
    return out


CASES = [(op, what, args) for op in sorted(LAUNCHED) for what, args in breaks(op)]


@pytest.mark.parametrize("op, what, args", CASES, ids=[f"{op}: {what}" for op, what, _ in CASES])
def test_invalid_calls_raise_before_any_launch(launches, op, what, args):
    with pytest.raises((ValueError, TypeError)) as error:
        getattr(tkaot.mhc, op)(*args)
    assert str(error.value).startswith(f"tkaot.mhc.{op}: "), error.value
    assert not launches, f"{op} ({what}) launched {launches}"


def test_errors_name_the_argument_and_the_rule(launches):
    with pytest.raises(ValueError, match=r"o must be of an expansion rate \(mhc_mult\) in \[1, 8\], got shape \(5, 9, 64\)"):
        tkaot.mhc.expand_to_mhc_fwd(*valid_calls(5, mhc=9, hidden=64)["expand_to_mhc_fwd"])
    with pytest.raises(ValueError, match="x must be of a hidden size that is a multiple of 8"):
        tkaot.mhc.mhc_pre_apply_mix_fwd(*valid_calls(5, hidden=60)["mhc_pre_apply_mix_fwd"])
    with pytest.raises(ValueError, match=r"input_mixes must be of shape \(5, 24\) for mhc=4, got \(5, 23\)"):
        tkaot.mhc.mhc_pre_split_mixes_fwd(*_swap(valid_calls(5)["mhc_pre_split_mixes_fwd"], 0, f32(5, 23)))
    with pytest.raises(ValueError, match=r"repeat must be in \[1, 2147483647\], got 0"):
        tkaot.mhc.mhc_sinkhorn_bwd(*_swap(valid_calls(5)["mhc_sinkhorn_bwd"], 3, 0))


# ---- model configs


def test_hf_config_maps_hc_mult_to_every_mhc_kernel():
    model = _model_shapes.ModelConfig.from_dict({"hidden_size": 7168, "hc_mult": 4}, "v4-style")
    needed = _model_shapes.needed_variants(_model_shapes.shape_tables(model))
    mhc = {(v.kernel, v.key) for v in needed if v.kernel.startswith("mhc_")}
    others = [d for d in ALL_KERNELS if d.name != PRE_APPLY_MIX_BWD.name]
    shipped = {(d.name, d.key([4] if d.axis_names == ("mhc_mult",) else ["float32"])) for d in others}
    assert mhc == shipped | {(PRE_APPLY_MIX_BWD.name, U3)}  # the op's tiling at hidden 7168
    narrow = _model_shapes.ModelConfig.from_dict({"hidden_size": 2560, "hc_mult": 4})
    needed = _model_shapes.needed_variants(_model_shapes.shape_tables(narrow))
    assert [v.key for v in needed if v.kernel == PRE_APPLY_MIX_BWD.name] == [U1]
    assert all(v.reason is None for v in needed if v.kernel.startswith("mhc_"))
    for config in ({"hidden_size": 7168}, {"hidden_size": 7168, "hc_mult": 0}, {"hidden_size": 7168, "hc_mult": True}):
        model = _model_shapes.ModelConfig.from_dict(config)
        assert not [v for v in _model_shapes.needed_variants(_model_shapes.shape_tables(model)) if v.kernel.startswith("mhc_")]
    wide = _model_shapes.ModelConfig.from_dict({"hidden_size": 7168, "mhc_mult": 16})
    needed = _model_shapes.needed_variants(_model_shapes.shape_tables(wide))
    unsupported = [v for v in needed if v.kernel.startswith("mhc_") and "mhc_mult=" in v.key]
    assert unsupported and all(v.reason for v in unsupported)


def test_the_presets_have_no_mhc():
    """No shipped model config declares hyper-connections: the default set's mHC variants come from mhc.toml."""
    for config in Path(__file__).resolve().parent.parent.joinpath("build_tools", "model_configs").glob("*.json"):
        assert _model_shapes.load_config(config).hc_mult is None, config.name
