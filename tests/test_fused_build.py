"""Fused inference ops on CPU: their kernels build (one variant each), their LaunchSpecs bind to
the ops' argument lists, bad input is refused before launch, and the references agree with
independent formulations."""

import json

import pytest
import torch

import tkaot
from build_tools.artifacts import BuildCache
from build_tools.build import build_variants
from build_tools.ops import Variant
from build_tools.sweep import load_shapeset
from tkaot import reference, transform
from tkaot._kernel import Kernel
from tkaot._spec import LaunchSpec
from tkaot.errors import NoGPUError

BUILT = {
    "rotary": Variant.make("rotary", dict(rot_dim=64, dtype="bfloat16", interleaved=True)),
}
OP_KERNELS = {"rotary": transform._ROTARY}


@pytest.fixture(scope="module")
def built(tmp_path_factory, build_cache):
    out = tmp_path_factory.mktemp("fused")
    build_variants(list(BUILT.values()), out, "sm90", jobs=1, cache=BuildCache(build_cache))
    manifest = json.loads((out / "manifest.json").read_text())
    return out, {e["kernel"]: e for e in manifest["variants"]}


@pytest.mark.parametrize("kernel", sorted(BUILT))
def test_launch_spec_binds_to_the_op(built, kernel):
    out, entries = built
    entry = entries[kernel]
    assert entry["key"] == BUILT[kernel].key
    spec = LaunchSpec.from_json(entry["launch"])
    ops = OP_KERNELS[kernel]
    assert ops.key(tuple(BUILT[kernel].params.values())) == entry["key"]
    # Binding checks that every kernel parameter is supplied by the op's argument list
    Kernel(kernel, entry["key"], spec, out / "cubins" / f"{entry['cubin']}.cubin", entry["cubin"], "test").bind(ops.args)
    assert spec.smem == 0


def test_rotary_launch_spec(built):
    spec = LaunchSpec.from_json(built[1]["rotary"]["launch"])
    assert spec.grid == ("(((seqlen * num_heads) + 63) // 64)", "batch", "1")  # 4 threads a head row, 256 threads
    assert spec.block == (256, 1, 1)
    types = {p.name: p.type for p in spec.params}
    assert types["x"] == "ptr" and types["seqlen_offset"] == "i32" and types["num_heads"] == "i32"


def test_fused_shapeset_expands():
    variants = load_shapeset("fused")
    kernels = {v.kernel for v in variants}
    assert "rotary" in kernels
    assert len({(v.kernel, v.key) for v in variants}) == len(variants)


# --- validation, with meta tensors standing in for CUDA ones


@pytest.fixture
def fake_cuda(monkeypatch):
    """Treat meta tensors as CUDA tensors on device 0, so validation runs without a GPU."""

    def check_cuda(op, name, t, device_index=None):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "meta":
            raise ValueError(f"{op}: {name} must be a CUDA tensor, got a tensor on {t.device}")
        return 0

    monkeypatch.setattr("tkaot._validate.check_cuda", check_cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


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
        (lambda: dict(query=meta(4, 2, 64), positions=meta(4, dtype=torch.float32)), ValueError, "positions must be torch.int32"),
        (lambda: dict(query=meta(2, 4, 2, 64), positions=meta(4, dtype=torch.int32)), ValueError, r"positions must be of shape \(2, 4\)"),
        (lambda: dict(query=meta(4, 2, 64), seqlen_offset=61), ValueError, "seqlen_offset must be"),
        (lambda: dict(query=meta(4, 2, 64), seqlen_offset=1.0), TypeError, "seqlen_offset must be an int"),
        (lambda: dict(query=[1.0]), TypeError, "query must be a torch.Tensor"),
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


def test_apply_rotary_cpu_tensor_is_refused():
    with pytest.raises(ValueError, match="query must be a CUDA tensor"):
        tkaot.transform.apply_rotary(torch.randn(4, 2, 64), torch.randn(8, 64))


def test_signatures_match_tile_kernels():
    import inspect
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "shared/reference/tile_kernels_2.1.0_api.json"
    if not path.exists():
        pytest.skip("TileKernels API list not present")
    api = json.loads(path.read_text())
    for name, fn in [("transform.apply_rotary", tkaot.transform.apply_rotary)]:
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
