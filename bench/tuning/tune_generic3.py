"""Time norm_forward_and_per_token_cast's generic kernel (e4m3/32, no residual) against the one shipped before it,
its specialised variant and TileKernels, checking every output byte.

norm_cast_generic's default tiling now has a body for each width class (kernels_src/fused/norm_cast_generic.py,
RuntimeSplit.width_classes in kernels_src/norm/row_sum.py): rows over all 128 threads of a block (hidden > 2048) on
a split whose shift is a constant, so each vector is an offset from the row pointer as in the specialised kernel,
and the narrower rows on the runtime split, its loops to the 4 vectors those widths give a thread. Before it, one
body over the runtime split: 68.3 µs at 8192x7168 against 48.4 for the specialised kernel (H200, session 11: 1.41x).

The new kernel is built from this tree into an artifact set put first on TKAOT_PATH:

    tkaot-build build --shapeset bench/tuning/tune_generic3.toml --arch sm90 --out tune-artifacts/generic3
    TKAOT_PATH=$PWD/tune-artifacts/generic3 python -m bench.tuning.tune_generic3 --out DIR

Each shape runs twice in one process: with TKAOT_PATH (the specialised variant, then the new generic kernel), then
without it (the specialised variant again, then the control: the generic kernel of the prebuilt set, the one
shipped before this change as long as prebuilt/ is not rebuilt from this tree), each beside TileKernels; every
output (values and scale factors) is compared bit for bit with TileKernels' and with the specialised variant's.
The widths: 7168 (the issue's row), 4096 and 8192 (the wide class), 2048 and 1536 (the narrow class, 64 threads a
row; 1536 leaves a thread's last vector out of some rows), 2080 (wide, the last vector in half the lanes: no
specialised variant is built, so "specialised" is the generic kernel again and only TileKernels' bytes count).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from bench.tuning.tune_generic_perf import print_table, specialised_then_generic, start
from tkaot import _op
from tkaot._quant import norm_cast as _norm_cast

TOKENS = 8192
WIDTHS = (7168, 4096, 8192, 2048, 1536, 2080)
SETS = 4  # rotating inputs of 8192 rows: past L2 from 2048 columns on (bf16)
CONTROL_US = {f"norm_cast {TOKENS}x7168 e4m3/32": 68.34}  # the shipped generic kernel, session 11 (H200)


@contextlib.contextmanager
def prebuilt_only():
    """The registry without TKAOT_PATH's sets: the op's kernels come from the prebuilt set (the control)."""
    saved = os.environ.pop("TKAOT_PATH", None)
    _op.REGISTRY.reset()
    _norm_cast._NORM_CAST.cache.clear()
    try:
        yield
    finally:
        if saved is not None:
            os.environ["TKAOT_PATH"] = saved
        _op.REGISTRY.reset()
        _norm_cast._NORM_CAST.cache.clear()


def main(argv=None) -> None:
    out_dir, tk = start(argv)
    torch.manual_seed(0)
    rows, log, begun = [], [], time.time()
    for hidden in WIDTHS:
        name = f"norm_cast {TOKENS}x{hidden} e4m3/32"
        inputs = [{"x": torch.randn(TOKENS, hidden, device="cuda").to(torch.bfloat16)} for _ in range(SETS)]
        weight = torch.randn(hidden, device="cuda").to(torch.bfloat16)

        def call(module, a, weight=weight):
            return module.quant.norm_forward_and_per_token_cast(a["x"], weight, 1e-6, "e4m3", 32)

        new = specialised_then_generic(tk, log, name, _norm_cast._NORM_CAST, "norm_cast", inputs, call)
        with prebuilt_only():
            control = specialised_then_generic(tk, log, name, _norm_cast._NORM_CAST, "norm_cast", inputs, call)
        control[0]["candidate"] = "specialised (shipped, again)"
        control[1]["candidate"] = "generic (control: prebuilt set)"
        rows += [new[0], control[0], control[1], new[1]]
        log.append(f'{{"case": "{name}", "rows_relabelled": ["specialised (shipped, again)", "generic (control: prebuilt set)"]}}')
    (out_dir / "tune_generic3.jsonl").write_text("\n".join(log) + "\n")
    print(f"{torch.cuda.get_device_name(0)}, {time.time() - begun:.0f} s, TKAOT_PATH={os.environ.get('TKAOT_PATH', '')}")
    print_table(rows, {**{r["case"]: float("nan") for r in rows}, **CONTROL_US})


if __name__ == "__main__":
    main()
