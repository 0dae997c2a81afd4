"""Time the Sinkhorn backward and multilayer recompute candidates beside TileKernels, at the bench shapes
(bench/cases/mhc.py, mhc_fused.py), each checked byte for byte against TileKernels' output.

The machinery is bench/tuning/tune_mhc_perf.py's: each candidate is the op's kernel built into its own artifact
set, ARTIFACTS/<candidate>/, from the kernel as shipped before these candidates (Source, the controls), as
shipped now (".new") or with builder options or module constants changed. Build on a CPU with TileLang and nvcc
(the build CLI's shape sets cannot pass builder options or build an older source, hence this command):

    python -m bench.tuning.tune_mhc2 build --out tune-artifacts/mhc2

then time on the GPU, where tile_kernels imports (rows past --budget seconds, 55 by default, are skipped):

    python -m bench.tuning.tune_mhc2 --artifacts tune-artifacts/mhc2 --out DIR
"""

from __future__ import annotations

import sys

from bench.tuning import tune_mhc_perf
from bench.tuning.tune_mhc_perf import Candidate, Source, _set, options

ARTIFACTS = "tune-artifacts/mhc2"
BEFORE = "9e3421e"  # main before these candidates: Sinkhorn backward 27.97 us, recompute 1041.04 (TileKernels 17.04, 826.78)

_BWD, _RC = "kernels_src.mhc.sinkhorn_bwd", "kernels_src.mhc.multilayer_recompute"
_SINKHORN = dict(kernel="mhc_sinkhorn_bwd", op="mhc_sinkhorn_bwd")
_RECOMPUTE = dict(kernel="mhc_multilayer_recompute", op="mhc_multilayer_recompute")

# H200, session 11 (us; every candidate byte-identical to TileKernels), one line a kernel:
# sinkhorn_bwd: before 27.98, new 18.50 (shipped), loop 21.41, t64 18.33; TileKernels 17.02
# recompute: before 1029.7, new 985.0 (shipped), ahead6 1315.0, ahead5 972.7; TileKernels 816.9
CANDIDATES = (
    # Sinkhorn backward, an element a lane: the denominators (line sum + eps) kept in shared memory by the replay,
    # so the way back only reduces the products; a copy of the steps unrolled for 20 repeats
    Candidate("sinkhorn_bwd.before", patches=((_BWD, "build", Source(BEFORE)),), note="sums recomputed", **_SINKHORN),
    Candidate("sinkhorn_bwd.new", note="denominators kept, 20 repeats unrolled", **_SINKHORN),
    Candidate("sinkhorn_bwd.loop", patches=options(_BWD, unrolled_repeat=0), note="denominators kept, no unrolled copy",
              **_SINKHORN),
    Candidate("sinkhorn_bwd.t64", patches=_set(_BWD, LANE_THREADS=64), note="as new, 64 threads (4 tokens) a block",
              **_SINKHORN),
    # multilayer recompute: a stream at a time capped at 6 blocks an SM (80 registers); the next layer's output
    # read before this layer's stores (the loads of a layer then overlap the last one's)
    Candidate("recompute.before", patches=((_RC, "build", Source(BEFORE)),), note="all streams together, 128 regs",
              **_RECOMPUTE),
    Candidate("recompute.new", note="a stream at a time, 6 blocks", **_RECOMPUTE),
    Candidate("recompute.ahead6", patches=options(_RC, output_ahead=True), note="next output ahead, 6 blocks",
              **_RECOMPUTE),
    Candidate("recompute.ahead5", patches=options(_RC, output_ahead=True, min_blocks=5), note="next output ahead, 5 blocks",
              **_RECOMPUTE),
)  # fmt: skip


def main(argv=None) -> None:
    tune_mhc_perf.main(argv, CANDIDATES, ARTIFACTS, "tune_mhc2.json", __doc__)


if __name__ == "__main__":
    sys.exit(main())
