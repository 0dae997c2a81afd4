"""Every prebuilt cubin marked "pdl" waits (ACQBULK, griddepcontrol.wait) before its first memory access or
branch, in the SASS itself, not only in the CUDA source the build checks (build_tools/compile.py).

Needs cuobjdump (CUDA toolkit or the nvidia-cuda-cuobjdump wheel): on PATH, or named by TKAOT_CUOBJDUMP;
skipped without it (the CI image's toolkit has no cuobjdump).
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CUOBJDUMP = os.environ.get("TKAOT_CUOBJDUMP") or shutil.which("cuobjdump")
# Global, generic, bulk and atomic memory instructions, cache controls (prefetches), and control flow
TOUCHES = re.compile(r"^(LDG|STG|LD|ST|ATOM|ATOMG|RED|LDGSTS|CCTL|UBLKCP|UBLKPF|UTMALDG|UTMASTG|UTMAPF|BRA|BRX|JMP|CALL)\b")


def instructions(cubin: Path) -> list[str]:
    sass = subprocess.run([CUOBJDUMP, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    ops = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops.append(m.group(1))
    return ops


@pytest.mark.skipif(CUOBJDUMP is None, reason="no cuobjdump here (set TKAOT_CUOBJDUMP)")
def test_pdl_cubins_wait_before_touching_memory():
    manifest = json.loads((ROOT / "prebuilt" / "sm90" / "manifest.json").read_text())
    checked = 0
    for entry in manifest["variants"]:
        if not entry["launch"].get("pdl"):
            continue
        ops = instructions(ROOT / "prebuilt" / "sm90" / "cubins" / f"{entry['cubin']}.cubin")
        assert "ACQBULK" in ops, entry["key"]
        before = [op for op in ops[: ops.index("ACQBULK")] if TOUCHES.match(op)]
        assert before == [], f"{entry['kernel']} [{entry['key']}] runs {before} before griddepcontrol.wait"
        checked += 1
    assert checked > 0
