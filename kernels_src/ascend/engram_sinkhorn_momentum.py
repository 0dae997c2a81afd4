"""Sinkhorn momentum for Ascend, in place: m' = fma(m, beta1, (1 - beta1) * g) in fp32, stored in the buffer's
dtype, and the Sinkhorn input fma(g, 1 - beta1, beta1 * m') with nesterov, else m' (fp32, before rounding).

A block copies `BLOCK` elements of the gradient and the momentum buffer into the Unified Buffer, updates them in
a SIMT region with the CUDA kernel's fused multiply-adds (kernels_src/engram/sinkhorn_momentum.py) and copies
both results back; the last block's copies stop at numel. beta1, 1 - beta1 and nesterov are runtime values.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import fp32, tensor
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.ascend.engram_fused_weight import elementwise_tiles
from tkaot._engram.kernels import SINKHORN_MOMENTUM

DECL = SINKHORN_MOMENTUM
BLOCK = 4096
THREADS = 256


def build(grad_dtype: str, momentum_dtype: str, tiling: str):  # the tiling is the CUDA kernel's (its lanes): one layout here
    numel = T.dynamic("numel")

    def fma(a, b, c):
        # one rounding, as the CUDA kernel's ieee_fmaf (TileLang's Ascend dialect has no scalar fma of its own)
        return T.call_extern("float32", "fmaf", a, b, c)

    @T.prim_func
    def engram_sinkhorn_momentum(
        grad: tensor(grad_dtype, numel),
        momentum_buffer: tensor(momentum_dtype, numel),
        sinkhorn_input: fp32(numel),
        beta1: T.float32,
        one_minus_beta1: T.float32,
        nesterov: T.int32,
    ):
        with T.Kernel(T.ceildiv(numel, BLOCK)) as block:
            first = block * BLOCK
            g_ub, m_ub, s_ub = elementwise_tiles(first, BLOCK, (grad, grad_dtype), (momentum_buffer, momentum_dtype))
            with T.SimtVF(threads=THREADS):
                for j in T.Parallel(BLOCK):
                    g = T.Cast("float32", g_ub[j])
                    m = fma(T.Cast("float32", m_ub[j]), beta1, one_minus_beta1 * g)
                    s_ub[j] = T.if_then_else(nesterov != 0, fma(g, one_minus_beta1, beta1 * m), m)
                    m_ub[j] = T.Cast(momentum_dtype, m)
            T.copy(m_ub, momentum_buffer[first : first + BLOCK])
            T.copy(s_ub, sinkhorn_input[first : first + BLOCK])

    return engram_sinkhorn_momentum
