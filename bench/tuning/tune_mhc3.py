"""Time the multilayer recompute's shipped kernel (the control) and two candidates beside TileKernels, at the
bench shape (bench/cases/mhc_fused.py), each checked byte for byte against TileKernels' output.

Session 12 round 1 (H200, us, TileKernels in brackets; every row identical to TileKernels), every new candidate lost
and left kernels_src: recompute 8192x4x7168 bf16, 4 layers (828.83): shipped "stream6" 992.06, ahead5 983.20, each
layer's output and mixes staged in shared memory by cp.async two layers ahead 1203.66 (one ahead 1120.96, 5 blocks
1071.99, 64 threads 1229.97); pre big fuse 8192 / 1 token (146.82 / 4.87): shipped 142.35 / 5.42, first apply round
staged before the mixes' barrier 142.06 / 5.74 (2 rounds 154.58 / 5.67); normw_merge_bwd 24x28672 (5.38): shipped a
column a thread 5.78, 2 columns 7.97 (4 rows 7.24). Staging likely lost as it added shared-memory traffic and a
barrier a layer (every warp waits for the block's slowest) where the loads were not the bottleneck. What the SASS
shows instead: the recompute's bf16 stores (5/6 of its bytes) are four 32-bit ST.E each, not one 128-bit store,
where post_fwd's same store idiom into a kernel parameter is one STG.E.128; the recompute's destinations are generic
pointers read from its pointer table. At the CUDA level neither alignas(16) sources, assume_aligned or __isGlobal
destinations, a plain cast of the table entry nor make_uint4 merges them (cicc emits st.v2.u16 / st.u32 pieces); an
inline st.global.v4 does (STG.E.128, 80 registers, the shipped kernel's spills): candidate st128, kept in commit
ST128 (its kernel source; if it wins, ship that file), not in kernels_src.

The machinery is bench/tuning/tune_mhc_perf.py's: each candidate is the op's kernel built into its own artifact
set, ARTIFACTS/<candidate>/ (the shipped source or ST128's, or with builder options). Build on a CPU with
TileLang and nvcc (0.05 MB, under a minute):

    python -m bench.tuning.tune_mhc3 build --out tune-artifacts/mhc3

then time on the GPU, where tile_kernels imports (rows past --budget seconds, 55 by default, are skipped):

    python -m bench.tuning.tune_mhc3 --artifacts tune-artifacts/mhc3 --out DIR
"""

from __future__ import annotations

import sys

from bench.tuning import tune_mhc_perf
from bench.tuning.tune_mhc_perf import Candidate, Source, options

ARTIFACTS = "tune-artifacts/mhc3"

_RC = "kernels_src.mhc.multilayer_recompute"
# the kernel's stores as one inline st.global.v4 each (tkaot_store16), otherwise the shipped kernel
ST128 = "62bbf7d9530bf2f957652c75821f5a91c30dffb1"
_ST128 = ((_RC, "build", Source(ST128)),)
_RECOMPUTE = dict(kernel="mhc_multilayer_recompute", op="mhc_multilayer_recompute")

CANDIDATES = (
    # the control: loads at each layer's start into registers, a stream at a time, 6 blocks an SM (80 registers)
    Candidate("recompute.stream6", note="shipped: loads at the layer's start, 6 blocks", **_RECOMPUTE),
    # 128-bit stores, 6 blocks; and with ahead5 (1 % ahead of the control in sessions 11, 972.7 / 985.0, and 12,
    # 983.20 / 992.06: the next layer's output read ahead into registers, 5 blocks)
    Candidate("recompute.st128", patches=_ST128, note="shipped, stores one STG.E.128 each", **_RECOMPUTE),
    Candidate("recompute.st128_ahead5", patches=_ST128 + options(_RC, output_ahead=True, min_blocks=5),
              note="st128, next output ahead in registers, 5 blocks", **_RECOMPUTE),
)  # fmt: skip


def main(argv=None) -> None:
    tune_mhc_perf.main(argv, CANDIDATES, ARTIFACTS, "tune_mhc3.json", __doc__)


if __name__ == "__main__":
    sys.exit(main())
