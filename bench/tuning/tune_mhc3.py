"""Time the multilayer recompute, pre big fuse and normw_merge_bwd candidates beside TileKernels, at the bench shapes
(bench/cases/mhc_fused.py), each checked byte for byte against TileKernels' output.

The machinery is bench/tuning/tune_mhc_perf.py's: each candidate is the op's kernel built into its own artifact
set, ARTIFACTS/<candidate>/, from the kernel as shipped before these candidates (Source, the control), as
shipped now ("staged") or with builder options changed. Build on a CPU with TileLang and nvcc (the build CLI's
shape sets cannot pass builder options or build an older source, hence this command):

    python -m bench.tuning.tune_mhc3 build --out tune-artifacts/mhc3

then time on the GPU, where tile_kernels imports (rows past --budget seconds, 55 by default, are skipped):

    python -m bench.tuning.tune_mhc3 --artifacts tune-artifacts/mhc3 --out DIR
"""

from __future__ import annotations

import sys

from bench.tuning import tune_mhc_perf
from bench.tuning.tune_mhc_perf import Candidate, Source, options

ARTIFACTS = "tune-artifacts/mhc3"
BEFORE = "a3a2081"  # main before these candidates: recompute "stream6", 985.0 us (TileKernels 816.9)

_RC, _MERGE = "kernels_src.mhc.multilayer_recompute", "kernels_src.mhc.normw_merge_bwd"
_FUSE = "kernels_src.mhc.pre_big_fuse"
_FUSE_OP = dict(kernel="mhc_pre_big_fuse", op="mhc_pre_big_fuse_fwd")
_RECOMPUTE = dict(kernel="mhc_multilayer_recompute", op="mhc_multilayer_recompute")
_OLD = ((_RC, "build", Source(BEFORE)),)
_MERGE_OP = dict(kernel="mhc_normw_merge_bwd", op="mhc_fn_normw_merge_bwd", values={"dtype": "float32"})

CANDIDATES = (
    # the control: loads at each layer's start into registers, a stream at a time, 6 blocks an SM (80 registers)
    Candidate("recompute.stream6", patches=_OLD, note="shipped before: loads at the layer's start, 6 blocks",
              **_RECOMPUTE),
    # last session's runner-up: the next layer's output read ahead into registers, 5 blocks
    Candidate("recompute.ahead5", patches=_OLD + options(_RC, output_ahead=True, min_blocks=5),
              note="before, next output ahead in registers, 5 blocks", **_RECOMPUTE),
    # new default: a layer's output vector and mixes staged in shared memory by cp.async two layers ahead, one
    # barrier a layer, 6 blocks (80 registers, no spills)
    Candidate("recompute.staged", note="staged two layers ahead, 6 blocks", **_RECOMPUTE),
    Candidate("recompute.stages2", patches=options(_RC, stages=2), note="staged one layer ahead, 6 blocks",
              **_RECOMPUTE),
    Candidate("recompute.staged5", patches=options(_RC, min_blocks=5), note="staged two ahead, 5 blocks",
              **_RECOMPUTE),
    Candidate("recompute.t64", patches=options(_RC, threads=64, min_blocks=12),
              note="staged two ahead, 64 threads (512 columns) a block, 12 blocks", **_RECOMPUTE),
    # pre big fuse (8192 tokens and 1): warps 1..'s first apply round staged by cp.async before the mixes' barrier
    Candidate("big_fuse.before", patches=((_FUSE, "build", Source(BEFORE)),), note="shipped before: loads after the barrier",
              **_FUSE_OP),
    Candidate("big_fuse.early1", note="first round staged before the barrier (12 KiB)", **_FUSE_OP),
    Candidate("big_fuse.early2", patches=options(_FUSE, early_rounds=2), note="2 rounds staged (24 KiB)", **_FUSE_OP),
    # normw_merge_bwd (shipped unchanged: its cubin is main's): a thread's columns, rows in flight
    Candidate("normw_merge_bwd.r8", note="shipped: a column a thread, 8 rows in flight", **_MERGE_OP),
    Candidate("normw_merge_bwd.c2", patches=options(_MERGE, columns=2), note="2 columns a thread (256 a block), 8 rows",
              **_MERGE_OP),
    Candidate("normw_merge_bwd.c2r4", patches=options(_MERGE, columns=2, rows=4), note="2 columns a thread, 4 rows",
              **_MERGE_OP),
)  # fmt: skip


def main(argv=None) -> None:
    tune_mhc_perf.main(argv, CANDIDATES, ARTIFACTS, "tune_mhc3.json", __doc__)


if __name__ == "__main__":
    sys.exit(main())
