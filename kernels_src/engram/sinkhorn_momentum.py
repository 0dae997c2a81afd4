"""Sinkhorn momentum, in place: m' = fma(m, beta1, (1 - beta1) * g) in fp32 (stored in the buffer's dtype), and the
Sinkhorn input fma(g, 1 - beta1, beta1 * m') with nesterov, else m' (fp32, before rounding to the buffer's dtype).

Elementwise; the element count (a multiple of 8), beta1, 1 - beta1 (computed by the caller in double precision,
as TileKernels folds it) and nesterov are runtime values. Tiling "t<threads>v<vec>x<reps>": a CTA of `threads`
lanes takes threads * vec * reps elements, a lane `reps` runs of `vec` consecutive ones, threads * vec apart, so
with vec 4 every access of a warp is one contiguous span (512 bytes of fp32, 256 of bf16); with vec 8 a lane's
fp32 run is two 16-byte accesses 32 bytes apart, each touching every sector of 1 KB.
"""

import re

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from tkaot._engram.kernels import SINKHORN_MOMENTUM

DECL = SINKHORN_MOMENTUM  # the declaration this module builds (tkaot/_engram/kernels.py)


def parse_tiling(tiling: str) -> tuple[int, int, int]:
    """Tiling "t<threads>v<vec>x<reps>": lanes a CTA (a multiple of 32, at most 1024), consecutive elements a run
    (1, 2, 4 or 8: a divisor of the element count's 8), runs a lane (1-16)."""
    match = re.fullmatch(r"t(\d+)v(\d+)x(\d+)", tiling)
    if match is None:
        raise ValueError(f"engram_sinkhorn_momentum tiling {tiling!r} is not t<threads>v<vec>x<reps>")
    threads, vec, reps = map(int, match.groups())
    if not (threads % 32 == 0 and 32 <= threads <= 1024 and vec in (1, 2, 4, 8) and 1 <= reps <= 16):
        raise ValueError(f"engram_sinkhorn_momentum tiling {tiling!r}: threads a multiple of 32 in [32, 1024], vec 1/2/4/8, reps 1-16")
    return threads, vec, reps


def build(grad_dtype: str, momentum_dtype: str, tiling: str):
    threads, vec, reps = parse_tiling(tiling)
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
        with T.Kernel(T.ceildiv(numel, threads * vec * reps), threads=threads) as block:
            kernel_entry()
            T.assume(numel % 8 == 0)
            g = T.alloc_local((reps, vec), T.float32)
            m = T.alloc_local((reps, vec), T.float32)
            s = T.alloc_local((vec,), T.float32)
            first = block * reps * threads * vec + T.get_thread_binding() * vec
            for r in T.unroll(reps):  # every run's loads first: all in flight together
                if first + r * threads * vec < numel:
                    for j in T.vectorized(vec):
                        g[r, j] = grad[first + r * threads * vec + j]
                    for j in T.vectorized(vec):
                        m[r, j] = momentum_buffer[first + r * threads * vec + j]
            for r in T.unroll(reps):
                base = first + r * threads * vec
                if base < numel:
                    for j in T.unroll(vec):
                        m[r, j] = T.ieee_fmaf(m[r, j], beta1, one_minus_beta1 * g[r, j], "rn")
                    if nesterov != 0:
                        for j in T.unroll(vec):
                            s[j] = T.ieee_fmaf(g[r, j], one_minus_beta1, beta1 * m[r, j], "rn")
                    else:
                        for j in T.unroll(vec):
                            s[j] = m[r, j]
                    for j in T.vectorized(vec):
                        momentum_buffer[base + j] = m[r, j]
                    for j in T.vectorized(vec):
                        sinkhorn_input[base + j] = s[j]

    return engram_sinkhorn_momentum
