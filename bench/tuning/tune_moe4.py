"""Time moe_topk_gate_backward's 128-bit kernel (kernels_src/moe/moe_topk_gate_backward.py) beside TileKernels.

Each candidate is the kernel module as it is in the tree, or as it was at a commit with some of that module's values
patched (the switches of round 1, deleted from the tree since), built into its own artifact set ARTIFACTS/<candidate>/,
on a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_moe4 build --out tune-artifacts/moe4

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_moe4 --artifacts tune-artifacts/moe4 --out DIR [--budget 55]

Rows: bench/cases/backward.py's shapes (8192 x 256, top-8, without and with the aux term), each candidate's launcher
called with the op's argument order, CUDA-graph replay over rotating inputs larger than L2 (bench.timing), two
rounds (TileKernels, before, the candidates; then again), the lower median of each kept. Before timing, each
candidate's output is compared with "before"'s bytes (session 12's kernel) and with TileKernels' within the
parity suite's tolerance (bench/tuning/tune_train2.py's check: rtol 1e-5, atol 1e-6); a last check-only input
repeats experts within a token and leaves slots empty (-1), against the torch reference, and one with 250 experts
(not a multiple of 4: the element-by-element path). The rows run in a child process that announces each candidate
before it runs it; a child silent for STALL_S seconds (a hung kernel: a full-mask warp intrinsic some lane skips) or
past the budget is killed, its candidate's row says so, and the rows are run again without it. Prints one table last
(candidate, shape, µs, TileKernels µs, ratio, identical?) and writes DIR/tune_moe4.log.

Round 1 (H200, 2026-12-02, TileKernels 2.1.0 in the same process; 8192 x 256, top-8; µs, ratio to TileKernels):
    candidate       plain          aux            bytes
    before (s12)    9.33  1.14    10.93  1.15    (TK: within tolerance, max rel 1.6e-2 aux)
    vec             8.00  0.98    12.66  1.33    = before
    vec.ureg        7.32  0.90    12.99  1.37    = before  (u held in registers to the output)
    vec.w2 / b13    8.07 / 8.24   12.65 / 12.95  = before  (2 tokens a block / 13 blocks an SM)
    vec.ftz (+b13)  7.98          12.61 (12.63)  = before  (the far derivative by ftz ex2, rcp)
    vec.hearly      7.76  0.95    10.28  1.08    = before  (aux h loaded with the scores)
    vec.regsum      7.75  0.95     9.38  0.99    aux differs from before; nearer TK (max rel 4.4e-3); shipped
(TileKernels 8.15 plain, 9.49 aux.) vec.regsum ships: "shipped" below builds the tree, whose cubin is vec.regsum's
(sha256 e0370152...). Round 1's other candidates are built from ROUND1 with their switches set (SHIPPED_SUM_ORDER,
U_FROM_ROW, H_EARLY, FTZ_FAR there): add a Candidate(name, ROUND1, {switch: value}) to time one again.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.tuning import tune_train2
from bench.tuning.tune_train2 import cli
from bench.tuning.watch import ROW, Log, budget, child_start, run_child, started, stopped, with_reruns

ARTIFACTS = "tune-artifacts/moe4"
KERNEL, MODULE = "moe_topk_gate_backward", "kernels_src.moe.moe_topk_gate_backward"
BEFORE = "cbe24e7"  # main before session 13: the strided kernel of session 12
ROUND1 = "779a59f"  # round 1's module, its candidates behind switches
ROUNDS = 2


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    commit: str | None = None  # the module as it was at this commit (None: the tree)
    values: dict = field(default_factory=dict)  # that module's values patched while it is built
    note: str = ""
    warps: int = 4  # tokens a block (the shipped tiling's 4 unless said)
    min_blocks: int = 1  # the launch bound's blocks an SM


CANDIDATES = (
    Candidate("before", BEFORE, note="session 12 (cbe24e7): strided scalar accesses, branchy derivative, 53 registers"),
    Candidate("vec.r1", ROUND1, note="round 1's default: vec, the aux sums in session 12's order (its bytes)"),
    Candidate("vec.ureg", ROUND1, {"U_FROM_ROW": False}, "round 1's vec with the scores held in registers to the output"),
    Candidate("shipped", note="the tree: 16-byte vectors, aux sums over a lane's vectors (round 1's vec.regsum)"),
)  # fmt: skip


# ---- build (CPU)


@contextlib.contextmanager
def _patched(c: Candidate, tmp: Path):
    module = importlib.import_module(MODULE)
    values = {}
    build = module.build
    if c.commit is not None:
        from bench.tuning.tune_mhc_perf import _build_at

        build = _build_at(MODULE, c.commit, tmp)
        build.__globals__.update(c.values)  # the module loaded at that commit (a fresh one each time)
        values["build"] = build
    if (c.warps, c.min_blocks) != (4, 1):
        kernel = build.__globals__["gate_backward_kernel"]
        values["build"] = lambda tiling: kernel(c.warps, c.min_blocks)
    saved = {k: getattr(module, k) for k in values}
    try:
        for k, v in values.items():
            setattr(module, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


# ---- time (GPU)


def measure(artifacts: Path, say, started=lambda name, shape: None, skip=()) -> list[tuple]:
    """The rows (candidate, shape, µs, TK µs, ratio, verdict) of every candidate not in `skip`; `started(name, shape)`
    is called before each call of a candidate (or of TileKernels, "TK"), so a hang shows where it is."""
    import torch

    if not torch.cuda.is_available():
        say("no GPU: nothing measured")
        return []
    import tile_kernels as tk

    from bench.timing import device_us
    from bench.tuning.tune_train2 import ATOL, EXPERTS, RTOL, SCALE, SETS, TOKENS, TOPK, _call, _inputs, _run, _theirs, _verdict
    from tkaot.reference import backward as ref

    device = torch.cuda.current_device()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[tuple] = []
    launchers = tune_train2.load_launchers(artifacts, CANDIDATES, skip, say)
    calls = {name: _call(launch, device) for name, launch in launchers.items()}
    for aux in (False, True):
        shape = f"{TOKENS}x{EXPERTS}, top-{TOPK}" + (", aux" if aux else "")
        sets = [_inputs(gen, aux) for _ in range(SETS)]
        started("TK", shape)
        want = _run(_theirs(tk), sets[0])
        started("before", shape)
        control = _run(calls["before"], sets[0]) if "before" in calls else None
        verdicts = {}
        for name, call in calls.items():
            started(name, shape)
            verdicts[name] = _verdict(_run(call, sets[0]), control, want, RTOL, ATOL, "TK")
        best = {}
        for _ in range(ROUNDS):
            started("TK", shape)
            best["TK"] = min(best.get("TK", math.inf), device_us(_theirs(tk), sets, reps=30)[0])
            for name, call in calls.items():
                started(name, shape)
                best[name] = min(best.get(name, math.inf), device_us(call, sets, reps=30)[0])
        for name in calls:
            say(f"{name:12s} {shape:24s} {best[name]:7.2f} µs  TK {best['TK']:6.2f}  {verdicts[name]}")
            rows.append((name, shape, best[name], best["TK"], best[name] / best["TK"], verdicts[name]))
        del sets
    tune_train2.check_repeats(calls, gen, say, started)
    # 250 experts (rows not 16-byte aligned: the element-by-element path), with aux, against the reference
    say(_odd_rows(launchers, started, gen, ref, SCALE, TOPK))
    return rows


def _odd_rows(launchers: dict, started, gen, ref, scale: float, topk: int) -> str:
    import torch

    from bench.tuning.tune_train2 import _verdict

    tokens, experts, seqs = 999, 250, 3
    scores = torch.nn.functional.softplus(torch.randn(tokens, experts, device="cuda", generator=gen) * 2).sqrt()
    a = {
        "scores": scores,
        "idx": torch.argsort(torch.rand(tokens, experts, device="cuda", generator=gen), dim=1)[:, :topk].contiguous(),
        "w": torch.rand(tokens, topk, device="cuda", generator=gen),
        "dw": torch.randn(tokens, topk, device="cuda", generator=gen),
        "mask": torch.rand(tokens, device="cuda", generator=gen) > 0.1,
        "h": torch.randn(seqs, experts, device="cuda", generator=gen),
        "out": torch.empty(tokens, experts, device="cuda"),
    }
    want = ref.moe_topk_gate_backward(a["scores"], a["idx"], a["w"], a["dw"], scale, a["mask"], a["h"])
    from tkaot._op import current_stream

    device = torch.cuda.current_device()
    control, lines = None, []
    for name, launch in launchers.items():
        started(name, "250 experts + aux")
        out = a["out"].fill_(float("nan"))
        launch(
            device, current_stream(device),
            a["scores"].data_ptr(), a["idx"].data_ptr(), a["w"].data_ptr(), a["dw"].data_ptr(), a["mask"].data_ptr(),
            a["h"].data_ptr(), out.data_ptr(), scale, 1, tokens // seqs, tokens, experts, topk,
        )  # fmt: skip
        torch.cuda.synchronize()
        got = out.clone()
        control = got if name == "before" else control
        lines.append(f"250 experts + aux: {name}: {_verdict(got, control, want, 1e-4, 1e-6, 'the reference')}")
    return "\n".join(lines)


# ---- the run: the rows in a child process, watched (a candidate that hangs is killed and skipped)

TOTAL_S = 55  # the whole run's budget (--budget S)
STALL_S = 15  # a candidate silent this long is taken as hung
LOAD_S = 45  # the same for the imports (tilelang's) and TileKernels' first calls (JIT compiles)


def _child(argv) -> None:
    """Child: the rows, each candidate announced (START name|shape) before it runs, each row as ROW json."""
    _, artifacts, skip = child_start(argv)
    rows = measure(artifacts, functools.partial(print, flush=True), started, skip)
    for row in rows:
        print(ROW + json.dumps(row), flush=True)


def _run(artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """The rows in a watched child (bench/tuning/watch.py); the candidate it hung in, if any (its row says so)."""
    stop = run_child(
        "bench.tuning.tune_moe4", "all", artifacts, skip, deadline, say,
        on_row=lambda row: rows.setdefault(row[:2], row),  # a rerun's repeat of a row keeps the first
        stall_s=lambda name: STALL_S if name not in ("load", "TK") else LOAD_S,
        on_start=lambda name, shape: print(f"  ({name} at {shape or '-'})", flush=True),
    )  # fmt: skip
    return None if stop is None else stopped(stop, say, rows, 3)


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    """The rows in a child; a candidate that hangs is killed and the rows rerun without it."""
    start = time.perf_counter()
    deadline = start + total_s
    say = Log()
    rows: dict = {}

    for c in CANDIDATES:
        say(f"# {c.name}: {c.note}")
    with_reruns("gate", deadline, say, lambda skip: _run(artifacts, skip, deadline, say, rows))
    tune_train2.finish(say, list(rows.values()), start, out / "tune_moe4.log", say.lines, (12, 24, 7))


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:  # the child: `part all --artifacts DIR --skip A,B` (bench/tuning/watch.py)
        _child(argv[1:])
        return
    build = functools.partial(tune_train2.build, candidates=CANDIDATES, patched=_patched)
    cli(argv, __doc__, ARTIFACTS, build, functools.partial(time_candidates, total_s=budget(argv, TOTAL_S)))


if __name__ == "__main__":
    main()
