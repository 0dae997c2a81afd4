"""Generated code where the first parity run on an H200 found tkaot's bytes differing from TileKernels' (see
bench/RESULTS.md), checked here on the PTX nvcc makes of the lowered kernel with the build's own flags.

mhc_head_mix_fwd: TileKernels' kernel computes sigmoid(x * scale + base) with the multiply and the add fused into
one fma.rn.f32 (nvcc contracts its expression; TileLang's JIT passes no fast-math flag, nor do we). Lowered and
compiled here for mhc_mult 1, 2 and 4, its floating-point instructions are exactly FMA_SIGMOID_PLUS_EPS below (at
mhc_mult 8 a thread does two elements, twice that sequence interleaved). tkaot's kernel must make the same ones.
"""

import re
import subprocess
from pathlib import Path

from build_tools.compile import lower, nvcc_command
from build_tools.ops import Variant

# fma(x, scale, base); 0 - v; expf(-v) (range reduction, ex2.approx, scaling); 1 + e; IEEE 1 / (1 + e); + eps
FMA_SIGMOID_PLUS_EPS = [
    "fma.rn.f32", "sub.f32",
    "fma.rn.f32", "fma.rm.f32", "add.f32", "neg.f32", "fma.rn.f32", "fma.rn.f32", "ex2.approx.ftz.f32",
    "fma.rn.f32", "rcp.rn.f32", "add.f32",
]  # fmt: skip
FLOAT_OP = re.compile(r"^\s+((?:add|sub|mul|fma|div|rcp|ex2|neg|max|min)\.[a-z0-9.]*f32)\s")


def ptx(source: str, tmp_path: Path) -> str:
    """The PTX of a lowered kernel, compiled with the build's nvcc flags (--ptx in place of --cubin)."""
    (tmp_path / "kernel.cu").write_text(source)
    cmd = [("--ptx" if flag == "--cubin" else flag) for flag in nvcc_command("sm90")]
    subprocess.run([*cmd, "kernel.cu", "-o", "kernel.ptx"], cwd=tmp_path, check=True, capture_output=True)
    return (tmp_path / "kernel.ptx").read_text()


def float_ops(ptx_text: str) -> list[str]:
    return [m.group(1) for line in ptx_text.splitlines() if (m := FLOAT_OP.match(line))]


def test_head_mix_fwd_fuses_the_sigmoid_argument_as_tile_kernels(tmp_path):
    _, _, source = lower(Variant.make("mhc_head_mix_fwd", {"dtype": "float32"}), "sm90")
    assert "__fmaf_rn(" in source
    assert float_ops(ptx(source, tmp_path)) == FMA_SIGMOID_PLUS_EPS
