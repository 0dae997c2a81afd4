"""`import tkaot` stays light: no TileLang, no TVM, no compiler."""

import subprocess
import sys


def test_import_leaves_tilelang_and_tvm_out():
    code = (
        "import sys, tkaot, tkaot.quant, tkaot.reference;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tilelang', 'tvm', 'tvm_ffi', 'kernels_src', 'build_tools')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_lazy_op_lists_match_the_modules():
    import tkaot
    from tkaot import _casts, _fused, _weight_casts, quant

    assert set(quant._CAST_NAMES) == set(_casts.__all__)
    assert set(quant._WEIGHT_CAST_NAMES) == set(_weight_casts.__all__)
    assert set(quant._FUSED_NAMES) == set(_fused.__all__)
    for name in quant.__all__:
        assert callable(getattr(quant, name)), name
    assert {"quant", "moe", "transform"} <= set(dir(tkaot))
    assert callable(tkaot.moe.moe_topk_gate_forward) and callable(tkaot.transform.apply_rotary)


def test_import_is_light_until_first_use():
    code = "import sys, tkaot; print(sorted(m for m in sys.modules if m.startswith('tkaot')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "tkaot._casts" not in proc.stdout and "tkaot.moe" not in proc.stdout
