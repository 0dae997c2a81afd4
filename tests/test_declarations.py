"""Every kernel declaration against the prebuilt manifest: keys, argument names and dynamic dims of every
built variant (generic ones included) are the declaration's, and every op a declaration names is a public tkaot op."""

import importlib
import json
from pathlib import Path

import pytest

from tkaot._decl import FAMILIES, all_kernels

MANIFEST = Path(__file__).resolve().parent.parent / "prebuilt" / "sm90" / "manifest.json"
DECLS = all_kernels()


@pytest.fixture(scope="module")
def entries():
    return json.loads(MANIFEST.read_text())["variants"]


def test_every_built_variant_matches_its_declaration(entries):
    assert entries
    for e in entries:
        decl = DECLS.get(e["kernel"])
        assert decl is not None, f"{e['kernel']} is built but not declared"
        assert set(e["static"]) == set(decl.axis_names), e["key"]
        values = [axis.parse(e["static"][axis.name]) for axis in decl.axes]
        assert decl.key(values) == e["key"]
        fixed = set(e.get("fixed", {}))  # static axes the kernel takes at run time (RUNTIME_AXES), passed after the op's
        assert fixed <= set(decl.axis_names), e["key"]
        args = e["launch"]["args"]
        assert {name for name, _, _ in args} == set(decl.args) | fixed, e["key"]
        assert {name for name, role, _ in args if role == "dim"} == set(decl.dims) | fixed, e["key"]


def test_every_declared_kernel_and_tiling_is_built(entries):
    built = {e["kernel"] for e in entries}
    assert built == set(DECLS)
    for decl in DECLS.values():
        if decl.tilings:
            shipped = {e["static"]["tiling"] for e in entries if e["kernel"] == decl.name}
            assert shipped == set(decl.tilings.values()), decl.name


def test_every_declared_op_is_public():
    for decl in DECLS.values():
        assert decl.ops, f"{decl.name} serves no op"
        for op in decl.ops:
            module, _, name = op.rpartition(".")
            assert module in {f"tkaot.{family}" for family in FAMILIES}, op
            assert callable(getattr(importlib.import_module(module), name, None)), op


def test_generic_entries_take_their_runtime_axes_as_dims(entries):
    """A generic variant (KernelDecl.generic) is keyed without its runtime axes and takes each as a dynamic dim."""
    generic = [e for e in entries if DECLS[e["kernel"]].generic_of]
    assert generic
    for e in generic:
        decl = DECLS[e["kernel"]]
        runtime = {a.name for a in decl.runtime_axes}
        roles = {name: (role, kind) for name, role, kind in e["launch"]["args"]}
        assert all(roles[name] == ("dim", "i32") for name in runtime), e["key"]
        assert not runtime & set(e["static"]) and decl.generic_of in DECLS, e["key"]
