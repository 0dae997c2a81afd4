"""mhc_pre_apply_mix_bwd's two tilings (u1, the one-vector walk; u3, the three-vector walk) beside TileKernels at
8192 tokens x 4 streams, hidden 7168 / 4096 / 2560 / 2048 / 1024 (bench/cases/mhc.py's case, bench/timing.py's CUDA-graph
timing over rotating inputs, alternating passes, median). Before timing, at every width, u1's outputs (x_grad and
mix_grad) are checked byte for byte against u3's (the shipped kernel's) on fresh inputs at 1, 3, 127, 4097 and 8192
tokens.

    PYTHONPATH=$PWD python -m bench.tuning.pam_bwd_tilings [--artifacts new-sm90] [--passes 5]

Both variants come from --artifacts (a set holding mhc_pre_apply_mix_bwd [mhc_mult=4,tiling=u1] and [..,tiling=u3]),
put first on TKAOT_PATH; the op is steered by its width threshold (tkaot/_mhc/kernels.py), and each launch's key is
checked. Prints one table last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

WIDTHS = (7168, 4096, 2560, 2048, 1024)
CHECK_TOKENS = (1, 3, 127, 4097, 8192)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--artifacts", default="new-sm90", help="the sm90 set holding both tilings")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--budget", type=float, default=110, help="seconds: widths not started by then are skipped")
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    args = parser.parse_args(argv)
    artifacts = Path(args.artifacts).resolve()
    if not (artifacts / "manifest.json").exists():
        sys.exit(f"{artifacts}: no manifest.json (build: python -m build_tools.cli build --op mhc_pre_apply_mix_bwd "
                 f"--set mhc_mult=4 --set 'tiling=u3|u1' --arch sm90 --out {args.artifacts} -j 4)")  # fmt: skip
    os.environ["TKAOT_PATH"] = os.pathsep.join(filter(None, (str(artifacts), os.environ.get("TKAOT_PATH", ""))))

    import torch

    import tkaot
    from bench import timing
    from bench.cases import mhc as cases
    from bench.run import _tile_kernels, rotating_inputs
    from tkaot._mhc import kernels, pre_apply_mix

    tilings = kernels.PRE_APPLY_MIX_BWD_TILINGS
    threshold = kernels.PRE_APPLY_MIX_BWD_NARROW_HIDDEN
    force = {tilings["narrow"]: 1 << 30, tilings["default"]: 0}  # the threshold that makes the op take each tiling
    tk = _tile_kernels()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    t0 = time.time()

    def served() -> set:
        """The launchers cached for each tiling: a set missing one would have cached the general (u3) launcher twice."""
        return {t: {id(launcher) for (_, _, t2), launcher in pre_apply_mix._BWD.cache.items() if t2 == t} for t in force}

    def run(tiling: str, a: dict):
        kernels.PRE_APPLY_MIX_BWD_NARROW_HIDDEN = force[tiling]
        try:
            return tkaot.mhc.mhc_pre_apply_mix_bwd(a["o_grad"], a["x"], a["mix"], a["x_grad"])
        finally:
            kernels.PRE_APPLY_MIX_BWD_NARROW_HIDDEN = threshold

    rows, skipped = [], []
    for hidden in map(int, args.widths.split(",")):
        if time.time() - t0 > args.budget:  # TileKernels compiles a kernel a width on its first call
            skipped.append(hidden)
            continue
        same = True
        for n in CHECK_TOKENS:  # byte check on fresh inputs (x_grad is accumulated in place: each walk gets a copy)
            a = {"o_grad": torch.randn(n, hidden, device="cuda").bfloat16(), "x": torch.randn(n, 4, hidden, device="cuda").bfloat16(),
                 "mix": torch.rand(n, 4, device="cuda") * 2, "x_grad": torch.randn(n, 4, hidden, device="cuda").bfloat16()}  # fmt: skip
            outs = []
            for t in force:
                b = {**a, "x_grad": a["x_grad"].clone()}
                mix_grad = run(t, b)
                outs.append((b["x_grad"].view(torch.int16), mix_grad.view(torch.int32)))
            same &= all(torch.equal(p, q) for p, q in zip(*outs))
        cases.HIDDEN = hidden  # bench/cases/mhc.py reads it when it makes a case and its inputs
        case = next(c for c in cases._stream_cases() if c.op == "mhc_pre_apply_mix_bwd")
        inputs = rotating_inputs(case, l2)
        impls = {t: (lambda a, t=t: run(t, a)) for t in force}
        if tk is not None:
            impls["TileKernels"] = lambda a, case=case: case.tile_kernels(tk, a)
        times = {name: [] for name in impls}
        for p in range(args.passes):
            for name in impls if p % 2 == 0 else reversed(list(impls)):
                times[name].append(timing.device_us(impls[name], inputs)[0])
        launched = served()
        assert all(len(v) == 1 for v in launched.values()) and len(set().union(*launched.values())) == len(force), launched
        med = {name: statistics.median(v) for name, v in times.items()}
        rows.append((hidden, med, same, tilings["narrow"] if hidden < threshold else tilings["default"]))
        print(f"hidden {hidden}: {', '.join(f'{n} {v:.2f}' for n, v in med.items())} µs; u1 bytes == u3 bytes: {same} "
              f"({time.time() - t0:.0f} s)", flush=True)  # fmt: skip
        del inputs
        torch.cuda.empty_cache()

    if skipped:
        print(f"not timed, past the {args.budget:.0f} s budget: hidden {', '.join(map(str, skipped))}")
    u1, u3 = tilings["narrow"], tilings["default"]
    print(f"\n{torch.cuda.get_device_name(0)}, 8192 tokens x 4 streams bf16, median of {args.passes} passes, µs")
    print(f"| hidden | {u1} | {u3} | TileKernels | {u1}/TK | {u3}/TK | {u1}/{u3} | op takes | {u1} bytes == {u3} |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for hidden, med, same, picked in rows:
        tkv = med.get("TileKernels")
        against = [f"{med[t] / tkv:.3f}" if tkv else "—" for t in (u1, u3)]
        print(f"| {hidden} | {med[u1]:.2f} | {med[u3]:.2f} | {f'{tkv:.2f}' if tkv else '—'} | {against[0]} | {against[1]} | "
              f"{med[u1] / med[u3]:.3f} | {picked} | {same} |")  # fmt: skip


if __name__ == "__main__":
    main()
