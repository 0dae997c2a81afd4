"""Time candidates for mhc_sinkhorn_bwd (mhc 4, 20 repeats) beside the shipped kernel and TileKernels (issue 16, round 9).

The bench row `mhc_sinkhorn_bwd 8192x4x4 fp32, 20 repeats` took 18.50 µs on the H200 against TileKernels' 17.02 (session
11). What the lowering shows (sm_90a, nvcc 13.0, the same flags as the build; TileKernels' kernel lowered from
tile_kernels/mhc/sinkhorn_cuda.py at repeat 20, token_block_size 8, as its wrapper calls it):
- the same layout: one matrix element a lane, 128 threads (8 tokens) a block, every step's input kept in shared memory
  (TileKernels keeps the sums and adds eps on the way back, we keep sum + eps), the repeat unrolled;
- the same step: a row or column sum is 2 SHFL.BFLY + 2 FADD, the divisions IEEE (MUFU.RCP, 5 FFMA, FCHK and a branch
  to the slow path each); a step back is LDS x2, FMUL, 2 SHFL, 2 FADD, 2 divisions (~45 SASS instructions, the same
  in both), a step forward 2 SHFL, 2 FADD, 1 division, 2 STS. The 20-repeat path, ours / theirs: 2,272 / 2,457 SASS
  instructions (static, the slow paths' calls included), 154 / 162 SHFL, 115 / 118 MUFU, 115 / 117 FCHK, 75 / 79 LDS;
  one BAR.SYNC (theirs at the turn, ours after the first step back);
- registers 37 (ours, the loop path included) against 20: both far under any limit;
- shared memory 24,320 bytes a block (ours) against 25,600: with the 1 KB the SM reserves a block, 9 of ours fit an SM
  (233,472 bytes), 8 of theirs. 1024 blocks on 132 SMs are 7.76 an SM, so theirs land 7 or 8 an SM, ours may land 9
  where the scheduler fills one SM before its neighbours, and the busiest SM sets the kernel's time (9/8 = 1.125);
- ours is launched with programmatic dependent launch and lets the next call launch at its entry
  (griddepcontrol.launch_dependents), TileKernels' without it (its get_pdl() is False by default): back to back, the
  next call's blocks can take the ninth slot of each SM while this one runs;
- each IEEE division is a branch region of its own (FCHK, a branch to the slow path, BSSY/BSYNC), and ptxas moves no
  work across it: the divisions of a step run one after another (MUFU.RCP then 5 dependent FFMA, ~40 cycles each),
  and only other warps hide them. From the time, the SMSP issues ~0.4 instructions a cycle (~1,770 executed a warp,
  8 warps an SMSP, 18.5 µs): the kernel waits on latency (shuffles, divisions), not on issue.
Candidates (the mhc_mult=4 variant each; outputs must be ctl's bytes, which the run checks):
  ctl          the shipped kernel (its cubin must be prebuilt/sm90's: checked at build and run)
  nopdl        ctl's cubin launched without PDL (a diagnosis: no early launch of the next call)
  waitonly     ctl without launch_dependents at its entry (still launched with PDL: the next call launches at exit)
  pad          ctl with shared memory for 40 records (25,600 bytes, TileKernels' size): at most 8 blocks an SM
  pad.nopdl    pad's cubin launched without PDL
  rows32/64/128  a thread a matrix row (rows_build): row sums in registers, column sums by a reduce-scatter of 3
               shuffles (thread i ends with column i's sum, in the butterfly's order) and 4 indexed shuffles back, so a
               step back divides a line's sum once a thread (5 divisions for 4 elements, against 2 a lane); 784 SASS
               instructions a token on the 20-repeat path (static) against ctl's 1,136, 64 registers; 8, 16 or 32 tokens a block
               (24,320 / 48,640 / 97,280 bytes of shared memory; 2 warps an SMSP)
  rows64f, rows128f  rows64/128 with FAST_DIV_SOURCE's divisions: a thread's 4 divisions side by side, one
               reciprocal where they share a divisor, one range check and one fallback branch for the group (62 registers)
  rows64.nopdl rows64's cubin launched without PDL
  lanes2       ctl's layout (lanes_build) with 2 tokens a lane, their steps side by side (2 independent chains a warp,
               4 warps an SMSP), 16 tokens a 128-thread block, 48 registers; lanes2w64 at 64 threads (8 tokens)
  lanes1f      ctl's layout with FAST_DIV_SOURCE's divisions (a step back's two divisions by one reciprocal)
  lanes2f      lanes2 with them
Every candidate adds in the shipped order (tree_sum's butterfly order, the products rounded with __fmul_rn first), so
its outputs are ctl's bytes.

On a CPU with TileLang and nvcc (about 30 s a candidate: only the mhc_mult=4 variant, the bench row's):

    python -m bench.tuning.tune_sinkbwd9 build --out tune-artifacts/sinkbwd9 [--only rows64,pad]

then on the GPU, from the tree's root with PYTHONPATH set to it (tile_kernels importable):

    python -m bench.tuning.tune_sinkbwd9 --artifacts tune-artifacts/sinkbwd9 --out DIR [--budget S]

The run, in a child process watched by this one (bench/tuning/watch.py: a candidate silent for STALL_S seconds, a hung
kernel, is killed and the run goes on without it; everything stops at --budget seconds, 170 by default):
1. checks, each candidate through the op (tkaot.mhc.mhc_sinkhorn_bwd, the candidate's launcher put in the op's kernel
   table) at 1, 3, 127, 4097 and 8192 tokens, mhc 4, repeat 1, 7, 20 and 21 (past the shared records), outputs
   poisoned with NaN first: every byte against ctl's (and no NaN left), and ctl's (so every candidate's) against
   TileKernels' (its kernel compiled for each repeat: every token count at 20; 127 and 8192 tokens at repeat 7 and 1
   while the run is under TK_CHECK_S seconds);
2. times (8192 tokens, repeat 20, CUDA-graph replay over 64 rotating input sets (96 MB, beyond L2), bench.timing)
   each candidate and TileKernels twice, the second pass in the reverse order, the outputs' bytes checked again.
Prints each row as it is timed and a table last (candidate, µs (the passes' mean), both passes, ratio to TileKernels,
ratio to ctl, verdict); writes DIR/tune_sinkbwd9.log.
"""

import argparse
import contextlib
import functools
import hashlib
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.tuning.watch import ROW, Log, child_start, run_child, started, with_reruns

ARTIFACTS = "tune-artifacts/sinkbwd9"
KERNEL = "mhc_sinkhorn_bwd"
MODULE = "kernels_src.mhc.sinkhorn_bwd"
KEY = "mhc_mult=4"
MHC, REPEAT, EPS = 4, 20, 1e-6
CONTROL = "ctl"


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    body: str  # "shipped" (kernels_src/mhc/sinkhorn_bwd.py, patched values) or "rows" (this file's body)
    threads: int = 128
    shared_records: int = 38  # shipped body: SHARED_RECORDS
    per_lane: int = 1  # lanes body: tokens a lane
    fast_div: bool = False  # rows and lanes bodies: FAST_DIV_SOURCE's divisions
    artifacts: str = ""  # a launch-only candidate: another candidate's artifact set
    pdl: bool | None = None  # None: as the manifest says (the op's launch)
    trigger: bool = True  # shipped body: griddepcontrol.launch_dependents at entry (False: none, so at exit)
    note: str = ""


CANDIDATES = (
    Candidate(CONTROL, "shipped", note="the shipped kernel (cubin = prebuilt/sm90's)"),
    Candidate("nopdl", "shipped", artifacts=CONTROL, pdl=False, note="ctl's cubin launched without PDL"),
    Candidate("waitonly", "shipped", trigger=False, note="ctl without launch_dependents at entry: the next call launches as this one ends"),
    Candidate("pad.nopdl", "shipped", shared_records=40, artifacts="pad", pdl=False, note="pad's cubin launched without PDL"),
    Candidate("pad", "shipped", shared_records=40, note="shared memory for 40 records: 25,600 bytes, at most 8 blocks an SM"),
    Candidate("rows32", "rows", threads=32, note="a thread a matrix row, 8 tokens a block"),
    Candidate("rows64", "rows", threads=64, note="a thread a matrix row, 16 tokens a block"),
    Candidate("rows128", "rows", threads=128, note="a thread a matrix row, 32 tokens a block"),
    Candidate("rows64f", "rows", threads=64, fast_div=True, note="rows64, a thread's divisions without a branch each"),
    Candidate("rows128f", "rows", threads=128, fast_div=True, note="rows128, a thread's divisions without a branch each"),
    Candidate("rows64.nopdl", "rows", threads=64, artifacts="rows64", pdl=False, note="rows64 launched without PDL"),
    Candidate("lanes2", "lanes", threads=128, per_lane=2, note="an element a lane of 2 tokens, steps side by side, 16 tokens a block"),
    Candidate("lanes1f", "lanes", threads=128, per_lane=1, fast_div=True, note="ctl's layout, divisions without a branch each"),
    Candidate("lanes2f", "lanes", threads=128, per_lane=2, fast_div=True, note="lanes2, divisions without a branch each"),
    Candidate("lanes2w64", "lanes", threads=64, per_lane=2, note="lanes2 at 64 threads a block (8 tokens)"),
)  # fmt: skip
NAMES = tuple(c.name for c in CANDIDATES)


# ---- the rows body (a candidate; mhc 4)

# IEEE division's fast path as nvcc lowers `x / d` (the SASS of every division here: MUFU.RCP, then
# e = fma(-d, r, 1), y = fma(r, e, r), q = fma(x, y, 0), rem = fma(-d, q, x), q = fma(y, rem, q), with FCHK sending
# operands it cannot take to a slow path), here without the branch a division: the range check is ours, meant to be
# stricter than FCHK's, whose rule is not documented (both operands' magnitudes in [2**-40, 2**40): no zero, denormal,
# infinity or NaN, quotients far from overflow and underflow), and where it fails for any of a group's operands the
# group is divided again by `/`. So the quotients should be `/`'s bits (the run checks them against ctl's), and a
# thread's independent divisions overlap (each `/` is a branch region of its own).
FAST_DIV_SOURCE = """
__device__ __forceinline__ float tkaot_tune_rcp(float d) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    return __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
}
__device__ __forceinline__ float tkaot_tune_quotient(float x, float d, float y) {
    float q = __fmaf_rn(x, y, 0.0f);
    return __fmaf_rn(y, __fmaf_rn(-d, q, x), q);
}
__device__ __forceinline__ int tkaot_tune_in_range(float v) {
    float a = fabsf(v);
    return (a >= 0x1p-40f) & (a < 0x1p40f);
}
"""


def rows_build(threads: int, fast_div: bool = False, unrolled_repeat: int = REPEAT):
    """mhc_sinkhorn_bwd at mhc 4 with one matrix row a thread: thread i of a token's 4 (adjacent lanes) holds row i's 4
    elements. A row sum is tree_sum in registers; a column sum a butterfly over the token's lanes (xor 2, then 1),
    done as a reduce-scatter: thread i ends with column i's sum, in the butterfly's order, and the column values a
    thread needs for its 4 elements come back by 4 indexed shuffles. Records as the shipped kernel's: each step's
    input (4 elements a thread) and its line's denominator (sum + eps) in shared memory for up to 20 repeats, later
    ones in `scratch`; `repeat` == unrolled_repeat runs an unrolled copy. fast_div: a thread's 4 divisions side by side
    without a branch each (FAST_DIV_SOURCE)."""
    import tilelang.language as T

    from kernels_src.mhc.common import WARP, tree_sum
    from kernels_src.pdl import kernel_entry
    from tkaot._mhc.kernels import sinkhorn_record_row

    n, mm = MHC, MHC * MHC
    row_words = sinkhorn_record_row(n)
    per_block = threads // n
    shared_records = 38
    assert 2 * (unrolled_repeat - 1) <= shared_records
    num_tokens = T.dynamic("num_tokens")
    repeat = T.dynamic("repeat")

    def mul(a, b):
        return T.call_extern("float32", "__fmul_rn", a, b)

    @T.macro
    def divide(out, num, den, same: bool, q, y, ok):
        """out[k] = num(k) / den(k) for k < 4 (den(0) for every k if `same`), IEEE's bits; with fast_div the 4 quotients
        from FAST_DIV_SOURCE's fast path, all again by IEEE division where any operand is outside its range."""
        if not fast_div:
            for k in T.unroll(n):
                q[k] = num(k) / den(k)
        else:
            ok[0] = 1
            for k in T.unroll(1 if same else n):
                y[k] = T.call_extern("float32", "tkaot_tune_rcp", den(k))
                ok[0] = ok[0] & T.call_extern("int32", "tkaot_tune_in_range", den(k))
            for k in T.unroll(n):
                ok[0] = ok[0] & T.call_extern("int32", "tkaot_tune_in_range", num(k))
                q[k] = T.call_extern("float32", "tkaot_tune_quotient", num(k), den(k), y[0] if same else y[k])
            if ok[0] == 0:
                for k in T.unroll(n):
                    q[k] = num(k) / den(k)
        for k in T.unroll(n):
            out[k] = q[k]

    @T.macro
    def column_sum(out, v, s1, i):
        """out[0] = the sum over the token's rows of column i (the thread's own index) of v, in the butterfly's order
        ((v_i + v_i^2) + (v_i^1 + v_i^3), the same bits in every order of the outer pairs)."""
        high = (i >> 1) & 1
        for j in T.unroll(2):  # lanes 2 apart swap the column pair the other keeps
            s1[j] = T.if_then_else(high == 0, v[j], v[2 + j]) + T.shfl_xor(T.if_then_else(high == 0, v[2 + j], v[j]), 2)
        low = i & 1
        out[0] = T.if_then_else(low == 0, s1[0], s1[1]) + T.shfl_xor(T.if_then_else(low == 0, s1[1], s1[0]), 1)

    @T.macro
    def gather(out, value, first):
        """out[k] = value on the token's lane k (first + k)."""
        for k in T.unroll(n):
            out[k] = T.shfl_sync(value, first + k)

    @T.macro
    def keep(records, denoms, scratch, m, d, r, half: int, tid, i, token, live):
        """m (this thread's row of the matrix entering step r's row (half 0) or column (1) normalisation) and d (the
        denominator of its row, or of column i) as record (r, half), r >= 1; in scratch every thread writes its
        line's denominator at word 16 + i."""
        if 2 * r - 2 + half < shared_records:
            for k in T.vectorized(n):
                records[2 * r - 2 + half, tid, k] = m[k]
            denoms[2 * r - 2 + half, tid] = d[0]
        elif live:
            for k in T.vectorized(n):
                scratch[r, half, token, i * n + k] = m[k]
            scratch[r, half, token, mm + i] = d[0]

    @T.macro
    def fetch(records, denoms, scratch, m, dl, d, r, half: int, tid, i, slot, token, live):
        """Record (r, half) back: m, and dl the denominators (a row's in dl[0]; the token's 4 columns' in dl[0:4], and
        column i's in d[0])."""
        for k in T.unroll(n):
            m[k] = T.float32(0)
            dl[k] = T.float32(1)
        d[0] = T.float32(1)
        if 2 * r - 2 + half < shared_records:
            for k in T.vectorized(n):
                m[k] = records[2 * r - 2 + half, tid, k]
            if half == 0:
                dl[0] = denoms[2 * r - 2 + half, tid]
            else:
                for k in T.vectorized(n):
                    dl[k] = denoms[2 * r - 2 + half, slot * n + k]
                d[0] = denoms[2 * r - 2 + half, tid]
        elif live:
            for k in T.vectorized(n):
                m[k] = scratch[r, half, token, i * n + k]
            if half == 0:
                dl[0] = scratch[r, half, token, mm + i]
            else:
                for k in T.vectorized(n):
                    dl[k] = scratch[r, half, token, mm + k]
                d[0] = scratch[r, half, token, mm + i]

    def loop(kind):
        def steps(start, stop=None):
            return T.unroll(start, stop, explicit=True) if kind == "unrolled" else T.serial(start, stop)

        return steps

    @T.macro
    def walk(steps, repeat, records, denoms, scratch, m, g, p, d0, dq0, dl, d, t, s1, prod, q, y, ok, tid, i, slot, first,
             token, live, eps):  # fmt: skip
        """The forward's replay from the first column normalisation's output in m, then the steps back to g at the
        softmax's output."""
        for r in steps(1, repeat):
            d[0] = tree_sum([m[k] for k in range(n)]) + eps
            keep(records, denoms, scratch, m, d, r, 0, tid, i, token, live)
            divide(m, lambda k: m[k], lambda k: d[0], True, q, y, ok)
            column_sum(t, m, s1, i)
            d[0] = t[0] + eps
            gather(dl, d[0], first)
            if 2 * r - 1 < shared_records:
                keep(records, denoms, scratch, m, d, r, 1, tid, i, token, live)
            elif live:  # scratch: every thread keeps its token's 4 column denominators (read back by itself alone)
                for k in T.vectorized(n):
                    scratch[r, 1, token, mm + k] = dl[k]
                for k in T.vectorized(n):
                    scratch[r, 1, token, i * n + k] = m[k]
            divide(m, lambda k: m[k], lambda k: dl[k], False, q, y, ok)
        for back in steps(repeat):
            r = repeat - 1 - back
            if back == repeat - 1:
                for k in T.unroll(n):
                    m[k] = p[k] + eps  # the first column normalisation's input
                    dl[k] = d0[k]
                d[0] = dq0[0]
            else:
                fetch(records, denoms, scratch, m, dl, d, r, 1, tid, i, slot, token, live)
            for k in T.unroll(n):
                prod[k] = mul(g[k], m[k])
            column_sum(t, prod, s1, i)
            t[0] = t[0] / d[0]
            gather(s1, t[0], first)
            divide(g, lambda k: g[k] - s1[k], lambda k: dl[k], False, q, y, ok)
            if back < repeat - 1:
                fetch(records, denoms, scratch, m, dl, d, r, 0, tid, i, slot, token, live)
                for k in T.unroll(n):
                    prod[k] = mul(g[k], m[k])
                t[0] = tree_sum([prod[k] for k in range(n)]) / dl[0]
                divide(g, lambda k: g[k] - t[0], lambda k: dl[0], True, q, y, ok)

    @T.prim_func
    def sinkhorn_bwd(
        grad_output: T.Tensor[(num_tokens, mm), T.float32],
        x: T.Tensor[(num_tokens, mm), T.float32],
        grad_input: T.Tensor[(num_tokens, mm), T.float32],
        scratch: T.Tensor[(repeat, 2, num_tokens, row_words), T.float32],
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, per_block), threads=threads) as block:
            kernel_entry(FAST_DIV_SOURCE if fast_div else "")
            tid = T.get_thread_binding()
            i = tid % n  # the thread's row of its token's matrix
            slot = tid // n
            token = block * per_block + slot
            live = token < num_tokens
            first = tid % WARP - i  # the lane of the token's row 0
            records = T.alloc_shared((shared_records, threads, n), T.float32)
            denoms = T.alloc_shared((shared_records, threads), T.float32)
            m = T.alloc_local((n,), T.float32)
            g = T.alloc_local((n,), T.float32)
            p = T.alloc_local((n,), T.float32)  # the softmax output
            d0 = T.alloc_local((n,), T.float32)  # the first column normalisation's denominators
            dq0 = T.alloc_local((1,), T.float32)  # and column i's
            dl = T.alloc_local((n,), T.float32)
            d = T.alloc_local((1,), T.float32)
            t = T.alloc_local((1,), T.float32)
            s1 = T.alloc_local((n,), T.float32)
            prod = T.alloc_local((n,), T.float32)
            q = T.alloc_local((n,), T.float32)
            y = T.alloc_local((n,), T.float32)
            ok = T.alloc_local((1,), T.int32)

            for k in T.unroll(n):
                m[k] = T.float32(0)
                g[k] = T.float32(0)
            if live:  # rows past the tokens work on zeros (every lane takes part in the shuffles)
                for k in T.vectorized(n):
                    m[k] = x[token, i * n + k]
                for k in T.vectorized(n):
                    g[k] = grad_output[token, i * n + k]
            t[0] = T.max(T.max(m[0], m[2]), T.max(m[1], m[3]))
            for k in T.unroll(n):
                m[k] = T.exp(m[k] - t[0])
            t[0] = tree_sum([m[k] for k in range(n)])
            divide(p, lambda k: m[k], lambda k: t[0], True, q, y, ok)
            for k in T.unroll(n):
                m[k] = p[k] + eps
            column_sum(t, m, s1, i)
            dq0[0] = t[0] + eps
            gather(d0, dq0[0], first)
            divide(m, lambda k: m[k], lambda k: d0[k], False, q, y, ok)
            if unrolled_repeat and repeat == unrolled_repeat:
                walk(loop("unrolled"), unrolled_repeat, records, denoms, scratch, m, g, p, d0, dq0, dl, d, t, s1, prod, q, y,
                     ok, tid, i, slot, first, token, live, eps)  # fmt: skip
            else:
                walk(loop("serial"), repeat, records, denoms, scratch, m, g, p, d0, dq0, dl, d, t, s1, prod, q, y, ok, tid, i,
                     slot, first, token, live, eps)  # fmt: skip
            for k in T.unroll(n):
                prod[k] = mul(g[k], p[k])
            t[0] = tree_sum([prod[k] for k in range(n)])
            for k in T.unroll(n):
                g[k] = (g[k] - t[0]) * p[k]
            if live:
                for k in T.vectorized(n):
                    grad_input[token, i * n + k] = g[k]

    return sinkhorn_bwd


def lanes_build(threads: int, per_lane: int, fast_div: bool = False, unrolled_repeat: int = REPEAT):
    """The shipped layout (one matrix element a lane, kernels_src/mhc/sinkhorn_bwd.py) with `per_lane` tokens a lane: lane
    e of a 16-lane group holds element e of tokens slot, slot + groups, ... of the block, their steps side by side (the
    same instructions, independent chains: a warp issues one token's work while the other's shuffle or division is in
    flight). Records in shared memory as the shipped kernel's, (record, token of the lane, lane); the same sums and
    divisions in the same order, token by token. fast_div: the divisions of a step by FAST_DIV_SOURCE's fast path, the
    lane's tokens side by side, the two of a step back by one reciprocal."""
    import tilelang.language as T

    from kernels_src.mhc.common import WARP
    from kernels_src.pdl import kernel_entry
    from tkaot._mhc.kernels import sinkhorn_record_row

    n, mm, u_n = MHC, MHC * MHC, per_lane
    row_words = sinkhorn_record_row(n)
    groups = threads // mm  # token groups a block
    per_block = groups * u_n
    shared_records = 38
    assert 2 * (unrolled_repeat - 1) <= shared_records
    num_tokens = T.dynamic("num_tokens")
    repeat = T.dynamic("repeat")

    def mul(a, b):
        return T.call_extern("float32", "__fmul_rn", a, b)

    @T.macro
    def line_sum(out, value, stride: int):
        """out[u] = the butterfly sum of value[u] over the lane's row (stride 1) or column (stride 4), each token's."""
        for u in T.unroll(u_n):
            out[u] = value[u]
        for s in T.unroll(2):
            for u in T.unroll(u_n):
                out[u] = out[u] + T.shfl_xor(out[u], (2 >> s) * stride)

    @T.macro
    def keep(records, denoms, scratch, m, d, r, half: int, tid, slot, line, e, token, live):
        if 2 * r - 2 + half < shared_records:
            for u in T.unroll(u_n):
                records[2 * r - 2 + half, u, tid] = m[u]
                denoms[2 * r - 2 + half, u, slot, line] = d[u]
        else:
            for u in T.unroll(u_n):
                if live[u]:
                    scratch[r, half, token[u], e] = m[u]
                    scratch[r, half, token[u], mm + line] = d[u]

    @T.macro
    def fetch(records, denoms, scratch, m, d, r, half: int, tid, slot, line, e, token, live):
        for u in T.unroll(u_n):
            m[u] = T.float32(0)
            d[u] = T.float32(1)
        if 2 * r - 2 + half < shared_records:
            for u in T.unroll(u_n):
                m[u] = records[2 * r - 2 + half, u, tid]
                d[u] = denoms[2 * r - 2 + half, u, slot, line]
        else:
            for u in T.unroll(u_n):
                if live[u]:
                    m[u] = scratch[r, half, token[u], e]
                    d[u] = scratch[r, half, token[u], mm + line]

    @T.macro
    def back_through(g, m, d, t, prod, stride: int, q, q2, y, ok):
        for u in T.unroll(u_n):
            prod[u] = mul(g[u], m[u])
        line_sum(t, prod, stride)
        if not fast_div:
            for u in T.unroll(u_n):
                t[u] = t[u] / d[u]
                g[u] = (g[u] - t[u]) / d[u]
        else:
            ok[0] = 1
            for u in T.unroll(u_n):
                y[u] = T.call_extern("float32", "tkaot_tune_rcp", d[u])
                ok[0] = ok[0] & T.call_extern("int32", "tkaot_tune_in_range", d[u]) & T.call_extern("int32", "tkaot_tune_in_range", t[u])
                q[u] = T.call_extern("float32", "tkaot_tune_quotient", t[u], d[u], y[u])
            for u in T.unroll(u_n):
                ok[0] = ok[0] & T.call_extern("int32", "tkaot_tune_in_range", g[u] - q[u])
                q2[u] = T.call_extern("float32", "tkaot_tune_quotient", g[u] - q[u], d[u], y[u])
            if ok[0] == 0:
                for u in T.unroll(u_n):
                    q[u] = t[u] / d[u]
                    q2[u] = (g[u] - q[u]) / d[u]
            for u in T.unroll(u_n):
                t[u] = q[u]
                g[u] = q2[u]

    @T.macro
    def divide(m, d, q, y, ok):
        """m[u] = m[u] / d[u], IEEE's bits (fast_div: FAST_DIV_SOURCE's fast path, `/` again where out of its range)."""
        if not fast_div:
            for u in T.unroll(u_n):
                m[u] = m[u] / d[u]
        else:
            ok[0] = 1
            for u in T.unroll(u_n):
                y[u] = T.call_extern("float32", "tkaot_tune_rcp", d[u])
                ok[0] = ok[0] & T.call_extern("int32", "tkaot_tune_in_range", d[u]) & T.call_extern("int32", "tkaot_tune_in_range", m[u])
                q[u] = T.call_extern("float32", "tkaot_tune_quotient", m[u], d[u], y[u])
            if ok[0] == 0:
                for u in T.unroll(u_n):
                    q[u] = m[u] / d[u]
            for u in T.unroll(u_n):
                m[u] = q[u]

    def loop(kind):
        def steps(start, stop=None):
            return T.unroll(start, stop, explicit=True) if kind == "unrolled" else T.serial(start, stop)

        return steps

    @T.macro
    def walk(steps, repeat, records, denoms, scratch, m, g, p, d0, d, t, prod, q, q2, y, ok, tid, slot, e, token, live, eps):
        for r in steps(1, repeat):
            line_sum(d, m, 1)
            for u in T.unroll(u_n):
                d[u] = d[u] + eps
            keep(records, denoms, scratch, m, d, r, 0, tid, slot, e // n, e, token, live)
            divide(m, d, q, y, ok)
            line_sum(d, m, n)
            for u in T.unroll(u_n):
                d[u] = d[u] + eps
            keep(records, denoms, scratch, m, d, r, 1, tid, slot, e % n, e, token, live)
            divide(m, d, q, y, ok)
        for back in steps(repeat):
            if back == repeat - 1:
                for u in T.unroll(u_n):
                    m[u] = p[u] + eps
                    d[u] = d0[u]
            else:
                fetch(records, denoms, scratch, m, d, repeat - 1 - back, 1, tid, slot, e % n, e, token, live)
            back_through(g, m, d, t, prod, n, q, q2, y, ok)
            if back < repeat - 1:
                fetch(records, denoms, scratch, m, d, repeat - 1 - back, 0, tid, slot, e // n, e, token, live)
                back_through(g, m, d, t, prod, 1, q, q2, y, ok)

    @T.prim_func
    def sinkhorn_bwd(
        grad_output: T.Tensor[(num_tokens, mm), T.float32],
        x: T.Tensor[(num_tokens, mm), T.float32],
        grad_input: T.Tensor[(num_tokens, mm), T.float32],
        scratch: T.Tensor[(repeat, 2, num_tokens, row_words), T.float32],
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, per_block), threads=threads) as block:
            kernel_entry(FAST_DIV_SOURCE if fast_div else "")
            tid = T.get_thread_binding()
            e = tid % mm  # the element (e // 4, e % 4) of each of the lane's tokens
            slot = tid // mm
            records = T.alloc_shared((shared_records, u_n, threads), T.float32)
            denoms = T.alloc_shared((shared_records, u_n, groups, n), T.float32)
            token = T.alloc_local((u_n,), T.int32)
            live = T.alloc_local((u_n,), T.bool)
            m = T.alloc_local((u_n,), T.float32)
            g = T.alloc_local((u_n,), T.float32)
            p = T.alloc_local((u_n,), T.float32)
            d0 = T.alloc_local((u_n,), T.float32)
            d = T.alloc_local((u_n,), T.float32)
            t = T.alloc_local((u_n,), T.float32)
            prod = T.alloc_local((u_n,), T.float32)
            q = T.alloc_local((u_n,), T.float32)
            q2 = T.alloc_local((u_n,), T.float32)
            y = T.alloc_local((u_n,), T.float32)
            ok = T.alloc_local((1,), T.int32)
            for u in T.unroll(u_n):
                token[u] = block * per_block + u * groups + slot
                live[u] = token[u] < num_tokens
                m[u] = T.float32(0)
                g[u] = T.float32(0)
                if live[u]:
                    m[u] = x[token[u], e]
                    g[u] = grad_output[token[u], e]
            for u in T.unroll(u_n):
                t[u] = m[u]
            for s in T.unroll(2):
                for u in T.unroll(u_n):
                    t[u] = T.max(t[u], T.shfl_xor(t[u], 2 >> s))
            for u in T.unroll(u_n):
                m[u] = T.exp(m[u] - t[u])
            line_sum(t, m, 1)
            for u in T.unroll(u_n):
                p[u] = m[u] / t[u]
                m[u] = p[u] + eps
            line_sum(t, m, n)
            for u in T.unroll(u_n):
                d0[u] = t[u] + eps
                m[u] = m[u] / d0[u]
            if unrolled_repeat and repeat == unrolled_repeat:
                walk(loop("unrolled"), unrolled_repeat, records, denoms, scratch, m, g, p, d0, d, t, prod, q, q2, y, ok, tid, slot,
                     e, token, live, eps)  # fmt: skip
            else:
                walk(
                    loop("serial"), repeat, records, denoms, scratch, m, g, p, d0, d, t, prod, q, q2, y, ok, tid, slot, e, token, live, eps
                )
            for u in T.unroll(u_n):
                prod[u] = mul(g[u], p[u])
            line_sum(t, prod, 1)
            for u in T.unroll(u_n):
                g[u] = (g[u] - t[u]) * p[u]
                if live[u]:
                    grad_input[token[u], e] = g[u]

    assert WARP % mm == 0
    return sinkhorn_bwd


# ---- build (CPU)


@contextlib.contextmanager
def _patched(c: Candidate):
    """kernels_src.mhc.sinkhorn_bwd building candidate c."""
    import importlib

    module = importlib.import_module(MODULE)
    saved = {
        "build": module.build, "SHARED_RECORDS": module.SHARED_RECORDS, "LANE_THREADS": module.LANE_THREADS,
        "kernel_entry": module.kernel_entry,
    }  # fmt: skip
    try:
        if c.body == "rows":
            module.build = lambda mhc_mult, **kw: rows_build(c.threads, c.fast_div)
        elif c.body == "lanes":
            module.build = lambda mhc_mult, **kw: lanes_build(c.threads, c.per_lane, c.fast_div)
        else:
            module.SHARED_RECORDS, module.LANE_THREADS = c.shared_records, c.threads
            if not c.trigger:
                module.kernel_entry = _wait_only()
        yield
    finally:
        for a, v in saved.items():
            setattr(module, a, v)


def _wait_only():
    """kernels_src.pdl.kernel_entry without griddepcontrol.launch_dependents: the kernel behind launches at this one's exit."""
    import tilelang.language as T

    from kernels_src.pdl import PDL_SOURCE

    @T.macro
    def entry(extra_source: str = ""):
        T.import_source(PDL_SOURCE + extra_source)
        T.call_extern("int32", "tkaot_pdl_wait")

    return entry


def _ctl_identical(artifacts: Path, root: Path) -> str:
    """Whether ctl's cubin is prebuilt/sm90's (the manifest's hash and the file's bytes)."""
    shipped = {
        e["key"]: e["cubin"] for e in json.loads((root / "prebuilt/sm90/manifest.json").read_text())["variants"] if e["kernel"] == KERNEL
    }
    mine = {e["key"]: e["cubin"] for e in json.loads((artifacts / CONTROL / "manifest.json").read_text())["variants"]}
    digest = shipped.get(KEY)
    path = artifacts / CONTROL / "cubins" / f"{mine.get(KEY)}.cubin"
    data = path.read_bytes() if path.is_file() else b""
    prebuilt = root / "prebuilt/sm90/cubins" / f"{digest}.cubin"
    same = (
        mine.get(KEY) == digest and hashlib.sha256(data).hexdigest() == digest and (not prebuilt.is_file() or prebuilt.read_bytes() == data)
    )
    return f"ctl cubin ({KEY}) {'identical to' if same else 'DIFFERS from'} prebuilt/sm90's ({digest[:12] if digest else 'not in it'})"


def build(out: Path, only: tuple[str, ...] = ()) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    # A cache of each candidate's own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-sinkbwd9-cache-") as cache:
        for c in CANDIDATES:
            if c.artifacts or (only and c.name not in only):
                continue
            t = time.perf_counter()
            try:
                with _patched(c):
                    build_variants(
                        [Variant.make(KERNEL, {"mhc_mult": MHC})], out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name)
                    )
            except Exception as exc:  # a candidate that fails to build is reported, not fatal
                print(f"{c.name:8s} NOT BUILT: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
                continue
            entry = json.loads((out / c.name / "manifest.json").read_text())["variants"][0]
            print(f"{c.name:8s} built in {time.perf_counter() - t:5.1f} s: block {entry['launch']['block'][0]}, "
                  f"{entry['launch']['smem']} B shared  ({c.note})", flush=True)  # fmt: skip
    if (out / CONTROL / "manifest.json").is_file():
        print(_ctl_identical(out, Path.cwd()), flush=True)
    print(f"{out}: {time.perf_counter() - t0:.0f} s", flush=True)


# ---- check and time (GPU), in the child

CHECK_TOKENS = (1, 3, 127, 4097, 8192)
CHECK_REPEATS = (20, 7, 1, 21)  # the bench row's first
TK_CHECKS = {20: CHECK_TOKENS, 7: (127, 8192), 1: (127, 8192)}  # (repeat: tokens) also compared with TileKernels
TK_CHECK_S = 75  # TileKernels compiles a kernel a repeat: its checks at repeat 7 and 1 only within this many seconds
TOKENS, SETS = 8192, 64  # 64 sets of 1.5 MB: one pass 96 MB, beyond the 50 MB L2 (bench/run.py's count)


def _launchers(artifacts: Path, say) -> dict:
    """{name: Kernel} for every candidate whose set loads."""
    from tkaot._kernel import Kernel

    kernels = {}
    for c in CANDIDATES:
        set_dir = artifacts / (c.artifacts or c.name)
        try:
            e = next(e for e in json.loads((set_dir / "manifest.json").read_text())["variants"] if e["key"] == KEY)
            kernels[c.name] = Kernel(
                e["kernel"], e["key"], e["launch"], set_dir / "cubins" / f"{e['cubin']}.cubin", e["cubin"], set_dir.name
            )
        except Exception as exc:
            say(f"{c.name}: not loaded ({type(exc).__name__}: {exc})")
    return kernels


def _bind(kernel, pdl: bool | None):
    """The kernel's launcher for the op (pdl None: as its manifest says, as the op launches it)."""
    from tkaot._mhc import sinkhorn as op

    return kernel.bind(op._BWD.args, pdl=pdl)


@contextlib.contextmanager
def _serving(launcher):
    """The op's launcher table with `launcher` in it for mhc 4 on the current device."""
    import torch

    from tkaot._mhc import sinkhorn as op

    table = op._BWD
    key = (torch.cuda.current_device(), MHC)
    saved = table.cache.get(key)
    table.cache[key] = launcher
    try:
        yield
    finally:
        if saved is None:
            table.cache.pop(key, None)
        else:
            table.cache[key] = saved


def _inputs(tokens: int, seed: int) -> dict:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, MHC, MHC, generator=gen, device="cuda")
    g = torch.randn(tokens, MHC, MHC, generator=gen, device="cuda")
    return {"x": x, "g": g, "out": torch.full((tokens, MHC, MHC), math.nan, device="cuda")}


def _same(a, b) -> bool:
    import torch

    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


class Run:
    """The child's state: the candidates' launchers and TileKernels (if it imports)."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.say = say
        pdl = {c.name: c.pdl for c in CANDIDATES}
        self.kernels = {name: _bind(k, pdl[name]) for name, k in _launchers(artifacts, say).items() if name not in skip}
        self.start = time.perf_counter()
        tk = None
        if "TK" in skip:
            say("TileKernels skipped (it hung before): no TK columns")
        else:
            try:
                import tile_kernels as tk
            except ImportError as exc:
                say(f"TileKernels not importable ({exc}): no TK columns")
        self.tk = tk

    def ours(self, name: str, a: dict, repeat: int):
        import torch

        import tkaot

        a["out"].fill_(math.nan)
        with _serving(self.kernels[name]):
            tkaot.mhc.mhc_sinkhorn_bwd(a["g"], a["x"], a["out"], repeat, EPS)
        out = a["out"].clone()
        torch.cuda.synchronize()
        return out

    def theirs(self, a: dict, repeat: int):
        a["out"].fill_(math.nan)
        self.tk.mhc.mhc_sinkhorn_bwd(a["g"], a["x"], a["out"], repeat, EPS)
        return a["out"].clone()


def check(run: Run) -> None:
    """Phase 1: every candidate's bytes against ctl's, ctl's against TileKernels' (TK_CHECKS)."""
    import torch

    say, bad, done = run.say, 0, 0
    failed = dict.fromkeys(run.kernels, 0)  # outputs that differ from ctl's or keep a NaN, a candidate
    for repeat in CHECK_REPEATS:
        for tokens in CHECK_TOKENS:
            a = _inputs(tokens, seed=tokens * 31 + repeat)
            outs = {}
            for name in run.kernels:  # each announced: a candidate that hangs or faults is named, and rerun without
                started(name, f"check: {tokens} tokens, repeat {repeat}")
                outs[name] = run.ours(name, a, repeat)
            want = outs.get(CONTROL)
            for name, got in outs.items():
                done += 1
                if want is None:
                    break
                if name != CONTROL and not _same(got, want):
                    bad += 1
                    failed[name] += 1
                    say(f"check {name} {tokens} tokens repeat {repeat}: DIFFERS from ctl ({int((got != want).sum())} of {got.numel()})")
                if got.isnan().any():
                    bad += 1
                    failed[name] += 1
                    say(f"check {name} {tokens} tokens repeat {repeat}: NaN left (an element not written)")
            tk_time = repeat == REPEAT or time.perf_counter() - run.start < TK_CHECK_S
            if run.tk is not None and want is not None and tokens in TK_CHECKS.get(repeat, ()) and tk_time:
                started("TK", f"{tokens} tokens, repeat {repeat}")
                theirs = run.theirs(a, repeat)
                torch.cuda.synchronize()
                done += 1
                if not _same(want, theirs):
                    bad += 1
                    say(f"check ctl {tokens} tokens repeat {repeat}: DIFFERS from TileKernels ({int((want != theirs).sum())} elements)")
            del a, outs
    cases = len(CHECK_REPEATS) * len(CHECK_TOKENS)
    for name, n in failed.items():
        say(f"check {name:12s} {'every output = ctl' if not n else f'{n} of {cases} outputs WRONG'} ({cases} cases)")
    say(f"checks: {done} outputs, {bad} mismatches (candidates against ctl, ctl against TileKernels)")


def measure(run: Run, emit) -> None:
    """Phase 2: each candidate and TileKernels timed twice at 8192 tokens, repeat 20, the second pass reversed; emit a
    row (name, shape, µs, passes, verdict) for each."""
    import torch

    from bench.timing import device_us

    shape = f"{TOKENS}x{MHC}x{MHC}, {REPEAT} repeats"
    inputs = [_inputs(TOKENS, seed=1000 + s) for s in range(SETS)]
    calls = {}
    for name, launcher in run.kernels.items():

        def call(a, launcher=launcher):
            import tkaot

            with _serving(launcher):
                tkaot.mhc.mhc_sinkhorn_bwd(a["g"], a["x"], a["out"], REPEAT, EPS)

        calls[name] = call
    if run.tk is not None:
        calls["TK"] = lambda a: run.tk.mhc.mhc_sinkhorn_bwd(a["g"], a["x"], a["out"], REPEAT, EPS)
    outs = {}
    for label, call in calls.items():
        started(label, shape)
        inputs[0]["out"].fill_(math.nan)
        call(inputs[0])
        torch.cuda.synchronize()
        outs[label] = inputs[0]["out"].clone()
    times: dict = {label: [] for label in calls}
    for order in (list(calls), list(reversed(calls))):
        for label in order:
            started(label, shape)
            times[label].append(device_us(calls[label], inputs)[0])
    for label, (a, b) in times.items():
        verdicts = []
        if CONTROL in outs and label != CONTROL:
            verdicts.append("=ctl" if _same(outs[label], outs[CONTROL]) else "DIFFERS from ctl")
        if "TK" in outs and label != "TK":
            verdicts.append("=TK" if _same(outs[label], outs["TK"]) else "DIFFERS from TK")
        emit((label, shape, (a + b) / 2, f"{a:.2f}/{b:.2f}", " ".join(verdicts) or "-"))


def _part(argv) -> None:
    """Child: the checks, then the timed rows, each call announced (START name|what) first, each row as ROW json."""
    _, artifacts, skip = child_start(argv)
    say = functools.partial(print, flush=True)
    run = Run(artifacts, skip, say)
    if CONTROL in run.kernels and run.kernels[CONTROL] is not None:
        say(_ctl_identical(artifacts, Path.cwd()))
    if "check" not in skip:
        check(run)
    measure(run, lambda row: print(ROW + json.dumps(row), flush=True))


# ---- the run (GPU): the phases in a watched child

TOTAL_S = 170  # the whole run's budget (--budget S)
STALL_S = 20  # a candidate silent this long is taken as hung (TileKernels' first calls compile: TK_STALL_S)
TK_STALL_S = 120


def _line(row, base: dict) -> str:
    name, shape, us, passes, verdict = row
    tk, ctl = base.get("TK"), base.get(CONTROL)
    to_tk = f"{us / tk:6.3f}" if tk and not math.isnan(us) else f"{'-':>6s}"
    to_ctl = f"{us / ctl:6.3f}" if ctl and not math.isnan(us) else f"{'-':>6s}"
    return f"{name:10s} {shape:24s} {us:8.2f} {passes:>13s} {to_tk} {to_ctl}  {verdict}"


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    start = time.perf_counter()
    deadline = start + total_s
    out.mkdir(parents=True, exist_ok=True)
    say = Log()
    rows: dict = {}
    say(
        f"tune_sinkbwd9: artifacts {artifacts}, budget {total_s:.0f} s; candidates: "
        + ", ".join(f"{c.name} ({c.note})" for c in CANDIDATES)
    )

    def one(skip: list[str]) -> str | None:
        def on_row(row) -> None:
            rows.setdefault(row[0], row)  # a rerun's repeat of a row keeps the first
            say(f"{row[0]:10s} {row[1]:24s} {row[2]:8.2f} {row[3]:>13s}  {row[4]}")

        stop = run_child("bench.tuning.tune_sinkbwd9", "all", artifacts, skip, deadline, say, on_row,
                         stall_s=lambda name: TK_STALL_S if name in ("load", "TK") else STALL_S,
                         on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True))  # fmt: skip
        if stop is None:
            return None
        name, what, how = stop
        say(f"{how} in {name} at {what or '-'}")
        return name if name in NAMES or name in ("check", "TK") else None  # rerun without it

    with_reruns("tune_sinkbwd9", deadline, say, one)  # a rerun checks and times what is left
    base = {name: row[2] for name, row in rows.items()}
    say(f"\n{'candidate':10s} {'shape':24s} {'µs':>8s} {'passes':>13s} {'/TK':>6s} {'/ctl':>6s}  outputs (8192 tokens)")
    for row in rows.values():
        say(_line(row, base))
    say(f"{time.perf_counter() - start:.0f} s")
    (out / "tune_sinkbwd9.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:
        _part(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("time", "build"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(ARTIFACTS), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the sets go; time: the log's directory")
    parser.add_argument("--only", default="", help="build: these candidates (comma-separated) only")
    parser.add_argument("--budget", type=float, default=TOTAL_S, help="time: the whole run's seconds")
    args = parser.parse_args(argv)
    if args.command == "build":
        args.out.mkdir(parents=True, exist_ok=True)
        build(args.out, tuple(n for n in args.only.split(",") if n))
        return
    import torch

    if not torch.cuda.is_available():
        print("tune_sinkbwd9: no GPU here; nothing timed (the build runs on a CPU: `build --out DIR`)")
        return
    time_candidates(args.artifacts, args.out, args.budget)


if __name__ == "__main__":
    main()
