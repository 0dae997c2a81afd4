"""`import tkaot` stays light: no TileLang, no TVM, no compiler."""

import importlib
import json
import subprocess
import sys


def test_import_leaves_tilelang_and_tvm_out():
    code = (
        "import sys, tkaot, tkaot.quant, tkaot.engram, tkaot.modeling, tkaot.reference;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tilelang', 'tvm', 'tvm_ffi', 'kernels_src', 'build_tools')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_lazy_op_lists_match_the_modules():
    import tkaot
    from tkaot import engram, mhc, moe, quant, transform

    for family in (quant, moe, transform, mhc, engram):
        for module, names in family._MODULES.items():
            assert set(names) == set(importlib.import_module(module).__all__), module
            for name in names:  # each op maps to the module defining it
                assert callable(getattr(family, name)) and getattr(family, name).__module__ == module, name
        assert family.__all__ == sorted(n for names in family._MODULES.values() for n in names)
    assert {"quant", "moe", "transform", "mhc", "engram", "modeling"} <= set(dir(tkaot))
    assert callable(tkaot.moe.moe_topk_gate_forward) and callable(tkaot.transform.apply_rotary)


def test_import_is_light_until_first_use():
    code = "import sys, tkaot; print(sorted(m for m in sys.modules if m.startswith('tkaot')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "tkaot._quant.casts" not in proc.stdout and "tkaot.moe" not in proc.stdout


def test_quant_loads_each_op_module_on_first_use():
    code = (
        "import json, sys, tkaot.quant; loaded = lambda: sorted(m for m in sys.modules if m.startswith('tkaot'));"
        "before = loaded(); tkaot.quant.swiglu_forward; print(json.dumps([before, loaded()]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    before, after = (set(names) for names in json.loads(proc.stdout))
    lazy = {f"tkaot._quant.{m}" for m in ("casts", "weight_casts", "cast_common", "fused", "swiglu", "norm_cast", "norm")}
    assert not before & lazy
    assert {"tkaot._quant.swiglu", "tkaot._quant.fused"} <= after and not after & {"tkaot._quant.norm_cast", "tkaot._quant.casts"}
