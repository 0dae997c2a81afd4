"""tkaot.mhc's head mix, norm-weight merge, reduce partials + RMSNorm, pre big fuse and multilayer recompute on CPU.

Their kernels build (the default set's variants, one job) and each lowered signature is checked against its
declaration by the build; the launch specs bind to the ops' argument lists; every op's call resolves to a built
variant through a registry of that build; bad input is refused before any launch; and the references agree
with independent formulations (each backward with autograd of its forward reference, in float32 and in a
float64 gradcheck).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import tkaot
from build_tools.artifacts import BuildCache
from build_tools.build import build_variants
from build_tools.sweep import load_shapeset
from tests.helpers import meta, record_launches
from tkaot import _kernel, _op
from tkaot._mhc import big_fuse, head_mix, norm_fn, recompute
from tkaot._mhc.kernels import KERNELS
from tkaot._spec import LaunchSpec
from tkaot.reference import mhc as ref
from tkaot.registry import Registry

F32, BF16 = torch.float32, torch.bfloat16
MHC = tkaot.mhc
OP_KERNELS = {
    "mhc_head_mix_fwd": head_mix._FWD, "mhc_head_mix_bwd": head_mix._BWD,
    "mhc_normw_merge_fwd": norm_fn._MERGE_FWD, "mhc_normw_merge_bwd": norm_fn._MERGE_BWD,
    "mhc_reduce_partials_fwd": norm_fn._REDUCE_FWD, "mhc_reduce_partials_bwd": norm_fn._REDUCE_BWD,
    "mhc_pre_big_fuse": big_fuse._FUSE, "mhc_pre_big_fuse_split": big_fuse._SPLIT, "mhc_multilayer_recompute": recompute._RECOMPUTE,
}  # fmt: skip
OPS = {k.name: k for k in KERNELS if k.name in OP_KERNELS}  # the rest of tkaot.mhc: tests/test_mhc_ops.py
MODULES = (head_mix, norm_fn, big_fuse, recompute)


def default_variants():
    """The mHC variants of the default shape set (build_tools/shapesets/default.toml includes mhc.toml)."""
    return [v for v in load_shapeset("default") if v.kernel in OPS]


@pytest.fixture(scope="module")
def built(tmp_path_factory, build_cache):
    out = tmp_path_factory.mktemp("mhc") / "sm90"
    build_variants(default_variants(), out, "sm90", jobs=1, cache=BuildCache(build_cache))
    return out, json.loads((out / "manifest.json").read_text())


def test_the_default_set_has_one_variant_a_kernel():
    assert sorted(v.kernel for v in default_variants()) == sorted(OPS)


def test_every_variant_builds_and_its_launch_spec_binds_to_the_op(built):
    out, manifest = built
    entries = [e for e in manifest["variants"] if e["kernel"] in OPS]
    assert sorted(e["kernel"] for e in entries) == sorted(OPS)
    for entry in entries:
        spec = LaunchSpec.from_json(entry["launch"])
        assert spec.pdl, f"{entry['kernel']} must wait for the grid before it (PDL)"
        kernel = _kernel.Kernel(entry["kernel"], entry["key"], spec, out / "cubins" / f"{entry['cubin']}.cubin", entry["cubin"], "test")
        kernel.bind(OP_KERNELS[entry["kernel"]].args)  # every kernel parameter is supplied by the op's arguments


def test_runtime_sizes_stay_out_of_the_grid_constants(built):
    """Token count, splits, num_sms, layers and hidden size are runtime: the grids name them, no variant fixes them."""
    _, manifest = built
    grids = {e["kernel"]: LaunchSpec.from_json(e["launch"]).grid for e in manifest["variants"] if e["kernel"] in OPS}
    assert grids["mhc_head_mix_bwd"][0] == "num_sms"
    assert grids["mhc_pre_big_fuse"][0] == "num_tokens"
    assert grids["mhc_pre_big_fuse_split"][1] == "num_tokens"  # grid y: the op keeps it to SPLIT_MAX_TOKENS
    assert "hidden" in grids["mhc_multilayer_recompute"][0] and grids["mhc_multilayer_recompute"][1] == "num_tokens"


# ---- valid calls on meta tensors, resolved through a registry of the build


def valid_calls(tokens: int = 5, m: int = 4, hidden: int = 512, splits: int = 3):
    """One valid call of each op on meta tensors: {op name: (args, kwargs)}."""
    m3 = m * (m + 2)
    mixes = lambda: meta(tokens, m, dtype=F32)  # noqa: E731
    return {
        "mhc_head_compute_mix_fwd": ((mixes(), meta(1, dtype=F32), meta(m, dtype=F32), mixes(), 1e-6), {}),
        "mhc_head_compute_mix_bwd": (
            (mixes(), mixes(), meta(1, dtype=F32), meta(m, dtype=F32), mixes(), meta(7, 1, dtype=F32), meta(7, m, dtype=F32), 7),
            {"token_block_size": 16},
        ),
        "mhc_fn_normw_merge_fwd": ((meta(m3, m * hidden, dtype=F32), meta(m * hidden, dtype=F32), meta(m3, m * hidden, dtype=F32)), {}),
        "mhc_fn_normw_merge_bwd": (
            tuple(meta(m3, m * hidden, dtype=F32) if i != 1 and i != 4 else meta(m * hidden, dtype=F32) for i in range(5)),
            {},
        ),
        "mhc_reduce_partials_and_rmsnorm_fwd": (
            (meta(splits, tokens, 1, m3, dtype=F32), meta(splits, tokens, 1, dtype=F32), meta(tokens, 1, m3, dtype=F32),
             meta(tokens, 1, dtype=F32), meta(tokens, m3, dtype=F32), m * hidden, 1e-6, splits),
            {},
        ),
        "mhc_reduce_partials_and_rmsnorm_bwd": (
            (meta(tokens, m3, dtype=F32), meta(tokens, 1, m3, dtype=F32), meta(tokens, 1, dtype=F32),
             meta(tokens, 1, m3, dtype=F32), meta(tokens, 1, dtype=F32), m * hidden, 1e-6),
            {},
        ),
        "mhc_pre_big_fuse_fwd": (
            (meta(splits, tokens, m3, dtype=F32), meta(splits, tokens, dtype=F32), meta(3, dtype=F32), meta(m3, dtype=F32),
             meta(tokens, m, hidden, dtype=BF16), meta(tokens, m, dtype=F32), meta(tokens, m * m, dtype=F32),
             meta(tokens, hidden, dtype=BF16), 1e-6, 1e-6, 1e-6, 2.0, 20),
            {"n_splits": splits},
        ),
        "mhc_multilayer_recompute": (
            (meta(tokens, m, hidden, dtype=BF16), [meta(tokens, m, 1, dtype=F32)] * 3, [meta(tokens, hidden, dtype=BF16)] * 2,
             [meta(tokens, m, 1, dtype=F32)] * 2, [meta(tokens, m, m, dtype=F32)] * 2, [meta(tokens, hidden, dtype=BF16)] * 3,
             [meta(tokens, m, hidden, dtype=BF16)] * 2),
            {},
        ),
    }  # fmt: skip


@pytest.fixture
def recorded(monkeypatch):
    """Meta tensors as CUDA device 0; every mHC op's kernel lookup records (kernel, key) and returns a launcher that
    checks its argument count; the pointer table stays on the host."""
    monkeypatch.setattr(recompute, "pointer_table", lambda addresses, device: torch.tensor(addresses, dtype=torch.int64))
    return record_launches(monkeypatch, MODULES)


@pytest.mark.parametrize("op", sorted(valid_calls()))
@pytest.mark.parametrize("tokens", [1, 3, 127, 4097])
def test_valid_calls_launch_one_kernel(recorded, op, tokens):
    args, kwargs = valid_calls(tokens)[op]
    assert getattr(MHC, op)(*args, **kwargs) is None
    assert len(recorded) == 1


@pytest.mark.parametrize("tokens", [1, 3, 64, 65, 127, 4097])
def test_pre_big_fuse_splits_a_token_over_blocks_up_to_split_max_tokens(recorded, tokens):
    args, kwargs = valid_calls(tokens)["mhc_pre_big_fuse_fwd"]
    MHC.mhc_pre_big_fuse_fwd(*args, **kwargs)
    want = "mhc_pre_big_fuse_split" if tokens <= big_fuse.SPLIT_MAX_TOKENS else "mhc_pre_big_fuse"
    assert recorded == [(want, "mhc_mult=4")]


def test_pre_big_fuse_without_its_split_variant_launches_the_one_block_kernel(monkeypatch):
    """A set built without the split variant (an older set, a hand-written shape set) serves few tokens too."""
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(big_fuse, "current_stream", lambda device: 0)
    launched = []

    def get(self, device, *values, general_tiling=None):
        if self.kernel == "mhc_pre_big_fuse_split":
            raise tkaot.VariantNotBuilt("tkaot.mhc.mhc_pre_big_fuse_fwd", self.kernel, self.decl.key(values), [], "", [])
        return lambda *a: launched.append(self.kernel)

    monkeypatch.setattr(_op.OpKernels, "get", get)
    for kernels in (big_fuse._FUSE, big_fuse._SPLIT):
        monkeypatch.setattr(kernels, "cache", {})
    for tokens in (1, 1, 4097):
        args, kwargs = valid_calls(tokens)["mhc_pre_big_fuse_fwd"]
        MHC.mhc_pre_big_fuse_fwd(*args, **kwargs)
    assert launched == ["mhc_pre_big_fuse"] * 3


def test_zero_tokens_launch_nothing_but_the_partials_of_the_head_mix_backward(recorded):
    for op, (args, kwargs) in valid_calls(0).items():
        if op.startswith("mhc_fn_normw_merge"):  # no token dimension
            continue
        recorded.clear()
        getattr(MHC, op)(*args, **kwargs)
        assert len(recorded) == (op == "mhc_head_compute_mix_bwd"), op  # its partial rows are written (zero) even then


def test_every_call_resolves_to_a_built_variant(built, monkeypatch):
    out, _ = built
    get_device = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "meta" else get_device(self))
    monkeypatch.setenv("TKAOT_PATH", str(out))
    monkeypatch.setenv("TKAOT_STRICT", "1")
    registry = Registry()
    monkeypatch.setattr(registry, "device_arch", lambda index: "sm90")
    monkeypatch.setattr(_op, "REGISTRY", registry)
    resolved = []
    monkeypatch.setattr(_kernel.Kernel, "bind", lambda self, names, **kw: lambda *a: resolved.append(self.kernel))
    monkeypatch.setattr(recompute, "pointer_table", lambda addresses, device: torch.tensor(addresses, dtype=torch.int64))
    for module in MODULES:
        monkeypatch.setattr(module, "current_stream", lambda device: 0)
    for kernels in OP_KERNELS.values():
        monkeypatch.setattr(kernels, "cache", {})
    for op, (args, kwargs) in valid_calls(4097, hidden=7168, splits=16).items():
        getattr(MHC, op)(*args, **kwargs)
    args, kwargs = valid_calls(1, hidden=7168, splits=16)["mhc_pre_big_fuse_fwd"]  # a decode token: the split kernel
    MHC.mhc_pre_big_fuse_fwd(*args, **kwargs)
    assert sorted(resolved) == sorted(OPS)
    with pytest.raises(tkaot.VariantNotBuilt, match="mhc_mult=2"):  # a rate the default set does not build
        args, kwargs = valid_calls(3, m=2)["mhc_pre_big_fuse_fwd"]
        MHC.mhc_pre_big_fuse_fwd(*args, **kwargs)


def test_the_recompute_table_lists_every_layer_tensor_in_the_kernels_order(recorded, monkeypatch):
    """pre mixes, layer inputs, residuals, layer outputs, post mixes, comb mixes; on CPU tensors with real addresses."""
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    tables = []
    monkeypatch.setattr(recompute, "pointer_table", lambda addresses, device: tables.append(addresses) or torch.tensor(addresses))
    t, m, h = 3, 4, 64

    def f32(*s):
        return torch.zeros(*s, dtype=F32)

    def bf16(*s):
        return torch.zeros(*s, dtype=BF16)

    lists = ([f32(t, m) for _ in range(3)], [bf16(t, h) for _ in range(2)], [f32(t, m) for _ in range(2)],
             [f32(t, m, m) for _ in range(2)], [bf16(t, h) for _ in range(3)], [bf16(t, m, h) for _ in range(2)])  # fmt: skip
    pre, outs, post, comb, inputs, residuals = lists
    MHC.mhc_multilayer_recompute(bf16(t, m, h), *lists)
    assert tables == [[x.data_ptr() for x in (*pre, *inputs, *residuals, *outs, *post, *comb)]]


@pytest.mark.parametrize("m", [1, 2, 3, 5, 6, 7])
def test_recompute_mixes_need_only_4_byte_alignment_when_m_is_not_a_multiple_of_4(recorded, m):
    """The kernel copies such mix rows a float at a time: mixes one float into a buffer are taken."""
    args, _ = valid_calls(m=m)["mhc_multilayer_recompute"]
    res0, pre, outs, post, comb, inputs, residuals = args
    pre, post, comb = ([_one_float_in(*x.shape) for x in xs] for xs in (pre, post, comb))
    assert MHC.mhc_multilayer_recompute(res0, pre, outs, post, comb, inputs, residuals) is None
    assert len(recorded) == 1


# ---- refusals: each a valid call with one thing broken, refused before any launch


def broken(op, change):
    """A call of op: its valid meta arguments with change(args: list, kwargs: dict) applied."""

    def call():
        args, kwargs = valid_calls()[op]
        args, kwargs = list(args), dict(kwargs)
        change(args, kwargs)
        getattr(MHC, op)(*args, **kwargs)

    return call


def _set(i, value):
    def change(args, kwargs):
        args[i] = value() if callable(value) else value

    return change


def _non_contiguous(*shape, dtype=F32):
    """A maker of a transposed (non-contiguous) meta tensor of `shape`."""
    return lambda: meta(*reversed(shape), dtype=dtype).transpose(0, -1)


def _one_float_in(*shape):
    """A contiguous float32 meta view of `shape` one float into a buffer: 4-byte but not 16-byte aligned."""
    return meta(math.prod(shape) + 1, dtype=F32)[1:].view(shape)


REFUSALS = [
    # head mix
    ("mhc_head_compute_mix_fwd", _set(0, lambda: meta(5, 4, dtype=BF16)), ValueError, "input_mix must be torch.float32"),
    ("mhc_head_compute_mix_fwd", _set(2, lambda: meta(3, dtype=F32)), ValueError, r"mhc_base must be of shape \(4,\)"),
    ("mhc_head_compute_mix_fwd", _set(3, lambda: meta(4, 5, dtype=F32)), ValueError, "output_mix must be of shape"),
    ("mhc_head_compute_mix_fwd", _set(0, _non_contiguous(5, 4)), ValueError, "input_mix must be contiguous"),
    ("mhc_head_compute_mix_fwd", _set(1, lambda: meta(3, dtype=F32)), ValueError, "mhc_scale must be of shape"),
    ("mhc_head_compute_mix_fwd", _set(4, "eps"), TypeError, "mhc_pre_eps must be a float"),
    ("mhc_head_compute_mix_fwd", _set(0, lambda: torch.zeros(5, 4)), ValueError, "input_mix must be a CUDA tensor"),
    ("mhc_head_compute_mix_bwd", _set(5, lambda: meta(6, 1, dtype=F32)), ValueError, "mhc_scale_grad_partial must be of shape"),
    ("mhc_head_compute_mix_bwd", _set(7, 0), ValueError, "num_sms must be in"),
    ("mhc_head_compute_mix_bwd", _set(7, 7.0), TypeError, "num_sms must be an int"),
    ("mhc_head_compute_mix_bwd", lambda a, k: k.update(token_block_size=-1), ValueError, "token_block_size must be in"),
    ("mhc_head_compute_mix_bwd", lambda a, k: [a.__setitem__(i, meta(5, 3, dtype=F32)) for i in (0, 1, 4)]
     or a.__setitem__(3, meta(3, dtype=F32)) or a.__setitem__(6, meta(7, 3, dtype=F32)), ValueError, "power-of-two mhc_mult"),
    # norm-weight merge
    ("mhc_fn_normw_merge_fwd", _set(1, lambda: meta(100, dtype=F32)), ValueError, "normw must be of shape"),
    ("mhc_fn_normw_merge_fwd", _set(2, lambda: meta(24, 2048, dtype=BF16)), ValueError, "out_fn must be torch.float32"),
    ("mhc_fn_normw_merge_bwd", _set(3, _non_contiguous(24, 2048)), ValueError, "fn_grad must be contiguous"),
    ("mhc_fn_normw_merge_bwd", _set(4, lambda: meta(2047, dtype=F32)), ValueError, "normw_grad must be of shape"),
    # reduce partials + RMSNorm
    ("mhc_reduce_partials_and_rmsnorm_fwd", _set(7, 4), ValueError, "out_mul_splitted must be of shape"),
    ("mhc_reduce_partials_and_rmsnorm_fwd", _set(1, lambda: meta(3, 5, 2, dtype=F32)), ValueError, "sqrsum_splitted must be of shape"),
    ("mhc_reduce_partials_and_rmsnorm_fwd", _set(5, 0), ValueError, "rms_group_size must be in"),
    ("mhc_reduce_partials_and_rmsnorm_fwd", _set(5, 2048.0), TypeError, "rms_group_size must be an int"),
    ("mhc_reduce_partials_and_rmsnorm_fwd", _set(4, lambda: meta(5, 23, dtype=F32)), ValueError, "out must be of shape"),
    ("mhc_reduce_partials_and_rmsnorm_bwd", _set(2, lambda: meta(5, 1, dtype=BF16)), ValueError, "sqrsum must be torch.float32"),
    ("mhc_reduce_partials_and_rmsnorm_bwd", _set(3, lambda: meta(5, 2, 24, dtype=F32)), ValueError, "out_mul_grad must be of shape"),
    # pre big fuse
    ("mhc_pre_big_fuse_fwd", lambda a, k: k.update(n_splits=16), ValueError, "gemm_out_mul must be of shape"),
    ("mhc_pre_big_fuse_fwd", _set(4, lambda: meta(5, 3, 512, dtype=BF16)), ValueError, "mhc_mult .dim 1. one of"),
    ("mhc_pre_big_fuse_fwd", _set(4, lambda: meta(5, 8, 512, dtype=BF16)), ValueError, "mhc_mult .dim 1. one of"),
    ("mhc_pre_big_fuse_fwd", _set(4, lambda: meta(5, 4, 512, dtype=F32)), ValueError, "residual must be torch.bfloat16"),
    ("mhc_pre_big_fuse_fwd", _set(4, _non_contiguous(5, 4, 512, dtype=BF16)), ValueError, "residual must be contiguous"),
    ("mhc_pre_big_fuse_fwd", _set(7, lambda: meta(5, 500, dtype=BF16)), ValueError, "layer_input must be of shape"),
    ("mhc_pre_big_fuse_fwd", lambda a, k: [a.__setitem__(4, meta(5, 4, 500, dtype=BF16)), a.__setitem__(7, meta(5, 500, dtype=BF16))],
     ValueError, "multiple of 8"),
    ("mhc_pre_big_fuse_fwd", _set(6, lambda: meta(5, 4, 4, dtype=F32)), ValueError, "comb_mix must be 2-D"),
    ("mhc_pre_big_fuse_fwd", _set(3, lambda: meta(20, dtype=F32)), ValueError, "mhc_base must be of shape"),
    ("mhc_pre_big_fuse_fwd", _set(12, 2.5), TypeError, "sinkhorn_repeat must be an int"),
    ("mhc_pre_big_fuse_fwd", _set(12, -1), ValueError, "sinkhorn_repeat must be in"),
    ("mhc_pre_big_fuse_fwd", _set(5, lambda: meta(5, 4, dtype=BF16)), ValueError, "post_mix must be torch.float32"),
    # multilayer recompute
    ("mhc_multilayer_recompute", _set(0, lambda: meta(5, 3, 512, dtype=BF16)), ValueError, "initial_residual must be of shape|mhc_mult"),
    ("mhc_multilayer_recompute", _set(0, lambda: meta(5, 9, 512, dtype=BF16)), ValueError, r"mhc_mult \(dim -2\) in \[1, 8\]"),
    ("mhc_multilayer_recompute", _set(0, lambda: meta(5, 4, 500, dtype=BF16)), ValueError, "multiple of 8"),
    ("mhc_multilayer_recompute", _set(0, lambda: meta(5, 4, 512, dtype=F32)), ValueError, "initial_residual must be torch.bfloat16"),
    ("mhc_multilayer_recompute", _set(0, _non_contiguous(5, 4, 512, dtype=BF16)), ValueError, "initial_residual must be contiguous"),
    ("mhc_multilayer_recompute", _set(1, []), ValueError, "pre_mix_list must be non-empty"),
    ("mhc_multilayer_recompute", _set(5, [meta(5, 512, dtype=BF16)] * 2), ValueError, "layer_input_list must be of 3 tensors"),
    ("mhc_multilayer_recompute", _set(3, [meta(5, 4, dtype=F32)] * 3), ValueError, "post_mix_list must be of 2 tensors"),
    ("mhc_multilayer_recompute", _set(6, [meta(5, 4, 512, dtype=BF16)]), ValueError, "residual_list must be of 2 tensors"),
    ("mhc_multilayer_recompute", lambda a, k: [a.__setitem__(i, a[i][:1]) for i in (2, 3, 4, 6)], ValueError,
     "num_layers .3. or num_layers - 1"),
    ("mhc_multilayer_recompute", _set(2, (meta(5, 512, dtype=BF16), meta(5, 511, dtype=BF16))), ValueError,
     r"layer_output_list\[1\] must be of 2560"),
    ("mhc_multilayer_recompute", _set(4, [meta(5, 4, 4, dtype=BF16)] * 2), ValueError, r"comb_mix_list\[0\] must be torch.float32"),
    ("mhc_multilayer_recompute", _set(1, [meta(5, 4, dtype=F32), meta(5, 4, dtype=F32), _non_contiguous(5, 4)()]), ValueError,
     r"pre_mix_list\[2\] must be contiguous"),
    ("mhc_multilayer_recompute", _set(1, [meta(5, 4, dtype=F32)] * 2 + ["x"]), TypeError, r"pre_mix_list\[2\] must be a torch.Tensor"),
    ("mhc_multilayer_recompute", _set(1, meta(5, 4, dtype=F32)), TypeError, "pre_mix_list must be a list"),
    ("mhc_multilayer_recompute", _set(6, [meta(5, 4, 512, dtype=BF16), torch.zeros(5, 4, 512, dtype=BF16)]), ValueError,
     r"residual_list\[1\] must be on the device"),
    # M % 4 == 0: every mix row is read by 16-byte cp.async
    ("mhc_multilayer_recompute", _set(1, lambda: [meta(5, 4, 1, dtype=F32), _one_float_in(5, 4, 1), meta(5, 4, 1, dtype=F32)]),
     ValueError, r"pre_mix_list\[1\] must be 16-byte aligned"),
    ("mhc_multilayer_recompute", _set(3, lambda: [_one_float_in(5, 4, 1)] * 2), ValueError, r"post_mix_list\[0\] must be 16-byte aligned"),
    ("mhc_multilayer_recompute", _set(4, lambda: [meta(5, 4, 4, dtype=F32), _one_float_in(5, 4, 4)]), ValueError,
     r"comb_mix_list\[1\] must be 16-byte aligned"),
]  # fmt: skip


@pytest.mark.parametrize("op, change, error, match", REFUSALS, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSALS)])
def test_invalid_calls_raise_before_any_launch(recorded, op, change, error, match):
    with pytest.raises(error, match=match):
        broken(op, change)()
    assert not recorded, f"an invalid call launched {recorded}"


# ---- references against independent formulations


def _rand(*shape, dtype=F32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", [F32, torch.float64])
def test_head_mix_backward_is_autograd_of_its_forward(dtype):
    tokens, m, num_sms, block = 77, 4, 5, 8
    x, scale, base, dy = _rand(tokens, m, dtype=dtype), _rand(1, dtype=dtype), _rand(m, dtype=dtype), _rand(tokens, m, dtype=dtype, seed=1)
    leaves = [t.clone().requires_grad_() for t in (x, scale, base)]
    ref.mhc_head_compute_mix_fwd(*leaves, 1e-6).backward(dy)
    dx, scale_part, base_part = ref.mhc_head_compute_mix_bwd(dy, x, scale, base, num_sms, block)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is F32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, leaves[0].grad, **tol)
    torch.testing.assert_close(scale_part.sum(0), leaves[1].grad, **tol)
    torch.testing.assert_close(base_part.sum(0), leaves[2].grad, **tol)
    # partial row p sums the tiles p, p + num_sms, ... of `block` tokens
    tiles = [(t // block) % num_sms for t in range(tokens)]
    g = dx / scale[0]
    assert torch.allclose(base_part[2], g[[t for t in range(tokens) if tiles[t] == 2]].sum(0), **tol)
    small = tuple(t.double().requires_grad_() for t in (x[:5], scale, base))
    torch.autograd.gradcheck(lambda *a: ref.mhc_head_compute_mix_fwd(*a, 1e-6), small)


@pytest.mark.parametrize("dtype", [F32, torch.float64])
def test_normw_merge_backward_is_autograd_of_its_forward_plus_what_was_there(dtype):
    fn, w, dy = _rand(6, 40, dtype=dtype), _rand(40, dtype=dtype), _rand(6, 40, dtype=dtype, seed=1)
    fn_grad0, w_grad0 = _rand(6, 40, dtype=dtype, seed=2), _rand(40, dtype=dtype, seed=3)
    leaves = [t.clone().requires_grad_() for t in (fn, w)]
    ref.mhc_fn_normw_merge_fwd(*leaves).backward(dy)
    fn_grad, w_grad = ref.mhc_fn_normw_merge_bwd(fn, w, dy, fn_grad0, w_grad0)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is F32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fn_grad - fn_grad0, leaves[0].grad, **tol)
    torch.testing.assert_close(w_grad - w_grad0, leaves[1].grad, **tol)
    torch.autograd.gradcheck(ref.mhc_fn_normw_merge_fwd, (fn[:2, :5].double().requires_grad_(), w[:5].double().requires_grad_()))


@pytest.mark.parametrize("dtype", [F32, torch.float64])
def test_reduce_partials_backward_is_autograd_of_its_forward(dtype):
    splits, tokens, groups, m3, size, eps = 3, 9, 2, 24, 1000, 1e-6
    parts, sq_parts = _rand(splits, tokens, groups, m3, dtype=dtype), _rand(splits, tokens, groups, dtype=dtype).abs() * 50
    out_mul, sqrsum, out = ref.mhc_reduce_partials_and_rmsnorm_fwd(parts, sq_parts, size, eps, splits)
    torch.testing.assert_close(out_mul, parts.sum(0))
    torch.testing.assert_close(sqrsum, sq_parts.sum(0))
    dy = _rand(tokens, m3, dtype=dtype, seed=4)
    leaves = [out_mul.clone().requires_grad_(), sqrsum.clone().requires_grad_()]

    def forward(mul, sq):  # out as a function of the reduced mixes and squared sums
        return (mul * torch.rsqrt(sq / size + eps).unsqueeze(-1)).sum(1)

    torch.testing.assert_close(forward(out_mul, sqrsum), out, rtol=1e-5, atol=1e-6)
    forward(*leaves).backward(dy)
    mul_grad, sq_grad = ref.mhc_reduce_partials_and_rmsnorm_bwd(dy, out_mul, sqrsum, size, eps)
    tol = dict(rtol=1e-4, atol=1e-6) if dtype is F32 else dict(rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(mul_grad, leaves[0].grad, **tol)
    torch.testing.assert_close(sq_grad, leaves[1].grad, **tol)
    small = (out_mul[:2].double().requires_grad_(), sqrsum[:2].double().requires_grad_())
    torch.autograd.gradcheck(forward, small)


def test_pre_big_fuse_reference_is_the_composition_of_the_unfused_steps():
    """reduce + RMSNorm (as the op above), split mixes, Sinkhorn and apply-mix, written out independently."""
    tokens, m, hidden, splits = 7, 4, 64, 4
    m3 = m * (m + 2)
    parts, sq = _rand(splits, tokens, m3), _rand(splits, tokens).abs() * 100
    scale, base = _rand(3), _rand(m3, seed=1)
    residual = _rand(tokens, m, hidden, seed=2).bfloat16()
    post, comb, layer_input = ref.mhc_pre_big_fuse_fwd(parts, sq, scale, base, residual, 1e-6, 1e-2, 1e-6, 2.0, 20, splits)
    _, _, mixes = ref.mhc_reduce_partials_and_rmsnorm_fwd(parts[:, :, None], sq[:, :, None], m * hidden, 1e-6, splits)
    logits = mixes * torch.cat([scale[0].expand(m), scale[1].expand(m), scale[2].expand(m * m)]) + base
    torch.testing.assert_close(post, logits[:, m : 2 * m].sigmoid() * 2.0)
    c = logits[:, 2 * m :].view(tokens, m, m).softmax(-1) + 1e-6
    c = c / (c.sum(1, keepdim=True) + 1e-6)
    for _ in range(19):
        c = c / (c.sum(2, keepdim=True) + 1e-6)
        c = c / (c.sum(1, keepdim=True) + 1e-6)
    torch.testing.assert_close(comb, c.reshape(tokens, m * m))
    assert torch.allclose(c.sum(1), torch.ones(tokens, m), atol=1e-3)  # columns of a doubly stochastic matrix
    pre = logits[:, :m].sigmoid() + 1e-2
    expected = torch.einsum("tm,tmh->th", pre, residual.float()).bfloat16()
    assert (layer_input.float() - expected.float()).abs().max() <= expected.float().abs().max() * 2**-7


def test_multilayer_recompute_reference_chains_the_layer_step():
    tokens, m, hidden, layers = 6, 4, 32, 3
    res0 = _rand(tokens, m, hidden).bfloat16()
    pre = [_rand(tokens, m, 1, seed=i).sigmoid() for i in range(layers)]
    outs = [_rand(tokens, hidden, seed=10 + i).bfloat16() for i in range(layers - 1)]
    post = [_rand(tokens, m, 1, seed=20 + i).sigmoid() * 2 for i in range(layers - 1)]
    comb = [_rand(tokens, m, m, seed=30 + i).softmax(-1) for i in range(layers - 1)]
    inputs, residuals = ref.mhc_multilayer_recompute(res0, pre, outs, post, comb)
    assert len(inputs) == layers and len(residuals) == layers - 1
    res = res0
    for layer in range(layers):
        expected = (pre[layer] * res.float()).sum(1).bfloat16()
        assert (inputs[layer].float() - expected.float()).abs().max() <= 2**-6 * expected.float().abs().max()
        if layer < layers - 1:
            # mhc_post: out[o] = post[o] * x + sum_i comb[i, o] * res[i]
            res = (post[layer] * outs[layer].float()[:, None] + torch.einsum("tio,tih->toh", comb[layer], res.float())).bfloat16()
            assert (residuals[layer].float() - res.float()).abs().max() <= 2**-6 * res.float().abs().max()
            res = residuals[layer]
