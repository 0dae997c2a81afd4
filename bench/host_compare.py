"""Host µs per op call on a GPU machine, two or more checkouts side by side in one run (before/after a refactor).

    python -m bench.host_compare OLD_TREE . [--rounds 3] [--clock cpu] [--calls 20000]

Each tree's calls run in their own fresh process (that tree's tkaot, this checkout's bench code), pinned to one
core, the trees alternating round by round. Each figure is bench.timing.host_us of bench.host_overhead's 1-token
cases, launched for real: the least of 5 loops of --calls calls, timed in chunks of 200 with the device drained
between chunks, so the launch queue never blocks. `--clock cpu` times the thread's CPU time instead of wall time:
the driver's own work in each launch counts, the time the process was preempted does not. Prints one JSON line per
tree and round, then the least over rounds per op and tree (noise on a host only ever adds time, so the least is
the figure to compare), then the median over rounds (how far one round's figure moves).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import json, os, time, torch
os.sched_setaffinity(0, {{sorted(os.sched_getaffinity(0))[-1]}})  # one core: no migrations mid-loop
from bench import timing
from bench.host_overhead import cases
import tkaot
result = {{"launcher": tkaot.launcher_kind()}}
for name, fn in cases("cuda").items():
    fn(); torch.cuda.synchronize()
    result[name] = round(timing.host_us(fn, n={calls}, stat=min, clock={clock}), 3)
    torch.cuda.synchronize()
print(json.dumps(result))
"""


_CLOCKS = {"wall": "time.perf_counter_ns", "cpu": "time.thread_time_ns"}


def probe(tree: Path, clock: str = "wall", calls: int = 20000) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    script = _PROBE.format(calls=calls, clock=_CLOCKS[clock])
    proc = subprocess.run([sys.executable, "-c", script], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"host probe failed in {tree}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clock", choices=tuple(_CLOCKS), default="wall", help="wall time, or this thread's CPU time")
    parser.add_argument("--calls", type=int, default=20000, help="calls a loop (5 loops a figure)")
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {tree: {} for tree in args.trees}
    for round_ in range(args.rounds):
        for tree in args.trees:
            result = probe(Path(tree).resolve(), args.clock, args.calls)
            print(json.dumps({"tree": tree, "round": round_, **result}), flush=True)
            for name, value in result.items():
                if isinstance(value, float):
                    samples[tree].setdefault(name, []).append(value)
    names = list(next(iter(samples.values())))
    for title, stat in (("least of rounds", min), ("median of rounds", statistics.median)):
        print(f"{'host µs per call (' + title + ')':45s} " + " ".join(f"{t[-12:]:>12s}" for t in args.trees))
        for name in names:
            print(f"{name:45s} " + " ".join(f"{stat(samples[t].get(name, [float('nan')])):12.2f}" for t in args.trees))


if __name__ == "__main__":
    main()
