"""Engram gate forward: out = x + sigmoid(signed_sqrt(dot * rstd_x * rstd_k * scalar)) * v, per (token, head).

For head h of a token: x = hidden_states[t, h], k = kv[t, h], v = kv[t, hc_mult], w = weight_fused[h];
dot = sum(x * w * k), rstd_x = rsqrt(mean(x^2) + eps), rstd_k likewise, and
signed_sqrt(d) = sign(d) * sqrt(max(|d|, clamp_value)).

Two forms, the same sums in the same order (so the same bits). The streaming form ("c<ctas>s<stages>x<slice>w",
the op's kernel but for few tokens): a CTA is one warp that runs over a stretch of consecutive tokens of ONE head:
grid (hc_mult, runs), run r taking tokens [r * ceil(T / runs), ...), runs = min(T, ctas // hc_mult), so the CTAs
of a token's heads run side by side (v comes from HBM about once) and the weight row stays in the SM's L1 from
token to token.
Lane l sums elements c * 256 + l * 8 + j for the chunks c in ascending order and j = 0..7 in order, then
the warp sums its lanes: the order TileKernels sums in, so dot, rstd_x, rstd_k and the gate score come
out the same bits.

Loads are cp.async into shared memory, so a load in flight holds no register. A token is a stream of
2 * tiles items of 4 chunks (1024 elements): items 0..tiles-1 are k (with x, parked in shared memory
for pass 2), the rest v. A ring of `stages` slots holds the items; the warp stages item n + stages - 1
(one commit group an item, empty past the end) before it waits for item n, so v is in flight while the
warp finishes pass 1 and reduces. Once a token's last reads are issued, the next token's first items
are staged, so the run streams without a drain between tokens. A lane reads back only the vectors it
staged itself: the wait on its own groups is the only synchronisation (no block barrier, one warp).
x past the parked slice (hidden above slice * 256) is read from global memory in both passes. An item's
fp32 weights (4 chunks, 32 registers a lane) are read one item ahead, unguarded (a chunk past the row reads
the last one): one L2 round trip an item, overlapping the wait for and the sums of the item before, where a
read guarded by the chunk test waited once a chunk (28 a token). Read just before their own item's wait
instead: H200 398.3 / 5.58 / 6.87 / 8.84 µs against 392.2 / 5.53 / 7.10 / 9.03 at 8192 / 1 / 16 / 128 tokens
(session 13).

A warp's time on a token is mostly its instructions' latency (one warp a CTA; at few tokens, one an SM), so
a whole item (its 4 chunks in the row and x's in the slice: every item where hidden is a multiple of 1024
up to slice * 256) runs a body with no test a chunk and plain weight addresses; a partial item, or one
past the slice, the tested body. The test is one an item, uniform across the warp.

The decode form ("c<ctas>d<slice>w<warps>", see build; the op's kernel for few tokens on the inference path) shares
the row's latency among the warps of a CTA instead: all of them stage the token's whole row at once, pass 1's three
sums run in three warps side by side, each in the lanes' order above. It holds the row in shared memory, so it serves
hidden up to slice * 256; where there are no more tokens than runs, a run is its own token (no division on the way to
the first load).

Runtime values: tokens, hc_mult, hidden (a multiple of 256, at most 16384), eps, clamp_value,
scalar (hidden ** -0.5), and `flags`: bit 0 saves dot / gate_score / rstd_x / rstd_k, bit 1 reads
image_token_mask (masked tokens copy x to out, their saved values are 0), bit 2 writes out in place
of hidden_states (masked rows are then left alone).
"""

import re

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import GATE_FWD, MAX_GATE_HIDDEN

DECL = GATE_FWD  # the declaration this module builds (tkaot/_engram/kernels.py)

# a streaming lane only reads back the shared-memory vectors it staged itself; the decode form places its own barriers
PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}

VEC = 8  # bf16 elements a lane reads at once
CHUNK = 32 * VEC  # elements a warp reads at once
TILE = 4  # chunks an item (a ring slot) holds
SAVE, MASK, IN_PLACE = 1, 2, 4
SUM_WARPS = (0, 1, 2)  # the decode form's warps of x * x, k * k and x * w * k

# the decode form's runs (the grid's y size), read from gridDim rather than recomputed from the token count
GRID_Y_SOURCE = "__device__ __forceinline__ int tkaot_grid_y() {\n    return (int)gridDim.y;\n}\n"


def parse_decode(tiling: str) -> tuple[int, int, int] | None:
    """Decode tiling "c<ctas>d<slice>w<warps>": CTAs of `warps` warps (at most; split among the heads), a token's whole
    row (hidden at most slice * 256) staged by all the warps at once, the three sums in warps 0, 1 and 2. None where
    the tiling is not of this form."""
    match = re.fullmatch(r"c(\d+)d(\d+)w(\d+)", tiling)
    if match is None:
        return None
    ctas, slice_, warps = map(int, match.groups())
    if not (1 <= ctas <= 65535 and 3 <= warps <= 32 and slice_ % warps == 0 and 1 <= slice_ <= MAX_GATE_HIDDEN // CHUNK):
        raise ValueError(f"engram_gate_fwd tiling {tiling!r}: ctas 1-65535, 3-32 warps, slice a multiple of warps up to 64")
    return ctas, slice_, warps


def parse_tiling(tiling: str) -> tuple[int, int, int]:
    """Tiling "c<ctas>s<stages>x<slice>w": CTAs of one warp in the grid (at most; split among the heads), ring
    slots of 1024 elements, chunks of 256 of x parked in shared memory; "w": an item's weights are read one item
    ahead (the only form; the name tells it from the tilings measured before, which read them later)."""
    match = re.fullmatch(r"c(\d+)s(\d+)x(\d+)w", tiling)
    if match is None:
        raise ValueError(f"engram_gate_fwd tiling {tiling!r} is not c<ctas>s<stages>x<slice>w")
    ctas, stages, slice_ = map(int, match.groups())
    if not (1 <= ctas <= 65535 and 2 <= stages <= 32 and 1 <= slice_ <= MAX_GATE_HIDDEN // CHUNK):
        raise ValueError(f"engram_gate_fwd tiling {tiling!r}: ctas 1-65535, stages 2-32, slice 1-64")
    return ctas, stages, slice_


def cp_async(vec: int):
    """The macro copying vec elements (16 bytes) from src to dst by cp.async (dst and src: element accesses)."""

    @T.macro
    def cp(dst, src):
        T.ptx_cp_async(T.access_ptr(dst, "w", vec), T.access_ptr(src, "r", vec), vec)

    return cp


def streaming_steps(stages: int, slice_: int):
    """The streaming form's macros (stage, item_weights, pass1_item, pass2_item) for a ring of `stages` slots and x
    parked up to slice_ chunks."""
    ahead = stages - 1  # items in flight beyond the one the warp waits for
    cp = cp_async(VEC)

    @T.macro
    def stage_k(n, t, head, col, chunks, hidden_states, kv, x_smem, ring, whole):
        """Item n's x (up to the slice) and k; `whole`: all its chunks are in the row and x's in the slice."""
        for q in T.unroll(TILE):
            c = n * TILE + q
            if whole:
                cp(x_smem[c * CHUNK + col], hidden_states[t, head, c * CHUNK + col])
                cp(ring[n % stages, q * CHUNK + col], kv[t, head, c * CHUNK + col])
            elif c < chunks:
                if c < slice_:
                    cp(x_smem[c * CHUNK + col], hidden_states[t, head, c * CHUNK + col])
                cp(ring[n % stages, q * CHUNK + col], kv[t, head, c * CHUNK + col])

    @T.macro
    def stage_v(n, m, t, col, chunks, kv, hc_mult, ring, whole):
        """Item n (v's item m); `whole`: all its chunks are in the row."""
        for q in T.unroll(TILE):
            c = m * TILE + q
            if whole:
                cp(ring[n % stages, q * CHUNK + col], kv[t, hc_mult, c * CHUNK + col])
            elif c < chunks:
                cp(ring[n % stages, q * CHUNK + col], kv[t, hc_mult, c * CHUNK + col])

    @T.macro
    def stage(n, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, x_smem, ring):
        """Item n of token t in flight, one commit group (empty past the token: the waits count items). A whole
        item (the common case: hidden a multiple of 1024, x parked) is staged without a test a chunk."""
        if n < tiles:
            if (n + 1) * TILE <= T.min(chunks, slice_):
                stage_k(n, t, head, col, chunks, hidden_states, kv, x_smem, ring, True)
            else:
                stage_k(n, t, head, col, chunks, hidden_states, kv, x_smem, ring, False)
        elif n < 2 * tiles:
            if (n - tiles + 1) * TILE <= chunks:
                stage_v(n, n - tiles, t, col, chunks, kv, hc_mult, ring, True)
            else:
                stage_v(n, n - tiles, t, col, chunks, kv, hc_mult, ring, False)
        T.ptx_commit_group()

    @T.macro
    def item_weights(n, head, col, chunks, weight_fused, w_local):
        """Item n's fp32 weights (4 chunks a lane), read unguarded: a chunk past the row reads the last one."""
        for q in T.unroll(TILE):
            for j in T.vectorized(VEC):
                w_local[q * VEC + j] = weight_fused[head, T.min(n * TILE + q, chunks - 1) * CHUNK + col + j]

    @T.macro
    def chunk_in(t, c, slot, q, head, col, hidden_states, x_smem, ring, x_local, k_local, whole):
        """Chunk c into registers: x's (parked in shared memory, or past the slice from global memory; a `whole`
        item's is parked), then the vector of ring slot `slot` the chunk (the item's q-th) was staged into."""
        if whole:
            for j in T.vectorized(VEC):
                x_local[j] = x_smem[c * CHUNK + col + j]
        elif c < slice_:
            for j in T.vectorized(VEC):
                x_local[j] = x_smem[c * CHUNK + col + j]
        else:
            for j in T.vectorized(VEC):
                x_local[j] = hidden_states[t, head, c * CHUNK + col + j]
        for j in T.vectorized(VEC):
            k_local[j] = ring[slot, q * CHUNK + col + j]

    @T.macro
    def pass1_item(n, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, weight_fused, x_smem, ring, w_local,
                   w_next, x_local, k_local, sum_x, sum_k, sum_d, whole):  # fmt: skip
        """Item n of pass 1: the next item's weights read, the next item staged, this one's loads waited for, its
        sums added. `whole`: its 4 chunks are in the row and x's in the slice, so no chunk is tested."""
        # the next item's weights, in flight across this item's wait and sums: an unguarded read (a chunk past the
        # row reads the last one, unused; past the last item, the last item's), one L2 round trip an item. Read
        # ahead of the staging: read after it, ptxas placed most of them behind the wait
        for i in T.unroll(TILE * VEC):
            w_local[i] = w_next[i]
        item_weights(n + 1, head, col, chunks, weight_fused, w_next)
        stage(n + ahead, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, x_smem, ring)
        T.ptx_wait_group(ahead)
        for q in T.unroll(TILE):
            if whole or n * TILE + q < chunks:
                chunk_in(t, n * TILE + q, n % stages, q, head, col, hidden_states, x_smem, ring, x_local, k_local, whole)
                for j in T.serial(VEC):
                    sum_x[0] += x_local[j] * x_local[j]
                    sum_k[0] += k_local[j] * k_local[j]
                    sum_d[0] += x_local[j] * w_local[q * VEC + j] * k_local[j]

    @T.macro
    def pass2_item(m, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, output, x_smem, ring, x_local, k_local,
                   gate, whole):  # fmt: skip
        """Item m of pass 2 (v's): the next item staged, this one's loads waited for, out = x + gate * v stored."""
        stage(tiles + m + ahead, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, x_smem, ring)
        T.ptx_wait_group(ahead)
        for q in T.unroll(TILE):
            c = m * TILE + q
            if whole or c < chunks:
                chunk_in(t, c, (tiles + m) % stages, q, head, col, hidden_states, x_smem, ring, x_local, k_local, whole)
                for j in T.vectorized(VEC):
                    output[t, head, c * CHUNK + col + j] = x_local[j] + gate * k_local[j]

    return stage, item_weights, pass1_item, pass2_item


def decode_sums(warps: int):
    """The decode form's item_sums macro for items of `warps` chunks."""

    @T.macro
    def square_sum(smem, local, sums, s, at):
        """sums[s] += the squares of smem's VEC values from `at`, in order (staged through `local`)."""
        for j in T.vectorized(VEC):
            local[j] = smem[at + j]
        for j in T.serial(VEC):
            sums[s] += local[j] * local[j]

    @T.macro
    def item_sums(n, col, chunks, warp, x_smem, k_smem, w_smem, x_local, k_local, w_local, sums, whole):
        """Item n's share of this warp's sum (SUM_WARPS), chunk by chunk in order; `whole`: no chunk tested."""
        for s in (0, 1, 2):  # expanded at trace time: one branch a sum
            if warp == SUM_WARPS[s]:
                for q in T.unroll(warps):
                    if whole or n * warps + q < chunks:
                        if s == 0:  # x * x
                            square_sum(x_smem, x_local, sums, 0, (n * warps + q) * CHUNK + col)
                        elif s == 1:  # k * k
                            square_sum(k_smem, k_local, sums, 1, (n * warps + q) * CHUNK + col)
                        else:  # x * w * k
                            for j in T.vectorized(VEC):
                                x_local[j] = x_smem[(n * warps + q) * CHUNK + col + j]
                            for j in T.vectorized(VEC):
                                k_local[j] = k_smem[(n * warps + q) * CHUNK + col + j]
                            for j in T.vectorized(VEC):
                                w_local[j] = w_smem[(n * warps + q) * CHUNK + col + j]
                            for j in T.serial(VEC):
                                sums[2] += x_local[j] * w_local[j] * k_local[j]

    return item_sums


@T.macro
def publish_sum(s, warp, tid, sums, totals, total: T.Ref):
    """In warp SUM_WARPS[s]: its lanes' shuffle sum of sums[s] into `total`, and lane 0's copy into totals[s]."""
    if warp == SUM_WARPS[s]:
        total = T.warp_reduce_sum(sums[s])
        if tid % 32 == 0:
            totals[s] = total


def build(tiling: str):
    """Either form in one prim_func: the parameters, the grid, a masked token and the gate are the same; the staging
    and the passes are the form's, picked at trace time.

    The decode form: a CTA of `warps` warps a (head, run of tokens); the token's row is staged at once, in items of
    `warps` chunks, warp q staging chunk q of every item (x, k and the fp32 weights: one commit group an item; v's
    chunks: one group after), so the round trips overlap and the issue is shared. Pass 1's three sums are independent
    chains, each summed in TileKernels' order by the lanes of one warp (SUM_WARPS), an item at a time behind a block
    barrier (an item's chunks come from every warp); then each warp's shuffle sum, the totals through shared memory,
    and pass 2 by every warp over the chunks it staged itself (no barrier). A row of hidden above slice * 256 is not
    served (the op keeps such calls on the streaming form)."""
    decode_form = parse_decode(tiling)
    decode = decode_form is not None
    if decode:
        ctas, slice_, warps = decode_form
        items = slice_ // warps
        threads, entry_source, max_hidden = warps * 32, GRID_Y_SOURCE, slice_ * CHUNK
        item_sums = decode_sums(warps)
    else:
        ctas, stages, slice_ = parse_tiling(tiling)
        ahead = stages - 1  # items in flight beyond the one the warp waits for
        threads, entry_source, max_hidden = 32, "", MAX_GATE_HIDDEN
        stage, item_weights, pass1_item, pass2_item = streaming_steps(stages, slice_)
    num_tokens = T.dynamic("num_tokens")
    hc_mult = T.dynamic("hc_mult")
    hidden = T.dynamic("hidden")
    cp = cp_async(VEC)
    cp_w = cp_async(VEC // 2)  # 4 fp32: 16 bytes
    rows = (num_tokens, hc_mult)

    @T.prim_func
    def engram_gate_fwd(
        hidden_states: T.Tensor[(num_tokens, hc_mult, hidden), T.bfloat16],
        kv: T.Tensor[(num_tokens, hc_mult + 1, hidden), T.bfloat16],
        weight_fused: T.Tensor[(hc_mult, hidden), T.float32],
        image_token_mask: T.Tensor[(num_tokens,), T.bool],
        output: T.Tensor[(num_tokens, hc_mult, hidden), T.bfloat16],
        dot: T.Tensor[rows, T.float32],
        gate_score: T.Tensor[rows, T.float32],
        rstd_x: T.Tensor[rows, T.float32],
        rstd_k: T.Tensor[rows, T.float32],
        eps: T.float32,
        clamp_value: T.float32,
        scalar: T.float32,
        flags: T.int32,
    ):
        with T.Kernel(hc_mult, T.min(num_tokens, T.max(ctas // hc_mult, 1)), threads=threads) as (head, run):
            kernel_entry(entry_source)  # kernels_src/pdl.py: before any memory access
            T.assume(hidden % CHUNK == 0)
            T.assume(hidden <= max_hidden)
            tid = T.get_thread_binding()
            if decode:
                warp = tid // 32
                col = (tid % 32) * VEC
                chunks = hidden // CHUNK
                start = T.alloc_var(T.int32)
                end = T.alloc_var(T.int32)
                # the runs are the grid's y size; where there are no more tokens than runs (few tokens), a run is its
                # own token, without the divisions (the first loads wait for them)
                if num_tokens <= T.call_extern("int32", "tkaot_grid_y"):
                    start = run
                    end = run + 1
                else:
                    end = T.ceildiv(num_tokens, T.call_extern("int32", "tkaot_grid_y"))  # tokens a run
                    start = T.min(end * run, num_tokens)
                    end = T.min(start + end, num_tokens)
                x_smem = T.alloc_shared((slice_ * CHUNK,), T.bfloat16)
                k_smem = T.alloc_shared((slice_ * CHUNK,), T.bfloat16)
                v_smem = T.alloc_shared((slice_ * CHUNK,), T.bfloat16)
                w_smem = T.alloc_shared((slice_ * CHUNK,), T.float32)
                totals = T.alloc_shared((4,), T.float32)
                x_local = T.alloc_local((VEC,), T.float32)
                k_local = T.alloc_local((VEC,), T.float32)
                w_local = T.alloc_local((VEC,), T.float32)
                sums = T.alloc_local((3,), T.float32)
            else:
                col = tid * VEC  # tid: the lane
                chunks = hidden // CHUNK
                tiles = T.ceildiv(chunks, TILE)
                start = T.alloc_var(T.int32)
                end = T.alloc_var(T.int32)
                end = T.ceildiv(num_tokens, T.min(num_tokens, T.max(ctas // hc_mult, 1)))  # tokens a run
                start = T.min(end * run, num_tokens)
                end = T.min(start + end, num_tokens)
                x_smem = T.alloc_shared((slice_ * CHUNK,), T.bfloat16)
                ring = T.alloc_shared((stages, TILE * CHUNK), T.bfloat16)
                x_local = T.alloc_local((VEC,), T.float32)
                k_local = T.alloc_local((VEC,), T.float32)
                w_local = T.alloc_local((TILE * VEC,), T.float32)  # an item's weights
                w_next = T.alloc_local((TILE * VEC,), T.float32)  # the next item's
                sum_x = T.alloc_local((1,), T.float32)
                sum_k = T.alloc_local((1,), T.float32)
                sum_d = T.alloc_local((1,), T.float32)
            total_x = T.alloc_var(T.float32)
            total_k = T.alloc_var(T.float32)
            total_d = T.alloc_var(T.float32)
            gate = T.alloc_var(T.float32)
            live = T.alloc_var(T.bool)  # this token is gated (not masked)
            if not decode:
                staged = T.alloc_var(T.bool)  # this token's first items are in flight
                staged = False

            for t in T.serial(start, end):
                T.assume(0 <= t and t < num_tokens)
                live = True
                if (flags & MASK) != 0:  # the mask is read only when it is passed
                    live = not image_token_mask[t]
                if not live:
                    if (flags & IN_PLACE) == 0:
                        if decode:
                            for c in T.serial(T.ceildiv(chunks, warps)):
                                if c * warps + warp < chunks:
                                    for j in T.vectorized(VEC):
                                        output[t, head, (c * warps + warp) * CHUNK + col + j] = hidden_states[
                                            t, head, (c * warps + warp) * CHUNK + col + j]  # fmt: skip
                        else:
                            for c in T.serial(chunks):
                                for j in T.vectorized(VEC):
                                    output[t, head, c * CHUNK + col + j] = hidden_states[t, head, c * CHUNK + col + j]
                    if (flags & SAVE) != 0 and tid == 0:
                        dot[t, head] = 0.0
                        gate_score[t, head] = 0.0
                        rstd_x[t, head] = 0.0
                        rstd_k[t, head] = 0.0
                else:
                    if decode:
                        # the whole row in flight: item n's chunk q (x, k, w) by warp q, one group an item; v's after
                        for n in T.serial(items):
                            c = n * warps + warp
                            if c < chunks:
                                cp(x_smem[c * CHUNK + col], hidden_states[t, head, c * CHUNK + col])
                                cp(k_smem[c * CHUNK + col], kv[t, head, c * CHUNK + col])
                                cp_w(w_smem[c * CHUNK + col], weight_fused[head, c * CHUNK + col])
                                cp_w(w_smem[c * CHUNK + col + VEC // 2], weight_fused[head, c * CHUNK + col + VEC // 2])
                            T.ptx_commit_group()
                        for n in T.serial(items):
                            c = n * warps + warp
                            if c < chunks:
                                cp(v_smem[c * CHUNK + col], kv[t, hc_mult, c * CHUNK + col])
                        T.ptx_commit_group()
                        # pass 1: each sum's chain in TileKernels' order, an item at a time
                        T.clear(sums)
                        for n in T.serial(items):
                            # item n's group done: `items` groups may stay pending (the later items', v's and the empty
                            # groups committed here, one an item, which keep the count a constant)
                            T.ptx_wait_group(items)
                            T.ptx_commit_group()
                            T.sync_threads()
                            # each warp's chunks of the item in one stretch (its loads ahead of its sums); a whole
                            # item (all its chunks in the row) without a test a chunk
                            if (n + 1) * warps <= chunks:
                                item_sums(n, col, chunks, warp, x_smem, k_smem, w_smem, x_local, k_local, w_local, sums, True)
                            else:
                                item_sums(n, col, chunks, warp, x_smem, k_smem, w_smem, x_local, k_local, w_local, sums, False)
                        publish_sum(0, warp, tid, sums, totals, total_x)
                        publish_sum(1, warp, tid, sums, totals, total_k)
                        publish_sum(2, warp, tid, sums, totals, total_d)
                        T.sync_threads()
                        total_x = T.rsqrt(totals[0] / T.cast(hidden, T.float32) + eps)
                        total_k = T.rsqrt(totals[1] / T.cast(hidden, T.float32) + eps)
                        total_d = totals[2]
                    else:
                        if not staged:
                            for u in T.unroll(ahead):
                                stage(u, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, x_smem, ring)
                        # pass 1: the three sums in TileKernels' order
                        T.clear(sum_x)
                        T.clear(sum_k)
                        T.clear(sum_d)
                        item_weights(0, head, col, chunks, weight_fused, w_next)
                        for n in T.serial(tiles):
                            if (n + 1) * TILE <= T.min(chunks, slice_):
                                pass1_item(n, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, weight_fused, x_smem,
                                           ring, w_local, w_next, x_local, k_local, sum_x, sum_k, sum_d, True)  # fmt: skip
                            else:
                                pass1_item(n, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, weight_fused, x_smem,
                                           ring, w_local, w_next, x_local, k_local, sum_x, sum_k, sum_d, False)  # fmt: skip
                        total_x = T.warp_reduce_sum(sum_x[0])
                        total_k = T.warp_reduce_sum(sum_k[0])
                        total_d = T.warp_reduce_sum(sum_d[0])
                        total_x = T.rsqrt(total_x / T.cast(hidden, T.float32) + eps)
                        total_k = T.rsqrt(total_k / T.cast(hidden, T.float32) + eps)
                    gate = total_d * total_x * total_k * scalar
                    gate = T.sigmoid(T.copysign(T.sqrt(T.clamp(T.abs(gate), clamp_value, T.infinity(T.float32))), gate))
                    if (flags & SAVE) != 0 and tid == 0:
                        dot[t, head] = total_d
                        gate_score[t, head] = gate
                        rstd_x[t, head] = total_x
                        rstd_k[t, head] = total_k
                    if decode:
                        # pass 2: out = x + gate * v, each warp over the chunks it staged
                        T.ptx_wait_group(0)
                        for n in T.serial(items):
                            c = n * warps + warp
                            if c < chunks:
                                for j in T.vectorized(VEC):
                                    x_local[j] = x_smem[c * CHUNK + col + j]
                                for j in T.vectorized(VEC):
                                    k_local[j] = v_smem[c * CHUNK + col + j]
                                for j in T.vectorized(VEC):
                                    output[t, head, c * CHUNK + col + j] = x_local[j] + gate * k_local[j]
                        T.sync_threads()  # the row's shared memory read before the next token stages into it
                    else:
                        # pass 2: out = x + gate * v
                        for m in T.serial(tiles):
                            if (m + 1) * TILE <= T.min(chunks, slice_):
                                pass2_item(m, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, output, x_smem, ring,
                                           x_local, k_local, gate, True)  # fmt: skip
                            else:
                                pass2_item(m, t, head, col, chunks, tiles, hidden_states, kv, hc_mult, output, x_smem, ring,
                                           x_local, k_local, gate, False)  # fmt: skip
                        # the next token's first items, behind this token's last reads of their slots
                        staged = False
                        if t + 1 < end:
                            live = True
                            if (flags & MASK) != 0:
                                live = not image_token_mask[t + 1]
                            if live:
                                for u in T.unroll(ahead):
                                    stage(u, t + 1, head, col, chunks, tiles, hidden_states, kv, hc_mult, x_smem, ring)
                                staged = True

    return engram_gate_fwd
