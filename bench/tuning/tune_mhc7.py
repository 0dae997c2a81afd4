"""Check mhc_pre_big_fuse_fwd's token threshold (tkaot/_mhc/big_fuse.py, SPLIT_MAX_TOKENS): at 1 .. 128 tokens
(4 x 7168 bf16, 16 splits, 20 repeats, bench/cases/mhc_fused.py's inputs), the one-block kernel (ctl), the split
kernel (4 blocks a token) and TileKernels, each timed by CUDA-graph replay over rotating inputs (bench/timing.py),
with every output's bytes compared (split and TileKernels against ctl). Both kernels are the shipped ones, taken
from the artifact sets tkaot finds (prebuilt/ or TKAOT_PATH); the op is steered to one or the other by setting
SPLIT_MAX_TOKENS around each timing. On a GPU:

    python -m bench.tuning.tune_mhc7 [--out DIR] [--budget S]

Prints one row a token count (µs, ratios, which kernel the shipped threshold picks and which was faster) and, with
--out, writes DIR/tune_mhc7.log. Stops timing new rows past --budget seconds (50 by default: under a minute in all).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)
BUDGET_S = 50.0
_ALWAYS, _NEVER = 65535, 0  # SPLIT_MAX_TOKENS that make the op launch the split kernel, or the one-block kernel


def _outputs(case, inputs: dict) -> list:
    import torch

    mine = copy.deepcopy(inputs)
    case.tkaot(mine)
    torch.cuda.synchronize()
    return [mine[k] for k in ("post", "comb", "input")]


def _tk_outputs(case, tk, inputs: dict) -> list:
    import torch

    theirs = copy.deepcopy(inputs)
    case.tile_kernels(tk, theirs)
    torch.cuda.synchronize()
    return [theirs[k] for k in ("post", "comb", "input")]


def _same(a: list, b: list) -> bool:
    import torch

    return all(torch.equal(x, y) for x, y in zip(a, b))


def run(out: Path | None, budget_s: float) -> None:
    import torch

    from bench import timing
    from bench.cases import mhc_fused
    from bench.run import _tile_kernels, rotating_inputs
    from tkaot._mhc import big_fuse

    start = time.perf_counter()
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    shipped = big_fuse.SPLIT_MAX_TOKENS
    try:
        big_fuse._SPLIT.get(torch.cuda.current_device(), mhc_fused.M)
    except Exception as exc:  # the point of the run is the split kernel: say why it cannot be had
        say(f"tune_mhc7: the split kernel is not loadable here ({type(exc).__name__}: {exc}); nothing timed")
        return
    tk = _tile_kernels()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    say(f"tune_mhc7: SPLIT_MAX_TOKENS = {shipped}; {mhc_fused.M}x{mhc_fused.HIDDEN} bf16, {mhc_fused.SPLITS} splits, 20 repeats")
    say(f"{'tokens':>6s} {'ctl µs':>8s} {'split µs':>9s} {'TK µs':>8s} {'split/ctl':>9s} {'split/TK':>8s}  shipped  faster  bytes")
    try:
        for tokens in TOKENS:
            if time.perf_counter() - start > budget_s:
                say(f"budget of {budget_s:.0f} s spent; rows from {tokens} tokens not timed")
                break
            case = mhc_fused._big_fuse_case(tokens)
            torch.manual_seed(tokens)
            inputs = rotating_inputs(case, l2)
            us, got = {}, {}
            for name, limit in (("ctl", _NEVER), ("split", _ALWAYS)):
                big_fuse.SPLIT_MAX_TOKENS = limit
                got[name] = _outputs(case, inputs[0])
                us[name], _ = timing.device_us(case.tkaot, inputs)
            big_fuse.SPLIT_MAX_TOKENS = shipped
            verdict = ["split =ctl" if _same(got["split"], got["ctl"]) else "split DIFFERS from ctl"]
            tk_us = None
            if tk is not None:
                verdict.append("TK =ctl" if _same(_tk_outputs(case, tk, inputs[0]), got["ctl"]) else "TK differs from ctl")
                tk_us, _ = timing.device_us(lambda a, case=case: case.tile_kernels(tk, a), inputs)
            picked = "split" if tokens <= shipped else "ctl"
            faster = "split" if us["split"] < us["ctl"] else "ctl"
            tk_text = f"{tk_us:8.2f}" if tk_us is not None else f"{'-':>8s}"
            vs_tk = f"{us['split'] / tk_us:8.2f}" if tk_us else f"{'-':>8s}"
            say(f"{tokens:6d} {us['ctl']:8.2f} {us['split']:9.2f} {tk_text} {us['split'] / us['ctl']:9.2f} {vs_tk}  "
                f"{picked:7s}  {faster:6s}  {', '.join(verdict)}")  # fmt: skip
            del inputs, got
            torch.cuda.empty_cache()
    finally:
        big_fuse.SPLIT_MAX_TOKENS = shipped
    say(f"{time.perf_counter() - start:.1f} s")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "tune_mhc7.log").write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the log's directory")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds after which no new row is timed")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError:
        print("tune_mhc7: torch not importable; nothing timed")
        return
    if not torch.cuda.is_available():
        print("tune_mhc7: no GPU here (torch.cuda.is_available() is False); nothing timed")
        return
    run(args.out, args.budget)


if __name__ == "__main__":
    main()
