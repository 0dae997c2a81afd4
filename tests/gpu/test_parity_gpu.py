"""tkaot against TileKernels 2.1.0 on the parity cases (tests/parity_cases.py), byte for byte.

Runs where `tile_kernels` imports and a GPU is present. Each case is built twice, one copy of its inputs for each
library; TileKernels is called first, then tkaot with every CUDA tensor it allocates poisoned (0xFF bytes, NaN for
floats) and every out= buffer poisoned by the case itself. Then tests/parity_compare.py compares what each returns
(shapes, dtypes, strides, aliasing, bytes) and every input's storage afterwards. A case is identical, within
tolerance (stochastic rounding, compared level by level), differs, is missing (tkaot raises VariantNotBuilt), is not
comparable on this GPU (TileKernels' kernel needs a newer one: its stochastic rounding to bf16 / FP4 compiles only
for sm_100a and later) or is an error (either library raised something else). test_parity fails on differences and
errors; test_no_missing_variants fails while any case misses. The summary (per op: a count of each status) is
printed at the end, and written as JSON lines to the file TKAOT_PARITY_SUMMARY names.

TileKernels compiles a kernel per static configuration the first time it meets it (seconds each). Before the tests,
TKAOT_PARITY_WARM processes (default: one a core, up to 16; none under pytest-xdist) make the TileKernels calls of disjoint sets of
configurations once, so the compiles run in parallel and land in TileLang's kernel cache, where the test process
finds them; 0 turns this off. TKAOT_PARITY_CASES / _CONFIGS / _SEED choose the cases (tests/parity_cases.py).

    TKAOT_PARITY_SUMMARY=parity.jsonl python -m pytest -q tests/gpu/test_parity_gpu.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import tkaot
from tests import parity_cases
from tests.helpers import poisoned_allocations
from tests.parity_compare import compare_calls

pytestmark = pytest.mark.gpu
tile_kernels = pytest.importorskip("tile_kernels")

ROOT = Path(__file__).resolve().parents[2]
# Under pytest-xdist every worker would warm every selected op with its own processes (16 workers x 16 processes,
# compiling the same kernels): there the default is none, each test compiling what it meets
_DEFAULT_WARM = 0 if os.environ.get("PYTEST_XDIST_WORKER") else min(16, os.cpu_count() or 1)
WARM_WORKERS = int(os.environ.get("TKAOT_PARITY_WARM", str(_DEFAULT_WARM)))
WARM_TIMEOUT_S = 900
STATUSES = ("identical", "within tolerance", "differ", "missing", "not on this GPU", "errors")
# what TileLang's headers say when a TileKernels kernel needs an instruction this GPU lacks
NEEDS_NEWER_GPU = re.compile(r"requires sm_1\d\da")


@dataclass
class Outcome:
    case: parity_cases.Case
    status: str  # one of STATUSES
    detail: str = ""


RESULTS: dict[str, list[Outcome]] = {}


def run_case(case: parity_cases.Case) -> Outcome:
    theirs_call = case.build("cuda")
    try:
        theirs = parity_cases.resolve(tile_kernels, case.op)(*theirs_call.args, **theirs_call.kwargs)
        torch.cuda.synchronize()
    except Exception as exc:  # the case is not a call TileKernels takes (a generator bug), or not on this GPU
        if NEEDS_NEWER_GPU.search(str(exc)):
            return Outcome(case, "not on this GPU", NEEDS_NEWER_GPU.search(str(exc)).group(0))
        return Outcome(case, "errors", f"TileKernels raised {type(exc).__name__}: {exc}")
    ours_call = case.build("cuda")
    try:
        with poisoned_allocations():
            ours = parity_cases.resolve(tkaot, case.op)(*ours_call.args, **ours_call.kwargs)
        torch.cuda.synchronize()
    except tkaot.VariantNotBuilt as miss:
        return Outcome(case, "missing", f"{miss.kernel}[{miss.key}]")
    except Exception as exc:
        return Outcome(case, "errors", f"tkaot raised {type(exc).__name__}: {str(exc).splitlines()[0]}")
    problems, tolerant = compare_calls(
        (ours_call.args, ours_call.kwargs),
        ours,
        (theirs_call.args, theirs_call.kwargs),
        theirs,
        theirs_call.trims,
        theirs_call.adjacent,
        theirs_call.close,
    )
    if problems:
        return Outcome(case, "differ", "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else ""))
    return Outcome(case, "within tolerance" if tolerant else "identical")


@pytest.fixture(scope="module")
def warmed(request):
    """TileKernels' kernels for the selected ops' cases compiled once, in parallel processes (see the docstring)."""
    ops = sorted({item.callspec.params["op"] for item in request.session.items if getattr(item, "originalname", "") == "test_parity"})
    if WARM_WORKERS > 1 and ops:
        start = time.monotonic()
        command = [sys.executable, "-m", "tests.gpu.test_parity_gpu", "--warm"]
        workers = [
            subprocess.Popen(
                [*command, str(i), str(WARM_WORKERS), ",".join(ops)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for i in range(WARM_WORKERS)
        ]
        for worker in workers:
            try:
                worker.wait(timeout=max(1.0, WARM_TIMEOUT_S - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                worker.kill()  # what it compiled is cached; the tests compile the rest
                worker.wait()


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    yield
    if not RESULTS:
        return
    rows = []
    for op, outcomes in RESULTS.items():
        row = {"op": op, "cases": len(outcomes), "configs": len({o.case.config for o in outcomes})}
        row.update({status.replace(" ", "_"): sum(o.status == status for o in outcomes) for status in STATUSES})
        rows.append(row)
    total = {"op": "total", **{key: sum(r[key] for r in rows) for key in rows[0] if key != "op"}}
    lines = ["parity with TileKernels 2.1.0 (tests/gpu/test_parity_gpu.py):", "", "| op | cases | identical | within tolerance | "
             "differ | missing | not on this GPU | errors |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in [*rows, total]:
        counts = " | ".join(str(r[s.replace(" ", "_")]) for s in STATUSES)
        lines.append(f"| {r['op']} | {r['cases']} | {counts} |")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)
    path = os.environ.get("TKAOT_PARITY_SUMMARY")
    if path:
        with open(path, "w") as f:
            for r in [*rows, total]:
                f.write(json.dumps(r) + "\n")


@pytest.mark.parametrize("op", parity_cases.ops())
def test_parity(op, warmed):
    outcomes = RESULTS[op] = [run_case(case) for case in parity_cases.cases(op)]
    bad = [o for o in outcomes if o.status in ("differ", "errors")]
    report = [f"[{o.status}] {o.case.label} ({o.case.tolerance or 'byte for byte'}):\n    {o.detail}" for o in bad]
    assert not bad, f"{op}: {len(bad)} of {len(outcomes)} cases differ from TileKernels or fail:\n" + "\n".join(report)


def test_no_missing_variants():
    """The goal is no misses: every call TileKernels takes, tkaot serves."""
    if not RESULTS:
        pytest.skip("no parity case ran")
    missing = [f"{o.case.op}: {o.case.label}\n    {o.detail}" for outcomes in RESULTS.values() for o in outcomes if o.status == "missing"]
    assert not missing, f"{len(missing)} cases miss a variant:\n" + "\n".join(missing)


def warm(shard: int, shards: int, ops: list[str]) -> None:
    """Make the TileKernels calls of this shard's configurations of `ops` (their compiles land in TileLang's cache)."""
    for op in ops:
        for case in parity_cases.cases(op):
            if zlib.crc32(f"{op}|{case.config}".encode()) % shards != shard:
                continue
            try:
                call = case.build("cuda")
                parity_cases.resolve(tile_kernels, op)(*call.args, **call.kwargs)
                torch.cuda.synchronize()
            except Exception as exc:  # the test process reports it
                print(f"{op}: {case.label}: {type(exc).__name__}: {exc}", file=sys.stderr)


if __name__ == "__main__" and sys.argv[1:2] == ["--warm"]:
    warm(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(","))
