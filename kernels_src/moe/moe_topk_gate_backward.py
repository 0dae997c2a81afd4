"""moe_topk_gate_forward's backward: the gradient of the logits from those of the top-k weights (+ the aux term).

With u = scores = sqrt(softplus(logits)), chosen experts e_k (k < num_topk; -1 marks an empty slot), the
chosen scores' sum D = sum_k u[e_k] and the weights w_k = routed_scaling_factor * u[e_k] / (D + 1e-20):
    du[e] = sum over k with e_k = e of (routed_scaling_factor * dw_k - <dw, w>) / (D + 1e-20)
With an aux gradient h (grad_scores_sum: one row per sequence of tokens_per_seq tokens), tokens whose mask
is set add the gradient of u / sum(u):
    du[e] += (h[e] - <h, u> / sum(u)) / sum(u)
and dlogits = du * dsqrt(softplus)/dx, recovered from u as (1 - exp(-u^2)) / (2u) (0 at u = 0; logit_grad).

One warp a token, `warps` tokens a block (the tiling, "scatter<warps>"): lane l holds experts 128c + 4l + j (j < 4),
so a row is read and written in 16-byte vectors (two a lane at 256 experts; element by element, the same layout,
where the expert count is not a multiple of 4 or a row pointer is not 16-byte aligned: one uniform test); every sum
is a warp shuffle reduction (16, 8, 4, 2, 1 lanes apart, the order of moe_topk_gate's sums); lane k holds slot k.
The kernel is latency-bound (8192 tokens are 1.3 waves of warps on an H200), so a token's slots, scores row and (aux)
h row are loaded first, together, in the lane's vectors; the scores row goes to the warp's copy in shared memory,
from which the chosen scores and the output read it back. The aux term's sums run over the lane's own vectors (c,
then j), then across the warp: another rounding than session 12's strided kernel (within the parity tolerance, and
nearer TileKernels': 4.4e-3 rather than 1.6e-2 max relative at 8192 x 256). The route gradients reach their
experts through another shared row a warp: a slot whose expert no other slot of the token chose stores its own
gradient (0 + r, as a sum from 0 would); when some expert is chosen twice (a fixed routing; one vote a warp finds
out), each slot lane adds, in slot order, the gradients of every slot choosing its expert, and the last of those
slots stores the sum: no atomics, and the same bytes from run to run, repeated experts included. Every full-mask
warp intrinsic (shuffle, match, vote, __syncwarp) sits behind branches uniform over the warp only. Slots of experts
past num_experts are skipped by branches uniform over the warp. Token, expert and slot counts are runtime values:
one variant.
"""

import tilelang.language as T

from kernels_src.moe.common import WARP, warp_sum
from kernels_src.pdl import kernel_entry
from tkaot._moe.kernels import MAX_EXPERTS, MAX_TOPK, MOE_TOPK_GATE_BACKWARD

DECL = MOE_TOPK_GATE_BACKWARD  # the declaration this module builds (tkaot/_moe/kernels.py)

TILING_PREFIX = "scatter"  # "scatter<tokens a block>": route gradients scattered through shared memory

# d/dx sqrt(softplus(x)) = (1 - exp(-v)) / (2u), v = u^2. Below v = 1, where 1 - exp(-v) cancels, u * Q(v) with
# Q(v) ~ (1 - exp(-v)) / (2v): a degree-6 least-squares fit of ours (weights 1/Q at 4000 Chebyshev nodes of [0, 1],
# coefficients rounded to fp32), 1e-7 relative in fp32 Horner order; above, the fast exponential and division
# (a few ulps: no cancellation there). The exact expm1f and IEEE division cost ~40 instructions an expert.
DERIVATIVE_POLY = (
    0.5, -0.24999988079071045, 0.08333152532577515, -0.020822685211896896, 0.004136354196816683,
    -0.00064916379051283, 6.41353617538698e-05,
)  # fmt: skip

# A lane's experts, in 16-byte vectors: vector c of lane l holds experts c * SPAN + VEC * l + j (j < VEC), so a row is
# read and written in 128-bit accesses (element by element, the same layout, where a row is not 16-byte aligned)
VEC = 4
SPAN = WARP * VEC
CHUNKS = MAX_EXPERTS // SPAN

# The warp's rows (its scores, then its route gradients), reached through these helpers: a TileLang shared buffer
# would have its storage-sync pass put block-wide barriers between the stores and loads that only one warp makes.
# The 4-float helpers move v[0..3] (registers) as one 16-byte access
ROWS_SOURCE = """
__shared__ __align__(16) float tkaot_gate_rows[2][{warps}][{experts}];
__device__ __forceinline__ int tkaot_row_put(int row, int warp, int expert, float value) {{
    tkaot_gate_rows[row][warp][expert] = value;
    return 0;
}}
__device__ __forceinline__ float tkaot_row_get(int row, int warp, int expert) {{ return tkaot_gate_rows[row][warp][expert]; }}
__device__ __forceinline__ int tkaot_row_put4(int row, int warp, int expert, const float* v) {{
    *(float4*)&tkaot_gate_rows[row][warp][expert] = make_float4(v[0], v[1], v[2], v[3]);
    return 0;
}}
__device__ __forceinline__ int tkaot_row_zero4(int row, int warp, int expert) {{
    *(float4*)&tkaot_gate_rows[row][warp][expert] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return 0;
}}
__device__ __forceinline__ int tkaot_row_get4(int row, int warp, int expert, float* v) {{
    const float4 t = *(const float4*)&tkaot_gate_rows[row][warp][expert];
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    return 0;
}}
__device__ __forceinline__ int tkaot_load4(float* v, const float* src) {{
    const float4 t = *(const float4*)src;
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    return 0;
}}
__device__ __forceinline__ int tkaot_store4(float* dst, const float* v) {{
    *(float4*)dst = make_float4(v[0], v[1], v[2], v[3]);
    return 0;
}}
__device__ __forceinline__ int tkaot_aligned16(const void* p) {{ return (int)(((unsigned long long)p & 15ull) == 0ull); }}
// a if cond else b, both evaluated: a select the compiler cannot turn back into branches
__device__ __forceinline__ float tkaot_select(int cond, float a, float b) {{
    float r;
    asm("{{ .reg .pred p; setp.ne.s32 p, %1, 0; selp.f32 %0, %2, %3, p; }}" : "=f"(r) : "r"(cond), "f"(a), "f"(b));
    return r;
}}
__device__ __forceinline__ int tkaot_sync_warp() {{
    __syncwarp();
    return 0;
}}
// Whether any lane's expert (idx >= 0) is another lane's too. Every lane of the warp must reach both full-mask
// intrinsics: the match is taken before the test of idx (behind `&&`, lanes of empty slots skipped it: a hang)
__device__ __forceinline__ int tkaot_any_repeated(int idx) {{
    const unsigned peers = __match_any_sync(0xffffffffu, idx);
    return __any_sync(0xffffffffu, (idx >= 0) & (__popc(peers) > 1));
}}
"""
SCORES_ROW, ROUTE_ROW = 0, 1


def logit_grad(u, du):
    """du * dsqrt(softplus)/dx at the score u; 0 where u <= 0 (or NaN), whatever du. Both forms are evaluated and
    one selected: as branches, a warp whose scores straddle v = 1 ran both, behind three nested branch regions."""
    v = u * u
    q = T.float32(DERIVATIVE_POLY[-1])
    for c in reversed(DERIVATIVE_POLY[:-1]):
        q = q * v + T.float32(c)
    above = T.call_extern("float32", "__fdividef", 1.0 - T.call_extern("float32", "__expf", -v), 2 * u)
    near_or_far = T.call_extern("float32", "tkaot_select", T.Cast("int32", v < 1.0), u * q, above)
    return T.call_extern("float32", "tkaot_select", T.Cast("int32", u > 0), near_or_far * du, T.float32(0.0))


def build(tiling: str):
    return gate_backward_kernel(int(tiling.removeprefix(TILING_PREFIX)))


def first(c: int, lane):
    """The first expert of lane `lane`'s vector c."""
    return c * SPAN + lane * VEC


@T.macro
def load_vector(dst, at: int, src, row, start, vec, num_experts):
    """dst[at + j] = src[row, start + j] for the experts of the row (dst keeps its value past it)."""
    if vec != 0:
        if start < num_experts:  # rows of a multiple of VEC experts: a vector is whole or past the row
            T.call_extern("int32", "tkaot_load4", T.address_of(dst[at]), T.address_of(src[row, start]))
    else:
        for j in T.unroll(VEC):
            if start + j < num_experts:
                dst[at + j] = src[row, start + j]


@T.macro
def store_vector(dst, row, start, src, vec, num_experts):
    """dst[row, start + j] = src[j] for the experts of the row."""
    if vec != 0:
        if start < num_experts:
            T.call_extern("int32", "tkaot_store4", T.address_of(dst[row, start]), T.address_of(src[0]))
    else:
        for j in T.unroll(VEC):
            if start + j < num_experts:
                dst[row, start + j] = src[j]


def gate_backward_dims() -> tuple:
    """The backward's runtime dims, in both backends' kernels: (num_tokens, num_experts, num_topk)."""
    return tuple(T.dynamic(name) for name in ("num_tokens", "num_experts", "num_topk"))


def gate_backward_kernel(warps: int, min_blocks: int = 1, grad=logit_grad):
    """The kernel at `warps` tokens a block (`min_blocks`: a launch bound; `grad`: (u, du) -> the logit's gradient)."""
    num_tokens, num_experts, num_topk = gate_backward_dims()

    @T.prim_func
    def moe_topk_gate_backward(
        scores: T.Tensor[(num_tokens, num_experts), T.float32],
        topk_idx: T.Tensor[(num_tokens, num_topk), T.int64],
        topk_weights: T.Tensor[(num_tokens, num_topk), T.float32],
        grad_topk_weights: T.Tensor[(num_tokens, num_topk), T.float32],
        mask: T.Tensor[(num_tokens,), T.bool],
        # one row per sequence; its extent is nominal (rows are token // tokens_per_seq)
        grad_scores_sum: T.Tensor[(num_tokens, num_experts), T.float32],
        grad_logits: T.Tensor[(num_tokens, num_experts), T.float32],
        routed_scaling_factor: T.float32,
        has_aux: T.int32,
        tokens_per_seq: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as block:
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            kernel_entry(ROWS_SOURCE.format(warps=warps, experts=MAX_EXPERTS))  # kernels_src/pdl.py: before any memory access
            tid = T.get_thread_binding()
            lane = tid % WARP
            warp = tid // WARP
            token = block * warps + warp
            u = T.alloc_local((CHUNKS * VEC,), T.float32)
            h = T.alloc_local((CHUNKS * VEC,), T.float32)  # the aux gradient, laid out as u
            uv = T.alloc_local((VEC,), T.float32)
            dv = T.alloc_local((VEC,), T.float32)
            hv = T.alloc_local((VEC,), T.float32)
            gv = T.alloc_local((VEC,), T.float32)
            vec = T.alloc_var(T.int32)
            seq = T.alloc_var(T.int32)
            idx = T.alloc_var(T.int32)
            u_k = T.alloc_var(T.float32)
            g_k = T.alloc_var(T.float32)
            w_k = T.alloc_var(T.float32)
            masked = T.alloc_var(T.int32)
            topk_sum = T.alloc_var(T.float32)
            dot = T.alloc_var(T.float32)
            r_k = T.alloc_var(T.float32)
            other = T.alloc_var(T.int32)
            r_other = T.alloc_var(T.float32)
            r_sum = T.alloc_var(T.float32)
            last = T.alloc_var(T.int32)
            u_sum = T.alloc_var(T.float32)
            aux_dot = T.alloc_var(T.float32)
            inv = T.alloc_var(T.float32)
            if token < num_tokens:  # the same for a whole warp: the shuffles below see every lane
                # 16-byte accesses where every row starts 16-byte aligned (an absent h is a null pointer: aligned)
                vec = T.if_then_else(
                    num_experts % VEC == 0
                    and T.call_extern("int32", "tkaot_aligned16", scores.data) != 0
                    and T.call_extern("int32", "tkaot_aligned16", grad_logits.data) != 0
                    and T.call_extern("int32", "tkaot_aligned16", grad_scores_sum.data) != 0,
                    1,
                    0,
                )
                # The slots and the scores row first, together (and the aux term's mask; its h row in the vectors' order)
                idx = -1
                g_k = 0.0
                w_k = 0.0
                if lane < num_topk:
                    idx = T.cast(topk_idx[token, lane], T.int32)
                    g_k = grad_topk_weights[token, lane]
                    w_k = topk_weights[token, lane]
                for c in T.unroll(CHUNKS):
                    for j in T.unroll(VEC):
                        u[c * VEC + j] = 0.0
                    if c * SPAN < num_experts:  # uniform
                        load_vector(u, c * VEC, scores, token, first(c, lane), vec, num_experts)
                masked = 0
                if has_aux != 0:
                    seq = T.truncdiv(token, tokens_per_seq)
                    masked = T.cast(mask[token], T.int32)
                    for c in T.unroll(CHUNKS):
                        for j in T.unroll(VEC):
                            h[c * VEC + j] = 0.0
                        if c * SPAN < num_experts:
                            load_vector(h, c * VEC, grad_scores_sum, seq, first(c, lane), vec, num_experts)
                # The warp's scores row (the chosen scores are read from it) and its zeroed route row, to the end of
                # the last vector holding experts (zeros past the row)
                for c in T.unroll(CHUNKS):
                    if c * SPAN < num_experts:
                        T.call_extern("int32", "tkaot_row_put4", SCORES_ROW, warp, first(c, lane), T.address_of(u[c * VEC]))
                        T.call_extern("int32", "tkaot_row_zero4", ROUTE_ROW, warp, first(c, lane))
                T.call_extern("int32", "tkaot_sync_warp")
                # Slot k on lane k: its expert, score and gradient (0 for an empty slot)
                u_k = 0.0
                if idx >= 0 and idx < num_experts:
                    u_k = T.call_extern("float32", "tkaot_row_get", SCORES_ROW, warp, idx)
                if idx < 0:
                    g_k = 0.0
                dot = 0.0
                if lane < num_topk:
                    dot = g_k * w_k
                topk_sum = u_k
                warp_sum(topk_sum)
                warp_sum(dot)
                r_k = (routed_scaling_factor * g_k - dot) / (topk_sum + T.float32(1e-20))
                # Each slot lane sums, in slot order, the route gradients of the slots choosing its expert (from 0, as a
                # register accumulator would); the last such slot stores the sum in the warp's row. Without repeated
                # experts (uniform), the sum is the slot's own: 0 + r_k, rounded as the sum from 0 (-0 becomes +0)
                last = 1
                if T.call_extern("int32", "tkaot_any_repeated", idx) != 0:
                    r_sum = 0.0
                    for k in T.unroll(MAX_TOPK):
                        if k < num_topk:  # uniform
                            other = T.shfl_sync(idx, k)
                            r_other = T.shfl_sync(r_k, k)
                            if other == idx:
                                r_sum += r_other
                                if k > lane:
                                    last = 0
                else:
                    r_sum = T.call_extern("float32", "__fadd_rn", T.float32(0.0), r_k)
                if idx >= 0 and idx < num_experts and last != 0:
                    T.call_extern("int32", "tkaot_row_put", ROUTE_ROW, warp, idx, r_sum)
                inv = 0.0
                aux_dot = 0.0
                if has_aux != 0:
                    u_sum = 0.0
                    # over the lane's vectors (terms past the row +0); session 12's order (lane, lane + 32, ...): 12.66 us, not 9.38
                    for c in T.unroll(CHUNKS):
                        if c * SPAN < num_experts:
                            for j in T.unroll(VEC):
                                u_sum += u[c * VEC + j]
                                aux_dot += h[c * VEC + j] * u[c * VEC + j]
                    warp_sum(u_sum)
                    warp_sum(aux_dot)
                    inv = T.if_then_else(masked != 0, T.float32(1.0) / u_sum, T.float32(0.0))
                T.call_extern("int32", "tkaot_sync_warp")  # the route row's stores before its loads
                for c in T.unroll(CHUNKS):
                    if c * SPAN < num_experts:
                        T.call_extern("int32", "tkaot_row_get4", ROUTE_ROW, warp, first(c, lane), T.address_of(dv[0]))
                        if has_aux != 0:
                            # through hv: read from h directly, nvcc unswitched this loop on has_aux (55 registers, unmeasured)
                            for j in T.unroll(VEC):
                                hv[j] = h[c * VEC + j]
                            for j in T.unroll(VEC):
                                dv[j] = dv[j] + (hv[j] - aux_dot * inv) * inv
                        # u held in registers to here instead: 7.32 us, not 7.75, without aux but 12.99, not 9.38, with it
                        T.call_extern("int32", "tkaot_row_get4", SCORES_ROW, warp, first(c, lane), T.address_of(uv[0]))
                        for j in T.unroll(VEC):
                            gv[j] = grad(uv[j], dv[j])
                        store_vector(grad_logits, token, first(c, lane), gv, vec, num_experts)

    return moe_topk_gate_backward
