"""Every public tkaot op keeps TileKernels 2.1.0's name, parameters (in order) and defaults.

tests/data/tile_kernels_2.1.0_api.json is a copy of TileKernels' public API (names and signatures as
`inspect` prints them), so this runs anywhere, CI included.
"""

import ast
import importlib
import inspect
import json
from pathlib import Path

import pytest

from tkaot import _decl

API = json.loads((Path(__file__).parent / "data" / "tile_kernels_2.1.0_api.json").read_text())
FAMILIES = (*_decl.FAMILIES, "rand")  # the public op families (tkaot/<family>.py); rand declares no kernels


def _implemented():
    for family in FAMILIES:
        module = importlib.import_module(f"tkaot.{family}")
        for name in module.__all__:
            yield f"{family}.{name}", getattr(module, name)


def _defaults(signature_text: str) -> dict:
    """Parameter defaults of a signature as TileKernels printed it (literals only)."""
    tree = ast.parse(f"def f{signature_text.split(' -> ')[0]}: pass").body[0].args
    positional = tree.args[len(tree.args) - len(tree.defaults) :]
    pairs = list(zip(positional, tree.defaults)) + [(a, d) for a, d in zip(tree.kwonlyargs, tree.kw_defaults) if d is not None]
    return {a.arg: _value(d) for a, d in pairs}


def _value(node):
    """A default's value: a literal, or a torch attribute such as torch.float32."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        import torch

        return getattr(torch, node.attr)
    return ast.literal_eval(node)


@pytest.mark.parametrize("name, fn", list(_implemented()), ids=lambda v: v if isinstance(v, str) else "")
def test_public_op_matches_tile_kernels(name, fn):
    if name == "moe.moe_topk_gate":  # tkaot's alias of moe_topk_gate_forward under its earlier name
        name = "moe.moe_topk_gate_forward"
        fn = importlib.import_module("tkaot.moe").moe_topk_gate_forward
    assert name in API, f"tkaot.{name} is not a TileKernels 2.1.0 function"
    ours = inspect.signature(fn).parameters
    assert list(ours) == API[name]["params"], name
    for param, default in _defaults(API[name]["signature"]).items():
        assert ours[param].default == default, f"{name}: {param} defaults to {ours[param].default!r}, TileKernels {default!r}"
    for param in ours.values():
        if param.default is inspect.Parameter.empty:
            assert param.name not in _defaults(API[name]["signature"]), f"{name}: {param.name} needs a default"


def test_the_copy_is_the_whole_api():
    assert len(API) == 57 and all({"params", "signature"} <= set(entry) for entry in API.values())
