"""Sinkhorn momentum, in place: m' = fma(m, beta1, (1 - beta1) * g) in fp32 (stored in the buffer's dtype), and the
Sinkhorn input fma(g, 1 - beta1, beta1 * m') with nesterov, else m' (fp32, before rounding to the buffer's dtype).

Elementwise over 8-element vectors; the element count (a multiple of 8), beta1, 1 - beta1 (computed
by the caller in double precision, as TileKernels folds it) and nesterov are runtime values.
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from tkaot._engram.kernels import SINKHORN_MOMENTUM

DECL = SINKHORN_MOMENTUM  # the declaration this module builds (tkaot/_engram/kernels.py)

THREADS = 128
VEC = 8


def build(grad_dtype: str, momentum_dtype: str):
    numel = T.dynamic("numel")

    @T.prim_func
    def engram_sinkhorn_momentum(
        grad: T.Tensor[(numel,), grad_dtype],
        momentum_buffer: T.Tensor[(numel,), momentum_dtype],
        sinkhorn_input: T.Tensor[(numel,), T.float32],
        beta1: T.float32,
        one_minus_beta1: T.float32,
        nesterov: T.int32,
    ):
        with T.Kernel(T.ceildiv(numel, THREADS * VEC), threads=THREADS) as block:
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(numel % VEC == 0)
            base = (block * THREADS + T.get_thread_binding()) * VEC
            g = T.alloc_local((VEC,), T.float32)
            m = T.alloc_local((VEC,), T.float32)
            s = T.alloc_local((VEC,), T.float32)
            if base < numel:
                for j in T.vectorized(VEC):
                    g[j] = grad[base + j]
                for j in T.vectorized(VEC):
                    m[j] = momentum_buffer[base + j]
                for j in T.unroll(VEC):
                    m[j] = T.ieee_fmaf(m[j], beta1, one_minus_beta1 * g[j], "rn")
                if nesterov != 0:
                    for j in T.unroll(VEC):
                        s[j] = T.ieee_fmaf(g[j], one_minus_beta1, beta1 * m[j], "rn")
                else:
                    for j in T.unroll(VEC):
                        s[j] = m[j]
                for j in T.vectorized(VEC):
                    momentum_buffer[base + j] = m[j]
                for j in T.vectorized(VEC):
                    sinkhorn_input[base + j] = s[j]

    return engram_sinkhorn_momentum
