"""Time candidates of moe_topk_gate_backward (kernels_src/moe/moe_topk_gate_backward.py) beside TileKernels.

Each candidate is the kernel built with another builder (a module attribute patched while it is built, or the
module as it was at a commit), into its own artifact set ARTIFACTS/<candidate>/, on a CPU with TileLang and nvcc:

    python -m bench.tuning.tune_train2 build --out tune-artifacts/train2

(the build CLI's shape sets cannot build an older source or a builder the declaration does not ship, hence this
command), then timed on the GPU, where tile_kernels imports:

    python -m bench.tuning.tune_train2 --artifacts tune-artifacts/train2 --out DIR

Rows: bench/cases/backward.py's shapes (8192 x 256, top-8, without and with the aux term), each candidate's
launcher called with the op's argument order, CUDA-graph replay over rotating inputs larger than L2 (bench.timing).
Before timing, each candidate's output is compared with the control's bytes ("before", the kernel shipped until
now) and with TileKernels' within the parity suite's tolerance (tests/parity_backward_cases.py: rtol 1e-5 / atol
1e-6; TileKernels builds with fast math and adds repeated experts with atomics). A last check-only input repeats
experts within a token and leaves slots empty (-1), against the torch reference.
Prints a table last (candidate, shape, µs, TileKernels µs, ratio, identical?) and writes DIR/tune_train2.log.

Earlier runs (H200, µs at 8192x256 top-8 / with aux; TileKernels 7.2-8.0 / 8.3-8.5): the kernel before the
shared-memory gather 11.84 / 13.78; "before" (scatter, 1/2/4/8 tokens a block) 12.17 / 11.28 / 11.54 / 11.29 and
14.40 / 13.96 / 14.00 / 13.81, within noise (10.50 / 13.17 in the session's final bench run).
Session 11 (H200; plain / aux, TileKernels 7.75 / 9.63): before 11.67 / 13.92, new 10.52 / 12.48 (shipped), new.exact
11.69 / 13.73, new.1warp 12.72 / 14.86, new.b12 11.68 / 17.75 (spills); all close to TileKernels (max rel 3.2e-7
plain; 1.6e-2 with aux for every candidate, "before" too: elements where h - <h,u>/sum(u) cancels to near 0, within
the atol). new.gather not yet measured (earlier, a global gather timed as the shared one, within noise): 55
registers rather than 64, 8 KiB of shared memory a block rather than 16. What else TileKernels does not do: it is
built for its expert count (8 scores a lane at 256, 2 16-byte loads and stores), while ours runs to MAX_EXPERTS (512:
u and h of 16 registers a lane, half of them idle at 256, 16 branch-guarded scalar accesses); a 256-expert bound (a
second variant) is the next candidate: new.e256 (session 12, unmeasured), the kernel built for 256 experts at most.
Session 12: "before" is now session 11's kernel (a3a2081), and "new" skips the slot loop (32 unrolled steps, each
a uniform branch, 8 of them 2 shuffles) when no expert is chosen twice: one __match_any_sync and one vote a warp,
then 0 + r_k, the loop's own sum, so its bytes must equal before's ("=before"). new.exact, new.1warp and new.b12
(session 11's losers) are no longer built. Round 1 on the H200 hung in "new" (its full-mask __match_any_sync was
behind `&&`, skipped by the lanes of empty slots; fixed) after "before" 10.61 µs, TileKernels 8.21 (plain).
Session 13 gave the kernel another layout (bench/tuning/tune_moe4.py, which reuses this module's checks and launchers):
new.gather's edits and new.e256's patch fit session 12's module (cbe24e7) only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ARTIFACTS = "tune-artifacts/train2"
KERNEL, MODULE = "moe_topk_gate_backward", "kernels_src.moe.moe_topk_gate_backward"
BEFORE = "a3a2081"  # main before session 12: the kernel of session 11 (the "scatter4" of 9e3421e before it)
TOKENS, EXPERTS, TOPK, SCALE, SEQS = 8192, 256, 8, 2.5, 4
SETS = 4  # rotating input sets: 4 x (8 MiB in + 8 MiB out), past the 50 MiB L2
RTOL, ATOL = 1e-5, 1e-6


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    builder: str  # a function of this module returning `build`, or "before" (the module at BEFORE)
    note: str


CANDIDATES = (
    Candidate("before", "before", "as shipped in session 11 (a3a2081): every slot lane runs the 32-slot loop of shuffles"),
    Candidate("new", "shipped", "the new default: without repeated experts (one match + vote), a slot stores its own gradient"),
    Candidate("new.gather", "gathered", "new, the chosen scores gathered from global memory (L1): no scores row in shared memory"),
    Candidate("new.e256", "bounded", "new built for at most 256 experts (8 scores a lane, not 16): what a 256-expert variant gives"),
)  # fmt: skip


# ---- the candidates' builders (each returns a `build(tiling)`)


def shipped():
    return importlib.import_module(MODULE).build


def bounded():
    """new with MAX_EXPERTS 256 while the kernel is built (valid for <= 256 experts only: a measurement)."""
    module = importlib.import_module(MODULE)

    def build(tiling):
        saved = module.PER_LANE, module.MAX_EXPERTS
        module.PER_LANE, module.MAX_EXPERTS = 256 // module.WARP, 256
        try:
            return module.gate_backward_kernel(4)
        finally:
            module.PER_LANE, module.MAX_EXPERTS = saved

    return build


# new.gather: the shipped module with these exact edits (each must match once). TileKernels writes no scores row:
# it zeroes its route row and reads the chosen scores back from the row just loaded (an L1 hit); ours stores the
# whole row in shared memory (8 stores a lane, 4 KiB of a block's 8) for 1 load a slot lane. Same values, same bytes.
GATHER_EDITS = (
    ("__shared__ float tkaot_gate_rows[2]", "__shared__ float tkaot_gate_rows[1]"),
    ("SCORES_ROW, ROUTE_ROW = 0, 1", "SCORES_ROW, ROUTE_ROW = -1, 0"),
    ('                        T.call_extern("int32", "tkaot_row_put", SCORES_ROW, warp, lane + i * WARP, u[i])\n', ""),
    ('u_k = T.call_extern("float32", "tkaot_row_get", SCORES_ROW, warp, idx)', "u_k = scores[token, idx]"),
)


def gathered(tmp: Path):
    """`build` of the shipped module with GATHER_EDITS applied, loaded from a file (TileLang reads its source)."""
    import importlib.util

    text = Path(importlib.import_module(MODULE).__file__).read_text()
    for old, new in GATHER_EDITS:
        if text.count(old) != 1:
            raise AssertionError(f"new.gather: {old!r} is not in the kernel once")
        text = text.replace(old, new)
    file = tmp / "moe_topk_gate_backward_gather.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location(f"{MODULE}_gather", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build


def before(tmp: Path):
    """`build` of the kernel module as it was at BEFORE."""
    from bench.tuning.tune_mhc_perf import _build_at

    return _build_at(MODULE, BEFORE, tmp)


@contextlib.contextmanager
def _patched(candidate: Candidate, tmp: Path):
    module = importlib.import_module(MODULE)
    saved = module.build
    if candidate.builder in ("before", "gathered"):
        module.build = globals()[candidate.builder](tmp)
    else:
        module.build = globals()[candidate.builder]()
    try:
        yield
    finally:
        module.build = saved


def build(out: Path, candidates=CANDIDATES, patched=None) -> None:
    """Each candidate (`patched(candidate, tmp)`: the context it builds in; this module's by default) into out/<name>."""
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant
    from tkaot._moe.kernels import MOE_GATE_BWD_TILINGS

    t0 = time.perf_counter()
    # A cache of its own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-gate-cache-") as cache:
        for c in candidates:
            t = time.perf_counter()
            with (patched or _patched)(c, Path(cache)):
                variant = Variant.make(KERNEL, {"tiling": MOE_GATE_BWD_TILINGS["default"]})
                build_variants([variant], out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name))
            print(f"{c.name:14s} built in {time.perf_counter() - t:5.1f} s", flush=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 1e6:.2f} MB, {time.perf_counter() - t0:.0f} s")


# ---- time (GPU)


def _launcher(artifacts: Path, candidate: Candidate):
    from tkaot._kernel import Kernel
    from tkaot._moe import backward as gate_backward

    set_dir = artifacts / candidate.name
    (entry,) = [e for e in json.loads((set_dir / "manifest.json").read_text())["variants"] if e["kernel"] == KERNEL]
    cubin = set_dir / "cubins" / f"{entry['cubin']}.cubin"
    return Kernel(KERNEL, entry["key"], entry["launch"], cubin, entry["cubin"], candidate.name).bind(gate_backward._KERNEL.args)


def _inputs(gen, aux: bool, tokens: int = TOKENS, repeats: bool = False) -> dict:
    import torch

    scores = torch.nn.functional.softplus(torch.randn(tokens, EXPERTS, device="cuda", generator=gen) * 2).sqrt()
    idx = torch.argsort(torch.rand(tokens, EXPERTS, device="cuda", generator=gen), dim=1)[:, :TOPK].contiguous()
    if repeats:  # fixed routing may repeat an expert; masked slots carry -1
        idx[::3, 1] = idx[::3, 0]
        idx[::5, 7] = idx[::5, 0]
        idx[::7, 4] = -1
    return {
        "scores": scores, "idx": idx,
        "w": torch.rand(tokens, TOPK, device="cuda", generator=gen),
        "dw": torch.randn(tokens, TOPK, device="cuda", generator=gen),
        "mask": (torch.rand(tokens, device="cuda", generator=gen) > 0.1) if aux else None,
        "h": torch.randn(SEQS, EXPERTS, device="cuda", generator=gen) if aux else None,
        "out": torch.empty(tokens, EXPERTS, device="cuda"),
    }  # fmt: skip


def _call(launch, device: int):
    from tkaot._op import current_stream

    def call(a: dict) -> None:
        tokens = a["scores"].shape[0]
        launch(
            device, current_stream(device),
            a["scores"].data_ptr(), a["idx"].data_ptr(), a["w"].data_ptr(), a["dw"].data_ptr(),
            0 if a["mask"] is None else a["mask"].data_ptr(), 0 if a["h"] is None else a["h"].data_ptr(),
            a["out"].data_ptr(), SCALE, 0 if a["h"] is None else 1, tokens // SEQS, tokens, EXPERTS, TOPK,
        )  # fmt: skip

    return call


def _theirs(tk):
    def call(a: dict) -> None:
        tk.moe.moe_topk_gate_backward(a["scores"], a["idx"], a["w"], a["dw"], SCALE, mask=a["mask"], grad_scores_sum=a["h"], out=a["out"])

    return call


def _run(call, a: dict):
    import torch

    a["out"].fill_(float("nan"))
    call(a)
    torch.cuda.synchronize()
    return a["out"].clone()


def _verdict(got, control, want, rtol: float, atol: float, against: str) -> str:
    import torch

    same = "=before" if control is not None and torch.equal(got.view(torch.int32), control.view(torch.int32)) else "differs from before"
    rel = ((got - want).abs() / want.abs().clamp_min(1e-30)).max().item()
    close = "close to" if torch.allclose(got, want, rtol=rtol, atol=atol) else "FAR from"
    return f"{same}, {close} {against} (max rel {rel:.1e})"


def time_candidates(artifacts: Path, out: Path) -> None:
    start = time.perf_counter()
    log: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        log.append(line)

    rows = measure(artifacts, say)
    finish(say, rows, start, out / "tune_train2.log", log, (14, 24, 7))


def measure(artifacts: Path, say, started=lambda name, shape: None, skip=()) -> list[tuple]:
    """The rows (candidate, shape, µs, TK µs, ratio, verdict) of every candidate not in `skip`; `started(name, shape)`
    is called before each call of a candidate (or of TileKernels, "TK"), so a hang shows where it is."""
    import tile_kernels as tk
    import torch

    from bench.timing import device_us

    device = torch.cuda.current_device()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[tuple] = []
    calls = {name: _call(launch, device) for name, launch in load_launchers(artifacts, CANDIDATES, skip, say).items()}
    for aux in (False, True):
        shape = f"{TOKENS}x{EXPERTS}, top-{TOPK}" + (", aux" if aux else "")
        sets = [_inputs(gen, aux) for _ in range(SETS)]
        started("TK", shape)
        want = _run(_theirs(tk), sets[0])
        tk_us, _ = device_us(_theirs(tk), sets, reps=30)
        started("before", shape)
        control = _run(calls["before"], sets[0]) if "before" in calls else None
        for name, call in calls.items():
            started(name, shape)
            verdict = _verdict(_run(call, sets[0]), control, want, RTOL, ATOL, "TK")
            us, mode = device_us(call, sets, reps=30)
            say(f"{name:14s} {shape:24s} {us:7.2f} µs ({mode})  TK {tk_us:6.2f}  {verdict}")
            rows.append((name, shape, us, tk_us, us / tk_us, verdict))
        del sets
    check_repeats(calls, gen, say, started)
    return rows


def load_launchers(artifacts: Path, candidates, skip, say) -> dict:
    """Each candidate's launcher (name -> launcher), those in `skip` left out; one that fails to load is said, not fatal."""
    launchers = {}
    for c in candidates:
        if c.name in skip:
            continue
        try:
            launchers[c.name] = _launcher(artifacts, c)
        except Exception as exc:
            say(f"{c.name}: not loaded ({type(exc).__name__}: {exc})")
    return launchers


def check_repeats(calls: dict, gen, say, started) -> None:
    """Repeated experts and empty slots, without and with aux: each call against the torch reference and before's bytes."""
    from tkaot.reference import backward as ref

    for aux in (False, True):
        shape = "repeats" + (" + aux" if aux else "")
        a = _inputs(gen, aux, tokens=1000, repeats=True)
        want = ref.moe_topk_gate_backward(a["scores"], a["idx"], a["w"], a["dw"], SCALE, a["mask"], a["h"])
        started("before", shape)
        control = _run(calls["before"], a) if "before" in calls else None
        for name, call in calls.items():
            started(name, shape)
            say(f"{shape}: {name}: {_verdict(_run(call, a), control, want, 1e-4, 1e-6, 'the reference')}")


def finish(say, rows, start: float, path: Path, log: list[str], widths: tuple[int, int, int]) -> None:
    """Print the table (candidate, shape, µs, TK µs, ratio, identical?) and the run's seconds; write the log."""
    name_w, shape_w, num_w = widths
    say(f"\n{'candidate':{name_w}s} {'shape':{shape_w}s} {'µs':>{num_w}s} {'TK µs':>{num_w}s} {'ratio':>6s}  identical?")
    for name, shape, us, tk_us, ratio, verdict in rows:
        say(f"{name:{name_w}s} {shape:{shape_w}s} {us:{num_w}.2f} {tk_us:{num_w}.2f} {ratio:6.2f}  {verdict}")
    say(f"{time.perf_counter() - start:.1f} s")
    path.write_text("\n".join(log) + "\n")


def main(argv=None) -> None:
    cli(argv, __doc__, ARTIFACTS, build, time_candidates)


def cli(argv, doc: str, artifacts: str, build_sets, time_sets) -> None:
    """A two-command tuning script's command line: `build --out SETS` (CPU), or `--artifacts SETS --out DIR` (GPU)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("time", "build"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(artifacts), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the sets go; time: the log's directory")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "build":
        build_sets(args.out)
    else:
        time_sets(args.artifacts, args.out)


if __name__ == "__main__":
    main()
