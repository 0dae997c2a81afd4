"""norm_forward refuses bad input with a clear exception before any launch (CPU: meta tensors stand in)."""

import pytest
import torch

import tkaot
from tests.helpers import meta
from tkaot.errors import NoGPUError

# fake_cuda (tests/conftest.py) lets meta tensors stand in for CUDA ones


def test_cpu_tensor_is_refused():
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        tkaot.quant.norm_forward(torch.randn(4, 512), None, 1e-6)


def test_non_tensor_is_refused():
    with pytest.raises(TypeError, match="torch.Tensor"):
        tkaot.quant.norm_forward([1.0, 2.0], None, 1e-6)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: dict(x=meta(4, 512, dtype=torch.float16)), "bfloat16 or float32"),
        (lambda: dict(x=meta(512)), "2-D"),
        (lambda: dict(x=meta(2, 2, 4, 512)), "2-D"),
        (lambda: dict(x=meta(4, 1024)[:, :512].t().contiguous().t()), "contiguous in its last dimension"),
        (lambda: dict(x=meta(4, 516)[:, :512]), "multiples of 8"),
        (lambda: dict(x=meta(4, 512), weight=meta(256)), "weight must be of shape"),
        (lambda: dict(x=meta(4, 512), weight=meta(512, dtype=torch.float32)), "weight must be torch.bfloat16"),
        (lambda: dict(x=meta(4, 512), residual=meta(4, 256)), "residual must be of shape"),
        (lambda: dict(x=meta(4, 512), out=meta(4, 512, dtype=torch.float32)), "out must be torch.bfloat16"),
        (lambda: dict(x=meta(4, 512), residual=meta(4, 512), residual_out=meta(3, 512)), "residual_out must be of shape"),
        (lambda: dict(x=meta(70000, 1, 512)), "65535"),
        # the hidden rule is checked where the op binds a launcher (Rule(after="launch")), before any launch
        (lambda: dict(x=meta(4, 520)), "hidden size a multiple of 16"),
        (lambda: dict(x=meta(2, 3, 8208)), r"in \(0, 8192\], got shape \(2, 3, 8208\)"),
    ],
)
def test_bad_inputs_raise_before_launch(fake_cuda, make, match):
    kwargs = make()
    x = kwargs.pop("x")
    weight = kwargs.pop("weight", None)
    with pytest.raises(ValueError, match=match):
        tkaot.quant.norm_forward(x, weight, 1e-6, **kwargs)


def test_valid_input_without_gpu_reaches_the_registry_and_says_so(fake_cuda):
    with pytest.raises(NoGPUError):
        tkaot.quant.norm_forward(meta(4, 512), meta(512), 1e-6)


def test_signature_matches_tile_kernels():
    import inspect
    import json
    from pathlib import Path

    api = (
        json.loads((Path(__file__).resolve().parent / "data" / "tile_kernels_2.1.0_api.json").read_text())
        if (Path(__file__).resolve().parent / "data" / "tile_kernels_2.1.0_api.json").exists()
        else None
    )
    params = list(inspect.signature(tkaot.quant.norm_forward).parameters)
    expected = ["x", "weight", "eps", "residual", "out_scale", "out", "residual_out", "with_rstd"]
    assert params == expected
    if api is not None:
        assert api["quant.norm_forward"]["params"] == expected
    defaults = {k: v.default for k, v in inspect.signature(tkaot.quant.norm_forward).parameters.items()}
    assert defaults["out_scale"] == 1.0 and defaults["with_rstd"] is False and defaults["residual"] is None


def test_non_tensor_weight_is_refused(fake_cuda):
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        tkaot.quant.norm_forward(meta(4, 512), [1.0] * 512, 1e-6)


def test_misaligned_weight_is_refused(fake_cuda):
    with pytest.raises(ValueError, match="weight must be"):
        tkaot.quant.norm_forward(meta(4, 512), meta(1024)[::2], 1e-6)


def test_a_rule_placed_at_launch_is_off_the_per_call_check_and_in_the_launch_check(fake_cuda):
    from tkaot._quant import norm

    rule = "hidden % 16 == 0 and 0 < hidden <= 8192"
    assert rule not in norm.SIGNATURE.source()
    assert rule in norm.SIGNATURE.source(at_launch=True)
    # a width the per-call check lets through: only the launch check refuses it
    args = (meta(4, 520), None, None, None, None, 1e-6, 1.0)
    norm.SIGNATURE.checker()(*args)
    with pytest.raises(ValueError, match="hidden size a multiple of 16"):
        norm.SIGNATURE.check_at_launch(*args)
