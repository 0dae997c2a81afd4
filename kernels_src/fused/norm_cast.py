"""RMSNorm fused with the per-token FP8 E4M3 cast (groups of 32 columns).

y = round_dtype(s * rstd * weight * out_scale), s = round_dtype(x + residual),
then each group of 32 outputs of a row is cast with its own scale factor,
exactly as a per-token cast of y would. A row lives in registers, spread over
`row_threads` threads holding whole 16-byte vectors (thread `lane` owns
vectors `v * row_threads + lane`), so x and residual are read once and every
output written once. The sum of squares is reduced with warp shuffles, then
across warps through shared memory; a group's amax with shuffles among the
32 / vec lanes that hold it.

The `tiling` axis picks the thread layout, the blocks per SM the compiler
must fit (its register cap), whether the weight is read with x, and whether the
lean instruction sequence is used; TILINGS says what each name means. The lean
sequence does the same fp32 operations on the outputs, but unpacks the rounded
outputs and converts them to FP8 two at a time (one cvt per two values)
instead of one by one.

Weight, residual, rstd and the extra normalised (bf16) output are runtime
flags; the scale-factor kind (kernels_src/quant/common.py) is static. Scale
factors are written through (batch, token, group) strides, so row-major and
TMA-aligned column-major layouts are one kernel.
"""

from typing import NamedTuple

import tilelang.language as T

from kernels_src.axes import Axis
from kernels_src.fused.bf16 import BF16_AT
from kernels_src.fused.division import DIV_NORMAL, lean_e4m3_scale_factor
from kernels_src.norm.row_sum import row_sum
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant.common import amax_floor, scale_factor, to_e4m3

KERNEL = "norm_cast"
OPS = ("tkaot.quant.norm_forward_and_per_token_cast",)
DTYPES = ("bfloat16", "float32")
SF_KINDS = ("fp32", "pow2", "ue8m0")
GROUP = 32
FP8 = "float8_e4m3"
MAX_HIDDEN = 8192

DYNAMIC_DIMS = ("num_tokens", "batch")

NUM_THREADS = 128
NUM_SMS = 132  # H200: the "persist" grid is NUM_SMS times the blocks an SM holds
MAX_VECS_PER_THREAD = 4
# "w4" rows: whole warps, at most this many threads a row, every thread the same number of vectors
MAX_ROW_THREADS = 256


# tiling -> (layout, blocks per SM the compiler must fit or None (for "warps": resident threads per
#            SM it aims at), weight read before the row reduction, lean instruction sequence,
#            lean fp32 scale factors: see lean_scale_factor)
#   "pow2": 128 threads a block, a power of two of them a row, up to MAX_VECS_PER_THREAD vectors each
#           beyond 128 threads (7 for hidden 7168); "warps": see row_tiling.
# Reading the weight with x keeps its loads off the path after the reduction (the weight is a runtime
# option, so the compiler cannot hoist them), at the cost of holding it in registers.
class Tiling(NamedTuple):
    layout: str
    blocks: int | None
    preload: bool
    lean: bool
    lean_sf: bool
    pairs: bool = False
    late_sf: bool = False
    early_bf16: bool = False
    words: bool = False
    persist: bool = False
    l2_prefetch: bool = False
    smem_prefetch: bool = False
    pdl: bool = False
    weight_prefetch: bool = False
    residual: bool = False
    residual_late: bool = False


TILINGS = {
    "base": ("pow2", None, False, False, False),
    "pre": ("pow2", None, True, False, False),
    "pre6": ("pow2", 6, True, False, False),
    "w4": ("warps", 1280, True, False, False),
    "lean": ("pow2", None, False, True, False),
    "lean6": ("pow2", 6, True, True, False),
    "leanw4": ("warps", 1280, True, True, False),
    "lean6d": ("pow2", 6, True, True, True),
    "leanw4d": ("warps", 1280, True, True, True),
    "lean8d": ("pow2", 8, False, True, True),
    "lean6pl": ("pow2", 6, True, True, False, True, True),
    "lean6plbwd": ("pow2", 6, True, True, True, True, True, True, True),
    "lean8nlbwd": ("pow2", 8, False, True, True, True, True, True, True),
    "lean8nlbwdp": ("pow2", 8, False, True, True, True, True, True, True, True),
    "lean8nlbwdpf": ("pow2", 8, False, True, True, True, True, True, True, True, True),
    "lean8nlbwds": ("pow2", 8, False, True, True, True, True, True, True, True, False, True),
    "lean8nlbwdg": ("pow2", 8, False, True, True, True, True, True, True, False, False, False, True),
    "lean7nlbwdg": ("pow2", 7, False, True, True, True, True, True, True, False, False, False, True),
    "lean9nlbwdg": ("pow2", 9, False, True, True, True, True, True, True, False, False, False, True),
    "lean8nlbwdpg": ("pow2", 8, False, True, True, True, True, True, True, True, False, False, True),
    "lean8nlbwdsg": ("pow2", 8, False, True, True, True, True, True, True, True, False, True, True),
    "lean8nlbwdgw": ("pow2", 8, False, True, True, True, True, True, True, False, False, False, True, True),
    "lean9nlbwdgw": ("pow2", 9, False, True, True, True, True, True, True, False, False, False, True, True),
    "lean6nlbwdgw": ("pow2", 6, False, True, True, True, True, True, True, False, False, False, True, True),
    "lean7nlbwdgw": ("pow2", 7, False, True, True, True, True, True, True, False, False, False, True, True),
    "lean6plbwdgw": ("pow2", 6, True, True, True, True, True, True, True, False, False, False, True, True),
    "lean7plbwdgw": ("pow2", 7, True, True, True, True, True, True, True, False, False, False, True, True),
}
TILINGS = {name: Tiling(*fields) for name, fields in TILINGS.items()}
# Residual-specialised tilings, for calls with a residual only: "R", has_residual taken as set (the kernel reads
# residual without asking); "L", the residual sum stored after the row reduction instead of as it is made
TILINGS["lean6plbwdgwR"] = TILINGS["lean6plbwdgw"]._replace(residual=True)
TILINGS["lean6plbwdgwRL"] = TILINGS["lean6plbwdgwR"]._replace(residual_late=True)
# More fields where given (off otherwise): "pairs", the outputs rounded to bf16 two at a time into
# one word (cvt.rn.bf16x2.f32) and unpacked from it with a shift and a mask; "late_sf", a thread's scale
# factors kept in registers and stored after its last vector, under one branch; "early_bf16" (with pairs),
# the extra bf16 output written before the scale is applied, so the unrounded outputs need not stay live;
# "words", bf16 inputs and weights widened from their 32-bit words (tkaot_bf16_at); "persist", a grid of
# NUM_SMS times the resident blocks striding over the rows (needs a blocks count); "l2_prefetch" (with
# persist), each row's next x row bulk-prefetched into L2 before the row is loaded; "smem_prefetch" (with
# persist), each thread's vectors of its next row copied into shared memory (cp.async) while the current row
# computes; "pdl", the kernel waits for the grid before it at entry and is launched with programmatic dependent
# launch (kernels_src/pdl.py); "weight_prefetch", the first NUM_SMS blocks ask L2 for the weight's lines at entry.
# H200 tuning (bench/results/tuning, 8192x7168 -> e4m3/32): lean6 56.4 µs, lean6pl 50.5 (TileKernels 51.2),
# 53.5 after its bf16-output fix (TileKernels 51.5); 2026-12-01 runs 12-17: lean6pl 52.5-52.6, early_bf16
# 52.7, words 50.4-50.9, lean6plbwd (early_bf16, words, lean fp32 sf) 49.98-50.36 (TileKernels 50.5-51.4);
# runs 18-20: the weight read after the reduction at 8 blocks an SM, lean8nlbwd, 49.5-49.7 (6 and 7 blocks
# 50.8-51.0, 9 and 10 blocks 49.9-50.1 and 50.7-50.8, rows over 7 warps at 5-6 blocks 51.3-51.9, without
# early_bf16 49.7-49.8; TileKernels 50.9-51.4).
# 2026-12-01 runs 21-23 (bench/results/tuning): persistent grids (p, pf, s; with PDL pg, sg) 59.8-79.0; with the PDL
# wait, lean8nlbwdg 47.7-48.1 while every call shares one weight, but 49.2-49.4 with a weight per input set (as
# bench/cases/fused.py and a model's layers have; lean8nlbwd 50.0): the weight, read after the row reduction, came
# from DRAM on the first rows' critical path; prefetched into L2 at entry, lean8nlbwdgw 47.8-47.9 (9 blocks 48.0-
# 48.1; TileKernels 50.8-50.9, copy ceiling 4.19-4.20 TB/s). Run 24 (bench/tune_options.py), with a residual:
# lean8nlbwdgw 106.4-107.7, 6/7/9 blocks the same, the weight preloaded at 6 blocks (lean6plbwdgw) 103.9-105.0
# (1.6 µs slower without a residual; TileKernels 103.3-104.4). (At 4-5 blocks the preloading kernel still takes
# 80 registers, so the SM holds 6 blocks anyway: fewer need another limit.) Runs 25-29 (residual rows):
# lean6plbwdgwRL 102.4-103.3 (shipped for calls with a residual), lean6plbwdgwR 102.9-103.9 (TileKernels
# 102.9-104.0). In R the weight loads waited behind the residual stores (program order); L frees them. Tried in those
# runs and since removed: R and RL at 7 blocks an SM 103.3-104.3, at 8 (weight after the reduction) 106.7, at 5
# (72 registers: 7 resident) 106.4, at 5 held by a 40 KiB shared-memory pad 114.5; the loads compiled with and
# without the residual under one branch 105.1; streaming stores (st.global.cs) 103.2-103.8, and 0.6-0.9 µs slower
# without a residual.
# Tried and dropped: an out_scale == 1 loop (spills), every lane storing its group's sf, 5 and 8 blocks an SM
# (with the preloading tilings of the time).
AXES = (
    Axis("hidden", int, check=lambda h: 0 < h <= MAX_HIDDEN and h % GROUP == 0, rule=f"a multiple of {GROUP} in (0, {MAX_HIDDEN}]"),
    Axis("dtype", str, choices=DTYPES),
    Axis("sf", str, choices=SF_KINDS),
    Axis("tiling", str, choices=tuple(TILINGS)),
)
DEFAULT_TILING = "base"

# tkaot_div_normal (kernels_src/fused/division.py) for the lean "fp32" scale factors, and the bf16 pair
# rounding of the "pairs" tilings
_DEVICE_HELPERS = (
    DIV_NORMAL
    + BF16_AT
    + """__device__ __forceinline__ int tkaot_prefetch_l2(const void* ptr, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(__cvta_generic_to_global(ptr)), "r"(bytes));
    return 0;
}
__device__ __forceinline__ int tkaot_prefetch_line_l2(const void* ptr) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(__cvta_generic_to_global(ptr)));
    return 0;
}
__device__ __forceinline__ int tkaot_cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(gmem) : "memory");
    return 0;
}
__device__ __forceinline__ int tkaot_cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
    return 0;
}
__device__ __forceinline__ int tkaot_cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    return 0;
}
__device__ __forceinline__ unsigned tkaot_bf16x2(float lo, float hi) {
    unsigned word;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(word) : "f"(hi), "f"(lo));
    return word;
}
"""
)


def row_tiling(hidden: int, dtype: str, tiling: str = DEFAULT_TILING) -> tuple[int, int, int, int, int | None]:
    """(elements per vector, threads per row, vectors per thread, threads per block, min blocks per SM or None).

    The "warps" layout spreads a row over whole warps, at most MAX_ROW_THREADS threads, each
    holding the same number of vectors (hidden 7168 bf16: 224 threads of 4); rows too narrow or
    of no such split fall back to the "pow2" layout.
    """
    vec = 16 // (2 if dtype == "bfloat16" else 4)
    num_vecs = hidden // vec
    layout, blocks = TILINGS[tiling][:2]
    if layout == "warps":
        per_thread = -(-num_vecs // MAX_ROW_THREADS)
        while per_thread <= 2 * MAX_VECS_PER_THREAD and (num_vecs % per_thread or (num_vecs // per_thread) % 32):
            per_thread += 1
        if per_thread <= 2 * MAX_VECS_PER_THREAD:
            row_threads = num_vecs // per_thread
            threads = row_threads * max(1, MAX_ROW_THREADS // row_threads)
            return vec, row_threads, per_thread, threads, max(1, blocks // threads)
        blocks = None
    row_threads = 8
    while row_threads < NUM_THREADS and -(-num_vecs // row_threads) > MAX_VECS_PER_THREAD:
        row_threads *= 2
    return vec, row_threads, -(-num_vecs // row_threads), NUM_THREADS, blocks


def build(hidden: int, dtype: str, sf: str, tiling: str = DEFAULT_TILING):
    vec, row_threads, vecs_per_thread, threads, min_blocks = row_tiling(hidden, dtype, tiling)
    preload, lean, lean_sf = TILINGS[tiling][2:5]
    pairs, late_sf = TILINGS[tiling].pairs, TILINGS[tiling].late_sf
    early_bf16 = pairs and TILINGS[tiling].early_bf16
    words = TILINGS[tiling].words and dtype == "bfloat16"
    pairs = pairs and lean and dtype == "bfloat16"  # an fp32 row rounds to itself
    lean_sf = lean_sf and sf == "fp32" and dtype == "bfloat16"  # checked for bf16 amax values only
    rows_per_block = threads // row_threads
    lanes = min(row_threads, 32)
    row_warps = row_threads // lanes
    group_lanes = GROUP // vec
    num_groups = hidden // GROUP
    num_words = -(-num_groups // 4)
    packed = sf == "ue8m0"
    exact = hidden % (vec * row_threads) == 0  # every thread's vectors are in range

    batch, num_tokens = T.dynamic("batch"), T.dynamic("num_tokens")
    x_bstride, x_stride = T.dynamic("x_batch_stride"), T.dynamic("x_stride")
    res_bstride, res_stride = T.dynamic("residual_batch_stride"), T.dynamic("residual_stride")
    rout_bstride, rout_stride = T.dynamic("residual_out_batch_stride"), T.dynamic("residual_out_stride")
    out_bstride, out_stride = T.dynamic("out_batch_stride"), T.dynamic("out_stride")
    ob_bstride, ob_stride = T.dynamic("out_bf16_batch_stride"), T.dynamic("out_bf16_stride")
    sf_bstride, sf_stride, sf_gstride = T.dynamic("sf_batch_stride"), T.dynamic("sf_stride"), T.dynamic("sf_group_stride")
    rows = (batch, num_tokens, hidden)
    if packed:
        sf_shape, sf_strides, sf_dtype = (batch, num_tokens, num_words, 4), (sf_bstride, sf_stride, sf_gstride, 1), "uint8"
    else:
        sf_shape, sf_strides, sf_dtype = (batch, num_tokens, num_groups), (sf_bstride, sf_stride, sf_gstride), "float32"

    persist = TILINGS[tiling].persist and min_blocks is not None
    l2_prefetch = persist and TILINGS[tiling].l2_prefetch
    smem_prefetch = persist and TILINGS[tiling].smem_prefetch
    pdl = TILINGS[tiling].pdl
    weight_prefetch = TILINGS[tiling].weight_prefetch
    residual_given, residual_late = TILINGS[tiling].residual, TILINGS[tiling].residual_late
    grid_x = T.ceildiv(num_tokens, rows_per_block)
    passes = 1
    if persist:
        grid_x = T.min(grid_x, NUM_SMS * min_blocks)
        passes = T.ceildiv(num_tokens, rows_per_block * grid_x)

    def widen(vectors, v, j):
        # Value j of vector v as fp32: from its 32-bit word where "words" says so
        if words:
            return T.call_extern("float32", "tkaot_bf16_at", T.address_of(vectors[v, 0]), j)
        return T.cast(vectors[v, j], T.float32)

    @T.macro
    def store_sf(out_sf, b, token, gi, stored):
        # Group gi's scale factor; packed, the unused bytes of a row's last word are written as 0
        if packed:
            out_sf[b, token, gi // 4, gi % 4] = stored
            if num_groups % 4 != 0 and gi == num_groups - 1:
                for p in T.unroll(num_groups % 4, 4):
                    out_sf[b, token, num_words - 1, p] = T.uint8(0)
        else:
            out_sf[b, token, gi] = stored

    @T.macro
    def store_residual_sums(residual_out, x_reg, b, token, lane):
        # "L": the thread's residual sums, stored once the row reduction has consumed them
        for v in T.unroll(vecs_per_thread):
            col = (v * row_threads + lane) * vec
            if token < num_tokens and (exact or col < hidden):
                for j in T.vectorized(vec):
                    residual_out[b, token, col + j] = x_reg[v, j]

    @T.macro
    def add_residual(residual, residual_out, x_reg, r_reg, b, token, v, col):
        for j in T.vectorized(vec):
            r_reg[j] = residual[b, token, col + j]
        for j in T.vectorized(vec):
            x_reg[v, j] = x_reg[v, j] + r_reg[j]
        if not residual_late:
            for j in T.vectorized(vec):
                residual_out[b, token, col + j] = x_reg[v, j]

    @T.macro
    def load_row(x, residual, residual_out, x_next, x_reg, r_reg, b, token, lane, has_residual):
        # The thread's vectors of its row into x_reg, the residual added (and the sum stored) where the call has one:
        # "R" tilings take it as given, the others ask has_residual
        for v in T.unroll(vecs_per_thread):
            col = (v * row_threads + lane) * vec
            if token < num_tokens and (exact or col < hidden):
                if smem_prefetch:
                    for j in T.vectorized(vec):
                        x_reg[v, j] = x_next[T.get_thread_binding() // row_threads, col + j]
                else:
                    for j in T.vectorized(vec):
                        x_reg[v, j] = x[b, token, col + j]
                if residual_given:
                    add_residual(residual, residual_out, x_reg, r_reg, b, token, v, col)
                elif has_residual != 0:
                    add_residual(residual, residual_out, x_reg, r_reg, b, token, v, col)
            else:
                for j in T.vectorized(vec):
                    x_reg[v, j] = T.cast(0, dtype)

    @T.prim_func
    def norm_cast(
        x: T.StridedTensor[rows, (x_bstride, x_stride, 1), dtype],
        weight: T.Tensor[(hidden,), dtype],
        residual: T.StridedTensor[rows, (res_bstride, res_stride, 1), dtype],
        residual_out: T.StridedTensor[rows, (rout_bstride, rout_stride, 1), dtype],
        out: T.StridedTensor[rows, (out_bstride, out_stride, 1), FP8],
        out_sf: T.StridedTensor[sf_shape, sf_strides, sf_dtype],
        out_bf16: T.StridedTensor[rows, (ob_bstride, ob_stride, 1), T.bfloat16],
        rstd: T.Tensor[(batch, num_tokens), T.float32],
        eps: T.float32,
        out_scale: T.float32,
        has_weight: T.int32,
        has_residual: T.int32,
        has_rstd: T.int32,
        has_out_bf16: T.int32,
    ):
        with T.Kernel(grid_x, batch, threads=threads) as (block, b):
            if min_blocks is not None:
                T.annotate_min_blocks_per_sm(min_blocks)
            if lean_sf or pairs or words or pdl or weight_prefetch:
                T.import_source(_DEVICE_HELPERS + (PDL_SOURCE if pdl else ""))
            if pdl:
                pdl_entry()
            if weight_prefetch:
                # The first blocks of the grid ask L2 for the weight's lines (one a thread) before they load x, so
                # the weight, read after the row reduction, is no DRAM round trip on the first rows' critical path
                weight_lines = T.ceildiv(hidden * (16 // vec), 128)
                if has_weight != 0 and block < NUM_SMS and b == 0 and T.get_thread_binding() < weight_lines:
                    T.call_extern("int32", "tkaot_prefetch_line_l2", T.address_of(weight[T.get_thread_binding() * (128 * vec // 16)]))
            # Callers guarantee 16-byte aligned input rows and vec-aligned output rows
            T.assume(x_stride % vec == 0)
            T.assume(x_bstride % vec == 0)
            T.assume(res_stride % vec == 0)
            T.assume(res_bstride % vec == 0)
            T.assume(rout_stride % vec == 0)
            T.assume(rout_bstride % vec == 0)
            T.assume(out_stride % vec == 0)
            T.assume(out_bstride % vec == 0)
            T.assume(ob_stride % vec == 0)
            T.assume(ob_bstride % vec == 0)
            tid = T.get_thread_binding()
            lane = tid % row_threads
            x_reg = T.alloc_local((vecs_per_thread, vec), dtype)
            r_reg = T.alloc_local((vec,), dtype)
            w_reg = T.alloc_local((vecs_per_thread if preload else 1, vec), dtype)
            y_reg = T.alloc_local((vec,), dtype)
            yb_reg = T.alloc_local((vec,), T.bfloat16)
            q_reg = T.alloc_local((vec,), FP8)
            part = T.alloc_local((vec,), T.float32)
            yf = T.alloc_local((vec,), T.float32)
            if late_sf:
                sf_keep = T.alloc_local((vecs_per_thread,), sf_dtype)
            if pairs:
                yv = T.alloc_local((vec,), T.float32)
                word = T.alloc_var(T.uint32)
            acc = T.alloc_local((1,), T.float32)
            acc[0] = 0.0
            amax = T.alloc_var(T.float32)
            scale = T.alloc_var(T.float32)
            if lean_sf:
                clamped = T.alloc_var(T.float32)
                sf_lean = T.alloc_local((1,), T.float32)
                inv_lean = T.alloc_local((1,), T.float32)
            warp_sums = T.alloc_shared((rows_per_block, row_warps), T.float32)
            if smem_prefetch:
                # The row a thread's row takes next pass: each thread copies, and later reads, its own vectors
                x_next = T.alloc_shared((rows_per_block, hidden), dtype)
                first = block * rows_per_block + tid // row_threads
                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    if first < num_tokens and (exact or col < hidden):
                        T.call_extern(
                            "int32", "tkaot_cp_async16", T.address_of(x_next[tid // row_threads, col]), T.address_of(x[b, first, col])
                        )
                T.call_extern("int32", "tkaot_cp_async_commit")

            # With "persist", a grid of resident blocks strides over the rows, and with "l2_prefetch" one thread
            # of a row bulk-prefetches the x row it takes next into L2; otherwise a block a row group (one pass)
            for it in T.serial(passes):
                token = (it * grid_x + block) * rows_per_block + tid // row_threads
                if persist:
                    acc[0] = 0.0
                    if l2_prefetch and lane == 0 and token + grid_x * rows_per_block < num_tokens:
                        T.call_extern(
                            "int32", "tkaot_prefetch_l2", T.address_of(x[b, token + grid_x * rows_per_block, 0]), hidden * (16 // vec)
                        )
                if smem_prefetch:
                    T.call_extern("int32", "tkaot_cp_async_wait_all")
                if smem_prefetch:
                    load_row(x, residual, residual_out, x_next, x_reg, r_reg, b, token, lane, has_residual)
                else:
                    load_row(x, residual, residual_out, x, x_reg, r_reg, b, token, lane, has_residual)  # x_next not read
                if preload and has_weight != 0:
                    for v in T.unroll(vecs_per_thread):
                        col = (v * row_threads + lane) * vec
                        if exact or col < hidden:
                            for j in T.vectorized(vec):
                                w_reg[v, j] = weight[col + j]
                for v in T.unroll(vecs_per_thread):
                    if words:
                        for j in T.unroll(vec):
                            part[j] = widen(x_reg, v, j) * widen(x_reg, v, j)
                    else:
                        for j in T.vectorized(vec):
                            part[j] = T.cast(x_reg[v, j], T.float32) * T.cast(x_reg[v, j], T.float32)
                    for j in T.unroll(vec):
                        acc[0] += part[j]

                row_sum(acc, warp_sums, tid // row_threads, lane, lanes, row_warps)
                if residual_late:
                    if residual_given:
                        store_residual_sums(residual_out, x_reg, b, token, lane)
                    elif has_residual != 0:
                        store_residual_sums(residual_out, x_reg, b, token, lane)
                inv_rms = T.alloc_var(T.float32, init=T.rsqrt(acc[0] / hidden + eps))
                if smem_prefetch:
                    # This thread's vectors of the row it takes next pass, in flight while this row computes;
                    # issued after the row reduction, which has consumed every value read from x_next (and, over
                    # several warps, passed a barrier), so the copies cannot overwrite them early
                    for v in T.unroll(vecs_per_thread):
                        col = (v * row_threads + lane) * vec
                        if token + grid_x * rows_per_block < num_tokens and (exact or col < hidden):
                            T.call_extern(
                                "int32",
                                "tkaot_cp_async16",
                                T.address_of(x_next[tid // row_threads, col]),
                                T.address_of(x[b, token + grid_x * rows_per_block, col]),
                            )
                    T.call_extern("int32", "tkaot_cp_async_commit")
                if has_rstd != 0 and lane == 0 and token < num_tokens:
                    rstd[b, token] = inv_rms

                for v in T.unroll(vecs_per_thread):
                    col = (v * row_threads + lane) * vec
                    in_row = exact or col < hidden
                    wv = v if preload else 0
                    if not preload and has_weight != 0 and in_row:
                        for j in T.vectorized(vec):
                            w_reg[0, j] = weight[col + j]
                    if lean:
                        for j in T.unroll(vec):
                            scale = out_scale
                            if has_weight != 0:
                                scale = widen(w_reg, wv, j) * out_scale
                            if pairs:
                                yv[j] = widen(x_reg, v, j) * inv_rms * scale
                            else:
                                y_reg[j] = T.cast(T.cast(x_reg[v, j], T.float32) * inv_rms * scale, dtype)
                        if pairs:
                            # Rounded two at a time into one word; the low half shifted up, the high half masked
                            for j in T.unroll(vec // 2):
                                word = T.call_extern("uint32", "tkaot_bf16x2", yv[2 * j], yv[2 * j + 1])
                                yf[2 * j] = T.reinterpret(word << T.uint32(16), T.float32)
                                yf[2 * j + 1] = T.reinterpret(word & T.uint32(0xFFFF0000), T.float32)
                        else:
                            # Vectorized, the rounded outputs are unpacked two at a time
                            for j in T.vectorized(vec):
                                yf[j] = T.cast(y_reg[j], T.float32)
                        # The amax of the rounded outputs, over the lanes of the group (all lanes shuffle)
                        amax = T.abs(yf[0])
                        for j in T.unroll(1, vec):
                            amax = T.max(amax, T.abs(yf[j]))
                    else:
                        for j in T.unroll(vec):
                            scale = out_scale
                            if has_weight != 0:
                                scale = T.cast(w_reg[wv, j], T.float32) * out_scale
                            y_reg[j] = T.cast(T.cast(x_reg[v, j], T.float32) * inv_rms * scale, dtype)
                        amax = T.abs(T.cast(y_reg[0], T.float32))
                        for j in T.unroll(1, vec):
                            amax = T.max(amax, T.abs(T.cast(y_reg[j], T.float32)))
                    for i in T.unroll(group_lanes.bit_length() - 1):
                        amax = T.max(amax, T.shfl_xor(amax, 1 << i))
                    if lean_sf:
                        # The "fp32" scale factor (clamped / 448, 448 / clamped) without IEEE division's branch
                        clamped = T.max(amax, T.float32(amax_floor("e4m3", sf)))
                        lean_e4m3_scale_factor(clamped, sf_lean, inv_lean)
                        stored, inv = sf_lean[0], inv_lean[0]
                    else:
                        stored, inv = scale_factor(amax, "e4m3", sf)
                    if early_bf16 and has_out_bf16 != 0 and token < num_tokens and in_row:
                        # Before yf is scaled (it holds bf16 values: the cast is exact), so yv need not stay live
                        for j in T.unroll(vec):
                            yb_reg[j] = T.cast(yf[j], T.bfloat16)
                        for j in T.vectorized(vec):
                            out_bf16[b, token, col + j] = yb_reg[j]
                    if lean:
                        for j in T.vectorized(vec):
                            yf[j] = yf[j] * inv
                        for j in T.vectorized(vec):
                            q_reg[j] = T.cast(yf[j], FP8)
                    else:
                        for j in T.unroll(vec):
                            q_reg[j] = to_e4m3(T.cast(y_reg[j], T.float32) * inv)
                    if token < num_tokens and in_row:
                        for j in T.vectorized(vec):
                            out[b, token, col + j] = q_reg[j]
                        if has_out_bf16 != 0 and not early_bf16:
                            for j in T.unroll(vec):
                                # yf is scaled by now; under "pairs" the bf16 output is yv rounded
                                yb_reg[j] = T.cast(yv[j] if pairs else y_reg[j], T.bfloat16)
                            for j in T.vectorized(vec):
                                out_bf16[b, token, col + j] = yb_reg[j]
                        if late_sf:
                            sf_keep[v] = stored
                        elif lane % group_lanes == 0:
                            store_sf(out_sf, b, token, col // GROUP, stored)
                if late_sf:
                    if token < num_tokens and lane % group_lanes == 0:
                        for v in T.unroll(vecs_per_thread):
                            col = (v * row_threads + lane) * vec
                            if exact or col < hidden:
                                store_sf(out_sf, b, token, col // GROUP, sf_keep[v])

                if persist and row_warps > 1:
                    T.sync_threads()  # warp_sums is written again next pass

    return norm_cast
