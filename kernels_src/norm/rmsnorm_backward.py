"""RMSNorm backward, pass 1: x_grad of each row, and each block's fp32 share of the weight gradient.

With xhat = x * rstd, g = out_grad * out_scale and gw = g * weight (g without a weight):
    x_grad = (gw - xhat * (sum(xhat * gw) / hidden)) * rstd  (+ residual_out_grad)
    weight_grad = sum over rows of xhat * g
A row is spread over `row_threads` threads (tkaot/_quant/kernels.py: norm_backward_tiling; a block of 256
threads holds several rows when they are short); each thread holds whole 16-byte vectors of x and out_grad
in registers across the row, in their own dtype, so both are read from global memory once, and the weight's
vectors from the start; the row's dot product is reduced with warp shuffles, then across warps through shared
memory (double-buffered: one barrier a row).
The rows a block visits next are staged in shared memory by cp.async, STAGES rows ahead of each row slot (x,
out_grad and residual_out_grad; each thread copies and later reads only its own vectors), and each row's rstd
is read one row ahead: the loads of the next rows are in flight while a row is reduced and written, rather
than one row's loads, then its reduction, then its stores (TileKernels stages its rows likewise). x's and
out_grad's stage slots are refilled as soon as the thread has read them, before the reduction (in the plain form
each vector's as soon as it is read); the residual gradient's after the row's stores.
Every product that meets a sum is an explicit fused multiply-add or a product rounded on its own (__fmaf_rn),
so the compiler cannot contract the two tiers' code differently: x_grad = fma(-xhat, mean, gw) * rstd (+ the
residual gradient as the fma's addend).
The grid is a fixed number of blocks (num_blocks, chosen by the op) that stride over the rows, so a thread owns
the same columns in every row it visits and accumulates their weight gradient in registers; at the end a block
adds its row slots in a fixed order and writes one partial row, partials[block, :]. Pass 2
(kernels_src/norm/weight_grad_reduce.py) adds the partials in a fixed order: the result does not
depend on timing. Tokens, blocks, strides, out_scale and whether there is a weight or a residual
gradient are runtime values.

One kernel body serves both tiers: a static tiling (StaticTiling, the specialised kernel: hidden fixed) or, in the
generic kernel (kernels_src/norm/rmsnorm_backward_generic.py), a body per width class that it branches into once on
the runtime hidden: the widths whose rows take the same threads (ClassTiling: the row's threads, slots and warps
constants, so each vector's address is a constant offset, as in the specialised kernel; only the vectors some width of
the class leaves out of the row are checked against hidden). Every tiling gives each thread the same columns of the
same rows and adds them in the same order, so the generic kernel writes the specialised kernel's bytes. (One body with
the threads a row takes computed from hidden, for the narrow widths, measured slower: bf16 1024 47.8 µs against 23.1
on its class body, H200, session 13.)
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._quant.kernels import NORM_BACKWARD_THREADS, RMSNORM_BACKWARD, norm_backward_tiling

DECL = RMSNORM_BACKWARD  # the declaration this module builds (tkaot/_quant/kernels.py)

NUM_THREADS = NORM_BACKWARD_THREADS
# One block an SM (the op's grid, NORM_BACKWARD_MAX_BLOCKS): up to 255 registers a thread for x, out_grad, the
# weight (NORM_BACKWARD_MAX_VECTORS vectors of each) and their fp32 weight-gradient sums. Before: 2 blocks an SM of
# 128 registers, out_grad read from the stage again after the reduction and an fp32 weight read from L1 each row.
MIN_BLOCKS_PER_SM = 1
# Rows staged ahead of each row slot: a block's stage of one tensor is at most 32 KiB (fp32 8192; bf16 rows of 7
# vectors: 28 KiB), so 2 stages of x, out_grad and residual_out_grad take at most 192 KiB (before: 1 stage for fp32
# at 2 blocks an SM)
STAGES = 2
STAGED_TENSORS = 3  # x, out_grad, residual_out_grad
MULTIPLE, MAX_HIDDEN = 32, 8192  # the hidden axis: a multiple of 32 up to 8192
# The kernel's barriers are its own (build_tools/compile.py applies this to its lowering): a thread reads only the
# vectors its own cp.async wrote, after its own wait, so the only shared data are the warp sums (row_dot: a
# barrier after writing them, in the half of the row's parity) and the slot sums at the end (a barrier before and
# after writing them). TileLang's inserted barriers (around each staged read and copy: 6 a row at 7168) are left out.
PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}


def build(hidden: int, dtype: str):
    return rmsnorm_backward_kernel(StaticTiling(hidden, dtype), dtype)


class StaticTiling:
    """norm_backward_tiling of a static hidden, as the specialised kernel uses it."""

    static = True

    def __init__(self, hidden: int, dtype: str, threads: int = NUM_THREADS):
        self.hidden, self.threads = hidden, threads  # the block's threads: `slots` rows of row_threads
        self.vec, self.row_threads, self.vectors = norm_backward_tiling(hidden, dtype)
        self.slots = threads // self.row_threads
        self.stage_elems = self.slots * hidden  # one tensor's rows of a stage
        self.lanes = min(self.row_threads, 32)
        self.row_warps = self.row_threads // self.lanes
        self.warps_shape, self.slots_shape = (2, self.slots, self.row_warps), (self.slots, hidden)
        self.exact = hidden % (self.vec * self.row_threads) == 0  # every thread's vectors are in range

    def in_row(self, v, col):
        """Whether the thread's vector v, at column col, is in the row."""
        return self.exact or col < self.hidden

    def live(self, v) -> bool:
        """Whether the thread's unrolled vector v is among its row's vectors (always: the loops run to the count)."""
        return True

    def mean(self, total):
        return total / T.float32(self.hidden)

    def lane_and_slot(self, tid):
        return tid % self.row_threads, tid // self.row_threads

    def warp_at(self, half, sub, w):
        return half, sub, w

    def slot_at(self, s, col):
        return s, col


class ClassTiling:
    """norm_backward_tiling over a class of widths whose rows take the same threads, (lo, hi], hidden a runtime value.

    The threads a row takes, its lanes, a block's row slots and a row's warps are constants, as in the specialised
    kernel, so each vector's shared and global address is a constant offset from the thread's row. A vector in the
    row at the class's narrowest width is in it at every width of the class: only the others are checked against
    hidden (and skipped past the thread's count), each check a constant for the vectors below (`sure`, `counted`)
    once the loop is unrolled. Shared memory is sized for the class's widest rows and indexed flat.
    """

    static = False
    exact = False

    def __init__(self, hidden, dtype: str, lo: int, hi: int):
        self.hidden, self.lo, self.hi = hidden, lo, hi
        self.vec, self.row_threads, self.vectors = norm_backward_tiling(hi, dtype)  # the most vectors: the widest's
        self.narrowest = lo + MULTIPLE
        if norm_backward_tiling(self.narrowest, dtype)[1] != self.row_threads:
            raise AssertionError(f"widths {self.narrowest} and {hi} take different threads a row")
        self.threads = NUM_THREADS
        self.slots = NUM_THREADS // self.row_threads
        self.lanes = min(self.row_threads, 32)
        self.row_warps = self.row_threads // self.lanes
        self.stage_elems = self.slots * hi  # one tensor's rows of a stage at the class's widest, flat
        self.warps_shape, self.slots_shape = (2, self.slots * self.row_warps), (self.slots * hi,)
        # a vector below `sure` is in the row at every width of the class; one below `counted`, among its vectors
        self.sure = self.narrowest // (self.row_threads * self.vec)
        self.counted = -(-self.narrowest // (self.row_threads * self.vec))

    def in_row(self, v, col):
        # (v < sure: a constant once the loop is unrolled; col < hidden spelt so each access is seen in bounds)
        return T.Or(v < self.sure, col + self.vec <= self.hidden)

    def live(self, v):
        return T.Or(v < self.counted, v * self.row_threads < self.hidden // self.vec)

    def mean(self, total):
        return total / T.cast(self.hidden, "float32")  # IEEE division, as by the static one

    def lane_and_slot(self, tid):
        return tid % self.row_threads, tid // self.row_threads

    def warp_at(self, half, sub, w):
        return half, sub * self.row_warps + w

    def slot_at(self, s, col):
        return (s * self.hidden + col,)


def width_classes(hidden, dtype: str) -> tuple[ClassTiling, ...]:
    """The generic kernel's tilings: a ClassTiling for each class of widths whose rows take the same threads, narrowest
    first, together every width the generic tier takes (a multiple of MULTIPLE up to MAX_HIDDEN)."""
    spans = []  # [lo, hi, threads]: the widths in (lo, hi] take `threads` threads a row
    for h in range(MULTIPLE, MAX_HIDDEN + 1, MULTIPLE):
        threads = norm_backward_tiling(h, dtype)[1]
        if spans and spans[-1][2] == threads:
            spans[-1][1] = h
        else:
            spans.append([h - MULTIPLE, h, threads])
    return tuple(ClassTiling(hidden, dtype, lo, hi) for lo, hi, _ in spans)


def _at(buf, head, col):
    """The index of column col in buf's row head[0] (a 2-D buf), or past flat offset head[0] (a flat one)."""
    return (head[0] + col,) if len(buf.shape) == 1 else (head[0], col)


def _fma(a, b, c):
    return T.call_extern("float32", "__fmaf_rn", a, b, c)


def _mul(a, b):
    return T.call_extern("float32", "__fmul_rn", a, b)


def rmsnorm_backward_kernel(tilings, dtype: str, static_body=None):
    """The kernel over a StaticTiling (specialised: one body), or the generic kernel's tuple of ClassTiling (a body each,
    taken where hidden is in its class). The same sums in the same order in each. `static_body` replaces tiling_body
    for a StaticTiling (kernels_src/norm/rmsnorm_backward_residual.py: the calls with a residual gradient)."""
    main = tilings if isinstance(tilings, StaticTiling) else tilings[0]
    hidden = main.hidden

    num_tokens = T.dynamic("num_tokens")
    num_blocks = T.dynamic("num_blocks")
    og_stride, x_stride, rg_stride = T.dynamic("out_grad_stride"), T.dynamic("x_stride"), T.dynamic("residual_out_grad_stride")
    only = (static_body or tiling_body)(main, dtype, num_tokens, num_blocks) if main.static else None
    bodies = [] if main.static else [(c.lo, c.hi, tiling_body(c, dtype, num_tokens, num_blocks)) for c in tilings]

    @T.prim_func
    def rmsnorm_backward(
        out_grad: T.StridedTensor[(num_tokens, hidden), (og_stride, 1), dtype],
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), dtype],
        weight: T.Tensor[(hidden,), dtype],
        rstd: T.Tensor[(num_tokens,), T.float32],
        residual_out_grad: T.StridedTensor[(num_tokens, hidden), (rg_stride, 1), dtype],
        x_grad: T.Tensor[(num_tokens, hidden), dtype],
        partials: T.Tensor[(num_blocks, hidden), T.float32],
        out_scale: T.float32,
        has_weight: T.int32,
        has_residual: T.int32,
    ):
        with T.Kernel(num_blocks, threads=main.threads) as block:
            T.annotate_min_blocks_per_sm(MIN_BLOCKS_PER_SM)
            kernel_entry()  # kernels_src/pdl.py: before any memory access
            if not main.static:
                T.assume(hidden % MULTIPLE == 0)  # as declared: whole vectors, so each access is one
            # Callers guarantee 16-byte aligned rows, so every vector access is one 16-byte access
            T.assume(og_stride % main.vec == 0)
            T.assume(x_stride % main.vec == 0)
            T.assume(rg_stride % main.vec == 0)
            args = (out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, has_weight, has_residual, block)
            if main.static:
                only(*args)
            else:
                # One branch on hidden, the same in every thread: the body of its width class (each body's shared
                # memory is its own, the same bytes as the others')
                for lo, hi, body in bodies:
                    if hidden > lo and hidden <= hi:
                        body(*args)

    return rmsnorm_backward


def tiling_body(tiling, dtype: str, num_tokens, num_blocks, form: str = "runtime"):
    """The kernel's body over one tiling, as a macro of the kernel's parameters and its block. `form`:
    - "runtime": whether there is a weight and a residual gradient are the call's flags;
    - "residual" (kernels_src/norm/rmsnorm_backward_residual.py, a StaticTiling): has_residual taken as 1, x * rstd and
      the gradient held in fp32 registers from the dot product to the stores;
    - "plain" (kernels_src/norm/rmsnorm_backward_plain.py, a StaticTiling): neither a weight nor a residual gradient,
      both flags taken as 0: no weight registers or weight-gradient sums, x and out_grad alone staged, x * rstd and
      the gradient held as in the residual form; each block runs its own rows' count (so where a block holds one row
      slot, every row it visits is in range: no row checks), and each vector's stage slots are refilled right after
      the thread reads them.
    In the residual and plain forms the row's warp-sum barrier is one of its row slot's threads."""
    if form not in ("runtime", "residual", "plain"):
        raise ValueError(f"tiling_body form {form!r}")
    residual, plain = form == "residual", form == "plain"
    held = residual or plain  # x * rstd and the gradient held in fp32 from the dot product to the stores
    hidden, vec, vecs_per_thread = tiling.hidden, tiling.vec, tiling.vectors
    row_threads, slots = tiling.row_threads, tiling.slots
    stages, region = STAGES, tiling.stage_elems
    staged_tensors = 2 if plain else STAGED_TENSORS
    row_checks = not (plain and slots == 1)  # a block's own count of one row slot visits no row past the last

    def rows_of(block):
        """How many rows each slot of the block visits: every block the grid's most (some past the last row), or in
        the plain form the block's own count (where the block holds several row slots, the last may still be past)."""
        if plain:
            return T.ceildiv(num_tokens - block * slots, num_blocks * slots)
        return T.ceildiv(num_tokens, num_blocks * slots)

    def token_of(it, block, sub):
        return (it * num_blocks + block) * slots + sub

    def staged(stage, tensor, sub, col):
        """Flat index of a vector's first element in the staging buffer: (stage, tensor, row slot, column)."""
        return (stage * staged_tensors + tensor) * region + sub * hidden + col

    def with_residual(has_residual):
        """Whether the rows have a residual gradient: always in the residual body, never in the plain one, else as the
        call says."""
        return residual or (not plain and has_residual != 0)

    def with_weight(has_weight):
        """Whether there is a weight: never in the plain body, else as the call says."""
        return not plain and has_weight != 0

    @T.macro
    def row_dot(acc, warp_sums, half, sub, lane):
        """acc[0], a thread's share of the row's dot product, becomes the row's in every thread of the row. The warp
        sums alternate between two halves of warp_sums (`half`, the row's parity): the next row writes the other
        half, and the row after it this one only after the next row's barrier, which every thread passes after its
        reads."""
        for i in T.unroll(tiling.lanes.bit_length() - 1):
            acc[0] += T.shfl_xor(acc[0], tiling.lanes >> (i + 1))
        if tiling.row_warps > 1:
            if lane % 32 == 0:
                warp_sums[tiling.warp_at(half, sub, lane // 32)] = acc[0]
            if (residual or plain) and slots > 1:
                T.sync_threads(sub + 1, row_threads)  # each slot's warp sums are its own: its rows need not wait
            else:
                T.sync_threads()
            acc[0] = 0.0
            for w in T.unroll(tiling.row_warps):
                acc[0] += warp_sums[tiling.warp_at(half, sub, w)]

    def in_range(token):
        """Whether the slot's row `token` is a row (a constant True where the form needs no row checks)."""
        return token < num_tokens if row_checks else True

    @T.macro
    def stage_vector(src, stage_buf, tensor, stage, sub, token, lane, v):
        # The thread's own vector v of row `token` (zeros past the last token) into its slot of the stage
        col = (v * row_threads + lane) * vec
        if tiling.in_row(v, col):
            T.ptx_cp_async(
                T.access_ptr(stage_buf[staged(stage, tensor, sub, col)], "w", vec),
                T.access_ptr(src[T.min(token, num_tokens - 1), col], "r", vec),
                vec,
                token < num_tokens,
            )

    @T.macro
    def stage_row(src, stage_buf, tensor, stage, sub, token, lane):
        # The thread's own vectors of row `token` into its slot of the stage
        for v in T.unroll(vecs_per_thread):
            stage_vector(src, stage_buf, tensor, stage, sub, token, lane, v)

    @T.macro
    def store_held(dst, head, dw, lane):
        """Each thread's held weight-gradient sums (dw) into dst's row head[0], or from flat offset head[0] where dst
        is flat."""
        for v in T.unroll(vecs_per_thread):
            col = (v * row_threads + lane) * vec
            if tiling.in_row(v, col):
                for j in T.vectorized(vec):
                    dst[_at(dst, head, col + j)] = dw[v, j]

    @T.macro
    def body(out_grad, x, weight, rstd, residual_out_grad, x_grad, partials, out_scale, has_weight, has_residual, block):
        tid = T.get_thread_binding()
        lane, sub = tiling.lane_and_slot(tid)
        x_in = T.alloc_local((vecs_per_thread, vec), dtype)
        g_in = T.alloc_local((vecs_per_thread, vec), dtype)
        if held:
            xh_held = T.alloc_local((vecs_per_thread, vec), T.float32)
            gw_held = T.alloc_local((vecs_per_thread, vec), T.float32)
        if not plain:
            w_in = T.alloc_local((vec,), dtype)
            w_held = T.alloc_local((vecs_per_thread, vec), dtype)
            dw = T.alloc_local((vecs_per_thread, vec), T.float32)
            r_in = T.alloc_local((vec,), dtype)
        res = T.alloc_local((vec,), dtype)
        acc = T.alloc_local((1,), T.float32)
        stage_buf = T.alloc_shared((stages * staged_tensors * region,), dtype)
        warp_sums = T.alloc_shared(tiling.warps_shape, T.float32)
        if not plain:
            slot_sums = T.alloc_shared(tiling.slots_shape, T.float32)
        r = T.alloc_var(T.float32)
        r_next = T.alloc_var(T.float32)
        xh = T.alloc_var(T.float32)
        g = T.alloc_var(T.float32)
        t = T.alloc_var(T.float32)

        if not plain:
            for v in T.unroll(vecs_per_thread):
                for j in T.unroll(vec):
                    dw[v, j] = 0.0
        if with_weight(has_weight):
            for v in T.unroll(vecs_per_thread):
                col = (v * row_threads + lane) * vec
                if tiling.in_row(v, col):
                    for j in T.vectorized(vec):
                        w_in[j] = weight[col + j]
                else:
                    for j in T.unroll(vec):
                        w_in[j] = T.cast(0, dtype)
                for j in T.unroll(vec):
                    w_held[v, j] = w_in[j]

        # The first `stages` rows of each slot, one commit group a row
        for s in T.unroll(stages):
            stage_row(x, stage_buf, 0, s, sub, token_of(s, block, sub), lane)
            stage_row(out_grad, stage_buf, 1, s, sub, token_of(s, block, sub), lane)
            if with_residual(has_residual):
                stage_row(residual_out_grad, stage_buf, 2, s, sub, token_of(s, block, sub), lane)
            T.ptx_commit_group()
        r_next = 0.0
        if token_of(0, block, sub) < num_tokens:
            r_next = rstd[token_of(0, block, sub)]

        for it in T.serial(rows_of(block)):
            token = token_of(it, block, sub)
            ahead = token_of(it + stages, block, sub)  # the row this iteration stages in its place
            stage = it % stages
            if not row_checks:
                T.assume(token < num_tokens)  # the block's own count: its stores are seen in bounds
            r = r_next
            r_next = 0.0
            if token_of(it + 1, block, sub) < num_tokens:
                r_next = rstd[token_of(it + 1, block, sub)]
            T.ptx_wait_group(stages - 1)  # this row's group has landed: the thread reads its own vectors
            acc[0] = 0.0
            for v in T.unroll(vecs_per_thread):
                col = (v * row_threads + lane) * vec
                if in_range(token) and tiling.in_row(v, col):
                    for j in T.vectorized(vec):
                        x_in[v, j] = stage_buf[staged(stage, 0, sub, col) + j]
                    for j in T.vectorized(vec):
                        g_in[v, j] = stage_buf[staged(stage, 1, sub, col) + j]
                else:
                    for j in T.unroll(vec):
                        x_in[v, j] = T.cast(0, dtype)
                        g_in[v, j] = T.cast(0, dtype)
                if plain:  # the vector read: its slots take the row `stages` ahead's at once
                    stage_vector(x, stage_buf, 0, stage, sub, ahead, lane, v)
                    stage_vector(out_grad, stage_buf, 1, stage, sub, ahead, lane, v)
            if not plain:
                # x and out_grad read: the stage takes theirs of the row `stages` ahead (the residual gradient's,
                # read after the reduction, at the end of the row)
                stage_row(x, stage_buf, 0, stage, sub, ahead, lane)
                stage_row(out_grad, stage_buf, 1, stage, sub, ahead, lane)
            for v in T.unroll(vecs_per_thread):
                if tiling.live(v):  # a generic tiling's vectors past the count: not the thread's, not added
                    for j in T.unroll(vec):
                        xh = T.cast(x_in[v, j], T.float32) * r
                        g = T.cast(g_in[v, j], T.float32) * out_scale
                        if with_weight(has_weight):
                            dw[v, j] = _fma(xh, g, dw[v, j])
                            g = _mul(g, T.cast(w_held[v, j], T.float32))
                        acc[0] = _fma(xh, g, acc[0])
                        if held:
                            xh_held[v, j] = xh
                            gw_held[v, j] = g

            # The row's dot product in every thread of the row (shuffles, then warps through shared memory)
            row_dot(acc, warp_sums, it % 2, sub, lane)
            mean = tiling.mean(acc[0])

            for v in T.unroll(vecs_per_thread):
                col = (v * row_threads + lane) * vec
                if in_range(token) and tiling.in_row(v, col):
                    if with_residual(has_residual):
                        for j in T.vectorized(vec):
                            r_in[j] = stage_buf[staged(stage, 2, sub, col) + j]
                    for j in T.unroll(vec):
                        if held:
                            t = _fma(-xh_held[v, j], mean, gw_held[v, j])
                        else:
                            xh = T.cast(x_in[v, j], T.float32) * r
                            g = T.cast(g_in[v, j], T.float32) * out_scale
                            if with_weight(has_weight):
                                g = _mul(g, T.cast(w_held[v, j], T.float32))
                            t = _fma(-xh, mean, g)
                        if with_residual(has_residual):
                            res[j] = T.cast(_fma(t, r, T.cast(r_in[j], T.float32)), dtype)
                        else:
                            res[j] = T.cast(_mul(t, r), dtype)
                    for j in T.vectorized(vec):
                        x_grad[token, col + j] = res[j]
            if with_residual(has_residual):
                stage_row(residual_out_grad, stage_buf, 2, stage, sub, ahead, lane)
            T.ptx_commit_group()
        T.ptx_wait_group(0)

        if with_weight(has_weight):
            # The block's row slots added in slot order, one partial row a block
            if slots == 1:
                store_held(partials, (block,), dw, lane)
            else:
                T.sync_threads()  # every thread's last staged reads are done: slot_sums may share their memory
                store_held(slot_sums, tiling.slot_at(sub, 0), dw, lane)
                T.sync_threads()
                for c in T.serial(T.ceildiv(hidden, tiling.threads)):
                    col = c * tiling.threads + tid
                    if col < hidden:
                        r = slot_sums[tiling.slot_at(0, col)]
                        for s in T.unroll(1, slots):
                            r += slot_sums[tiling.slot_at(s, col)]
                        partials[block, col] = r

    return body
