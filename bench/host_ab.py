"""Host µs per call of norm_forward and moe_topk_gate_forward at 1 token: issue 14's starting point (805a1b8) beside
this tree, in one process on a GPU machine.

    git archive 805a1b8 tkaot | tar -x -C OLD      # the old tree's sources
    python -m bench.host_ab --old OLD [--rounds 10]

Fresh processes a tree (bench.host_compare) move a row by more than these ops' difference on a busy host; here the old
functions' source (OLD/tkaot/quant.py, OLD/tkaot/moe.py) is executed beside this tree's op modules, with this tree's
launchers and kernels, so both call the same launch path and only their Python differs. Pinned to one core, thread
CPU time (bench.timing.host_us: chunks of 200 calls, the device drained between chunks), the calls alternating round by
round, one JSON line a round, then the least and the median over rounds. Four rows an op: "old" (805a1b8's),
"old+guard" (805a1b8's with this tree's torch.compile guard, the op's first line since issue 18's torch.compile
integration, at its head), "called" (this tree's op as written, calling its checker: a copy of the function made before
its first call) and "now" (the op as it runs, its checker written into it at the first call, tkaot/_inline.py). The
outputs are checked equal first.
"""

from __future__ import annotations

import argparse
import ast
import collections
import inspect
import json
import os
import statistics
import time
import types
from pathlib import Path


def _old_function(tree: Path, path: str, name: str, module, extra: dict, guard: bool = False):
    """`name` from the old tree's source file `path`, defined over `module`'s names (and `extra`, the old helpers).
    With `guard`, this tree's first two lines of the op (the torch.compile guard and its return) are put at the head
    of the old body: the old function as it would cost with the guard that torch.compile's integration added."""
    source = (tree / path).read_text()
    start = source.index(f"def {name}(")
    end = source.index("\ndef ", start + 10)
    if guard:
        lines = inspect.getsource(getattr(module, name)).splitlines(keepends=True)
        guard_node = ast.parse("".join(lines)).body[0].body[1]  # after the docstring
        assert isinstance(guard_node, ast.If) and "is_dynamo_compiling" in ast.unparse(guard_node.test), "no guard where expected"
        doc_end = source.index('"""', source.index('"""', start) + 3) + 4  # past the old docstring's closing line
        source = source[start:doc_end] + "".join(lines[guard_node.lineno - 1 : guard_node.end_lineno]) + source[doc_end:end]
        start, end = 0, len(source)
    namespace = dict(vars(module))
    namespace.update(extra)
    exec(source[start:end], namespace)  # the old tree's own source, named on the command line
    return namespace[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, type=Path, help="a directory holding the old tree's tkaot/ sources")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})

    import torch

    from bench import timing
    from tkaot import _validate
    from tkaot._moe import ops as gate
    from tkaot._quant import norm

    max_i32 = 2**31 - 1
    old_gate_helpers = {
        "MAX_I32": max_i32, "_MAX_GATE_TOKENS": 1 << 26, "_MAX_TOPK": 32, "_GATE_TILING": "ballot4",
        "check_cuda": _validate.check_cuda, "fail": _validate.fail,
    }  # fmt: skip
    old_norm_helpers = {
        "MAX_I32": max_i32, "_NORM_VEC": {torch.bfloat16: 8, torch.float32: 4}, "_NORM_DTYPE_NAMES": norm._DTYPE_NAMES,
        "check_cuda": _validate.check_cuda, "check_rows": _validate.check_rows, "check_like": _validate.check_like,
        "fail": _validate.fail, "_row_strides": lambda t: norm._rows(t.stride()),
    }  # fmt: skip
    old_gate = _old_function(args.old, "tkaot/moe.py", "moe_topk_gate_forward", gate, old_gate_helpers)
    old_gate_guard = _old_function(args.old, "tkaot/moe.py", "moe_topk_gate_forward", gate, old_gate_helpers, guard=True)
    old_norm = _old_function(args.old, "tkaot/quant.py", "norm_forward", norm, old_norm_helpers)
    old_norm_guard = _old_function(args.old, "tkaot/quant.py", "norm_forward", norm, old_norm_helpers, guard=True)

    # the ops as written, calling their checker: copies made before a first call writes the checker into them
    def as_written(f):
        return types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__)

    gate_called, norm_called = as_written(gate.moe_topk_gate_forward), as_written(norm.norm_forward)
    logits = torch.randn(1, 256, device="cuda")
    x = torch.randn(1, 7168, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(7168, dtype=torch.bfloat16, device="cuda")
    calls = {
        "gate old": lambda: old_gate(logits, 8, False, 0, 2.5, 0),
        "gate old+guard": lambda: old_gate_guard(logits, 8, False, 0, 2.5, 0),
        "gate called": lambda: gate_called(logits, 8, False, 0, 2.5, 0),
        "gate now": lambda: gate.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0),
        "norm old": lambda: old_norm(x, w, 1e-6),
        "norm old+guard": lambda: old_norm_guard(x, w, 1e-6),
        "norm called": lambda: norm_called(x, w, 1e-6),
        "norm now": lambda: norm.norm_forward(x, w, 1e-6),
    }
    for op in ("gate", "norm"):
        results = [calls[f"{op} {kind}"]()[:2] for kind in ("old", "old+guard", "called", "now")]
        assert all(torch.equal(p, q) for r in results[1:] for p, q in zip(results[0], r) if p is not None), f"{op}: the functions disagree"
    assert "_check" not in norm.norm_forward.__code__.co_names, "norm_forward's checker was not written into it"
    samples = collections.defaultdict(list)
    for r in range(args.rounds):
        for name, call in calls.items() if r % 2 == 0 else reversed(calls.items()):
            samples[name].append(timing.host_us(call, n=4000, rounds=3, stat=min, clock=time.thread_time_ns))
        print(json.dumps({name: round(v[-1], 3) for name, v in samples.items()}), flush=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, one core, thread CPU time, {args.rounds} rounds")
    print(f"{'':15s} {'least':>7s} {'median':>7s}")
    for name, v in samples.items():
        print(f"{name:15s} {min(v):7.3f} {statistics.median(v):7.3f}")
    # the rows of a round ran back to back: their differences round by round cancel what drifts between rounds
    print("median of the per-round differences:")
    for op in ("gate", "norm"):
        for a, b in (("now", "old"), ("now", "old+guard"), ("old+guard", "old")):
            diffs = [p - q for p, q in zip(samples[f"{op} {a}"], samples[f"{op} {b}"])]
            print(f"  {op} {a} - {b}: {statistics.median(diffs):+.3f}")


if __name__ == "__main__":
    main()
