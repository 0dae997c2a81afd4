"""Declarations of the kernels behind tkaot.engram (tkaot/_decl.py): n-gram hashing, the gate (forward, backward and
its weight-gradient reduction) and the Sinkhorn normalisation of the embedding tables.

Sizes are runtime values wherever that costs nothing measurable: tokens, hidden size, head count (hc_mult), layers,
tables, rows, partial counts. What stays static: the n-gram order (its XOR chain is unrolled), the Sinkhorn head_dim
(a row lives in registers, reduced in TileKernels' order) and the momentum dtypes.
"""

from __future__ import annotations

from tkaot._decl import Axis, declarer, tiling_axis

_declare = declarer("engram_", "tkaot.engram.")

_E = "tkaot.engram."
MAX_NGRAM = 8
# The gate holds a head's fused weight row in shared memory (fp32): hidden at most 16384, a multiple of 256
MAX_GATE_HIDDEN = 16384
# Gate forward (kernels_src/engram/gate_fwd.py, "c<ctas>s<stages>x<slice>w"): one warp a CTA running over consecutive
# tokens of one head, loads by cp.async into a ring of `stages` slots of 1024 elements, x parked in shared memory for
# the first `slice` chunks of 256, a whole item run without a test a chunk, an item's weights read one item ahead;
# 1584 CTAs (12 an H200 SM at 18 KB each), 2 slots. Measured on the H200 (2026-12-02, TileKernels 400.3 / 5.20 / 8.00
# / 9.77 µs at 8192 / 1 / 16 / 128 tokens of 4 x 7168): c1584s2x28w 392.2 / 5.53 / 7.10 / 9.03; the body shipped
# before (a test a chunk, c1584s2x28) 420.1 / 7.85 / 10.19 / 11.70; the lean body with the weights read at their own
# item c1584s2x28 398.3 / 5.58 / 6.87 / 8.84, with 3 slots c1320s3x28 404.1 / 5.77 / 6.55 / 8.82
# (bench/tuning/tune_engram4.py). Earlier: a whole row in flight at few tokens (c1584s14x28: 8.50 µs at 1 token
# against 7.79) and register rings (w4x28b6 591-603 µs at 8192 tokens) lost (bench/tuning/tune_engram2.py, 3)
# Decode form ("c<ctas>d<slice>w<warps>", kernels_src/engram/gate_fwd.py), launched on the inference
# path at up to GATE_FWD_DECODE_TOKENS tokens where hidden is at most GATE_FWD_DECODE_HIDDEN (its 28 chunks of 256):
# 4 warps a CTA, the row staged at once, the three sums in three warps. H200 at 4 x 7168 against c1584s2x28w and
# TileKernels (f014b86:bench/results/2026-12-03-H200-s19-tune_lat1.log, bench/tuning/tune_lat1.py at lat1 b2a33ee):
# c2048d28w4 3.56 / 4.23 / 10.50 / 449.05 µs at 1 / 16 / 128 / 8192 tokens, against 5.51 / 7.30 / 9.92 / 394.50 and
# 5.23 / 8.06 / 11.06 / 401.46; all three sums in warp 0 (c2048d28w4o) 3.58 / 4.25, 8 warps and 32 chunks (c2048d32w8)
# 3.51 / 4.25 at 1 / 16 tokens but 11.44 at 128: no better
GATE_FWD_TILINGS = {"default": "c1584s2x28w", "decode": "c2048d28w4"}
GATE_FWD_DECODE_TOKENS = 16  # the largest count measured faster (slower at 128)
GATE_FWD_DECODE_HIDDEN = 28 * 256  # the decode tiling's slice, in elements
# Gate backward (kernels_src/engram/gate_bwd.py, "k<keep>d<depth>v<ahead>xw"): 8 warps a CTA, two a head (4 heads), one
# CTA a weight-gradient partial; the first 28 groups of 256 kept on chip (go in shared memory, grad_w in registers),
# v's kept groups read once a token into shared memory by the whole CTA (the next token's during this one's grad_x
# pass), go staged 16 groups ahead in the dL/dg pass, x, k and the weight (from L2) through a ring of 14 slots in the
# grad_x pass, whose last 13 groups stage the next token's first go groups, the kernel's own barriers. One tiling for
# every hidden (a runtime value; groups past 28 take the kernel's plain loop). Measured on the H200 at 8192x4x7168
# (2026-12-03, f014b86:bench/results/2026-12-03-H200-s19-tune_gatebwd10.log, bench/tuning/tune_gatebwd10.py as of 6e7bed1):
# k28d14v16xw 663.16 µs, k28d11v16 (the weight kept in shared memory, 11 slots, the next go staged at the token's
# start; shipped before) 711.86, TileKernels 671.37; dropping the group checks for hidden >= 7168 (a tiling chosen by
# hidden) spills with the streamed weight (xfw 726.75, with a wait a pair of groups xfpw 668.15) and gains less
# without it (xf 692.37). Earlier (f014b86:bench/results/2026-12-02-H200-s15-tune_engram6.log,
# f014b86:bench/results/2026-12-03-H200-s17-tune_gatebwd9.log): v staged by each warp (k28d14c) 743.79, TileLang's
# inserted barriers (k28d12c) 849, register rings (k28d12, spilled) 1202 µs; ring depth, go groups ahead and PDL nearly
# indifferent (within 6 µs)
GATE_BWD_TILINGS = {"default": "k28d14v16xw"}
# Weight-gradient reduction (kernels_src/engram/grad_w_reduce.py, "t<threads>r<rows><s|d>"): four columns a thread,
# batches of `rows` partials copied by cp.async in a loop into two buffers in turn (4-byte copies where an input is
# misaligned or numel not a multiple of 4): t32r44d, 224 CTAs of 128 columns at 4 x 7168. Measured on the H200
# (132x4x7168 beside TileKernels, 2026-12-03, eec3673:bench/results/2026-12-03-H200-s24-tune_engram_gradw24.log,
# harness eec3673:bench/tuning/tune_engram_gradw24.py; µs): TileKernels 6.33, t32r44d 6.21, t56r66d 6.31, t64r66d
# 6.40, t56r148s (the 148 rows' copies unrolled, shipped before) 6.47, one buffer in a loop 6.69-7.96; in the fifteenth
# session's round (TileKernels 6.81) t56r148s 6.50 and one thread a column with the loads in registers (t224r132) 7.63
GRAD_W_REDUCE_TILINGS = {"default": "t32r44d"}
# Sinkhorn column reduction (kernels_src/engram/sinkhorn_step_reduce.py, "t<threads>r<rows><s|d>"): four columns a
# thread, batches of `rows` partials copied by cp.async in a loop, two buffers: t24r200d, 96 columns a CTA, 54 CTAs at
# head_dim 5120, 150 KB of shared memory. Measured on the H200 (396x5120 fp32, 2026-12-03,
# a1dab7b:bench/results/2026-12-03-H200-s24-tune_engram_reduce24-round{1,2,3}.log, harness
# a1dab7b:bench/tuning/tune_engram_reduce24.py; µs): round 3 (TileKernels 6.24) t24r200d
# 5.54, t16r200d 5.72, t16r396s (one buffer, one trip) 5.98, t16r132d 6.08, t16r100d 6.21; round 2 (TileKernels
# 6.58) batches of 50 rows 7.9-8.6; round 1, the copies unrolled (130-440 KB of code) 10.0-12.2; one thread a column
# with four loads in registers at a time (shipped before) 18.46 against TileKernels' 6.57 in the bench run before
SINKHORN_STEP_REDUCE_TILINGS = {"default": "t24r200d"}
# Sinkhorn momentum (kernels_src/engram/sinkhorn_momentum.py, "t<threads>v<vec>x<reps>"): 128 lanes, one run of 4
# elements a lane (512 a CTA), every warp access one contiguous span. Measured on the H200 (512000512 fp32 grad, bf16
# momentum, nesterov, 2026-12-03, 5cabb61:bench/tuning/tune_engram_mom22.py and its logs in 5cabb61:bench/results; µs):
#   round 2 (TileKernels 1445.4): t128v4x1 1444.7, t192v4x1 1446.5, t256v4x1 1447.7 (shipped a few hours), t128v4x2
#   (shipped before) 1449.0, t320v4x1 1453.5, t384v4x1 1456.2, two runs of 2 (t256v2x2) 1453.1, t512v2x1 1539.9;
#   round 1 (TileKernels 1445.3): full CTAs without the bounds tests (t256v4x1u) 1446.4 against t256v4x1's 1446.7;
#   streaming cache hints on grad and the output 1520.8; 32 lanes 2410.1 under PDL but 1445.2 without it (TileKernels
#   times its kernel without PDL: under PDL the wait of each of 2M 32-lane CTAs is what costs)
SINKHORN_MOMENTUM_TILINGS = {"default": "t128v4x1"}
SINKHORN_HEAD_DIMS = "a multiple of 256 in [256, 8192]"
MOMENTUM_DTYPES = ("bfloat16", "float32")

ENGRAM_HASH = _declare(
    "engram.hash", (Axis("max_ngram_size", int, check=lambda n: 2 <= n <= MAX_NGRAM, rule=f"in [2, {MAX_NGRAM}]"),),
    ("ngram_token_ids", "multipliers", "vocab_sizes", "offsets", "image_token_mask", "output", "has_mask"),
    ("num_tokens", "num_layers", "num_tables"), ("engram_hash",),
)  # fmt: skip

FUSED_WEIGHT = _declare(
    "engram.fused_weight", (Axis("dtype", str, choices=("bfloat16",)),), ("weight_hidden", "weight_embed", "weight_fused"), ("numel",),
    ("fused_weight",),
)  # fmt: skip

GATE_FWD = _declare(
    "engram.gate_fwd", (tiling_axis(GATE_FWD_TILINGS),),
    ("hidden_states", "kv", "weight_fused", "image_token_mask", "output", "dot", "gate_score", "rstd_x", "rstd_k", "eps",
        "clamp_value", "scalar", "flags"),
    ("num_tokens", "hc_mult", "hidden"), ("engram_gate_fwd",), tilings=GATE_FWD_TILINGS,
)  # fmt: skip

GATE_BWD = _declare(
    "engram.gate_bwd", (tiling_axis(GATE_BWD_TILINGS),),
    ("grad_out", "hidden_states", "kv", "weight_fused", "dot", "gate_score", "rstd_x", "rstd_k", "image_token_mask",
        "grad_hidden_states", "grad_kv", "grad_w_partial", "clamp_value", "scalar", "has_mask"),
    ("num_tokens", "hidden", "num_partials"), ("engram_gate_bwd",), tilings=GATE_BWD_TILINGS,
)  # fmt: skip

GRAD_W_REDUCE = _declare(
    "engram.grad_w_reduce", (Axis("dtype", str, choices=("bfloat16",)), tiling_axis(GRAD_W_REDUCE_TILINGS)),
    ("grad_w_partial", "weight_hidden", "weight_embed", "grad_weight_hidden", "grad_weight_embed"), ("num_partials", "numel"),
    ("grad_w_reduce",), tilings=GRAD_W_REDUCE_TILINGS,
)  # fmt: skip

SINKHORN_MOMENTUM = _declare(
    "engram.sinkhorn_momentum",
    (Axis("grad_dtype", str, choices=MOMENTUM_DTYPES), Axis("momentum_dtype", str, choices=MOMENTUM_DTYPES),
        tiling_axis(SINKHORN_MOMENTUM_TILINGS)),
    ("grad", "momentum_buffer", "sinkhorn_input", "beta1", "one_minus_beta1", "nesterov"), ("numel",),
    ("engram_sinkhorn_momentum_update",), tilings=SINKHORN_MOMENTUM_TILINGS,
)  # fmt: skip


def _head_dim() -> Axis:
    return Axis("head_dim", int, check=lambda d: 256 <= d <= 8192 and d % 256 == 0, rule=SINKHORN_HEAD_DIMS)


SINKHORN_STEP = _declare(
    "engram.sinkhorn_step", (_head_dim(),), ("matrix", "row_scale", "col_scale", "row_norm", "col_sumsq_partial", "eps"),
    ("num_rows", "num_partials"), ("engram_sinkhorn_step",),
)  # fmt: skip

SINKHORN_STEP_REDUCE = _declare(
    "engram.sinkhorn_step_reduce", (Axis("dtype", str, choices=("float32",)), tiling_axis(SINKHORN_STEP_REDUCE_TILINGS)),
    ("col_sumsq_partial", "col_sumsq"), ("num_partials", "head_dim"), ("engram_sinkhorn_step_reduce",),
    tilings=SINKHORN_STEP_REDUCE_TILINGS,
)  # fmt: skip

SINKHORN_FINALIZE = _declare(
    "engram.sinkhorn_finalize", (_head_dim(),), ("matrix", "row_scale", "col_scale", "out", "eps", "alpha"), ("num_rows",),
    ("engram_sinkhorn_finalize",),
)  # fmt: skip

KERNELS = (
    ENGRAM_HASH, FUSED_WEIGHT, GATE_FWD, GATE_BWD, GRAD_W_REDUCE,
    SINKHORN_MOMENTUM, SINKHORN_STEP, SINKHORN_STEP_REDUCE, SINKHORN_FINALIZE,
)  # fmt: skip
