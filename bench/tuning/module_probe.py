"""What loading the default set's kernels as a few multi-kernel modules would save over one module a kernel (issue 14:
`tkaot.preload()` of the default sm90 set takes ~139 ms on the H200's host, ≤ 100 ms is the target).

The driver's share of preload was measured at ~77-110 ms for 735 cubins (cuModuleLoadData 47-65 ms, cuModuleGetFunction
30-44 ms; 8a36647:bench/results/2026-12-02-H200-s13-preload-probe.log). A synthetic probe put a module's own cost at ~25 µs of ~48 µs a
kernel alone. This probe measures it on the real kernels: the build mode lowers every specialised default sm90 variant
that preload loads (one per cubin), compiles those sharing a preamble into modules of up to --group kernels (one PTX, one
ptxas run, entries tagged apart as build_tools/nvcc_batch.py tags them) and writes the modules with the entries each
holds; the run mode, on a GPU, times in fresh processes, interleaved:
    single  each committed cubin of prebuilt/sm90 read, loaded and its function got (what preload does, minus its checks)
    multi   the probe's modules loaded and every entry got
    preload tkaot.preload() as shipped

    python -m bench.tuning.module_probe build --out tune-artifacts/module_probe [--group 64] [-j 2]   (CPU: ~12 min)
    python -m bench.tuning.module_probe --artifacts tune-artifacts/module_probe [--rounds 5]          (GPU, ~1 min)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(out: Path, group: int, jobs: int) -> None:
    import multiprocessing

    from build_tools import nvcc_batch
    from build_tools.compile import cache_key, lower_variants, nvcc_compile
    from build_tools.ops import source_sha256
    from build_tools.sweep import load_shapeset

    manifest = json.loads((ROOT / "prebuilt/sm90/manifest.json").read_text())
    entries = {(e["kernel"], e["key"]): e for e in manifest["variants"]}
    hashes: dict[str, str] = {}
    chosen, seen = [], set()
    for v in load_shapeset("default"):
        if v.kernel.endswith("_generic"):
            continue
        key = cache_key(v, "sm90", hashes.setdefault(v.kernel, source_sha256(v.kernel)))
        if key not in seen:
            seen.add(key)
            chosen.append(v)
    print(f"{len(chosen)} cubins to lower", flush=True)
    chunks = [chosen[i : i + 16] for i in range(0, len(chosen), 16)]
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        lowered = [(source, spec.symbol, spec.smem) for part in pool.map(lower_variants, chunks) for spec, source in part]
    print(f"lowered in {time.time() - t0:.0f} s", flush=True)
    by_head: dict[str, list[int]] = {}
    for n, (source, _, _) in enumerate(lowered):
        by_head.setdefault(nvcc_batch.preamble(source), []).append(n)
    out.mkdir(parents=True, exist_ok=True)
    modules, singles = [], []
    for members in by_head.values():
        for i in range(0, len(members), group):
            part = members[i : i + group]
            name = f"m{len(modules):03d}.cubin"
            source = nvcc_batch.batch_source([lowered[n][0] for n in part])  # one module holding every entry
            (out / name).write_bytes(nvcc_compile(source, "sm90", name))
            modules.append(
                {
                    "cubin": name,
                    "entries": [[lowered[n][1] + nvcc_batch.TAG.format(j), lowered[n][2]] for j, n in enumerate(part)],
                }
            )
    for v in chosen:
        e = entries[(v.kernel, v.key)]
        singles.append([e["cubin"], e["launch"]["symbol"], e["launch"]["smem"]])
    (out / "probe.json").write_text(json.dumps({"modules": modules, "singles": singles}))
    size = sum((out / m["cubin"]).stat().st_size for m in modules)
    print(f"{len(modules)} modules ({size / 1e6:.1f} MB) for {len(chosen)} kernels -> {out}", flush=True)


_PRE = "import time, torch; torch.cuda.init(); torch.empty(1, device='cuda'); torch.cuda.synchronize(); clock = time.perf_counter\n"
_LOAD = """
import json, sys
from pathlib import Path
from tkaot import _cuda
probe = json.loads(Path(sys.argv[1], "probe.json").read_text())
mode = sys.argv[2]
keep = []
t0 = clock()
if mode == "single":
    for sha, symbol, smem in probe["singles"]:
        m = _cuda.Module(Path("prebuilt/sm90/cubins", sha + ".cubin").read_bytes(), 0)
        keep.append((m, m.function(symbol, smem)))
else:
    for mod in probe["modules"]:
        m = _cuda.Module(Path(sys.argv[1], mod["cubin"]).read_bytes(), 0)
        keep.append(m)
        keep.extend(m.function(symbol, smem) for symbol, smem in mod["entries"])
torch.cuda.synchronize()
print((clock() - t0) * 1e3)
"""
_PRELOAD = "import tkaot\nt0 = clock(); tkaot.preload(); torch.cuda.synchronize(); print((clock() - t0) * 1e3)\n"


def run(artifacts: Path, rounds: int) -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit("no GPU here")
    probe = json.loads((artifacts / "probe.json").read_text())
    print(f"{len(probe['singles'])} kernels: {len(probe['singles'])} cubins vs {len(probe['modules'])} modules", flush=True)
    times: dict[str, list[float]] = {"single": [], "multi": [], "preload": []}
    for _ in range(rounds):
        for mode in times:
            code = _PRE + (_PRELOAD if mode == "preload" else _LOAD)
            args = [sys.executable, "-c", code] + ([] if mode == "preload" else [str(artifacts), mode])
            proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
            if proc.returncode:
                print(mode, "failed:", proc.stderr[-600:], flush=True)
                times[mode].append(float("nan"))
            else:
                times[mode].append(float(proc.stdout.split()[-1]))
    for mode, values in times.items():
        print(f"{mode:8s} median {statistics.median(values):7.1f} ms  all {' '.join(f'{x:.1f}' for x in values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--group", type=int, default=64)
    b.add_argument("-j", type=int, default=2)
    parser.add_argument("--artifacts", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.cmd == "build":
        build(args.out, args.group, args.j)
    elif args.artifacts:
        run(args.artifacts, args.rounds)
    else:
        parser.error("build, or --artifacts DIR on a GPU")


if __name__ == "__main__":
    main()
