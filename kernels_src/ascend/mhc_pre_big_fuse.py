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
the hidden segments, applying the pre mixes to each (mix_streams). Hidden size, split count and Sinkhorn
repeats are runtime values.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import PRE_BIG_FUSE

DECL = PRE_BIG_FUSE
MIX_THREADS = 32  # a thread a mix: M * (M + 2) <= 24 for M <= 4


def build(mhc_mult: int):
    m = mhc_mult
    a = mc.Args(m)
    n_splits = T.dynamic("n_splits")
    cols = mc.span(2 * (m + 1))

    @T.prim_func
    def mhc_pre_big_fuse(
        gemm_out_mul: mc.fp32(n_splits, a.num_tokens, a.mixes), gemm_out_sqrsum: mc.fp32(n_splits, a.num_tokens),
        mhc_scale: a.scale, mhc_base: a.base, residual: a.streams, post_mix: a.mix, comb_mix: a.comb_rows, layer_input: a.row,
        rms_eps: T.float32, mhc_pre_eps: T.float32, mhc_sinkhorn_eps: T.float32, mhc_post_mult_value: T.float32,
        sinkhorn_repeat: T.int32,
    ):  # fmt: skip
        with T.Kernel(a.num_tokens) as t:
            mix_ub = T.alloc_shared((MIX_THREADS,), T.float32)
            pre_ub = T.alloc_shared((m,), T.float32)
            res_ub = T.alloc_shared((m, cols), T.bfloat16)
            li_ub = T.alloc_shared((cols,), T.bfloat16)
            with T.SimtVF(threads=MIX_THREADS):
                part = T.alloc_local((2,), T.float32)  # the split sums: squares, then the mix
                mix = T.alloc_var(T.float32)
                comb = T.alloc_local((m * m,), T.float32)
                sums = T.alloc_local((m,), T.float32)
                # copies: a macro would name these arguments after its own parameters
                repeat = T.alloc_var(T.int32, init=sinkhorn_repeat)
                eps = T.alloc_var(T.float32, init=mhc_sinkhorn_eps)
                for e in T.Parallel(MIX_THREADS):
                    if e < a.mixes:
                        mc.add_splits(part, 0, gemm_out_sqrsum, t)
                        mc.add_splits(part, 1, gemm_out_mul, t, e)
                        mix = part[1] * T.rsqrt(part[0] / T.cast(m * a.hidden, T.float32) + rms_eps)
                        mix_ub[e] = mix
                        if e < m:
                            pre_ub[e] = mc.sigmoid(mix * mhc_scale[0] + mhc_base[e]) + mhc_pre_eps
                    if e < m:
                        post_mix[t, e] = mc.sigmoid(mix_ub[m + e] * mhc_scale[1] + mhc_base[m + e]) * mhc_post_mult_value
                    if e == 0:
                        for k in T.unroll(m * m):
                            comb[k] = mix_ub[2 * m + k] * mhc_scale[2] + mhc_base[2 * m + k]
                        mc.sinkhorn(comb, sums, m, repeat, eps)
                        mc.store_row(comb_mix, t, comb, m * m)
            for first in T.serial(0, a.hidden, cols):
                T.copy(residual[t, :, first : first + cols], res_ub)
                mc.mix_streams(li_ub, res_ub, lambda i: pre_ub[i], cols, m)
                T.copy(li_ub, layer_input[t, first : first + cols])

    return mhc_pre_big_fuse
