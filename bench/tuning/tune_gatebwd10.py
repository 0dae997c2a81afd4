"""Time candidates of engram_gate_bwd that move its per-token work toward TileKernels' (round 10), beside the shipped
kernel and TileKernels.

Round 9 (tune_gatebwd9.py) found the launch shape exhausted; the shipped k28d11v16 takes 720.0 µs at 8192 x 4 x 7168
bf16 on the H200 against TileKernels' 668.9 (1.077x). Both run one 256-thread CTA an SM, one wave of 132 CTAs, 63
tokens a CTA.

SASS, per thread and token at hidden 7168 (the instructions of the path a token takes; ours: prebuilt/sm90's cubin;
TileKernels': its kernel lowered for sm_90 at hidden 7168, 132 partials, no mask, no PDL, as its wrapper calls it on
the H200 (228 KB of shared memory an SM: x_blk_d 1792, go_blk_d 3584), compiled with the build's nvcc flags):
                 ours   TileKernels
  registers       219   255 (8-byte stack)
  token loop     3648   3047   (static: 3796 / 3114; ours holds the image-token path and the plain loops past keep)
  by pass        dL/dg 876 + head 71, exchange 225, grad_v 462 (7 turns of a runtime loop), grad_x 2014;
                 TileKernels: head + dL/dg + exchange 614, x setup 104, grad_v 358 (unrolled), grad_x 1971
  FFMA / FMUL / PRMT / F2FP: the same (689 / 459 / 336 / 126): the arithmetic is the same
  bf16 -> f32 (SHF.L + IMAD.U32): 685 / 673
  LOP3 118 / 5, P2R 32 / 1, BRA 104 / 37: our "group g < groups" checks of the 28 kept groups (hidden is a runtime
      value: the predicates kept as bits of one register, unpacked a group at a time), and grad_v's loop
  IADD3 172 / 62, IMAD 159 / 44, LEA 92 / 26: addressing (runtime hidden: 64-bit row addresses; grad_v's loop)
  LDGDEPBAR 83 / 17, DEPBAR 57 / 6: our commit group a position (2 KB of go or 4 KB of x and k), theirs a tile
      (28 KB of go; 14 KB of x, of k and 28 KB of w)
  LDS (scalar) 95 / 21, LDS.64 141 / 169, LDS.128 28 / 28 (w), LDGSTS.64 84 / 84, LDGSTS.128 4 / 35 (they stream
      w from L2 every token, 28 KB a tile, and v), STG.64 63 / 61
  barriers: 2 a token in both (ours: token start, dL/dg exchange; theirs: exchange, before the last x tile)
(these per-token counts are the SASS of the path a token takes, read by hand: not profiled.) Issue is not the limit
(8 warps x 3648 / 4 schedulers = 7.3 k cycles, 3.7-4.2 µs at 1.75-1.98 GHz of the 11.4 µs a token takes, 720 / 63;
theirs 6.1 k cycles of 10.6 µs), so the count matters as latency on each warp's path, and the structure more. Round 9
found the depth of either pass nearly indifferent (one ring slot fewer +3 µs, 2 or 4 more go groups +1-2 µs), so the
bytes in flight mid-pass do not bind; what differs is what is in flight at a token's boundary (inferred, not measured):
- TileKernels stages the next token's first half of go (28 KB) and its v during the current token's last x tile, so
  the next token's dL/dg pass starts with half its go landed. Ours drains every load at the end of the grad_x pass
  (its ring's last 10 positions are past the row: empty commit groups) and issues the next token's go only after the
  token-start barrier, then waits for the first group: a full memory latency a token with only go in flight.
- the shipped per-group wait: the grad_x pass waits, reads and works one 256-element group at a time (a DEPBAR and a
  branch, `g < groups`, between groups), TileKernels once a tile of 7 sub-blocks (its tile's LDS issued together).
The candidates (tiling letters, kernels_src/engram/gate_bwd.py's tiling_options; every one adds in the shipped order,
so its outputs are ctl's bytes, which the run checks):
  ctl    k28d11v16, the shipped kernel (its cubin must be prebuilt/sm90's: checked at build and run)
  x      k28d11v16x: the grad_x pass's last 10 groups stage the next token's first 10 go groups (20 KB) in place of
         the empty ring positions, behind one barrier (every grad_v reader done, the next v landed) that replaces the
         token-start barrier; the next token stages only go groups 10-15 as it starts (TileKernels' overlap)
  xv18   x with 2 more go groups in flight in the dL/dg pass
  f      k28d11v16f: hidden at least keep * 256 (T.assume; an op would pick it by hidden): no per-group checks
  fp     f, one wait a pair of groups in both passes (both groups read before the first is worked on; one position
         fewer in flight at the wait)
  xf, xfp  x and f; x, f and p
  xfi    xf, grad_v's 7 steps after grad_x's groups 0, 2, ..., 12 (the ring keeps flowing while grad_v works)
  xfpi   x, f, p and i
  xfw    xf with w staged through the ring beside x and k (16-byte cp.async from L2 every token, as TileKernels
         reads it) instead of kept in shared memory (114 KB freed): 14 ring slots (x allows at most (keep + 1) / 2),
         13 positions (52 KB of x and k) in flight against 10
  xw     x with w through the ring, 14 slots (the group checks kept: no f, whose 255 registers spill with w)
  xfpw   xfp with w through the ring, 14 slots
  fw     f with w through the ring, 19 slots (18 positions, 72 KB of x and k in flight)
Built for sm_90 (registers / stack bytes; the token loop's static SASS instructions; in it BAR, LDGDEPBAR, DEPBAR,
BRA, LOP3, IMAD, IADD3, LEA, LDGSTS.128; STL + LDL in it); shared memory 231,488 bytes (xw, xfw, xfpw 186,432; fw
227,392; TileKernels 186,400):
  ctl    219 / 0    3797   3  85  58  97 124 179 190 100  12   0
  x      219 / 0    4185   4  85  58 108 127 319 266 149  12   0
  xv18   219 / 0    4181   4  87  58 109 125 321 266 150  12   0
  f      255 / 8    4127   3  85  58  36   7 227 260 103  12   2
  fp     255 / 8    4077   3  85  30  36   7 235 263 105  12   2
  xf     255 / 16   4338   4  85  58  42   9 284 311 129  12   4
  xfp    255 / 16   4012   4  85  30  34   9 245 184 117  12   5
  xfi    255 / 48   4360   4  85  58  36   9 301 292 123  12  21
  xfpi   255 / 8    4183   4  85  30  36   8 265 293 121  12   2
  xw     186 / 0    4598   4  88  58 130 125 345 407 186  40   0
  xfw    255 / 88   4290   4  88  58  36   7 246 293 101  40  39
  xfpw   255 / 16   4128   4  88  30  36   6 215 278  93  40   4
  fw     255 / 0    4026   3  93  58  36   8 234 166 108  40   0
  TK     255 / 8    3115   3  19   7  40   7  51  72  32  42   1
(static counts: each loop holds paths a token at 7168 does not take, ours the image-token path, the plain loops past
keep and, with x, the first-token staging; the BAR count includes the rare v_ready == 0 path's.) The "@!PT LDS RZ"
padding before each cp.async batch (never issued) is most of our scalar LDS (101 against 27).
The passes' unrolled bodies, each run once a token (SASS instructions from a pass's first wait to its last: 27 of
its 28 groups, 13 of 14 pairs with p; dL/dg, then grad_x):
  ctl   700, 1893 (BRA 21 + 44, LOP3 38 + 39, IMAD 181 + 216)     x      664, 2162 (the tail's t + 1 addresses:
  f     563, 1785 (no BRA, no LOP3; IMAD 67 + 123)                        IMAD 299, IADD3 100, LEA 30 in grad_x)
  fp    457, 1694 (14 waits a pass)                               xv18   648, 2162
  xf    566, 1934                                                 xfp    493, 1874
  xfi   563, 2275 (grad_v's steps in it)                          xfpi   452, 2158
  xfw   553, 1806                                                 xfpw   478, 1665
  fw    564, 1708                                                 xw     719, 2078
TileKernels' grad_x pass is 1971 instructions in all (ours 2014: the same work), its token start, dL/dg pass and
exchange 614 (ours 71 + 876 + 225), its grad_v 358 (ours 462): f takes ours to its dL/dg count; what is left is
the structure (x) and the wait granularity (p).

On a CPU with TileLang and nvcc (a few seconds a candidate):

    python -m bench.tuning.tune_gatebwd10 build --out tune-artifacts/gatebwd10 [--only x,f]

then on the GPU, from the tree's root with PYTHONPATH set to it (tile_kernels importable):

    python -m bench.tuning.tune_gatebwd10 --artifacts tune-artifacts/gatebwd10 --out DIR [--budget S]

The run is round 9's (its check and time phases, imported): every candidate's bytes of grad_hidden_states, grad_kv and
grad_w_partial against ctl's (NaN-filled outputs) at 1, 3, 127, 4097, 8192 tokens, 1000 with 30% image tokens and 300
of hidden 7424, ctl's against TileKernels'; then each candidate and TileKernels timed twice at 8192 x 4 x 7168
(CUDA-graph replays over 2 input sets past the L2), the second pass reversed, outputs checked again. One table last;
writes DIR/tune_gatebwd10.log.
"""

import argparse
import sys
import time
from pathlib import Path

from bench.tuning import tune_gatebwd9 as r9
from bench.tuning.tune_gatebwd9 import CONTROL, SHIPPED, Candidate
from bench.tuning.watch import Log, run_child, with_reruns

ARTIFACTS = "tune-artifacts/gatebwd10"
MODULE = "bench.tuning.tune_gatebwd10"

CANDIDATES = (
    Candidate(CONTROL, SHIPPED, note="the shipped kernel (cubin = prebuilt/sm90's)"),
    Candidate("x", "k28d11v16x", note="the next token's first 10 go groups staged in the grad_x pass's last 10"),
    Candidate("xv18", "k28d11v18x", note="x, 2 more go groups ahead"),
    Candidate("f", "k28d11v16f", note="no per-group checks (hidden >= 7168)"),
    Candidate("fp", "k28d11v16fp", note="f, one wait a pair of groups in both passes"),
    Candidate("xf", "k28d11v16xf", note="x and f"),
    Candidate("xfp", "k28d11v16xfp", note="x, f and p"),
    Candidate("xfi", "k28d11v16xfi", note="xf, grad_v's steps inside the grad_x pass's first groups"),
    Candidate("xfpi", "k28d11v16xfpi", note="x, f, p and i"),
    Candidate("xw", "k28d14v16xw", note="x, w through the ring (L2) every token, 14 ring slots"),
    Candidate("xfw", "k28d14v16xfw", note="xf, w through the ring (L2) every token, 14 ring slots"),
    Candidate("xfpw", "k28d14v16xfpw", note="xfp, w through the ring, 14 ring slots"),
    Candidate("fw", "k28d19v16fw", note="f, w through the ring, 19 ring slots"),
)  # fmt: skip
NAMES = tuple(c.name for c in CANDIDATES)
r9.CANDIDATES, r9.NAMES = CANDIDATES, NAMES  # round 9's build, check and time phases run these


def time_candidates(artifacts: Path, out: Path, total_s: float = r9.TOTAL_S) -> None:
    """Round 9's run (its child, its phases) over this round's candidates."""
    import torch

    start = time.perf_counter()
    deadline = start + total_s
    out.mkdir(parents=True, exist_ok=True)
    say = Log()
    rows: dict = {}
    say(f"tune_gatebwd10: {torch.cuda.get_device_name()}, artifacts {artifacts}, budget {total_s:.0f} s; candidates: "
        + ", ".join(f"{c.name} ({c.note})" for c in CANDIDATES))  # fmt: skip

    def one(skip: list[str]) -> str | None:
        def on_row(row) -> None:
            rows.setdefault(row[0], row)
            say(f"{row[0]:10s} {row[1]:14s} {row[2]:8.2f} {row[3]:>15s}  {row[4]}")

        stop = run_child(MODULE, "all", artifacts, skip, deadline, say, on_row,
                         stall_s=lambda name: r9.TK_STALL_S if name in ("load", "TK") else r9.STALL_S,
                         on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True))  # fmt: skip
        if stop is None:
            return None
        name, what, how = stop
        say(f"{how} in {name} at {what or '-'}")
        return name if name in NAMES or name in ("check", "TK") else None

    with_reruns("tune_gatebwd10", deadline, say, one)
    base = {name: row[2] for name, row in rows.items()}
    say(f"\n{'candidate':10s} {'shape':14s} {'µs':>8s} {'passes':>15s} {'/TK':>6s} {'/ctl':>6s}  outputs ({r9.TOKENS} tokens)")
    for row in rows.values():
        say(r9._line(row, base))
    say(f"{time.perf_counter() - start:.0f} s")
    (out / "tune_gatebwd10.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:
        r9._part(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("time", "build"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(ARTIFACTS), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the sets go; time: the log's directory")
    parser.add_argument("--only", default="", help="build: these candidates (comma-separated) only")
    parser.add_argument("--budget", type=float, default=r9.TOTAL_S, help="time: the whole run's seconds")
    args = parser.parse_args(argv)
    if args.command == "build":
        args.out.mkdir(parents=True, exist_ok=True)
        r9.build(args.out, tuple(n for n in args.only.split(",") if n))
        return
    import torch

    if not torch.cuda.is_available():
        print("tune_gatebwd10: no GPU here; nothing timed (the build runs on a CPU: `build --out DIR`)")
        return
    time_candidates(args.artifacts, args.out, args.budget)


if __name__ == "__main__":
    main()
