"""Pieces shared by the MoE routing kernels: one warp per token, experts spread over lanes.

Layout: with W experts per vector (4 when rows are 16-byte aligned, else 1)
and C chunks per lane, slot `c * W + j` of lane `l` holds expert
`l * C * W + c * W + j`: each lane owns a run of C * W experts in increasing
order, so a lower lane always holds lower experts and ties resolve by lane order.
The generic kernels compute C at run time (Rows.runtime) and give the same lanes the same experts.
"""

import tilelang.language as T

from tkaot._moe.kernels import GATE_TILINGS, MAX_EXPERTS

WARP = 32
NONE = 0x7FFFFFFF  # "no expert": loses every tie against a real index
MAX_SLOTS = MAX_EXPERTS // WARP  # the most experts a lane holds
# The generic kernels select over the smallest of these slot counts that holds a lane's run (a uniform branch),
# so a 256-expert row scans the 8 slots its specialised kernel scans
SLOT_BUCKETS = (4, 8, MAX_SLOTS)


def layout(num_experts: int) -> tuple[int, int]:
    """(experts per vector, chunks per lane)."""
    vec = 4 if num_experts % 4 == 0 else 1
    return vec, -(-num_experts // (WARP * vec))


# Tilings of the selecting kernels: tokens (warps) a block. Selecting by ballot at 4 tokens a block beat ranking
# (value, index) pairs across the warp on a strided layout, and 2 or 8 tokens a block (bench/tuning/tune_moe.py).
TILINGS = {GATE_TILINGS["default"]: 4}


class Rows:
    """Which of a row's experts each lane holds (the module's layout): `per` experts a lane in `slots` registers,
    `vec` a vector.

    `Rows.of(num_experts)` is a specialised kernel's layout (per == slots, all static). `Rows.runtime(num_experts)`
    is the same layout for a runtime expert count, a multiple of 4: `per` an expression, MAX_SLOTS registers, the
    slots past `per` idle.
    """

    __slots__ = ("num_experts", "vec", "slots", "per")

    def __init__(self, num_experts, vec: int, slots: int, per):
        self.num_experts, self.vec, self.slots, self.per = num_experts, vec, slots, per

    @classmethod
    def of(cls, num_experts: int) -> "Rows":
        vec, chunks = layout(num_experts)
        return cls(num_experts, vec, chunks * vec, chunks * vec)

    @classmethod
    def runtime(cls, num_experts) -> "Rows":
        return cls(num_experts, 4, MAX_SLOTS, (num_experts + 4 * WARP - 1) // (4 * WARP) * 4)

    @property
    def chunks(self) -> int:
        """Vectors of registers a lane has (static)."""
        return self.slots // self.vec

    def base(self, c: int, lane):
        """The expert held in slot c * vec of this lane."""
        return lane * self.per + c * self.vec

    def held(self, c: int, lane):
        """Whether this lane's chunk c holds experts (it holds a whole vector or none)."""
        inside = self.base(c, lane) < self.num_experts
        return inside if isinstance(self.per, int) else T.And(c * self.vec < self.per, inside)


def warp_token(block, warps: int):
    """(lane, token) of this thread: a warp a token, `warps` tokens a block."""
    tid = T.get_thread_binding()
    return tid % WARP, block * warps + tid // WARP


@T.macro
def sqrt_softplus(x):
    # softplus with torch's threshold of 20, then sqrt; precise expf/log1pf/sqrtf
    return T.sqrt(T.if_then_else(x > 20.0, x, T.log1p(T.exp(x))))


@T.macro
def warp_sum(x: T.Ref):
    # butterfly 16, 8, 4, 2, 1: every lane ends with the same, fixed-order sum
    for i in T.unroll(5):
        x += T.shfl_xor(x, 16 >> i)


@T.macro
def warp_min(x: T.Ref):
    for i in T.unroll(5):
        x = T.min(x, T.shfl_xor(x, 16 >> i))


@T.macro
def warp_topk_ballot(vals, lane, num_experts, num_topk, out_idx: T.Ref, per, slots: int):
    """Lane k (< num_topk) gets the k-th largest of the warp's `vals`: a lane holds `per` experts, in the first of its `slots`.

    Ties go to the lower expert index, so the order is that of a stable
    descending sort; -inf values are still ranked (after every finite one).
    Each round a lane offers its best remaining slot (the first of equals); the warp
    max of those values alone (one shuffle a step) is found, and the lowest lane
    offering it wins, which on this layout is the lowest expert index.
    per, num_experts and num_topk may be runtime values (the generic gate's): the
    rounds are then a loop, and the slots past `per` are skipped.
    """
    removed = T.alloc_var(T.uint32, init=0)
    best = T.alloc_var(T.float32)
    best_slot = T.alloc_var(T.int32)
    top = T.alloc_var(T.float32)
    hit = T.alloc_var(T.uint32)
    winner = T.alloc_var(T.int32)
    slot = T.alloc_var(T.int32)
    if not isinstance(per, int):
        # A runtime `per`: the slots past the run, or past the row, start out removed, so each round tests one bit a slot
        for s in T.unroll(slots):
            if not (s < per and lane * per + s < num_experts):
                removed = removed | (T.uint32(1) << T.uint32(s))
    for k in T.unroll(num_topk) if isinstance(num_topk, int) else T.serial(num_topk):
        best = -T.infinity(T.float32)
        best_slot = NONE
        for s in T.unroll(slots):
            if (
                (not isinstance(per, int) or lane * per + s < num_experts)  # a static `per` is the slot count
                and ((removed >> T.Cast(T.uint32, s)) & T.uint32(1)) == T.uint32(0)
            ):
                if vals[s] > best or best_slot == NONE:
                    best = vals[s]
                    best_slot = s
        top = best
        for i in T.unroll(5):
            top = T.max(top, T.shfl_xor(top, 16 >> i))
        hit = T.Cast(T.uint32, T.ballot(best_slot != NONE and best == top))
        if hit == T.uint32(0):
            # only when a value is NaN: any lane with slots left, so the route stays in range
            hit = T.Cast(T.uint32, T.ballot(best_slot != NONE))
        winner = T.__ffs(hit) - 1
        slot = T.shfl_sync(best_slot, winner)
        if lane == k:
            out_idx = winner * per + slot  # noqa: F841 (a T.Ref: the caller's variable is written)
        if lane == winner:
            removed = removed | (T.uint32(1) << T.Cast(T.uint32, slot))


@T.macro
def load_row(vals, src, row, lane, rows: Rows):
    """vals[c * vec + j] = src[row, expert] for this lane's experts; -inf in the slots that hold none."""
    for c in T.unroll(rows.chunks):
        if rows.held(c, lane):
            for j in T.vectorized(rows.vec):
                vals[c * rows.vec + j] = src[row, rows.base(c, lane) + j]
        else:
            for j in T.unroll(rows.vec):
                vals[c * rows.vec + j] = -T.infinity(T.float32)


@T.macro
def rows_topk(vals, lane, num_topk, out_idx: T.Ref, rows: Rows):
    """warp_topk_ballot over `rows`: a static layout's slots, or the smallest of SLOT_BUCKETS holding a runtime one."""
    if isinstance(rows.per, int):
        warp_topk_ballot(vals, lane, rows.num_experts, num_topk, out_idx, rows.per, rows.slots)
    elif rows.per <= SLOT_BUCKETS[0]:
        warp_topk_ballot(vals, lane, rows.num_experts, num_topk, out_idx, rows.per, SLOT_BUCKETS[0])
    elif rows.per <= SLOT_BUCKETS[1]:
        warp_topk_ballot(vals, lane, rows.num_experts, num_topk, out_idx, rows.per, SLOT_BUCKETS[1])
    else:
        warp_topk_ballot(vals, lane, rows.num_experts, num_topk, out_idx, rows.per, SLOT_BUCKETS[2])


PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85


@T.macro
def philox_rounds(c0: T.Ref, c1: T.Ref, c2: T.Ref, c3: T.Ref, k0: T.Ref, k1: T.Ref, p0: T.Ref, p1: T.Ref):
    """The ten rounds of Philox4x32-10 on counter (c0, c1, c2, c3) with key (k0, k1), in place (uint32 variables; p0
    and p1 uint64 scratch). The Ascend gate draws with it too."""
    for r in T.unroll(10):
        p0 = T.Cast(T.uint64, c0) * T.uint64(PHILOX_M0)
        p1 = T.Cast(T.uint64, c2) * T.uint64(PHILOX_M1)
        c0 = T.Cast(T.uint32, p1 >> T.uint64(32)) ^ c1 ^ k0
        c2 = T.Cast(T.uint32, p0 >> T.uint64(32)) ^ c3 ^ k1
        c1 = T.Cast(T.uint32, p1)
        c3 = T.Cast(T.uint32, p0)
        if r < 9:
            k0 = k0 + T.uint32(PHILOX_W0)
            k1 = k1 + T.uint32(PHILOX_W1)


@T.macro
def philox_first_two(k0: T.Ref, c2: T.Ref, r0: T.Ref, r1: T.Ref):
    """The first two 32-bit outputs of Philox4x32-10 at counter (0, 0, c2, 0), key (k0, 0).

    This is the stream a curand Philox4_32_10 state initialised with
    (seed k0, subsequence c2, offset 0) produces, so results match TileKernels'.
    k0 and c2 are uint32 variables, and are consumed.
    """
    c0 = T.alloc_var(T.uint32, init=0)
    c1 = T.alloc_var(T.uint32, init=0)
    c3 = T.alloc_var(T.uint32, init=0)
    k1 = T.alloc_var(T.uint32, init=0)
    p0 = T.alloc_var(T.uint64)
    p1 = T.alloc_var(T.uint64)
    philox_rounds(c0, c1, c2, c3, k0, k1, p0, p1)
    r0 = c0  # noqa: F841 (T.Ref outputs)
    r1 = c1  # noqa: F841
