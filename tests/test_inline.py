"""Checkers written into their ops (tkaot/_inline.py): every op that calls a checker as a plain statement gets it
inlined, and the inlined op raises what the checker raises, from the op's own `_check(` line."""

import importlib
import os
import pkgutil
import subprocess
import sys
import traceback
import types

import pytest
import torch

import tkaot
from tests.helpers import meta
from tkaot import _inline, _validate

# calls of a checker the inliner leaves as calls, with the reason
NOT_INLINED = {
    ("tkaot._quant.casts", "per_channel_cast"): "picks one of two checkers in an expression",
}


def _op_modules():
    for info in pkgutil.walk_packages(tkaot.__path__, "tkaot."):
        if ".reference" not in info.name and not info.name.endswith("__main__"):
            yield importlib.import_module(info.name)


def _stand_ins(namespace: dict):
    """(name, signature) of each checker of the module, compiled or not yet."""
    for name, value in list(namespace.items()):
        sig = getattr(value, "signature", None)
        if isinstance(sig, _validate.Signature):
            yield name, sig


def test_every_checker_call_is_inlined():
    """Inline each checker of each op module (what its first call does), then no module-level function but the
    listed ones still reads a checker."""
    seen, left = 0, []
    for module in _op_modules():
        namespace = vars(module)
        names = dict(_stand_ins(namespace))
        for name, sig in names.items():
            source, env = _validate._source(sig)
            _inline.inline_checker(namespace, name, source, env)
            seen += 1
        for f in namespace.values():
            if isinstance(f, types.FunctionType) and f.__module__ == module.__name__ and set(f.__code__.co_names) & set(names):
                left.append((module.__name__, f.__name__))
    assert seen >= 40, f"only {seen} checkers found: the stand-ins lost their signature attribute?"
    assert sorted(left) == sorted(NOT_INLINED), f"checker calls not inlined: {sorted(set(left) - set(NOT_INLINED))}"
    assert not _inline._TREES, f"trees held after every checker was written in: {sorted(_inline._TREES)}"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(x=meta(4, 512, dtype=torch.float16)), "bfloat16 or float32"),
        (dict(x=meta(4, 516)[:, :512]), "multiples of 8"),
        (dict(x=meta(4, 512), weight=meta(256)), "weight must be of shape"),
        (dict(x=meta(4, 512), residual=meta(4, 512), residual_out=meta(3, 512)), "residual_out must be of shape"),
        (dict(x=meta(4, 512), eps="1e-6"), "eps must be a real number"),
        (dict(x=[1.0]), "x must be a torch.Tensor"),
    ],
)
def test_inlined_op_raises_the_checkers_error_from_its_check_line(fake_cuda, kwargs, match):
    from tkaot._quant import norm

    args = {"weight": None, "eps": 1e-6, **kwargs}
    checker = norm.SIGNATURE.checker()
    with pytest.raises((ValueError, TypeError), match=match) as expected:
        checker(args["x"], args["weight"], args.get("residual"), None, args.get("residual_out"), args["eps"], 1.0)
    source, env = _validate._source(norm.SIGNATURE)
    _inline.inline_checker(vars(norm), "_check", source, env)
    assert "_check" not in norm.norm_forward.__code__.co_names, "norm_forward was not inlined"
    with pytest.raises(type(expected.value)) as raised:
        norm.norm_forward(**args)
    assert str(raised.value) == str(expected.value)
    frame = [f for f in traceback.extract_tb(raised.value.__traceback__) if f.name == "norm_forward"][-1]
    assert frame.line.lstrip().startswith("device, dtype, batch") and "_check(" in frame.line


def test_inlining_can_be_turned_off():
    code = (
        "from tkaot._quant import norm; import torch\n"
        "try: norm.norm_forward(torch.zeros(2, 16), None, 1e-6)\n"
        "except ValueError: pass\n"
        "print('_check' in norm.norm_forward.__code__.co_names)\n"
    )
    env = {**os.environ, "TKAOT_INLINE_CHECKS": "0"}
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert (off[-1], on[-1]) == ("True", "False")
