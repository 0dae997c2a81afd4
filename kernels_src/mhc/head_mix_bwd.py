"""mHC head mix, backward: input_mix_grad, and per-block partial sums of the scale and base gradients.

With s = sigmoid(input_mix * scale + base[j]) and g = s * (1 - s) * output_mix_grad:
input_mix_grad = g * scale; block p writes mhc_scale_grad_partial[p] = sum of g * input_mix and
mhc_base_grad_partial[p, j] = sum of g over column j, over the tiles of `token_block_size` tokens
p, p + num_sms, p + 2 * num_sms, ... (the caller sums the partial rows). `num_sms` (the grid),
`token_block_size` and the expansion rate are runtime values: one cubin serves every GPU.

A thread owns tile elements tid, tid + 128, ... (flattened token-major), so its column is
tid % mhc_mult when the rate is a power of two up to 128; the block then sums by a butterfly over
shared memory, pairs 64, 32, ... apart, down to mhc_mult apart for the base and to 1 for the scale (pairs
within a warp by xor shuffles: the same additions, without a barrier each).
"""

import tilelang.language as T

from kernels_src.mhc.common import mix_types
from kernels_src.pdl import kernel_entry
from kernels_src.tensors import fp32
from tkaot._mhc.kernels import HEAD_MIX_BWD, HEAD_MIX_BWD_THREADS

DECL = HEAD_MIX_BWD  # the declaration this module builds (tkaot/_mhc/kernels.py)

THREADS = HEAD_MIX_BWD_THREADS
STEPS = THREADS.bit_length() - 1  # butterfly steps: 64, 32, ..., 1 apart
WARP = 32
UNROLL = 1  # rounds of a tile whose loads a thread issues together (H200, 8192 tokens: 2.12 us; 4 rounds 2.55)


def build(dtype: str):
    num_tokens, mhc_mult, num_sms = T.dynamic("num_tokens"), T.dynamic("mhc_mult"), T.dynamic("num_sms")
    mixes, scale, base = mix_types(num_tokens, mhc_mult, 1)

    @T.prim_func
    def mhc_head_mix_bwd(
        output_mix_grad: mixes,
        input_mix: mixes,
        mhc_scale: scale,
        mhc_base: base,
        input_mix_grad: mixes,
        mhc_scale_grad_partial: fp32(num_sms, 1),
        mhc_base_grad_partial: fp32(num_sms, mhc_mult),
        token_block_size: T.int32,
    ):
        with T.Kernel(num_sms, threads=THREADS) as pid:
            kernel_entry()
            T.assume(mhc_mult > 0)
            T.assume(token_block_size > 0)
            tid = T.get_thread_binding()
            scale_sum = T.alloc_var(T.float32)
            base_sum = T.alloc_var(T.float32)
            s = T.alloc_var(T.float32)
            g = T.alloc_var(T.float32)
            scale_red = T.alloc_shared((THREADS,), T.float32)
            base_red = T.alloc_shared((THREADS,), T.float32)
            x = T.alloc_local((UNROLL,), T.float32)
            dy = T.alloc_local((UNROLL,), T.float32)
            base = T.alloc_local((UNROLL,), T.float32)
            scale_sum = T.float32(0)
            base_sum = T.float32(0)
            tile = token_block_size * mhc_mult
            tiles = T.ceildiv(num_tokens, token_block_size)
            rounds = T.ceildiv(tile, THREADS)
            for wave in T.serial(T.ceildiv(tiles, num_sms)):
                t = wave * num_sms + pid
                if t < tiles:
                    for r0 in T.serial(T.ceildiv(rounds, UNROLL)):
                        for u in T.unroll(UNROLL):
                            f = (r0 * UNROLL + u) * THREADS + tid
                            token = t * token_block_size + f // mhc_mult
                            if f < tile and token < num_tokens:
                                x[u] = input_mix[token, f % mhc_mult]
                                dy[u] = output_mix_grad[token, f % mhc_mult]
                                base[u] = mhc_base[f % mhc_mult]
                        for u in T.unroll(UNROLL):
                            f = (r0 * UNROLL + u) * THREADS + tid
                            token = t * token_block_size + f // mhc_mult
                            if f < tile and token < num_tokens:
                                s = T.sigmoid(x[u] * mhc_scale[0] + base[u])
                                g = s * (T.float32(1) - s) * dy[u]
                                input_mix_grad[token, f % mhc_mult] = g * mhc_scale[0]
                                scale_sum = scale_sum + g * x[u]
                                base_sum = base_sum + g
            for step in T.serial(STEPS - 5):  # pairs in different warps, through shared memory
                apart = (THREADS // 2) >> step
                T.sync_threads()
                scale_red[tid] = scale_sum
                base_red[tid] = base_sum
                T.sync_threads()
                scale_sum = scale_sum + scale_red[tid ^ apart]
                if apart >= mhc_mult:
                    base_sum = base_sum + base_red[tid ^ apart]
            for step in T.unroll(5):  # pairs within a warp
                apart = (WARP // 2) >> step
                scale_sum = scale_sum + T.shfl_xor(scale_sum, apart)
                partner = T.shfl_xor(base_sum, apart)
                if apart >= mhc_mult:
                    base_sum = base_sum + partner
            if tid == 0:
                mhc_scale_grad_partial[pid, 0] = scale_sum
            if tid < mhc_mult:
                mhc_base_grad_partial[pid, tid] = base_sum

    return mhc_head_mix_bwd
