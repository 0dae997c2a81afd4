"""Time split_mixes_bwd's 16-byte rows (issue 16) beside TileKernels and the scalar kernel shipped before them (the
control, built from main's source at BEFORE), at the bench shapes (bench/cases/mhc*.py).

Session 12's SASS count found scalar 32-bit stores where 16-byte ones could be: split_mixes_bwd 51, sinkhorn_bwd 13,
normw_merge_bwd 9, reduce_partials_fwd 13. Round 1 (H200, 2026-12-02, TileKernels 2.1.0 in the same process; µs,
ratio to TileKernels):
- split_bwd.vec, each thread's token rows moved as 16-byte vectors when every tensor is 16-byte aligned (checked in
  the kernel), else as scalars: 4.44 (6.28, 0.71x) against the scalar control's 7.10 (1.13x), 8192 x 24; bytes equal
  to the control's, on misaligned inputs too (TileKernels adds the parameter gradients in its own order: 2 of 12
  tensors differ, at most 7.6e-5). Shipped (split_mixes_bwd.py): split_bwd.vec below builds the same cubin.
- normw_merge_bwd, 24 x 28672, the next chunk of rows loaded before this chunk's stores: 8 rows a chunk 5.57, 6 rows
  5.95, 4 rows 6.69; 64-thread blocks 5.54, both 5.49; shipped 5.79, TileKernels 5.29 (1.04x at best): not shipped,
  no longer buildable from the tree (branch mhc4 at 2aeae9c has them). Their "DIFFERS from ctl" was this script's
  fault, not theirs: the op accumulates into fn_grad and normw_grad, the timing's calls accumulated into the first
  input set, and each candidate's bytes were taken from that set after the ones before it had been timed (its
  |diff| against TileKernels fell by the same 729 a candidate). Bytes are now taken from a copy made first.
- reduce_partials_fwd, 16 x 8192 x 24, 16, 8 or 4 splits loaded before they are added: 9.37, 7.97, 8.46 against the
  shipped 7.23 (TileKernels 7.75; all bytes equal TileKernels'): not shipped, no longer buildable from the tree.

The machinery is bench/tuning/tune_mhc_perf.py's (candidates as patched builders, each built into its own artifact
set ARTIFACTS/<candidate>/, launched through the op's own validation and argument packing). Build on a CPU with
TileLang and nvcc (a few minutes on two shared cores):

    python -m bench.tuning.tune_mhc4 build --out tune-artifacts/mhc4

then on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_mhc4 --artifacts tune-artifacts/mhc4 --out DIR [--budget S]

Each op's rows run in a child process that announces every call before it makes it; a child silent for STALL_S
seconds (a hung kernel; twice that for TileKernels' first calls, which compile) or past the run's budget (--budget,
TOTAL_S by default) is killed, its row says so, and the op's rows run again without that candidate. Per candidate and
row: its output bytes against TileKernels' ("TK yes", or how many tensors differ and by how much: split_mixes_bwd's
parameter gradients are sums TileKernels adds in its own order, compared by value in the parity suite) and against
the control's ("=ctl"), then its device µs (CUDA-graph replay over rotating inputs larger than L2, median) beside
TileKernels' and the control's in the same child. Prints one table last and writes DIR/tune_mhc4.log.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import sys
import time
from pathlib import Path

from bench.tuning.tune_mhc_perf import Candidate, Source
from bench.tuning.watch import ROW, Log, child_start, run_child, started, with_reruns

ARTIFACTS = "tune-artifacts/mhc4"
BEFORE = "cbe24e7"  # main before the 16-byte rows: the control

_SPLIT = "kernels_src.mhc.split_mixes_bwd"
_SPLIT_OP = dict(kernel="mhc_split_mixes_bwd", op="mhc_pre_split_mixes_bwd", also=("mhc_split_mixes_bwd_reduce",))
_MERGE_OP = dict(kernel="mhc_normw_merge_bwd", op="mhc_fn_normw_merge_bwd", values={"dtype": "float32"})
CONTROL = ".ctl"  # the suffix of a control's name: the op's other candidates are checked against its bytes

CANDIDATES = (
    Candidate("split_bwd.ctl", patches=((_SPLIT, "build", Source(BEFORE)),), note="before: scalar rows", **_SPLIT_OP),
    Candidate("split_bwd.vec", note="shipped: 16-byte rows when aligned", **_SPLIT_OP),
    # the shipped kernel alone: its bytes against TileKernels' (round 1 compared them on accumulated inputs)
    Candidate("normw_merge_bwd.ctl", note="shipped: 8 rows a chunk", **_MERGE_OP),
)  # fmt: skip
# ops whose candidates also run on inputs at a 4-byte offset (their kernels branch on alignment)
MISALIGNED_CHECK = ("mhc_pre_split_mixes_bwd",)

TOTAL_S = 95  # the whole run's budget (--budget S)
STALL_S = 20  # a candidate silent this long is taken as hung (and the loading: tkaot and torch import)
TK_STALL_S = 60  # TileKernels' first calls compile its kernels


# ---- build (CPU)


def build(out: Path, only: str | None = None) -> None:
    from bench.tuning import tune_mhc_perf

    tune_mhc_perf.build(out, only, CANDIDATES)


# ---- one op's rows (GPU, in a child)


def _outputs(case, inputs: dict) -> list:
    """Every tensor the call writes or returns, on a copy of the inputs."""
    import torch

    from bench.tuning.tune_mhc_perf import _tensors

    a = copy.deepcopy(inputs)
    got = _tensors(case.tkaot(a)) + _tensors(a)
    torch.cuda.synchronize()
    return got


def _same(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for x, y in zip(a, b, strict=True)
    )


def _misaligned(inputs: dict) -> dict:
    """The inputs, each tensor copied to a place 4 bytes past a 16-byte boundary (a contiguous view at offset 1)."""
    import torch

    out = {}
    for k, t in inputs.items():
        if isinstance(t, torch.Tensor) and t.numel():
            buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
            out[k] = buf[1:].view(t.shape).copy_(t)
        else:
            out[k] = t
    return out


def _against_tk(got: list, want: list) -> str:
    """ "TK yes" if the two lists of tensors hold the same bytes, else how many differ and by how much at most."""
    if len(got) != len(want) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(got, want, strict=False)):
        return "TK MISMATCH (outputs differ in number, shape or dtype)"
    differ = [(a, b) for a, b in zip(got, want, strict=True) if not _same([a], [b])]
    if not differ:
        return "TK yes"
    worst = max(float((a.float() - b.float()).abs().max()) for a, b in differ)
    return f"TK no: {len(differ)} of {len(got)} tensors, max |diff| {worst:.3g}"


def measure_op(op: str, artifacts: Path, skip: tuple, started, say) -> None:
    """Say a ROW (candidate, shape, µs, TK µs, control µs, verdict) for each of op's candidates not in `skip`; the
    candidates run first, then TileKernels (its first call compiles), after which each row is said again with
    TileKernels' µs and bytes ("TK" in skip: never)."""
    import torch

    from bench import timing
    from bench.run import _tile_kernels, rotating_inputs
    from bench.tuning.tune_mhc_perf import _cases, _launching

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    chosen = [c for c in CANDIDATES if c.op == op and c.name not in skip]
    control = next((c for c in chosen if c.name.endswith(CONTROL)), None)
    if control is not None:  # first, so that the others compare with it
        chosen.remove(control)
        chosen.insert(0, control)
    for case in _cases()[op]:
        torch.manual_seed(0)
        inputs = rotating_inputs(case, l2)
        # the inputs every output is taken from: an op that accumulates (+=) into its inputs, as normw_merge_bwd
        # does, changes inputs[0] in each candidate's timing
        first = copy.deepcopy(inputs[0])
        odd = _misaligned(first) if op in MISALIGNED_CHECK else None
        want = odd_want = control_us = None
        rows, outputs = [], {}
        for c in chosen:
            started(c.name, case.shape)
            try:
                with _launching(c, artifacts):
                    got = outputs[c.name] = _outputs(case, first)
                    odd_got = _outputs(case, odd) if odd is not None else None
                    verdict = []
                    if c is control:
                        want, odd_want = got, odd_got
                    elif want is not None:
                        verdict.append("=ctl" if _same(got, want) else "DIFFERS from ctl")
                        if odd_want is not None:
                            verdict.append("misaligned =ctl" if _same(odd_got, odd_want) else "misaligned DIFFERS from ctl")
                    us, mode = timing.device_us(case.tkaot, inputs)
                    if mode != "graph":
                        verdict.append(f"({mode})")
            except Exception as exc:  # a candidate that fails to load or launch is reported, not fatal
                us, verdict = None, [f"error: {type(exc).__name__}: {exc}"[:120]]
            control_us = us if c is control else control_us
            rows.append([c.name, case.shape, us, None, control_us, ", ".join(verdict)])
            say(ROW + json.dumps(rows[-1]))
        tk = None if "TK" in skip else _tile_kernels()
        if tk is not None and case.tile_kernels is not None:
            started("TK", case.shape)
            theirs = copy.deepcopy(first)
            tk_got = _tensors_of(case.tile_kernels(tk, theirs)) + _tensors_of(theirs)
            torch.cuda.synchronize()
            tk_us, _ = timing.device_us(lambda a, case=case, tk=tk: case.tile_kernels(tk, a), inputs)
            for row in rows:
                row[3] = tk_us
                if row[0] in outputs:
                    row[5] = _against_tk(outputs[row[0]], tk_got) + (", " + row[5] if row[5] else "")
                say(ROW + json.dumps(row))
        del inputs, first, odd, outputs
        torch.cuda.empty_cache()


def _tensors_of(value) -> list:
    from bench.tuning.tune_mhc_perf import _tensors

    return _tensors(value)


def _row_text(row) -> str:
    name, shape, us, tk_us, ctl_us, verdict = row
    ratio = f"{us / tk_us:6.2f}" if us and tk_us else f"{'-':>6s}"
    to_ctl = f"{us / ctl_us:6.2f}" if us and ctl_us else f"{'-':>6s}"
    return f"{name:24s} {shape[:34]:34s} {_num(us)} {_num(tk_us)} {ratio} {_num(ctl_us)} {to_ctl}  {verdict}"


def _num(x) -> str:
    return f"{x:8.2f}" if x is not None and not math.isnan(x) else f"{'-':>8s}"


def _part(argv) -> None:
    """Child: one op's rows, each call announced (START name|shape) before it is made, each row as ROW json."""
    op, artifacts, skip = child_start(argv)
    measure_op(op, artifacts, skip, started, functools.partial(print, flush=True))


# ---- the run (GPU): each op's rows in a watched child


def _run_op(op: str, artifacts: Path, skip: list[str], deadline: float, say, rows: dict) -> str | None:
    """Run one op's rows in a child until it ends, stalls or passes the deadline; the candidate it hung in, if any."""

    def on_row(row: tuple) -> None:
        rows[tuple(row[:2])] = row  # a row said again (with TileKernels' figures, or by a rerun) replaces it
        say(_row_text(row))

    stop = run_child("bench.tuning.tune_mhc4", op, artifacts, skip, deadline, say, on_row,
                     stall_s=lambda name: STALL_S if name != "TK" else TK_STALL_S)  # fmt: skip
    return None if stop is None else _stopped(op, *stop, say, rows)


def _stopped(op: str, name: str, shape: str, what: str, say, rows: dict) -> str | None:
    """Say where a child stopped; a candidate's (not TileKernels' or the loading's) row says so and is returned."""
    say(f"{op}: {what} in {name} at {shape or '-'}")
    if name == "load":
        return None
    if name != "TK":
        rows[(name, shape)] = (name, shape, None, None, None, what)
    return name  # "TK": the rows are rerun without TileKernels


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    """Each op in its own child, in CANDIDATES' order; one that hangs in a candidate is rerun without it."""
    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    say = Log()
    rows: dict = {}

    say(f"tune_mhc4: artifacts {artifacts}, budget {total_s:.0f} s")
    ops = list(dict.fromkeys(c.op for c in CANDIDATES))
    for i, op in enumerate(ops):
        # each op may use its share of what is left, so one slow op cannot starve the rest
        deadline = time.perf_counter() + (start + total_s - time.perf_counter()) / (len(ops) - i)
        with_reruns(op, deadline, say, lambda skip, op=op, deadline=deadline: _run_op(op, artifacts, skip, deadline, say, rows))
    say(f"\n{'candidate':24s} {'shape':34s} {'µs':>8s} {'TK µs':>8s} {'ratio':>6s} {'ctl µs':>8s} {'/ctl':>6s}  identical?")
    for row in rows.values():
        say(_row_text(row))
    say(f"{time.perf_counter() - start:.1f} s")
    (out / "tune_mhc4.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:
        _part(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("build", "time"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(ARTIFACTS), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the artifact sets go; time: the log's directory")
    parser.add_argument("--only", help="build: only the candidates whose name contains this")
    parser.add_argument("--budget", type=float, default=TOTAL_S, help="time: the whole run's seconds")
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.out, args.only)
        return
    try:
        import torch

        if not torch.cuda.is_available():
            print("tune_mhc4: no GPU here (torch.cuda.is_available() is False); nothing timed")
            return
    except ImportError:
        print("tune_mhc4: torch not importable; nothing timed")
        return
    time_candidates(args.artifacts, args.out, args.budget)


if __name__ == "__main__":
    main()
