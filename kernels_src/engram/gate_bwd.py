"""Engram gate backward: grad_hidden_states, grad_kv and per-CTA partials of the fused weight's gradient.

With g the saved gate score, d = dot * scalar * rstd_x * rstd_k and the upstream gradient go of
a (token, head) row:
    dL/dg   = sum(go * v)
    r       = 0 where |d| < clamp_value, else dL/dg * g * (1 - g) * 0.5 * sqrt(scalar * rstd_x * rstd_k / |dot|)
    grad_x  = go + r * (k * w - x * dot * rstd_x^2 / hidden)
    grad_k  = r * (x * w - k * dot * rstd_k^2 / hidden)
    grad_v  = sum over heads of go * g
    grad_w  = sum over tokens of r * x * k (grad_w_partial[p]: the tokens of CTA p)
Image tokens (has_mask) pass go through to grad_x and get zero grad_kv.

One CTA a partial p, 8 warps, two a head (hc_mult is 4): CTA p takes tokens
[p * ceil(T / P), (p + 1) * ceil(T / P)). Lane l of warp `half` of a head owns, in every 256-element
group g, elements g * 256 + half * 128 + l * 4 + 0..3. Every sum runs in TileKernels' order (dL/dg:
a warp sums its lanes' elements group by group, then the two warps add; grad_v: heads in order;
grad_w: token by token), so the results are the same bits.

With one CTA an SM the kernel lives on bytes in flight. The first `keep` groups of a row are unrolled and
their loads staged by cp.async into shared memory, so a load in flight holds no register: go straight to its
parked place (grad_v and grad_x read it there, not from L2 again), x and k through a ring of `depth` slots, and v's
kept groups once a token, by the whole CTA, into `v_smem` (0.5 KB a group), as TileKernels reads it. A token is a
stream of 2 * keep positions: position p < keep is kept group p's go (the dL/dg pass), `ahead` of them in flight
ahead of the one waited for (2 KB a position); position keep + g is group g's x and k (the grad_x pass), a lane
staging position n + depth - 1 (one commit group, empty past the row) before it waits for position n. Each pass
drains its stream at its end, the grad_x pass's first loads in flight during the dL/dg exchange and grad_v. The next
token's v is copied during this token's grad_x pass, right after the exchange barrier has seen every reader of v
done (the copies join the grad_x pass's first commit group), and waited for (every thread's own copies, then the
token's first barrier) as the next token starts; a CTA's first token (or one after an image token) copies its own v
there. A token's saved scalars are read as it starts, behind its first loads. The kept groups' grad_w is summed in
registers and written once at the end. Groups past `keep` (hidden above keep * 256) take a plain loop that reads go
again and sums grad_w in grad_w_partial itself, so hidden stays a runtime value.

Synchronisation is the kernel's own (no inserted barriers): a lane reads back from the ring and its own head's
go only what it staged itself, after its own wait; two block barriers a token order the rest: one before the
dL/dg halves are exchanged (through `sums`, two halves used in turn), one between the last reads of every
head's parked go (grad_v) and the first overwrite of it (at the next token's start).

Measured on the H200 at 8192x4x7168 beside TileKernels (665.87 µs, 2026-12-02,
bench/results/2026-12-02-H200-s15-tune_engram6.log): k28d11v16 709.25 µs, against 743.79 for k28d14c (shipped
before: each warp staged its half of v through the ring, v read four times a token), k28d11c 743.03, k28d11v (10 go
groups ahead) 727.50, k28d9v 738.40, k28d11v22 717.65; earlier TileLang's inserted barriers (k28d12c) 849 and one
cp.async stream across both passes (k28d14s) 755 µs.
"""

import re

import tilelang.language as T

from kernels_src.engram.gate_fwd import cp_async
from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import GATE_BWD

DECL = GATE_BWD  # the declaration this module builds (tkaot/_engram/kernels.py)

# the kernel places its own barriers (the module docstring): TileLang's inserted two a kept group
PASS_CONFIGS = {"tl.disable_thread_storage_sync": True}

HC = 4
THREADS = HC * 2 * 32
GROUP = 256  # elements of a head's row two warps cover at once (4 a lane)
VEC = 4
SMEM_KB = 226  # shared memory a CTA may take on sm90 / sm100 (227 KB), less `sums`, in KB
V_VEC = 8  # bf16 elements of a thread's copy of v (16 bytes)


def parse_tiling(tiling: str) -> tuple[int, int, int]:
    """Tiling "k<keep>d<depth>v<ahead>[x][f][p][i][w]": groups of a row kept on chip (6.5 KB of shared memory a group:
    go, w and v), ring slots of the grad_x pass (4 KB each) and go groups in flight in the dL/dg pass (the module
    docstring); the letters are tiling_options' (w: 2.5 KB a kept group, 8 KB a slot)."""
    match = re.fullmatch(r"k(\d+)d(\d+)v(\d+)x?f?p?i?w?", tiling)
    if match is None:
        raise ValueError(f"engram_gate_bwd tiling {tiling!r} is not k<keep>d<depth>v<ahead>")
    keep, depth, ahead = int(match[1]), int(match[2]), int(match[3])
    kb = 2.5 * keep + 8 * depth if tiling.endswith("w") else 6.5 * keep + 4 * depth
    if not (1 <= keep <= 36 and 2 <= depth <= (24 if tiling.endswith("w") else 16) and 1 <= ahead < keep) or kb > SMEM_KB:
        raise ValueError(f"engram_gate_bwd tiling {tiling!r}: keep 1-36, depth 2-16, ahead 1 to keep - 1, {kb} KB above {SMEM_KB}")
    return keep, depth, ahead


def tiling_options(tiling: str) -> tuple[bool, bool, bool, bool, bool]:
    """(ahead_go, full, pairs, inline_v, stream_w) of a tiling, its letters:
    x, ahead_go: the grad_x pass's last depth - 1 groups stage the next token's first go groups (its ring positions
    are past the row there), behind one block barrier that takes the token start's place;
    f, full: hidden is at least keep * GROUP (the op's choice), so the kept groups run without a check;
    p, pairs (with f): both passes wait once for two groups and read both before working on the first (one position
    fewer in flight at the wait);
    i, inline_v (with f): grad_v's kept part one step (4 elements of each thread) after every second of the grad_x
    pass's first groups, not between the exchange and the grad_x pass, whose loads then keep flowing;
    w, stream_w: the weight staged through the ring beside x and k every token (from L2, as TileKernels reads it),
    not kept in shared memory: room for more ring slots."""
    keep, depth, ahead = parse_tiling(tiling)
    ahead_go, full, pairs, inline_v = "x" in tiling, "f" in tiling, "p" in tiling, "i" in tiling
    stream_w = tiling.endswith("w")
    if inline_v and not (full and 2 * (keep * GROUP // (THREADS * VEC)) <= keep - depth + 1):
        raise ValueError(f"engram_gate_bwd tiling {tiling!r}: i needs f and grad_v's steps done before the grad_x pass's tail")
    if pairs and not (full and keep % 2 == 0):
        raise ValueError(f"engram_gate_bwd tiling {tiling!r}: p needs f and an even keep")
    if ahead_go and not (depth - 1 <= ahead and 2 * depth <= keep + 1):
        raise ValueError(f"engram_gate_bwd tiling {tiling!r}: x needs depth - 1 <= ahead and 2 * depth <= keep + 1")
    if full and keep % (THREADS * VEC // GROUP) != 0:
        raise ValueError(f"engram_gate_bwd tiling {tiling!r}: f needs keep a multiple of {THREADS * VEC // GROUP}")
    return ahead_go, full, pairs, inline_v, stream_w


def build(tiling: str):
    keep, depth, ahead = parse_tiling(tiling)
    ahead_go, full, pairs, inline_v, stream_w = tiling_options(tiling)
    v_steps = keep * GROUP // (THREADS * VEC)  # grad_v's steps over the kept groups (with full)
    tail = keep - depth + 1  # from this group on, the grad_x pass stages positions past its own
    tail_dg = keep - ahead  # and the dL/dg pass
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    num_partials = T.dynamic("num_partials")
    cp = cp_async(VEC)
    rows = (num_tokens, HC)

    cp_v = cp_async(V_VEC)

    @T.macro
    def stage(p, on, t, head, own, groups, grad_out, hidden_states, kv, go_smem, ring, weight_fused, w_smem):
        """Position p of token t in flight where `on`, one commit group (empty past the row's groups)."""
        if on:
            if p < keep:
                if full or p < groups:
                    cp(go_smem[head, p * GROUP + own], grad_out[t, head, p * GROUP + own])
            elif full or p - keep < groups:
                cp(ring[p % depth, head, 0, own], hidden_states[t, head, (p - keep) * GROUP + own])
                cp(ring[p % depth, head, 1, own], kv[t, head, (p - keep) * GROUP + own])
                if stream_w:
                    cp(w_smem[p % depth, head, own], weight_fused[head, (p - keep) * GROUP + own])
        T.ptx_commit_group()

    @T.macro
    def copy_v(t, tid, groups, kv, v_smem):
        """Token t's v (its kept groups) into v_smem, a 16-byte copy a thread a round, not committed (the
        copies join the next commit group)."""
        for i in T.unroll(T.ceildiv(keep * GROUP, THREADS * V_VEC)):
            e = (i * THREADS + tid) * V_VEC
            if e < (keep if full else T.min(keep, groups)) * GROUP:
                cp_v(v_smem[e], kv[t, HC, e])

    @T.macro
    def next_v(t, end, has_mask, image_token_mask, tid, groups, kv, v_smem, v_ready: T.Ref):
        """The next token's v copied during this token (v_ready = 1), unless the run ends or it is an
        image token."""
        if t + 1 < end:
            if has_mask == 0:
                copy_v(t + 1, tid, groups, kv, v_smem)
                v_ready = 1
            elif not image_token_mask[t + 1]:
                copy_v(t + 1, tid, groups, kv, v_smem)
                v_ready = 1  # noqa: F841 (a T.Ref: the caller's variable is written)

    @T.macro
    def grad_v_step(i, t, tid, gates, go_smem, grad_kv, go, gv):
        """Step i of grad_v's kept part: 4 elements of each thread, heads summed in order."""
        e = (i * THREADS + tid) * VEC
        T.clear(gv)
        for h in T.unroll(HC):
            for j in T.vectorized(VEC):
                go[j] = go_smem[h, e + j]
            for j in T.vectorized(VEC):
                gv[j] += go[j] * gates[h]
        for j in T.vectorized(VEC):
            grad_kv[t, HC, e + j] = gv[j]

    @T.prim_func
    def engram_gate_bwd(
        grad_out: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        hidden_states: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        kv: T.Tensor[(num_tokens, HC + 1, hidden), T.bfloat16],
        weight_fused: T.Tensor[(HC, hidden), T.float32],
        dot: T.Tensor[rows, T.float32],
        gate_score: T.Tensor[rows, T.float32],
        rstd_x: T.Tensor[rows, T.float32],
        rstd_k: T.Tensor[rows, T.float32],
        image_token_mask: T.Tensor[(num_tokens,), T.bool],
        grad_hidden_states: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        grad_kv: T.Tensor[(num_tokens, HC + 1, hidden), T.bfloat16],
        grad_w_partial: T.Tensor[(num_partials, HC, hidden), T.float32],
        clamp_value: T.float32,
        scalar: T.float32,
        has_mask: T.int32,
    ):
        with T.Kernel(num_partials, threads=THREADS) as part:
            kernel_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(hidden % GROUP == 0)
            if full:
                T.assume(hidden >= keep * GROUP)
            T.assume(num_partials > 0)
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            head = warp // 2
            half = warp % 2
            own = half * 128 + lane * VEC  # this lane's elements in a group
            groups = hidden // GROUP
            per = T.ceildiv(num_tokens, num_partials)
            start = T.min(per * part, num_tokens)
            end = T.min(per * (part + 1), num_tokens)
            sums = T.alloc_shared((2, HC, 2), T.float32)
            go_smem = T.alloc_shared((HC, keep * GROUP), T.bfloat16)
            if stream_w:
                w_smem = T.alloc_shared((depth, HC, GROUP), T.float32)  # a ring of the weight, beside `ring`
            else:
                w_smem = T.alloc_shared((HC, keep * GROUP), T.float32)  # the weight of the kept groups
            ring = T.alloc_shared((depth, HC, 2, GROUP), T.bfloat16)  # [slot, head, v or x / k, element]
            v_smem = T.alloc_shared((keep * GROUP,), T.bfloat16)
            v_ready = T.alloc_var(T.int32)  # 1: this token's v was copied during the token before
            v_ready = 0
            grad_w = T.alloc_local((keep, VEC), T.float32)
            go = T.alloc_local((VEC,), T.float32)
            v = T.alloc_local((VEC,), T.float32)
            x = T.alloc_local((VEC,), T.float32)
            k = T.alloc_local((VEC,), T.float32)
            w = T.alloc_local((VEC,), T.float32)
            gv = T.alloc_local((VEC,), T.float32)
            gates = T.alloc_local((HC,), T.float32)
            acc = T.alloc_local((1,), T.float32)
            r = T.alloc_var(T.float32)
            gate = T.alloc_var(T.float32)
            rx = T.alloc_var(T.float32)
            rk = T.alloc_var(T.float32)
            d = T.alloc_var(T.float32)
            dot_x = T.alloc_var(T.float32)
            dot_k = T.alloc_var(T.float32)
            done = T.alloc_var(T.int32)  # unmasked tokens so far: picks the half of `sums` to use
            done = 0
            if pairs:  # two groups' values, read at one wait
                go2 = T.alloc_local((2, VEC), T.bfloat16)
                v2 = T.alloc_local((2, VEC), T.bfloat16)
                x2 = T.alloc_local((2, VEC), T.bfloat16)
                k2 = T.alloc_local((2, VEC), T.bfloat16)
                w2 = T.alloc_local((2, VEC), T.float32)

            T.clear(grad_w)
            if not stream_w:
                for g in T.unroll(keep):  # the weight of the kept groups, read by every token
                    if full or g < groups:
                        for j in T.vectorized(VEC):
                            w_smem[head, g * GROUP + own + j] = weight_fused[head, g * GROUP + own + j]
            for g in T.serial(keep, groups):  # past `keep`, grad_w is summed in grad_w_partial itself
                for j in T.vectorized(VEC):
                    grad_w_partial[part, head, g * GROUP + own + j] = 0.0

            for t in T.serial(start, end):
                if has_mask != 0 and image_token_mask[t]:
                    for i in T.serial(T.ceildiv(hidden, THREADS * 8)):
                        col = (i * THREADS + tid) * 8
                        if col < hidden:
                            for h in T.unroll(HC):
                                for j in T.vectorized(8):
                                    grad_hidden_states[t, h, col + j] = grad_out[t, h, col + j]
                            for h in T.unroll(HC + 1):
                                for j in T.vectorized(8):
                                    grad_kv[t, h, col + j] = T.bfloat16(0)
                else:
                    if ahead_go:
                        if v_ready == 0:  # nothing staged by the token before: its v and first go groups here
                            T.ptx_wait_group(0)
                            T.sync_threads()  # the previous token's readers of go_smem are done
                            copy_v(t, tid, groups, kv, v_smem)
                            T.ptx_commit_group()
                            T.ptx_wait_group(0)
                            T.sync_threads()
                            for u in T.unroll(depth - 1):
                                stage(u, True, t, head, own, groups, grad_out, hidden_states, kv, go_smem, ring, weight_fused, w_smem)
                        v_ready = 0
                        for u in T.unroll(depth - 1, ahead):
                            stage(u, u < keep, t, head, own, groups, grad_out, hidden_states, kv, go_smem, ring, weight_fused, w_smem)
                    else:
                        T.ptx_wait_group(0)  # this token's v, if the token before copied it
                        T.sync_threads()  # the previous token's readers of go_smem are done (and this token's v landed)
                        if v_ready == 0:
                            copy_v(t, tid, groups, kv, v_smem)
                            T.ptx_commit_group()
                            T.ptx_wait_group(0)
                            T.sync_threads()
                        v_ready = 0
                        for u in T.unroll(ahead):
                            stage(u, u < keep, t, head, own, groups, grad_out, hidden_states, kv, go_smem, ring, weight_fused, w_smem)
                    # this token's saved values, in flight during the dL/dg pass
                    gate = gate_score[t, head]
                    rx = rstd_x[t, head]
                    rk = rstd_k[t, head]
                    d = dot[t, head]
                    for h in T.unroll(HC):
                        gates[h] = gate_score[t, h]
                    # dL/dg of this warp's head, go parked in shared memory on the way
                    T.clear(acc)
                    for g in T.unroll(keep):
                        stage(
                            g + ahead, g < tail_dg, t, head, own, groups, grad_out, hidden_states, kv, go_smem, ring, weight_fused, w_smem
                        )
                        if pairs:
                            if g % 2 == 0:
                                T.ptx_wait_group(ahead - 1)
                                for q in T.unroll(2):
                                    for j in T.vectorized(VEC):
                                        go2[q, j] = go_smem[head, (g + q) * GROUP + own + j]
                                    for j in T.vectorized(VEC):
                                        v2[q, j] = v_smem[(g + q) * GROUP + own + j]
                            for j in T.vectorized(VEC):
                                go[j] = go2[g % 2, j]
                            for j in T.vectorized(VEC):
                                v[j] = v2[g % 2, j]
                            for j in T.serial(VEC):
                                acc[0] += go[j] * v[j]
                        else:
                            T.ptx_wait_group(ahead)
                        if not pairs and (full or g < groups):
                            for j in T.vectorized(VEC):
                                go[j] = go_smem[head, g * GROUP + own + j]
                            for j in T.vectorized(VEC):
                                v[j] = v_smem[g * GROUP + own + j]
                            for j in T.serial(VEC):
                                acc[0] += go[j] * v[j]
                    for g in T.serial(keep, groups):
                        for j in T.vectorized(VEC):
                            go[j] = grad_out[t, head, g * GROUP + own + j]
                        for j in T.vectorized(VEC):
                            v[j] = kv[t, HC, g * GROUP + own + j]
                        for j in T.serial(VEC):
                            acc[0] += go[j] * v[j]
                    for u in T.unroll(depth - 1):  # x and k of the first groups, in flight during the exchange and grad_v
                        stage(keep + u, True, t, head, own, groups, grad_out, hidden_states, kv, go_smem, ring, weight_fused, w_smem)
                    acc[0] = T.warp_reduce_sum(acc[0])
                    if lane == 0:
                        sums[done % 2, head, half] = acc[0]
                    T.sync_threads()
                    r = sums[done % 2, head, 0] + sums[done % 2, head, 1]
                    done = done + 1
                    # every reader of v_smem is past the barrier: the next token's v
                    next_v(t, end, has_mask, image_token_mask, tid, groups, kv, v_smem, v_ready)
                    r = T.Select(
                        T.abs(d) * scalar * rx * rk < clamp_value,
                        T.float32(0),
                        r * gate * (1.0 - gate) * 0.5 * T.sqrt(scalar * rx * rk / T.abs(d)),
                    )

                    # grad_v: every thread, 4 elements at a time, heads summed in order
                    if full and not inline_v:  # the kept part from go_smem
                        for i in T.serial(v_steps):
                            grad_v_step(i, t, tid, gates, go_smem, grad_kv, go, gv)
                    for i in T.serial(v_steps if full else 0, T.ceildiv(hidden, THREADS * VEC)):
                        e = (i * THREADS + tid) * VEC
                        if e < hidden:
                            T.clear(gv)
                            for h in T.unroll(HC):
                                if not full and e < keep * GROUP:
                                    for j in T.vectorized(VEC):
                                        go[j] = go_smem[h, e + j]
                                else:
                                    for j in T.vectorized(VEC):
                                        go[j] = grad_out[t, h, e + j]
                                for j in T.vectorized(VEC):
                                    gv[j] += go[j] * gates[h]
                            for j in T.vectorized(VEC):
                                grad_kv[t, HC, e + j] = gv[j]

                    # grad_x, grad_k and this token's share of grad_w
                    dot_x = d * rx * rx / T.cast(hidden, T.float32)
                    dot_k = d * rk * rk / T.cast(hidden, T.float32)
                    for g in T.unroll(keep):
                        if ahead_go and g >= tail:
                            if g == tail:  # every reader of go_smem (grad_v) is done, the next token's v landed
                                T.sync_threads()
                            # the ring's positions are past the row: the next token's first go groups instead
                            stage(
                                g - tail,
                                v_ready == 1,
                                t + 1,
                                head,
                                own,
                                groups,
                                grad_out,
                                hidden_states,
                                kv,
                                go_smem,
                                ring,
                                weight_fused,
                                w_smem,
                            )
                        else:
                            stage(
                                keep + g + depth - 1,
                                g < tail,
                                t,
                                head,
                                own,
                                groups,
                                grad_out,
                                hidden_states,
                                kv,
                                go_smem,
                                ring,
                                weight_fused,
                                w_smem,
                            )
                        if pairs:
                            if g % 2 == 0:
                                T.ptx_wait_group(depth - 2)
                                for q in T.unroll(2):
                                    for j in T.vectorized(VEC):
                                        go2[q, j] = go_smem[head, (g + q) * GROUP + own + j]
                                    for j in T.vectorized(VEC):
                                        x2[q, j] = ring[(keep + g + q) % depth, head, 0, own + j]
                                    for j in T.vectorized(VEC):
                                        k2[q, j] = ring[(keep + g + q) % depth, head, 1, own + j]
                                    for j in T.vectorized(VEC):
                                        if stream_w:
                                            w2[q, j] = w_smem[(keep + g + q) % depth, head, own + j]
                                        else:
                                            w2[q, j] = w_smem[head, (g + q) * GROUP + own + j]
                            for j in T.vectorized(VEC):
                                go[j] = go2[g % 2, j]
                            for j in T.vectorized(VEC):
                                x[j] = x2[g % 2, j]
                            for j in T.vectorized(VEC):
                                k[j] = k2[g % 2, j]
                            for j in T.vectorized(VEC):
                                w[j] = w2[g % 2, j]
                        else:
                            T.ptx_wait_group(depth - 1)
                        if full or g < groups:
                            if not pairs:
                                for j in T.vectorized(VEC):
                                    go[j] = go_smem[head, g * GROUP + own + j]
                                for j in T.vectorized(VEC):
                                    x[j] = ring[(keep + g) % depth, head, 0, own + j]
                                for j in T.vectorized(VEC):
                                    k[j] = ring[(keep + g) % depth, head, 1, own + j]
                                for j in T.vectorized(VEC):
                                    if stream_w:
                                        w[j] = w_smem[(keep + g) % depth, head, own + j]
                                    else:
                                        w[j] = w_smem[head, g * GROUP + own + j]
                            for j in T.vectorized(VEC):
                                grad_hidden_states[t, head, g * GROUP + own + j] = go[j] + r * (k[j] * w[j] - x[j] * dot_x)
                                grad_kv[t, head, g * GROUP + own + j] = r * (x[j] * w[j] - k[j] * dot_k)
                            for j in T.vectorized(VEC):
                                grad_w[g, j] = grad_w[g, j] + r * x[j] * k[j]
                        if inline_v:
                            if g % 2 == 0:
                                if g < 2 * v_steps:
                                    grad_v_step(g // 2, t, tid, gates, go_smem, grad_kv, go, gv)
                    for g in T.serial(keep, groups):
                        e = g * GROUP + own
                        for j in T.vectorized(VEC):
                            go[j] = grad_out[t, head, e + j]
                        for j in T.vectorized(VEC):
                            x[j] = hidden_states[t, head, e + j]
                        for j in T.vectorized(VEC):
                            k[j] = kv[t, head, e + j]
                        for j in T.vectorized(VEC):
                            w[j] = weight_fused[head, e + j]
                        for j in T.vectorized(VEC):
                            grad_hidden_states[t, head, e + j] = go[j] + r * (k[j] * w[j] - x[j] * dot_x)
                            grad_kv[t, head, e + j] = r * (x[j] * w[j] - k[j] * dot_k)
                        for j in T.vectorized(VEC):
                            grad_w_partial[part, head, e + j] = grad_w_partial[part, head, e + j] + r * x[j] * k[j]

            for g in T.unroll(keep):
                if full or g < groups:
                    for j in T.vectorized(VEC):
                        grad_w_partial[part, head, g * GROUP + own + j] = grad_w[g, j]

    return engram_gate_bwd
