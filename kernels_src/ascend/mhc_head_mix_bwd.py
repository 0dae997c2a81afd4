"""mHC head mix, backward, for Ascend: input_mix_grad, and per-block partial sums of the scale and base gradients
(as kernels_src/mhc/head_mix_bwd.py).

With s = sigmoid(input_mix * scale + base[j]) and g = s * (1 - s) * output_mix_grad: input_mix_grad = g * scale;
block p writes mhc_scale_grad_partial[p] = the sum of g * input_mix and mhc_base_grad_partial[p, j] = the sum of g
over column j, over the tiles of `token_block_size` tokens p, p + num_sms, p + 2 * num_sms, ... The block count
num_sms, token_block_size and the expansion rate are runtime values.

SIMT thread u takes tile elements u, u + THREADS, ... (token-major, read and written in global memory), so its
column is u % mhc_mult (the op keeps mhc_mult a power of two up to THREADS); it leaves its two sums in the `sums`
tile, whose scale row is added in thread order and whose base row in the order of each column's threads.
"""

from tilelang.ascend import language as T

from kernels_src.ascend import mhc_common as mc
from kernels_src.ascend.mhc_common import REQUIRES as REQUIRES
from kernels_src.ascend.mhc_common import unsupported as unsupported
from tkaot._mhc.kernels import HEAD_MIX_BWD, HEAD_MIX_BWD_THREADS

DECL = HEAD_MIX_BWD
THREADS = HEAD_MIX_BWD_THREADS  # the op keeps mhc_mult a power of two up to this, so it divides the thread count


def build(dtype: str):
    num_tokens, mhc_mult, num_sms = T.dynamic("num_tokens"), T.dynamic("mhc_mult"), T.dynamic("num_sms")
    mixes = mc.fp32(num_tokens, mhc_mult)

    @T.prim_func
    def mhc_head_mix_bwd(
        output_mix_grad: mixes, input_mix: mixes, mhc_scale: mc.fp32(1), mhc_base: mc.fp32(mhc_mult), input_mix_grad: mixes,
        mhc_scale_grad_partial: mc.fp32(num_sms, 1), mhc_base_grad_partial: mc.fp32(num_sms, mhc_mult), token_block_size: T.int32,
    ):  # fmt: skip
        T.assume(mhc_mult > 0)
        with T.Kernel(num_sms) as pid:
            sums = T.alloc_shared((2, THREADS), T.float32)
            with T.SimtVF(threads=THREADS):
                s = T.alloc_var(T.float32)
                g = T.alloc_var(T.float32)
                acc = T.alloc_local((2,), T.float32)  # the thread's sums: the scale's, the base's
                for u in T.Parallel(THREADS):
                    acc[0] = T.float32(0)
                    acc[1] = T.float32(0)
                    tiles = T.ceildiv(num_tokens, token_block_size)
                    for wave in T.serial(T.ceildiv(tiles, num_sms)):
                        for r in T.serial(T.ceildiv(token_block_size * mhc_mult, THREADS)):
                            f = r * THREADS + u
                            token = (wave * num_sms + pid) * token_block_size + f // mhc_mult
                            if f < token_block_size * mhc_mult and token < num_tokens:
                                s = mc.sigmoid(input_mix[token, f % mhc_mult] * mhc_scale[0] + mhc_base[f % mhc_mult])
                                g = s * (T.float32(1) - s) * output_mix_grad[token, f % mhc_mult]
                                input_mix_grad[token, f % mhc_mult] = g * mhc_scale[0]
                                acc[0] = acc[0] + g * input_mix[token, f % mhc_mult]
                                acc[1] = acc[1] + g
                    sums[0, u] = acc[0]
                    sums[1, u] = acc[1]
            with T.SimtVF(threads=THREADS):
                total = T.alloc_local((1,), T.float32)
                for j in T.Parallel(THREADS):
                    if j == 0:
                        total[0] = T.float32(0)
                        for n in T.serial(THREADS):
                            total[0] = total[0] + sums[0, n]
                        mhc_scale_grad_partial[pid, 0] = total[0]
                    if j < mhc_mult:
                        total[0] = T.float32(0)
                        for n in T.serial(THREADS // mhc_mult):
                            total[0] = total[0] + sums[1, j + n * mhc_mult]
                        mhc_base_grad_partial[pid, j] = total[0]

    return mhc_head_mix_bwd
