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
parked place (grad_v and grad_x read it there, not from L2 again), x, k and the weight (from L2 every token, as
TileKernels reads it, rather than kept in shared memory: room for more slots) through a ring of `depth` slots, and
v's kept groups once a token, by the whole CTA, into `v_smem` (0.5 KB a group), as TileKernels reads it. A token is
a stream of 2 * keep positions: position p < keep is kept group p's go (the dL/dg pass), `ahead` of them in flight
ahead of the one waited for (2 KB a position); position keep + g is group g's x, k and w (the grad_x pass, 8 KB a
position), a lane staging position n + depth - 1 (one commit group, empty past the row) before it waits for
position n. The grad_x pass's first loads are in flight during the dL/dg exchange and grad_v; its last depth - 1
groups, whose ring positions are past the row, stage the next token's first depth - 1 go groups instead (as
TileKernels stages the next token's go during its last x tile), so the next token starts with them in flight and
stages only go groups depth - 1 to ahead - 1. The next token's v is copied during this token's grad_x pass, right
after the exchange barrier has seen every reader of v done (the copies join the grad_x pass's first commit group);
a CTA's first token (or one after an image token) copies its own v and first go groups as it starts, behind a
barrier. A token's saved scalars are read as it starts, behind its first loads. The kept groups' grad_w is summed in
registers and written once at the end. Groups past `keep` (hidden above keep * 256) take a plain loop that reads go
again and sums grad_w in grad_w_partial itself, so hidden stays a runtime value.

Synchronisation is the kernel's own (no inserted barriers): a lane reads back from the ring and its own head's
go only what it staged itself, after its own wait; two block barriers a token order the rest: one before the
dL/dg halves are exchanged (through `sums`, two halves used in turn), one before the grad_x pass stages the next
token's go, between the last reads of every head's parked go (grad_v) and the first overwrite of it; it also sees the
next token's v landed, every thread having waited for the pass's first commit group by then (2 * depth <= keep + 1).

Measured on the H200 at 8192x4x7168 beside TileKernels (671.37 µs, 2026-12-03,
f014b86:bench/results/2026-12-03-H200-s19-tune_gatebwd10.log, bench/tuning/tune_gatebwd10.py as of 6e7bed1): k28d14v16xw
663.16 µs against 711.86 for k28d11v16 (shipped before: the weight kept in shared memory, x and k through 11 slots,
the next token's go staged after a token-start barrier) and 707.29 for its next-go staging alone; dropping the group
checks (g < groups) for hidden >= 7168 spilled with the streamed weight (726.75; 668.15 with one wait a pair of
groups) and gained less without it (692.37). Earlier (2026-12-02, f014b86:bench/results/2026-12-02-H200-s15-tune_engram6.log):
TileLang's inserted barriers (k28d12c) 849 and one cp.async stream across both passes (k28d14s) 755 µs.
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
    """Tiling "k<keep>d<depth>v<ahead>xw": groups of a row kept on chip (2.5 KB of shared memory a group: go and v),
    ring slots of the grad_x pass (8 KB each: x, k and w) and go groups in flight in the dL/dg pass (the module
    docstring); "xw": the next token's go staged in the grad_x pass's last groups (x) and the weight streamed
    through the ring (w), the only form (the name tells it from the tilings measured before)."""
    match = re.fullmatch(r"k(\d+)d(\d+)v(\d+)xw", tiling)
    if match is None:
        raise ValueError(f"engram_gate_bwd tiling {tiling!r} is not k<keep>d<depth>v<ahead>xw")
    keep, depth, ahead = int(match[1]), int(match[2]), int(match[3])
    kb = 2.5 * keep + 8 * depth
    # the next token's first depth - 1 go groups are staged in the grad_x pass's last depth - 1 groups (ahead covers
    # them), after its first commit group (the next v) has landed
    if not (keep <= 36 and 2 <= depth and 2 * depth <= keep + 1 and depth - 1 <= ahead < keep) or kb > SMEM_KB:
        bounds = "keep up to 36, depth 2 to (keep + 1) / 2, ahead depth - 1 to keep - 1"
        raise ValueError(f"engram_gate_bwd tiling {tiling!r}: {bounds}, {kb} KB above {SMEM_KB}")
    return keep, depth, ahead


def build(tiling: str):
    keep, depth, ahead = parse_tiling(tiling)
    tail = keep - depth + 1  # from this group on, the grad_x pass stages the next token's go (its positions: past the row)
    tail_dg = keep - ahead  # from this group on, the dL/dg pass stages nothing (its positions: the grad_x pass's)
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    num_partials = T.dynamic("num_partials")
    cp = cp_async(VEC)
    rows = (num_tokens, HC)

    cp_v = cp_async(V_VEC)

    @T.macro
    def stage(p, on, t, head, own, groups, grad_out, hidden_states, kv, weight_fused, go_smem, ring, w_smem):
        """Position p of token t in flight where `on`, one commit group (empty past the row's groups)."""
        if on:
            if p < keep:
                if p < groups:
                    cp(go_smem[head, p * GROUP + own], grad_out[t, head, p * GROUP + own])
            elif p - keep < groups:
                cp(ring[p % depth, head, 0, own], hidden_states[t, head, (p - keep) * GROUP + own])
                cp(ring[p % depth, head, 1, own], kv[t, head, (p - keep) * GROUP + own])
                cp(w_smem[p % depth, head, own], weight_fused[head, (p - keep) * GROUP + own])
        T.ptx_commit_group()

    @T.macro
    def copy_v(t, tid, groups, kv, v_smem):
        """Token t's v (its kept groups) into v_smem, a 16-byte copy a thread a round, not committed (the
        copies join the next commit group)."""
        for i in T.unroll(T.ceildiv(keep * GROUP, THREADS * V_VEC)):
            e = (i * THREADS + tid) * V_VEC
            if e < T.min(keep, groups) * GROUP:
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
            w_smem = T.alloc_shared((depth, HC, GROUP), T.float32)  # the weight's ring, beside `ring`
            ring = T.alloc_shared((depth, HC, 2, GROUP), T.bfloat16)  # [slot, head, x or k, element]
            v_smem = T.alloc_shared((keep * GROUP,), T.bfloat16)
            v_ready = T.alloc_var(T.int32)  # 1: this token's v and first go groups were staged during the token before
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

            T.clear(grad_w)
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
                    if v_ready == 0:  # nothing staged by the token before: its v and first go groups here
                        T.ptx_wait_group(0)
                        T.sync_threads()  # the previous token's readers of go_smem are done
                        copy_v(t, tid, groups, kv, v_smem)
                        T.ptx_commit_group()
                        T.ptx_wait_group(0)
                        T.sync_threads()
                        for u in T.unroll(depth - 1):
                            stage(u, True, t, head, own, groups, grad_out, hidden_states, kv, weight_fused, go_smem, ring, w_smem)
                    v_ready = 0
                    for u in T.unroll(depth - 1, ahead):
                        stage(u, u < keep, t, head, own, groups, grad_out, hidden_states, kv, weight_fused, go_smem, ring, w_smem)
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
                            g + ahead, g < tail_dg, t, head, own, groups, grad_out, hidden_states, kv, weight_fused, go_smem, ring, w_smem
                        )
                        T.ptx_wait_group(ahead)
                        if g < groups:
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
                    for u in T.unroll(depth - 1):  # the grad_x pass's first groups, in flight during the exchange and grad_v
                        stage(keep + u, True, t, head, own, groups, grad_out, hidden_states, kv, weight_fused, go_smem, ring, w_smem)
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
                    for i in T.serial(T.ceildiv(hidden, THREADS * VEC)):
                        e = (i * THREADS + tid) * VEC
                        if e < hidden:
                            T.clear(gv)
                            for h in T.unroll(HC):
                                if e < keep * GROUP:
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
                        if g >= tail:
                            if g == tail:  # every reader of go_smem (grad_v) is done, the next token's v landed
                                T.sync_threads()
                            # the ring's positions are past the row: the next token's first go groups instead
                            stage(g - tail, v_ready == 1, t + 1, head, own, groups, grad_out, hidden_states, kv, weight_fused,
                                  go_smem, ring, w_smem)  # fmt: skip
                        else:
                            stage(keep + g + depth - 1, True, t, head, own, groups, grad_out, hidden_states, kv, weight_fused,
                                  go_smem, ring, w_smem)  # fmt: skip
                        T.ptx_wait_group(depth - 1)
                        if g < groups:
                            for j in T.vectorized(VEC):
                                go[j] = go_smem[head, g * GROUP + own + j]
                            for j in T.vectorized(VEC):
                                x[j] = ring[(keep + g) % depth, head, 0, own + j]
                            for j in T.vectorized(VEC):
                                k[j] = ring[(keep + g) % depth, head, 1, own + j]
                            for j in T.vectorized(VEC):
                                w[j] = w_smem[(keep + g) % depth, head, own + j]
                            for j in T.vectorized(VEC):
                                grad_hidden_states[t, head, g * GROUP + own + j] = go[j] + r * (k[j] * w[j] - x[j] * dot_x)
                                grad_kv[t, head, g * GROUP + own + j] = r * (x[j] * w[j] - k[j] * dot_k)
                            for j in T.vectorized(VEC):
                                grad_w[g, j] = grad_w[g, j] + r * x[j] * k[j]
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
                if g < groups:
                    for j in T.vectorized(VEC):
                        grad_w_partial[part, head, g * GROUP + own + j] = grad_w[g, j]

    return engram_gate_bwd
