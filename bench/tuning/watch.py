"""A tuning script's rows measured in a watched child process, so that a hung kernel costs a row, not the run.

The child (`python -m MODULE part PART --artifacts DIR --skip A,B`) announces each call before it makes it
(START name|shape) and prints each row as ROW json; the parent kills it when it has been silent too long or the
run's deadline passes, and says where it stopped. Used by tune_train3.py, tune_mhc4.py and tune_normbwd.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

START, ROW = "START ", "ROW "  # a child's protocol lines


def run_child(
    module: str,
    part: str,
    artifacts: Path,
    skip: list[str],
    deadline: float,
    say: Callable[[str], None],
    on_row: Callable[[tuple], None],
    stall_s: Callable[[str], float],
    on_start: Callable[[str, str], None] = lambda name, shape: None,
) -> tuple[str, str, str] | None:
    """Run one part in a child until it ends (None), or until it fails, stays silent for stall_s(the candidate it
    last announced) seconds or passes the deadline: then (that candidate, its shape, "FAILED ..." or "KILLED ...").
    Its rows go to on_row, its announcements to on_start, any other line it prints to say."""
    import os
    import queue
    import signal
    import subprocess
    import sys
    import threading

    cmd = [sys.executable, "-m", module, "part", part, "--artifacts", str(artifacts), "--skip", ",".join(skip)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in child.stdout] + [lines.put(None)], daemon=True).start()
    name, shape = "load", ""
    while True:
        limit = stall_s(name)
        try:
            line = lines.get(timeout=max(0.0, min(limit, deadline - time.perf_counter())))
        except queue.Empty:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            why = "past the run's budget" if time.perf_counter() >= deadline else f"silent for {limit} s"
            return name, shape, f"KILLED ({why})"
        if line is None:
            if child.wait() != 0:  # an exception (its traceback on stderr), a CUDA error
                return name, shape, f"FAILED (exit {child.returncode})"
            return None
        line = line.rstrip("\n")
        if line.startswith(START):
            name, shape = line[len(START) :].split("|", 1)
            on_start(name, shape)
        elif line.startswith(ROW):
            on_row(tuple(json.loads(line[len(ROW) :])))
        else:
            say(line)


def with_reruns(part: str, deadline: float, say: Callable[[str], None], run: Callable[[list[str]], str | None]) -> None:
    """run(skip) the part's rows; while it names a candidate it hung in and the deadline leaves time, again without it."""
    skip: list[str] = []
    hung = run(skip)
    while hung is not None and hung not in skip and time.perf_counter() < deadline - 5:  # time for a rerun
        skip.append(hung)
        say(f"{part}: rerun without {', '.join(skip)}")
        hung = run(skip)


def budget(argv: list[str], default: float) -> float:
    """The run's seconds from --budget S in argv (taken out of it), else default."""
    if "--budget" not in argv:
        return default
    at = argv.index("--budget")
    seconds = float(argv[at + 1])
    del argv[at : at + 2]
    return seconds


class Log:
    """A run's `say`: prints each line at once and keeps it for the run's log file (`lines`)."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)


def stopped(stop: tuple[str, str, str], say: Callable[[str], None], rows: dict, blanks: int, label: str = "") -> str | None:
    """Say where a child stopped (run_child's (candidate, shape, how)); a candidate's row (not TileKernels' or the
    loading's) says how, after `blanks` NaN figures, and its name is returned for a rerun without it."""
    import math

    name, shape, what = stop
    say(f"{label}{what} in {name} at {shape or '-'}")
    if name in ("load", "TK"):
        return None
    rows.setdefault((name, shape), (name, shape, *[math.nan] * blanks, what))
    return name


def child_start(argv: list[str]) -> tuple[str, Path, tuple[str, ...]]:
    """A child's command line (`PART --artifacts DIR --skip A,B`, after `part`): (part, artifacts, skip), its loading
    announced."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("part")
    parser.add_argument("--artifacts", type=Path, required=True)
    parser.add_argument("--skip", default="")
    args = parser.parse_args(argv)
    started("load", "")
    return args.part, args.artifacts, tuple(s for s in args.skip.split(",") if s)


def started(name: str, shape: str) -> None:
    """A child's announcement of the call it is about to make (the parent's watch names it if it hangs)."""
    print(f"{START}{name}|{shape}", flush=True)
