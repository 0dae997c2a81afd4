"""The gate's fused RMSNorm weight: weight_fused = float(weight_hidden) * float(weight_embed), elementwise.

A product of two bf16 values is exact in fp32. Each thread multiplies one 16-byte vector (8
elements); the element count is a runtime value (a multiple of 8).
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.tensors import fp32, tensor
from tkaot._engram.kernels import FUSED_WEIGHT

DECL = FUSED_WEIGHT  # the declaration this module builds (tkaot/_engram/kernels.py)

THREADS = 128
VEC = 8


def fused_weight_kernel(dtype: str, body):
    """The engram_fused_weight prim_func of both backends, its arguments written once in the declaration's order
    (tkaot/_engram/kernels.py, which the build checks); body(numel, weight_hidden, weight_embed, weight_fused), a
    @T.macro, emits the kernel."""
    numel = T.dynamic("numel")
    weights = tensor(dtype, numel)

    @T.prim_func
    def engram_fused_weight(weight_hidden: weights, weight_embed: weights, weight_fused: fp32(numel)):
        body(numel, weight_hidden, weight_embed, weight_fused)

    return engram_fused_weight


def build(dtype: str):
    @T.macro
    def body(numel, weight_hidden, weight_embed, weight_fused):
        with T.Kernel(T.ceildiv(numel, THREADS * VEC), threads=THREADS) as block:
            kernel_entry()
            T.assume(numel % VEC == 0)
            base = (block * THREADS + T.get_thread_binding()) * VEC
            a = T.alloc_local((VEC,), T.float32)
            b = T.alloc_local((VEC,), T.float32)
            if base < numel:
                for j in T.vectorized(VEC):
                    a[j] = weight_hidden[base + j]
                for j in T.vectorized(VEC):
                    b[j] = weight_embed[base + j]
                for j in T.vectorized(VEC):
                    weight_fused[base + j] = a[j] * b[j]

    return fused_weight_kernel(dtype, body)
