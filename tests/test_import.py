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
