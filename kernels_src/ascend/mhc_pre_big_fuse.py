"""mHC pre-layer step, fused, for Ascend (as kernels_src/mhc/pre_big_fuse.py), one block a token t: with M =
mhc_mult and the mixes m = (the sum over splits of gemm_out_mul[:, t]) * rsqrt((the sum over splits of
gemm_out_sqrsum[:, t]) / (M * hidden) + rms_eps), each split sum in order from zero,
  post_mix[t, j]    = sigmoid(m[M + j] * mhc_scale[1] + mhc_base[M + j]) * mhc_post_mult_value
  comb_mix[t]       = Sinkhorn(m[2M:] * mhc_scale[2] + mhc_base[2M:] as M x M), sinkhorn_repeat steps
  layer_input[t, :] = bf16(the sum over i of pre[i] * residual[t, i, :]), pre[i] = sigmoid(m[i] * mhc_scale[0]
                      + mhc_base[i]) + mhc_pre_eps, in stream order from zero.

A first SIMT region gives each mix a thread, which keeps it in the Unified Buffer (the pre mixes too); after the
region's barrier, threads below M write the post mixes and thread 0 runs Sinkhorn on its own copy of the comb
matrix (kernels_src/ascend/mhc_common.py sinkhorn: the sums in the CUDA kernel's order). Then the block walks
the hidden segments, applying the pre mixes to each (stream_sum). Hidden size, split count and Sinkhorn repeats
are runtime values.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.mhc_common import THREADS, Args, segments, sigmoid, sinkhorn, span, stream_sum
from tkaot._mhc.kernels import PRE_BIG_FUSE

DECL = PRE_BIG_FUSE
REQUIRES: dict[str, int] = {}
MIX_THREADS = 32  # a thread a mix: M * (M + 2) <= 24 for M <= 4


def unsupported(mhc_mult) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(mhc_mult: int):
    m = mhc_mult
    mm, mixes = m * m, m * (m + 2)
    a = Args(m)
    n_splits = T.dynamic("n_splits")
    cols = span(2 * (m + 1))

    @T.prim_func
    def mhc_pre_big_fuse(
        gemm_out_mul: T.Tensor[(n_splits, a.num_tokens, mixes), T.float32],
        gemm_out_sqrsum: T.Tensor[(n_splits, a.num_tokens), T.float32],
        mhc_scale: T.Tensor[(3,), T.float32],
        mhc_base: T.Tensor[(mixes,), T.float32],
        residual: a.streams,
        post_mix: a.mix,
        comb_mix: T.Tensor[(a.num_tokens, mm), T.float32],
        layer_input: a.row,
        rms_eps: T.float32,
        mhc_pre_eps: T.float32,
        mhc_sinkhorn_eps: T.float32,
        mhc_post_mult_value: T.float32,
        sinkhorn_repeat: T.int32,
    ):
        with T.Kernel(a.num_tokens) as t:
            mix_ub = T.alloc_shared((MIX_THREADS,), T.float32)
            pre_ub = T.alloc_shared((m,), T.float32)
            res_ub = T.alloc_shared((m, cols), T.bfloat16)
            li_ub = T.alloc_shared((cols,), T.bfloat16)
            with T.SimtVF(threads=MIX_THREADS):
                squares = T.alloc_var(T.float32)
                mix = T.alloc_var(T.float32)
                comb = T.alloc_local((mm,), T.float32)
                # copies: a macro names the Vars it is given after its own parameters
                repeat = T.alloc_var(T.int32, init=sinkhorn_repeat)
                eps = T.alloc_var(T.float32, init=mhc_sinkhorn_eps)
                sums = T.alloc_local((m,), T.float32)
                for e in T.Parallel(MIX_THREADS):
                    if e < mixes:
                        squares = T.float32(0)
                        for split in T.serial(n_splits):
                            squares = squares + gemm_out_sqrsum[split, t]
                        mix = T.float32(0)
                        for split in T.serial(n_splits):
                            mix = mix + gemm_out_mul[split, t, e]
                        mix = mix * T.rsqrt(squares / T.cast(m * a.hidden, T.float32) + rms_eps)
                        mix_ub[e] = mix
                        if e < m:
                            pre_ub[e] = sigmoid(mix * mhc_scale[0] + mhc_base[e]) + mhc_pre_eps
                    if e < m:
                        post_mix[t, e] = sigmoid(mix_ub[m + e] * mhc_scale[1] + mhc_base[m + e]) * mhc_post_mult_value
                    if e == 0:
                        for k in T.unroll(mm):
                            comb[k] = mix_ub[2 * m + k] * mhc_scale[2] + mhc_base[2 * m + k]
                        sinkhorn(comb, sums, m, repeat, eps)
                        for k in T.unroll(mm):
                            comb_mix[t, k] = comb[k]
            for first in T.serial(0, a.hidden, cols):
                T.copy(residual[t, :, first : first + cols], res_ub)
                with T.SimtVF(threads=THREADS):
                    total = T.alloc_local((1,), T.float32)
                    for j in T.Parallel(cols):
                        stream_sum(total, 0, T.float32(0), pre_ub, res_ub, j, m)
                        li_ub[j] = T.cast(total[0], T.bfloat16)
                T.copy(li_ub, layer_input[t, first : first + cols])

    return mhc_pre_big_fuse
