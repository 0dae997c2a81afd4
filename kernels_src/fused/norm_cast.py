"""RMSNorm fused with the per-token FP8 E4M3 cast (groups of 32 columns).

y = round_dtype(s * rstd * weight * out_scale), s = round_dtype(x + residual),
then each group of 32 outputs of a row is cast with its own scale factor,
exactly as a per-token cast of y would. A row lives in registers, spread over
`row_threads` threads holding whole 16-byte vectors (thread `lane` owns
vectors `v * row_threads + lane`), so x and residual are read once and every
output written once. The sum of squares is reduced with warp shuffles, then
across warps through shared memory; a group's amax with shuffles among the
32 / vec lanes that hold it.

The outputs are TileKernels' bytes: the row split over the same threads, each
thread summing its squares into two fused multiply-add chains (even and odd
elements) that it adds at the end, the same shuffle and warp order, and
y = (s * rstd) * (weight * out_scale) as TileKernels forms it.

Both shipped tilings (TILINGS) use the lean instruction sequence: the same fp32
operations on the outputs, but bf16 outputs rounded two at a time into one word
(cvt.rn.bf16x2.f32), FP8 converted two at a time, the "fp32" scale factor
without IEEE division's branch (kernels_src/fused/division.py), bf16 values
widened from their 32-bit words, a thread's scale factors stored after its last
vector, and the extra bf16 output written before the scale is applied. The
kernel waits for the grid before it at entry (programmatic dependent launch,
kernels_src/pdl.py), and its first NUM_SMS blocks ask L2 for the weight's lines.

Weight, residual, rstd and the extra normalised (bf16) output are runtime
flags; the scale-factor kind (kernels_src/quant/common.py) is static. Scale
factors are written through (batch, token, group) strides, so row-major and
TMA-aligned column-major layouts are one kernel.
"""

from typing import NamedTuple

import tilelang.language as T

from kernels_src.fused import norm_cast_args
from kernels_src.fused.bf16 import BF16_AT
from kernels_src.fused.division import DIV_NORMAL, lean_e4m3_scale_factor
from kernels_src.norm.row_sum import NUM_THREADS, StaticSplit, row_split
from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant.common import amax_floor, scale_factor
from tkaot._quant.kernels import NORM_CAST

DECL = NORM_CAST  # the declaration this module builds (tkaot/_quant/kernels.py)
GROUP = 32
FP8 = "float8_e4m3"

NUM_SMS = 132  # H200: the blocks that prefetch the weight into L2


class Tiling(NamedTuple):
    blocks: int  # blocks an SM the compiler must fit (its register cap)
    preload: bool  # bf16 rows: the weight read with x, before the row reduction, and held in registers
    residual: bool  # for calls with a residual: has_residual taken as set, the residual sum stored after the reduction


# H200, 8192x7168 -> e4m3/32: the weight read after the reduction at 8 blocks an SM, 47.8-47.9 µs (TileKernels 50.8-50.9;
# persistent grids, 5-10 blocks and rows over whole warps were slower). With a residual the weight preloaded at 6 blocks,
# the residual sum stored after the reduction, 102.4-103.3 µs against 106.4-107.7 (TileKernels 102.9-104.0).
TILINGS = {
    DECL.tilings["default"]: Tiling(blocks=8, preload=False, residual=False),
    DECL.tilings["residual"]: Tiling(blocks=6, preload=True, residual=True),
}

# tkaot_div_normal (kernels_src/fused/division.py) for the lean "fp32" scale factors, the bf16 words, the
# weight's L2 prefetch and the bf16 pair rounding
_DEVICE_HELPERS = (
    DIV_NORMAL
    + BF16_AT
    + """__device__ __forceinline__ int tkaot_prefetch_line_l2(const void* ptr) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(__cvta_generic_to_global(ptr)));
    return 0;
}
__device__ __forceinline__ unsigned tkaot_bf16x2(float lo, float hi) {
    unsigned word;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(word) : "f"(hi), "f"(lo));
    return word;
}
"""
)


def row_tiling(hidden: int, dtype: str, tiling: str) -> tuple[int, int, int, int, int]:
    """(elements per vector, threads per row, vectors per thread, threads per block, min blocks per SM): the
    row split of kernels_src/norm/row_sum.py (TileKernels'), and the tiling's blocks an SM."""
    return *row_split(hidden, dtype), NUM_THREADS, TILINGS[tiling].blocks


def build(hidden: int, dtype: str, sf: str, tiling: str):
    return norm_cast_kernel(StaticSplit(hidden, dtype), dtype, sf, tiling)


def norm_cast_kernel(split, dtype: str, sf: str, tiling: str, by_width: bool = False):
    """The kernel over a row split (kernels_src/norm/row_sum.py): a static one, or one computed from a runtime
    hidden (kernels_src/fused/norm_cast_generic.py; by_width: a body for each of the split's width classes). Every
    thread sums, rounds and scales the same elements in the same order either way."""
    hidden, vec = split.hidden, split.vec
    threads, min_blocks = NUM_THREADS, TILINGS[tiling].blocks
    # An fp32 row's weight share (up to 32 values a thread) does not fit beside x under the register cap: it spills
    preload = TILINGS[tiling].preload and dtype == "bfloat16"
    words = dtype == "bfloat16"
    pairs = dtype == "bfloat16"  # an fp32 row rounds to itself
    lean_sf = sf == "fp32" and dtype == "bfloat16"  # checked for bf16 amax values only
    group_lanes = GROUP // vec
    num_groups = hidden // GROUP
    num_words = -(-num_groups // 4) if split.static else T.ceildiv(num_groups, 4)
    packed = sf == "ue8m0"

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

    residual_given = TILINGS[tiling].residual
    grid_x = split.grid(num_tokens)

    def widen(vectors, v, j):
        # Value j of vector v as fp32: from its 32-bit word where "words" says so
        if words:
            return T.call_extern("float32", "tkaot_bf16_at", T.address_of(vectors[v, 0]), j)
        return T.cast(vectors[v, j], T.float32)

    def split_body(split):
        # The kernel's body over a split: its macros read the split's lane, row, bounds, row pointers and vectors
        vecs_per_thread = split.vectors

        @T.macro
        def store_sf(sf_row, gi, stored):
            # Group gi's scale factor; packed, the unused bytes of a row's last word are written as 0
            if packed:
                sf_row.buffer[sf_row.at(gi // 4, gi % 4)] = stored
                if split.static:
                    if num_groups % 4 != 0 and gi == num_groups - 1:
                        for p in T.unroll(num_groups % 4, 4):
                            sf_row.buffer[sf_row.at(num_words - 1, p)] = T.uint8(0)
                elif gi == num_groups - 1:
                    for p in T.unroll(1, 4):
                        if p >= num_groups % 4 and num_groups % 4 != 0:
                            sf_row.buffer[sf_row.at(num_words - 1, p)] = T.uint8(0)
            else:
                sf_row.buffer[sf_row.at(gi)] = stored

        @T.macro
        def store_residual_sums(rout_row, x_reg, token, lane):
            # With a residual tiling: the thread's residual sums, stored once the row reduction has consumed them
            for v in T.unroll(vecs_per_thread):
                col = (v * split.row_threads + lane) * vec
                if token < num_tokens and split.in_row(col):
                    for j in T.vectorized(vec):
                        rout_row.buffer[rout_row.at(v, j)] = x_reg[v, j]

        @T.macro
        def add_residual(res_row, rout_row, x_reg, r_reg, v):
            for j in T.vectorized(vec):
                r_reg[j] = res_row.buffer[res_row.at(v, j)]
            for j in T.vectorized(vec):
                x_reg[v, j] = x_reg[v, j] + r_reg[j]
            if not residual_given:
                for j in T.vectorized(vec):
                    rout_row.buffer[rout_row.at(v, j)] = x_reg[v, j]

        @T.macro
        def load_unguarded(x_row, res_row, rout_row, x_reg, r_reg, token, lane, has_residual):
            # A generic split's vectors: every x vector loaded first (clamped into the tensor, whatever the width), then
            # the residual added, then the vectors outside the row zeroed. Zeroing a vector waits for its load, so were
            # it done vector by vector (a predicated move after each load) the loads would go out a few at a time
            for v in T.unroll(vecs_per_thread):
                for j in T.vectorized(vec):
                    x_reg[v, j] = x_row.buffer[x_row.read_at(v, j)]
            if residual_given or has_residual != 0:
                for v in T.unroll(vecs_per_thread):
                    for j in T.vectorized(vec):
                        r_reg[j] = res_row.buffer[res_row.read_at(v, j)]
                    for j in T.vectorized(vec):
                        x_reg[v, j] = x_reg[v, j] + r_reg[j]
                    if not residual_given and token < num_tokens and split.in_row((v * split.row_threads + lane) * vec):
                        for j in T.vectorized(vec):
                            rout_row.buffer[rout_row.at(v, j)] = x_reg[v, j]
            for v in T.unroll(vecs_per_thread):
                if not (token < num_tokens and split.in_row((v * split.row_threads + lane) * vec)):
                    for j in T.vectorized(vec):
                        x_reg[v, j] = T.cast(0, dtype)

        @T.macro
        def load_row(x_row, res_row, rout_row, x_reg, r_reg, token, lane, has_residual):
            # The thread's vectors of its row into x_reg, the residual added (and the sum stored) where the call has one:
            # the residual tiling takes it as given, the other asks has_residual
            if split.loads_unguarded:
                load_unguarded(x_row, res_row, rout_row, x_reg, r_reg, token, lane, has_residual)
            else:
                for v in T.unroll(vecs_per_thread):
                    col = (v * split.row_threads + lane) * vec
                    if token < num_tokens and split.in_row(col):
                        for j in T.vectorized(vec):
                            x_reg[v, j] = x_row.buffer[x_row.at(v, j)]
                        if residual_given:
                            add_residual(res_row, rout_row, x_reg, r_reg, v)
                        elif has_residual != 0:
                            add_residual(res_row, rout_row, x_reg, r_reg, v)
                    else:
                        for j in T.vectorized(vec):
                            x_reg[v, j] = T.cast(0, dtype)

        @T.macro
        def body(
            x,
            weight,
            residual,
            residual_out,
            out,
            out_sf,
            out_bf16,
            rstd,
            eps,
            out_scale,
            has_weight,
            has_residual,
            has_rstd,
            has_out_bf16,
            block,
            b,
        ):
            tid = T.get_thread_binding()
            lane = split.lane(tid)
            x_reg = T.alloc_local((vecs_per_thread, vec), dtype)
            r_reg = T.alloc_local((vec,), dtype)
            w_reg = T.alloc_local((vecs_per_thread if preload else 1, vec), dtype)
            y_reg = T.alloc_local((vec,), dtype)
            yb_reg = T.alloc_local((vec,), T.bfloat16)
            q_reg = T.alloc_local((vec,), FP8)
            sums = T.alloc_local((2,), T.float32)
            yf = T.alloc_local((vec,), T.float32)
            sf_keep = T.alloc_local((vecs_per_thread,), sf_dtype)
            if pairs:
                yv = T.alloc_local((vec,), T.float32)
                word = T.alloc_var(T.uint32)
            acc = T.alloc_local((1,), T.float32)
            amax = T.alloc_var(T.float32)
            scale = T.alloc_var(T.float32)
            if lean_sf:
                clamped = T.alloc_var(T.float32)
                sf_lean = T.alloc_local((1,), T.float32)
                inv_lean = T.alloc_local((1,), T.float32)
            warp_sums = T.alloc_shared(split.warp_sums_shape, T.float32)
            token = block * split.rows_per_block + split.row(tid)
            x_row = split.thread_row(x, b, token, lane, "r")
            res_row = split.thread_row(residual, b, token, lane, "r")
            rout_row = split.thread_row(residual_out, b, token, lane, "w")
            out_row = split.thread_row(out, b, token, lane, "w")
            ob_row = split.thread_row(out_bf16, b, token, lane, "w")
            load_row(x_row, res_row, rout_row, x_reg, r_reg, token, lane, has_residual)
            if preload and has_weight != 0:
                for v in T.unroll(vecs_per_thread):
                    col = (v * split.row_threads + lane) * vec
                    if split.in_row(col):
                        for j in T.vectorized(vec):
                            w_reg[v, j] = weight[col + j]
            # The thread's squares in two chains, even and odd elements, then their sum (TileKernels' order)
            sums[0] = 0.0
            sums[1] = 0.0
            for v in T.unroll(vecs_per_thread):
                if split.live(v):  # a generic split's vectors past the count: zeros, which add nothing
                    for j in T.unroll(vec):
                        sums[j % 2] = T.fma(widen(x_reg, v, j), widen(x_reg, v, j), sums[j % 2])
            acc[0] = sums[0] + sums[1]

            split.reduce(acc, warp_sums, split.row(tid), lane)
            if residual_given:
                store_residual_sums(rout_row, x_reg, token, lane)
            inv_rms = T.alloc_var(T.float32, init=T.rsqrt(acc[0] / split.divisor + eps))
            if has_rstd != 0 and lane == 0 and token < num_tokens:
                rstd[b, token] = inv_rms

            for v in T.unroll(vecs_per_thread):
                if split.live(v):  # (a generic split's vectors past the count: nothing to write)
                    col = (v * split.row_threads + lane) * vec
                    in_row = split.in_row(col)
                    wv = v if preload else 0
                    if not preload and has_weight != 0 and in_row:
                        for j in T.vectorized(vec):
                            w_reg[0, j] = weight[col + j]
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
                    for i in T.unroll(group_lanes.bit_length() - 1):
                        amax = T.max(amax, T.shfl_xor(amax, 1 << i))
                    if lean_sf:
                        # The "fp32" scale factor (clamped / 448, 448 / clamped) without IEEE division's branch
                        clamped = T.max(amax, T.float32(amax_floor("e4m3", sf)))
                        lean_e4m3_scale_factor(clamped, sf_lean, inv_lean)
                        stored, inv = sf_lean[0], inv_lean[0]
                    else:
                        stored, inv = scale_factor(amax, "e4m3", sf)
                    if has_out_bf16 != 0 and token < num_tokens and in_row:
                        # Before yf is scaled (it holds bf16 values: the cast is exact), so yv need not stay live
                        for j in T.unroll(vec):
                            yb_reg[j] = T.cast(yf[j], T.bfloat16)
                        for j in T.vectorized(vec):
                            ob_row.buffer[ob_row.at(v, j)] = yb_reg[j]
                    for j in T.vectorized(vec):
                        yf[j] = yf[j] * inv
                    for j in T.vectorized(vec):
                        q_reg[j] = T.cast(yf[j], FP8)
                    if token < num_tokens and in_row:
                        for j in T.vectorized(vec):
                            out_row.buffer[out_row.at(v, j)] = q_reg[j]
                        sf_keep[v] = stored
            # The thread's scale factors, stored after its last vector under one branch
            if token < num_tokens and lane % group_lanes == 0:
                sf_row = split.sf_row(out_sf, b, token)
                for v in T.unroll(vecs_per_thread):
                    col = (v * split.row_threads + lane) * vec
                    if split.in_row(col):
                        store_sf(sf_row, col // GROUP, sf_keep[v])

        return body

    if by_width:
        # The common widths (a row over all the block's threads) on a body whose shift is a constant, the others on
        # the runtime split's (kernels_src/norm/row_sum.py, RuntimeSplit.width_classes)
        wide_body, narrow_body = (split_body(s) for s in split.width_classes())
    else:
        body = split_body(split)

    @T.macro
    def kernel(
        x, weight, residual, residual_out, out, out_sf, out_bf16, rstd, eps, out_scale, has_weight, has_residual, has_rstd, has_out_bf16
    ):
        with T.Kernel(grid_x, batch, threads=threads) as (block, b):
            T.annotate_min_blocks_per_sm(min_blocks)
            T.import_source(split.helpers + _DEVICE_HELPERS + PDL_SOURCE)
            pdl_entry()
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
            split.enter()
            # the parameters, as each body macro takes them
            args = (x, weight, residual, residual_out, out, out_sf, out_bf16, rstd, eps, out_scale, has_weight, has_residual)
            args += (has_rstd, has_out_bf16, block, b)
            if not by_width:
                body(*args)
            elif hidden > split.widest_from:
                wide_body(*args)
            else:
                narrow_body(*args)

    strides = {
        "x": (x_bstride, x_stride),
        "residual": (res_bstride, res_stride),
        "residual_out": (rout_bstride, rout_stride),
        "out": (out_bstride, out_stride),
        "out_bf16": (ob_bstride, ob_stride),
    }

    def row_type(name, row_dtype):
        return T.StridedTensor[rows, (*strides[name], 1), row_dtype]

    sf_t = T.StridedTensor[sf_shape, sf_strides, sf_dtype]
    rstd_t = T.Tensor[(batch, num_tokens), T.float32]
    return norm_cast_args.norm_cast(row_type, dtype, FP8, T.Tensor[(hidden,), dtype], sf_t, rstd_t, kernel)
