"""Time swiglu_backward's fp32-x variants as rebuilt (s1d's cubin) against the shipped ones and TileKernels.

The bench row `swiglu_backward_and_per_token_cast | 8192x8192 fp32 x, bf16 grad -> bf16` shipped at 1.009x TileKernels'
time (seventeenth session: 116.29 µs against 115.22) with a kernel that was not the timed candidate s1d
(bench/tuning/tune_swigbwd8.py as of commit 8a216a6: 114.62 against 114.43). The shipped source pipelines the loads
as s1d does, but TileLang binds its `if` around the next chunk's loads to each of the three loads, and the loads and the
copy into this chunk's registers sit under the chunk's bounds test with the math; its cubin has 61 registers, s1d's 63.
kernels_src/fused/swiglu_backward.py as of this branch writes the fp32-x loop in s1d's shape, and its fp32-x cubins are
s1d's bytes (sm90); every other variant's cubin is the shipped one. Registers, shipped -> rebuilt (sm90; 128 threads a
block, so blocks an SM are unchanged): bf16 grad -> bf16 61 -> 63, -> fp32 62 -> 64; fp32 grad -> bf16 66 -> 66, -> fp32
66 -> 70 (sm100: 62 -> 64, 62 -> 64, 64 -> 64, 64 -> 68).

Sets timed, on the op's own call (tkaot.quant.swiglu_backward_and_per_token_cast, fp32 x, bf16 grad -> bf16):
  shipped    prebuilt/sm90's fp32-x variants (the ones in the tree this runs from)
  s1d        this branch's build of them (ARTIFACTS/sm90)
  TK         TileKernels' swiglu_backward_and_per_token_cast on the same inputs

On a CPU with TileLang and nvcc, the sets come from

    python -m build_tools.cli build --op swiglu_backward --set x_dtype=float32 --set 'grad_dtype=bfloat16|float32' \
        --set 'fmt=bf16|fp32' --set group=0 --set sf=none --arch sm90 --out tune-artifacts/swigbwd21/sm90

(and --arch sm100 into .../sm100). On the GPU, from the tree's root with PYTHONPATH set to it:

    python -m bench.tuning.tune_swigbwd21 [--artifacts tune-artifacts/swigbwd21] [--out DIR]

Checks first, on fresh inputs: s1d's outputs, byte for byte, against the shipped kernel's at 1, 3, 127, 4097 and 8192
tokens, hidden 4096 and 2048 (the timed shapes) and 1088 (a half chunk at the end), plain and with weights, clamp,
recompute and an expert layout; at 127 tokens the other three fp32-x variants (fp32 grad, fp32 out) too. Then each
set is timed by CUDA-graph replay over rotating input sets larger than L2 (bench.timing.device_us, median of its
replays), PASSES passes in alternating order, the median of the passes reported. Prints a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import statistics
import time
from pathlib import Path

ARTIFACTS = "tune-artifacts/swigbwd21"
KERNEL = "swiglu_backward"
FP32_X = [(g, f) for g in ("bfloat16", "float32") for f in ("bf16", "fp32")]
TOKENS = (1, 3, 127, 4097, 8192)
CHECK_HIDDEN = (4096, 2048, 1088)
TIME_HIDDEN = (4096, 2048)
SETS = 3  # rotating input sets: 3 x 448 MB at 8192 x 4096, far beyond L2
PASSES = 5
TK_BUDGET_S = 90  # past this, TileKernels is not compiled for the second width (the run stays under 150 s)


def _fp32_x_entries(set_dir: Path) -> dict[str, dict]:
    """{key: manifest entry} of a set's fp32-x variants of the kernel."""
    entries = json.loads((set_dir / "manifest.json").read_text())["variants"]
    return {e["key"]: e for e in entries if e["kernel"] == KERNEL and e["key"].startswith("x_dtype=float32,")}


def _launchers(set_dir: Path, say) -> dict:
    """{key: Kernel} of a set's fp32-x variants, each cubin's sha256 checked against its manifest."""
    from tkaot._kernel import Kernel

    kernels = {}
    for key, e in _fp32_x_entries(set_dir).items():
        path = set_dir / "cubins" / f"{e['cubin']}.cubin"
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != e["cubin"]:
            raise SystemExit(f"{path}: sha256 {digest} is not the manifest's")
        kernels[key] = Kernel(e["kernel"], key, e["launch"], path, e["cubin"], set_dir.name)
        say(f"  {set_dir}: {key} {e['cubin'][:16]}")
    if len(kernels) != len(FP32_X):
        raise SystemExit(f"{set_dir}: {len(kernels)} fp32-x variants, expected {len(FP32_X)}")
    return kernels


@contextlib.contextmanager
def _serving(kernels: dict):
    """The op's kernel table with these launchers for their keys (other variants: the registry's)."""
    from tkaot._quant import swiglu_backward as op

    table = op._KERNEL
    saved = dict(table.cache)
    table.cache.clear()
    original_get = table.get
    assert "get" not in vars(table), "_serving does not nest"

    def get(device, *values, **kw):
        key = table.key(values)
        if key in kernels:
            launcher = table.cache.get((device, *values))
            if launcher is None:
                launcher = table.cache[(device, *values)] = kernels[key].bind(table.args)
            return launcher
        return original_get(device, *values, **kw)

    table.get = get
    try:
        yield
    finally:
        del table.get
        table.cache.clear()
        table.cache.update(saved)


def _inputs(tokens: int, hidden: int, grad_dtype, seed: int) -> dict:
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, 2 * hidden, generator=g, device="cuda") * 3
    dy = torch.randn(tokens, hidden, generator=g, device="cuda").to(grad_dtype)
    w = torch.rand(tokens, generator=g, device="cuda")
    cuts = sorted(torch.randint(0, tokens + 1, (3,), generator=g, device="cuda").tolist())
    psum = torch.tensor([*cuts, tokens], dtype=torch.int32, device="cuda")
    return {"x": x, "dy": dy, "w": w, "psum": psum}


def _kwargs(a: dict, extra: bool) -> dict:
    if not extra:
        return {}
    return dict(topk_weights=a["w"], routed_scaling_factor=2.5, clamp_value=4.0, do_recompute=True, psum_num_tokens_per_expert=a["psum"])


def _same(got, want) -> bool:
    """Every output's bytes equal (pairs flattened; NaN bit patterns compared too)."""
    import torch

    def flat(result):
        out = []
        for t in result:
            out.extend(t if isinstance(t, tuple) else [t])
        return [t.contiguous().view(-1).view(torch.uint8) for t in out]

    a, b = flat(got), flat(want)
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def check(shipped: dict, cand: dict, say) -> str:
    """The candidate's outputs against the shipped kernel's on every check case; a summary verdict."""
    import torch

    import tkaot

    bad, cases = [], 0
    t0 = time.perf_counter()
    for hidden in CHECK_HIDDEN:
        for tokens in TOKENS:
            combos = [("bfloat16", "bf16", extra) for extra in (False, True)]
            if tokens == 127:
                combos += [(gd, f, extra) for gd, f in FP32_X if (gd, f) != ("bfloat16", "bf16") for extra in (False, True)]
            for grad_dtype, fmt, extra in combos:
                a = _inputs(tokens, hidden, getattr(torch, grad_dtype), seed=7 * tokens + hidden + int(time.time()) % 1000)
                kw = _kwargs(a, extra)
                with _serving(shipped):
                    want = tkaot.quant.swiglu_backward_and_per_token_cast(a["x"], a["dy"], fmt, 128, **kw)
                with _serving(cand):
                    got = tkaot.quant.swiglu_backward_and_per_token_cast(a["x"], a["dy"], fmt, 128, **kw)
                torch.cuda.synchronize()
                cases += 1
                if not _same(got, want):
                    bad.append(f"{tokens}x{hidden} {grad_dtype}->{fmt}{' +extras' if extra else ''}")
    for b in bad[:6]:
        say(f"  DIFFERS: {b}")
    verdict = f"{len(bad)} of {cases} cases DIFFER" if bad else f"bytes = shipped in all {cases} cases"
    say(f"check s1d vs shipped: {verdict} ({time.perf_counter() - t0:.1f} s)")
    return verdict


def measure(artifacts: Path, say, start: float) -> list[tuple]:
    import torch

    import tkaot
    from bench.timing import device_us

    shipped = _launchers(Path("prebuilt") / "sm90", say)
    cand = _launchers(artifacts / "sm90", say)
    same_cubin = all(shipped[k].cubin_sha256 == cand[k].cubin_sha256 for k in shipped)
    say(f"s1d cubins {'ARE' if same_cubin else 'are not'} the shipped ones")
    try:
        import tile_kernels as tk
    except ImportError:
        tk = None
        say("tile_kernels not importable: no TK rows")
    verdict = check(shipped, cand, say)
    rows = []
    for hidden in TIME_HIDDEN:
        shape = f"8192x{2 * hidden} fp32 x, bf16 grad -> bf16"
        inputs = [_inputs(8192, hidden, torch.bfloat16, seed=100 + i) for i in range(SETS)]

        def call(a):
            return tkaot.quant.swiglu_backward_and_per_token_cast(a["x"], a["dy"], "bf16", 128)

        def tk_call(a):
            return tk.quant.swiglu_backward_and_per_token_cast(a["x"], a["dy"], "bf16", 128)

        def timed(kernels, inputs=inputs):
            def run():
                with _serving(kernels):
                    return device_us(call, inputs)[0]

            return run

        sets = {"shipped": timed(shipped), "s1d": timed(cand)}
        with _serving(shipped):
            want = call(inputs[0])
        with _serving(cand):
            same = "yes" if _same(call(inputs[0]), want) else "NO"
        same_tk = "-"
        if tk is not None and (hidden == TIME_HIDDEN[0] or time.perf_counter() - start < TK_BUDGET_S):
            t = time.perf_counter()
            theirs = tk_call(inputs[0])
            torch.cuda.synchronize()
            same_tk = "yes" if _same(want, theirs) else "NO"
            say(f"TK first call at {shape}: {time.perf_counter() - t:.0f} s")
            sets["TK"] = lambda inputs=inputs: device_us(tk_call, inputs)[0]
        times: dict[str, list[float]] = {name: [] for name in sets}
        names = list(sets)
        for p in range(PASSES):
            order = names if p % 2 == 0 else names[::-1]
            for name in order:
                times[name].append(sets[name]())
            say(f"pass {p} {shape}: " + "  ".join(f"{n} {times[n][-1]:.2f}" for n in names))
        tk_us = statistics.median(times["TK"]) if "TK" in times else None
        for name in names:
            us = statistics.median(times[name])
            ratio = us / tk_us if tk_us else float("nan")
            eq = {"shipped": "ref", "s1d": same, "TK": same_tk}[name]
            rows.append((name, shape, us, min(times[name]), max(times[name]), ratio, eq))
        del inputs
    rows.append(("", "check", 0, 0, 0, 0, verdict))
    return rows


def main(argv=None) -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, default=Path(ARTIFACTS), help="the rebuilt sets (sm90/ under it)")
    parser.add_argument("--out", type=Path, default=None, help="where to write tune_swigbwd21.log")
    args = parser.parse_args(argv)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    t0 = time.perf_counter()
    say(f"device: {torch.cuda.get_device_name()}; {SETS} rotating input sets, {PASSES} alternating passes")
    rows = measure(args.artifacts, say, t0)
    say(f"{time.perf_counter() - t0:.0f} s")
    say("")
    say(f"{'set':8s} {'shape':36s} {'µs':>8s} {'min':>8s} {'max':>8s} {'/TK':>6s}  bytes = shipped (TK: = shipped)")
    for name, shape, us, lo, hi, ratio, eq in rows:
        if not name:
            say(f"{shape}: {eq}")
            continue
        say(f"{name:8s} {shape:36s} {us:8.2f} {lo:8.2f} {hi:8.2f} {ratio:6.3f}  {eq}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tune_swigbwd21.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
