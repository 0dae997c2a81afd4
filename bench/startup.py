"""Start-up costs on a GPU machine, each in fresh processes: import, family imports, preload, first call.

    python -m bench.startup                  # this checkout, 7 processes per figure, medians printed as JSON
    python -m bench.startup --tree DIR       # another checkout (its own tkaot/ and prebuilt/), for before/after

Every figure is measured after `import torch` and CUDA initialisation, so it is tkaot's own share. The tree's
`tkaot/` is byte-compiled first, as installing a wheel does (without it, a process under PYTHONDONTWRITEBYTECODE
compiles every module it imports: 75-100 ms of op lookups on the H200's host instead of ~20):
- import_ms: `import tkaot`;
- families_ms: then `import tkaot.quant, tkaot.moe, tkaot.transform`;
- ops_ms: then looking up every public op of those families (loads the lazily imported op modules);
- preload_ms: in another process, `tkaot.preload()` of every kernel of the device's sets (kernels counted);
- first_call_ms: in another process, the first `norm_forward` call (one cubin loaded) until the GPU is done.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys

_PRELUDE = "import time, torch; torch.cuda.init(); torch.empty(1, device='cuda'); torch.cuda.synchronize(); clock = time.perf_counter\n"

_IMPORTS = (
    _PRELUDE
    + """
t0 = clock(); import tkaot; t1 = clock()
import tkaot.quant, tkaot.moe, tkaot.transform; t2 = clock()
for family in (tkaot.quant, tkaot.moe, tkaot.transform):
    for name in family.__all__:
        getattr(family, name)
t3 = clock()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "families_ms": (t2 - t1) * 1e3, "ops_ms": (t3 - t2) * 1e3}))
"""
)

_PRELOAD = (
    _PRELUDE
    + """
import tkaot
t0 = clock(); n = tkaot.preload(); torch.cuda.synchronize(); t1 = clock()
print(json.dumps({"preload_ms": (t1 - t0) * 1e3, "preloaded": n}))
"""
)

_FIRST_CALL = (
    _PRELUDE
    + """
x = torch.randn(4, 7168, dtype=torch.bfloat16, device="cuda"); w = torch.randn(7168, dtype=torch.bfloat16, device="cuda")
torch.cuda.synchronize()
t0 = clock(); import tkaot; tkaot.quant.norm_forward(x, w, 1e-6); torch.cuda.synchronize(); t1 = clock()
print(json.dumps({"first_call_ms": (t1 - t0) * 1e3}))
"""
)


def _run(code: str, tree: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH", "")]))}
    proc = subprocess.run([sys.executable, "-c", "import json\n" + code], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"start-up probe failed in {tree}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(tree: str, repeats: int) -> dict:
    compileall.compile_dir(os.path.join(tree, "tkaot"), quiet=1)
    samples: dict[str, list[float]] = {}
    for code in (_IMPORTS, _PRELOAD, _FIRST_CALL):
        for _ in range(repeats):
            for key, value in _run(code, tree).items():
                samples.setdefault(key, []).append(value)
    result = {key: round(statistics.median(values), 2) for key, values in samples.items()}
    result.update({f"{key}_range": [round(min(v), 2), round(max(v), 2)] for key, v in samples.items() if key != "preloaded"})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=".", help="the checkout to measure (default: this one)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps({"tree": args.tree, **measure(os.path.abspath(args.tree), args.repeats)}))


if __name__ == "__main__":
    main()
