"""Sinkhorn momentum, in place: m' = fma(m, beta1, (1 - beta1) * g) in fp32 (stored in the buffer's dtype), and the
Sinkhorn input fma(g, 1 - beta1, beta1 * m') with nesterov, else m' (fp32, before rounding to the buffer's dtype).

Elementwise; the element count (a multiple of 8), beta1, 1 - beta1 (computed by the caller in double precision,
as TileKernels folds it) and nesterov are runtime values. Tiling "t<threads>v<vec>x<reps>": a CTA of `threads`
lanes takes threads * vec * reps elements, a lane `reps` runs of `vec` consecutive ones, threads * vec apart, so
with vec 4 every access of a warp is one contiguous span (512 bytes of fp32, 256 of bf16); with vec 8 a lane's
fp32 run is two 16-byte accesses 32 bytes apart, each touching every sector of 1 KB.

Letters after the tiling (tuning forms; each keeps the same fused multiply-adds, so the same bytes):
- "u": a CTA whose elements are all below numel (all but the last) runs its runs without a bounds test, one uniform
  branch a CTA;
- "e": PDL's launch_dependents after the stores, as TileKernels places its trigger (the wait stays at entry);
- "n": no PDL at all (neither the wait nor the trigger: launched without the attribute, as TileKernels' calls are);
- "c": cache hints, grad read by ld.global.nc.L1::no_allocate (read once) and sinkhorn_input stored by
  st.global.cs (written once, evict-first), the momentum buffer as before;
- "p": grad read by a plain ld.global (TileKernels' load; without it, and without "c", nvcc reads the restrict-
  qualified grad by ld.global.nc), with "c" ld.global.L1::no_allocate.
"c" and "p" read grad in 8- or 16-byte pieces (vec * its element size) and store in 8 or 16 (vec 2 or 4).
"""

import re

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, kernel_entry
from tkaot._engram.kernels import SINKHORN_MOMENTUM

DECL = SINKHORN_MOMENTUM  # the declaration this module builds (tkaot/_engram/kernels.py)

FLAGS = "uenpc"  # the tuning letters a tiling may end with, each at most once, in this order
_WORDS = {8: "v2.b32", 16: "v4.b32"}  # a piece's PTX vector by its bytes


def parse_tiling(tiling: str) -> tuple[int, int, int, str]:
    """Tiling "t<threads>v<vec>x<reps>[letters]": lanes a CTA (a multiple of 32, at most 1024), consecutive elements
    a run (1, 2, 4 or 8: a divisor of the element count's 8), runs a lane (1-16), then the tuning letters (the module
    docstring) in FLAGS' order."""
    match = re.fullmatch(r"t(\d+)v(\d+)x(\d+)([a-z]*)", tiling)
    if match is None:
        raise ValueError(f"engram_sinkhorn_momentum tiling {tiling!r} is not t<threads>v<vec>x<reps>[{FLAGS}]")
    threads, vec, reps = map(int, match.groups()[:3])
    letters = match.group(4)
    if not (threads % 32 == 0 and 32 <= threads <= 1024 and vec in (1, 2, 4, 8) and 1 <= reps <= 16):
        raise ValueError(f"engram_sinkhorn_momentum tiling {tiling!r}: threads a multiple of 32 in [32, 1024], vec 1/2/4/8, reps 1-16")
    if "".join(f for f in FLAGS if f in letters) != letters or ("e" in letters and "n" in letters):
        raise ValueError(f"engram_sinkhorn_momentum tiling {tiling!r}: letters from {FLAGS!r}, each once in that order, not both e and n")
    return threads, vec, reps, letters


def _load_function(name: str, nbytes: int, op: str) -> str:
    """CUDA source of `int name(void* dst, const void* src)`: `nbytes` from global src into registers at dst by one
    `op` (a ld.global form), in T.call_extern's int-returning form. Volatile, so it stays behind the PDL wait."""
    n = nbytes // 4
    outs = ", ".join(f'"=r"(v[{i}])' for i in range(n))
    regs = ", ".join(f"%{i}" for i in range(n))
    return (
        f"__device__ __forceinline__ int {name}(void* dst, const void* src) {{\n"
        f"    unsigned v[{n}];\n"
        f'    asm volatile("{op}.{_WORDS[nbytes]} {{{regs}}}, [%{n}];" : {outs} : "l"(__cvta_generic_to_global(src)));\n'
        f"    for (int i = 0; i < {n}; ++i) ((unsigned*)dst)[i] = v[i];\n"
        "    return 0;\n"
        "}\n"
    )


def _store_function(name: str, nbytes: int, op: str) -> str:
    """CUDA source of `int name(void* dst, const void* src)`: `nbytes` of registers at src to global dst by one `op`."""
    n = nbytes // 4
    ins = ", ".join(f'"r"(((const unsigned*)src)[{i}])' for i in range(n))
    regs = ", ".join(f"%{i + 1}" for i in range(n))
    return (
        f"__device__ __forceinline__ int {name}(void* dst, const void* src) {{\n"
        f'    asm volatile("{op}.{_WORDS[nbytes]} [%0], {{{regs}}};" :: "l"(__cvta_generic_to_global(dst)), {ins} : "memory");\n'
        "    return 0;\n"
        "}\n"
    )


def build(grad_dtype: str, momentum_dtype: str, tiling: str):
    threads, vec, reps, letters = parse_tiling(tiling)
    numel = T.dynamic("numel")
    span = threads * vec * reps  # elements a CTA
    grad_bytes = vec * (4 if grad_dtype == "float32" else 2)
    own_load, own_store = ("c" in letters or "p" in letters), "c" in letters
    if own_load and grad_bytes not in _WORDS or own_store and vec * 4 not in _WORDS:
        raise ValueError(f"engram_sinkhorn_momentum tiling {tiling!r}: 'c' and 'p' move 8 or 16 bytes a run")
    load_op = "ld.global" + ("" if "p" in letters else ".nc") + (".L1::no_allocate" if "c" in letters else "")
    extra = (_load_function("tkaot_load_grad", grad_bytes, load_op) if own_load else "") + (
        _store_function("tkaot_store_input", vec * 4, "st.global.cs") if own_store else ""
    )

    @T.macro
    def entry():
        if "e" in letters:  # the wait alone here; the trigger after the stores
            T.import_source(PDL_SOURCE + extra)
            T.call_extern("int32", "tkaot_pdl_wait")
        elif "n" in letters:
            T.import_source("\n" + extra)
        else:
            kernel_entry(extra)

    @T.macro
    def load(grad, momentum_buffer, g, gb, m, r, at):
        if own_load:
            T.call_extern("int32", "tkaot_load_grad", T.address_of(gb[r, 0]), T.address_of(grad[at]))
            for j in T.vectorized(vec):
                g[r, j] = gb[r, j]
        else:
            for j in T.vectorized(vec):
                g[r, j] = grad[at + j]
        for j in T.vectorized(vec):
            m[r, j] = momentum_buffer[at + j]

    @T.macro
    def update(momentum_buffer, sinkhorn_input, beta1, one_minus_beta1, nesterov, g, m, s, r, base):
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
        if own_store:
            T.call_extern("int32", "tkaot_store_input", T.address_of(sinkhorn_input[base]), T.address_of(s[0]))
        else:
            for j in T.vectorized(vec):
                sinkhorn_input[base + j] = s[j]

    @T.macro
    def runs(grad, momentum_buffer, sinkhorn_input, beta1, one_minus_beta1, nesterov, g, gb, m, s, first, checked):
        """Every run's loads first (all in flight together), then each run's update; `checked`: each run tested
        against numel."""
        for r in T.unroll(reps):
            if checked:
                if first + r * threads * vec < numel:
                    load(grad, momentum_buffer, g, gb, m, r, first + r * threads * vec)
            else:
                load(grad, momentum_buffer, g, gb, m, r, first + r * threads * vec)
        for r in T.unroll(reps):
            base = first + r * threads * vec
            if checked:
                if base < numel:
                    update(momentum_buffer, sinkhorn_input, beta1, one_minus_beta1, nesterov, g, m, s, r, base)
            else:
                update(momentum_buffer, sinkhorn_input, beta1, one_minus_beta1, nesterov, g, m, s, r, base)

    @T.prim_func
    def engram_sinkhorn_momentum(
        grad: T.Tensor[(numel,), grad_dtype],
        momentum_buffer: T.Tensor[(numel,), momentum_dtype],
        sinkhorn_input: T.Tensor[(numel,), T.float32],
        beta1: T.float32,
        one_minus_beta1: T.float32,
        nesterov: T.int32,
    ):
        with T.Kernel(T.ceildiv(numel, span), threads=threads) as block:
            entry()
            T.assume(numel % 8 == 0)
            g = T.alloc_local((reps, vec), T.float32)
            gb = T.alloc_local((reps, vec), grad_dtype)  # "c" / "p": grad's bytes as loaded
            m = T.alloc_local((reps, vec), T.float32)
            s = T.alloc_local((vec,), T.float32)
            first = block * span + T.get_thread_binding() * vec
            if "u" in letters:
                # uniform: the CTAs all of whose elements are below numel ((block + 1) * span wraps near 2**31)
                if block < numel // span:
                    runs(grad, momentum_buffer, sinkhorn_input, beta1, one_minus_beta1, nesterov, g, gb, m, s, first, False)
                else:
                    runs(grad, momentum_buffer, sinkhorn_input, beta1, one_minus_beta1, nesterov, g, gb, m, s, first, True)
            else:
                runs(grad, momentum_buffer, sinkhorn_input, beta1, one_minus_beta1, nesterov, g, gb, m, s, first, True)
            if "e" in letters:
                T.call_extern("int32", "tkaot_pdl_launch_dependents")

    return engram_sinkhorn_momentum
