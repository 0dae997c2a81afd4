"""Time shared-memory staging candidates for mhc_multilayer_recompute (mhc 4) beside the shipped kernel and TileKernels
(issue 16, round 10).

The bench row `mhc_multilayer_recompute 8192x4x7168 bf16, 4 layers` took 899.5 µs on the H200 against TileKernels' 825.4
(2026-12-03). Round 9 (tune_recomp9.py as of 615c48e) moved only the launch shape (blocks an SM, threads, the next
layer's output read ahead in registers, PDL): none faster. What TileKernels' kernel (tile_kernels/mhc/
multilayer_recompute_cuda.py) does besides its shape (64 threads per 512 hidden elements, 93 registers, 10 blocks an SM):
- the next layer's layer_output slice AND its pre/post/comb mixes go into double-buffered shared memory by cp.async
  (T.async_copy) at the top of layer l, before layer l's arithmetic and stores, and are waited for (ptx_wait_group)
  only at layer l + 1: one layer's compute and stores hide the next layer's load latency. Ours reads the layer's
  output and its mixes from global at the layer, after the previous layer's stores (their memory clobber keeps every
  read behind them), so each layer pays a full load latency before its first store;
- the mixes are in shared memory, read by every thread there (a broadcast); ours reads them per thread from global
  (24 scalar loads a thread a layer, L1 hits after the first warp);
- it makes all M new streams (a (M, h_blk) fp32 fragment) before storing any; ours makes and stores one stream at a
  time (tried as "all streams made together", 128 registers: slower; not repeated here);
- hidden and the layer counts are compiled in; a 1-D grid (token-major); no PDL; the last layer's pre read from global.
Candidates (the mhc_mult=4 variant each; the same products and sums in the same order as the shipped kernel, so the
outputs must be ctl's bytes, which the run checks; staged ones are built by staged_build below):
  ctl        the shipped kernel (its cubin must be prebuilt/sm90's: checked at build and run)
  mixblk     (b) the token's 24 mix values loaded once a block (24 threads) into shared memory, double-buffered, one
             barrier a layer (TileLang's own, placed before the reads)
  outasync   the next layer's output vector by cp.async into the thread's own 16 bytes of shared memory (double-buffered,
             no barrier: a thread reads only what it copied), mixes per thread as ctl
  async      (a) outasync plus the next layer's mixes by cp.async (6 threads, 16 bytes each; triple-buffered, so one
             barrier a layer suffices); one commit group a layer, cp.async.wait_group 1 before use
  async5     (a) at MIN_BLOCKS 5
  async7     (a) at MIN_BLOCKS 7 (the output vector no longer held in registers across the layer's loads)
  t64async   (c) (a) in 64-thread blocks, MIN_BLOCKS 10: TileKernels' shape and staging
  t64tk      (c) making all M new streams (32 fp32 a thread) before storing them back to back, as TileKernels does
  t64async12 (a) in 64-thread blocks at MIN_BLOCKS 12 (80 registers, as ctl)
As built here (sm90, nvcc 13.0; SASS read with cuobjdump): registers / dynamic shared memory / blocks an SM / spill
instructions: ctl 80 / 0 / 6 / 3 STL + 3 LDL (a 16-byte frame, inside the layer loop); mixblk 80 / 192 B / 6 / none;
outasync 80 / 4,096 B / 6 / none; async 80 / 4,384 B / 6 / none; async5 96 / 4,384 B / 5 / none; async7 72 / 4,384 B /
7 / 5 STL + 5 LDL; t64async and t64tk 96 / 2,336 B / 10 / none; t64async12 80 / 2,336 B / 12 / none. Every candidate
stores with six STG.E.128 (as ctl); async's copies are eight LDGSTS.E.BYPASS.128, its barrier one BAR.SYNC a layer.
Not a candidate: (a) with the 128-bit stores' asm lacking its memory clobber (Candidate(clobber=False)) compiles to
async's cubin byte for byte (sm90, nvcc 13.0): the clobber costs nothing once the reads are staged.
The `build` step prints each candidate's registers (from the cubin); shared memory is in the manifest's smem.

On a CPU with TileLang and nvcc (a few seconds a candidate):

    python -m bench.tuning.tune_recomp10 build --out tune-artifacts/recomp10 [--only async,t64async]

then on the GPU, from the tree's root with PYTHONPATH set to it (tile_kernels importable):

    python -m bench.tuning.tune_recomp10 --artifacts tune-artifacts/recomp10 --out DIR [--budget S]

The run, in a child process watched by this one (bench/tuning/watch.py: a candidate silent for STALL_S seconds is
killed and the run goes on without it; everything stops at --budget seconds, 140 by default):
1. checks each candidate through the op (tkaot.mhc.mhc_multilayer_recompute, the candidate's launcher put in the op's
   kernel table) at 1, 3, 127 and 4097 tokens, hidden 1536 (a half-empty block of 1,024 a token), 4 layers with 4 and
   with 3 post layers, then at those tokens and 8192 at the bench row's hidden 7168 and 4 post layers; outputs
   poisoned with NaN first: every byte against ctl's (and no NaN left), and ctl's against TileKernels' at hidden 7168
   (TileKernels compiles hidden and the layer counts in: one compile, the one the timing uses);
2. times (the bench shape: CUDA-graph replay over 2 rotating input sets of 3.3 GB each, bench.timing) each candidate
   and TileKernels twice, the second pass in the reverse order, the outputs' bytes checked again.
Prints each row as it is timed and a table last (candidate, µs (the passes' mean), both passes, ratio to TileKernels,
ratio to ctl, verdict); writes DIR/tune_recomp10.log.
"""

import argparse
import contextlib
import functools
import hashlib
import json
import math
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.tuning.watch import ROW, Log, child_start, run_child, started, with_reruns

ARTIFACTS = "tune-artifacts/recomp10"
KERNEL = "mhc_multilayer_recompute"
MODULE = "kernels_src.mhc.multilayer_recompute"
KEY = "mhc_mult=4"
MHC = 4
CONTROL = "ctl"


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    threads: int = 128
    min_blocks: int = 6
    out: str = "reg"  # the layer's output vector: "reg" (ctl: read into registers at the layer), "async" (the next
    # layer's, cp.async into the thread's own 16 bytes of shared memory while this layer computes)
    mixes: str = "thread"  # "thread" (ctl: every thread reads the token's mixes from global), "block" (24 threads
    # load them into shared memory once a block, a barrier, all read them there), "async" (6 threads cp.async the
    # next layer's 96 bytes of pre/post/comb into shared memory while this layer computes; a barrier a layer)
    together: bool = False  # all M new streams made (M * VEC fp32) before any is stored, as TileKernels does
    clobber: bool = True  # the 128-bit stores' asm keeps every memory access on its side (False: only its operands;
    # the staged reads are asm volatile (cp.async) or follow cp.async.wait_group, itself a memory clobber)
    artifacts: str = ""  # a launch-only candidate: another candidate's artifact set
    pdl: bool | None = None  # None: as the manifest says (the op's launch)
    note: str = ""

    @property
    def staged(self) -> bool:
        return self.out != "reg" or self.mixes != "thread" or self.together or not self.clobber


CANDIDATES = (
    Candidate(CONTROL, note="the shipped kernel (cubin = prebuilt/sm90's)"),
    Candidate("mixblk", mixes="block", note="(b) mixes loaded once a block into shared memory, a barrier a layer"),
    Candidate("outasync", out="async", note="the next layer's output vector by cp.async into the thread's shared slot"),
    Candidate("async", out="async", mixes="async", note="(a) next layer's output and mixes by cp.async, a group and a barrier a layer"),
    Candidate("async5", out="async", mixes="async", min_blocks=5, note="(a) at MIN_BLOCKS 5 (96 registers at most)"),
    Candidate("async7", out="async", mixes="async", min_blocks=7, note="(a) at MIN_BLOCKS 7 (72 registers at most)"),
    Candidate("t64async", threads=64, min_blocks=10, out="async", mixes="async", note="(c) (a), 64 threads, 10 blocks an SM (TK's)"),
    Candidate("t64tk", threads=64, min_blocks=10, out="async", mixes="async", together=True, note="(c), all streams made, then stored"),
    Candidate("t64async12", threads=64, min_blocks=12, out="async", mixes="async", note="(a), 64 threads, 12 blocks an SM (80 registers)"),
)  # fmt: skip
NAMES = tuple(c.name for c in CANDIDATES)


# ---- build (CPU)

# cp.async of 16 bytes global -> shared (both generic addresses, 16-byte aligned), its commit and waits, and a
# barrier as an int-returning call (T.call_extern's form)
ASYNC_SOURCE = """
__device__ __forceinline__ int tkaot_cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"((unsigned)__cvta_generic_to_shared(smem)), "l"(__cvta_generic_to_global(gmem)) : "memory");
    return 0;
}
__device__ __forceinline__ int tkaot_cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
    return 0;
}
__device__ __forceinline__ int tkaot_cp_async_wait1() {
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    return 0;
}
__device__ __forceinline__ int tkaot_cp_async_wait0() {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    return 0;
}
__device__ __forceinline__ int tkaot_barrier() {
    __syncthreads();
    return 0;
}
"""

# tkaot_store16 without the memory clobber (candidate clobber=False)
STORE16_NC_SOURCE = """
__device__ __forceinline__ int tkaot_store16_nc(void* dst, const void* src) {
    uint4 v = *(const uint4*)src;
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
                 :: "l"(__cvta_generic_to_global(dst)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
    return 0;
}
"""


def staged_build(c: Candidate, mhc_mult: int):
    """The shipped kernel with its layer output and/or mixes staged in shared memory (candidate c): the same products
    and sums in the same order as kernels_src.mhc.multilayer_recompute, so the same bytes. The layer loop and its
    barriers run in every thread; a thread past the hidden size skips the work, not the barriers."""
    import tilelang.language as T

    from kernels_src.mhc.multilayer_recompute import STORE16_SOURCE, VEC
    from kernels_src.pdl import PDL_SOURCE, pdl_entry

    m, threads, min_blocks = mhc_mult, c.threads, c.min_blocks
    out_async, mix_async, mix_block = c.out == "async", c.mixes == "async", c.mixes == "block"
    nbuf = 3 if mix_async else 2  # async: buffer l+1 is written in layer l, last read in l-2 (a barrier between)
    rows = 2 + m  # pre, post, comb[i][0..m) a row each (m fp32 = 16 bytes at m = 4)
    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    table_size = T.dynamic("table_size")

    @T.macro
    def store16(dst, di, src, si):
        T.call_extern("int32", "tkaot_store16" if c.clobber else "tkaot_store16_nc", T.address_of(dst[di]), T.address_of(src[si]))

    @T.macro
    def cp16(smem, si, gmem, gi):
        T.call_extern("int32", "tkaot_cp_async16", T.address_of(smem[si]), T.address_of(gmem[gi]))

    @T.prim_func
    def mhc_multilayer_recompute(
        initial_residual: T.Tensor[(num_tokens, m, hidden), T.bfloat16],
        pointer_table: T.Tensor[(table_size,), T.ptr],
        num_layers: T.int32,
        num_post: T.int32,
    ):
        with T.Kernel(T.ceildiv(hidden, VEC * threads), num_tokens, threads=threads) as (block, t):
            T.import_source(STORE16_SOURCE + PDL_SOURCE + ASYNC_SOURCE + STORE16_NC_SOURCE)
            pdl_entry()
            T.assume(hidden % VEC == 0)
            if min_blocks:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            h = (block * threads + tx) * VEC
            res = T.alloc_local((m, VEC), T.float32)
            mixed = T.alloc_local((m if c.together else 1, VEC), T.float32)
            loaded = T.alloc_local((m, VEC), T.bfloat16)
            lo = T.alloc_local((VEC,), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            li = T.alloc_local((VEC,), T.bfloat16)
            weights = T.alloc_local((m,), T.float32)
            out_sm = T.alloc_shared((2, threads, VEC), T.bfloat16)
            mix_sm = T.alloc_shared((nbuf, rows, m), T.float32)
            if h < hidden:
                for i in T.unroll(m):
                    for k in T.vectorized(VEC):
                        loaded[i, k] = initial_residual[t, i, h + k]
                for i in T.unroll(m):
                    for k in T.unroll(VEC):
                        res[i, k] = T.cast(loaded[i, k], T.float32)
            if (out_async or mix_async) and num_post > 0:  # layer 0's, one commit group
                if out_async and h < hidden:
                    first_output = T.make_tensor(pointer_table[2 * num_layers + num_post], (num_tokens, hidden), T.bfloat16)
                    cp16(out_sm, (0, tx, 0), first_output, (t, h))
                if mix_async:
                    pre0 = T.make_tensor(pointer_table[0], (num_tokens, m), T.float32)
                    post0 = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post], (num_tokens, m), T.float32)
                    comb0 = T.make_tensor(pointer_table[2 * num_layers + 3 * num_post], (num_tokens, m, m), T.float32)
                    if tx == 0:
                        cp16(mix_sm, (0, 0, 0), pre0, (t, 0))
                    elif tx == 1:
                        cp16(mix_sm, (0, 1, 0), post0, (t, 0))
                    elif tx < rows:
                        cp16(mix_sm, (0, tx, 0), comb0, (t, tx - 2, 0))
                T.call_extern("int32", "tkaot_cp_async_commit")
            for layer in T.serial(num_post):
                output = T.make_tensor(pointer_table[2 * num_layers + num_post + layer], (num_tokens, hidden), T.bfloat16)
                post = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post + layer], (num_tokens, m), T.float32)
                comb = T.make_tensor(pointer_table[2 * num_layers + 3 * num_post + layer], (num_tokens, m, m), T.float32)
                residual = T.make_tensor(pointer_table[2 * num_layers + layer], (num_tokens, m, hidden), T.bfloat16)
                pre = T.make_tensor(pointer_table[layer], (num_tokens, m), T.float32)
                layer_input = T.make_tensor(pointer_table[num_layers + layer], (num_tokens, hidden), T.bfloat16)
                buf = layer % nbuf
                if out_async or mix_async:
                    if layer + 1 < num_post:  # the next layer's, one commit group (empty in the last layer)
                        if out_async and h < hidden:
                            next_output = T.make_tensor(
                                pointer_table[2 * num_layers + num_post + layer + 1], (num_tokens, hidden), T.bfloat16
                            )
                            cp16(out_sm, ((layer + 1) % 2, tx, 0), next_output, (t, h))
                        if mix_async:
                            next_pre = T.make_tensor(pointer_table[layer + 1], (num_tokens, m), T.float32)
                            next_post = T.make_tensor(pointer_table[2 * num_layers + 2 * num_post + layer + 1], (num_tokens, m), T.float32)
                            next_comb = T.make_tensor(
                                pointer_table[2 * num_layers + 3 * num_post + layer + 1], (num_tokens, m, m), T.float32
                            )
                            nb = (layer + 1) % nbuf
                            if tx == 0:
                                cp16(mix_sm, (nb, 0, 0), next_pre, (t, 0))
                            elif tx == 1:
                                cp16(mix_sm, (nb, 1, 0), next_post, (t, 0))
                            elif tx < rows:
                                cp16(mix_sm, (nb, tx, 0), next_comb, (t, tx - 2, 0))
                    T.call_extern("int32", "tkaot_cp_async_commit")
                    T.call_extern("int32", "tkaot_cp_async_wait1")
                if mix_block:  # buffer l % 2 was last read in layer l - 2: layer l - 1's barrier lies between
                    if tx < m:
                        mix_sm[buf, 0, tx] = pre[t, tx]
                    elif tx < 2 * m:
                        mix_sm[buf, 1, tx - m] = post[t, tx - m]
                    elif tx < (2 + m) * m:
                        mix_sm[buf, 2 + (tx - 2 * m) // m, (tx - 2 * m) % m] = comb[t, (tx - 2 * m) // m, (tx - 2 * m) % m]
                if mix_async:  # (block: TileLang places its own __syncthreads before the reads, outside the guard)
                    T.call_extern("int32", "tkaot_barrier")
                if h < hidden:
                    if out_async:
                        for k in T.vectorized(VEC):
                            lo[k] = out_sm[layer % 2, tx, k]
                    else:
                        for k in T.vectorized(VEC):
                            lo[k] = output[t, h + k]
                    for i in T.unroll(m):
                        if mix_block or mix_async:
                            weights[i] = mix_sm[buf, 0, i]
                        else:
                            weights[i] = pre[t, i]
                    for k in T.unroll(VEC):
                        acc[k] = T.float32(0)
                    for i in T.unroll(m):
                        for k in T.unroll(VEC):
                            acc[k] = acc[k] + weights[i] * res[i, k]
                    for k in T.unroll(VEC):
                        li[k] = T.cast(acc[k], T.bfloat16)
                    store16(layer_input, (t, h), li, (0,))
                    for o in T.unroll(m):
                        r = o if c.together else 0  # mixed's row for stream o
                        if mix_block or mix_async:
                            for k in T.unroll(VEC):
                                mixed[r, k] = mix_sm[buf, 1, o] * T.cast(lo[k], T.float32)
                            for i in T.unroll(m):
                                for k in T.unroll(VEC):
                                    mixed[r, k] = mixed[r, k] + mix_sm[buf, 2 + i, o] * res[i, k]
                        else:
                            for k in T.unroll(VEC):
                                mixed[r, k] = post[t, o] * T.cast(lo[k], T.float32)
                            for i in T.unroll(m):
                                for k in T.unroll(VEC):
                                    mixed[r, k] = mixed[r, k] + comb[t, i, o] * res[i, k]
                        for k in T.unroll(VEC):
                            loaded[o, k] = T.cast(mixed[r, k], T.bfloat16)
                        if not c.together:
                            store16(residual, (t, o, h), loaded, (o, 0))
                    if c.together:
                        for o in T.unroll(m):
                            store16(residual, (t, o, h), loaded, (o, 0))
                    for o in T.unroll(m):
                        for k in T.unroll(VEC):
                            res[o, k] = T.cast(loaded[o, k], T.float32)
            if num_layers > num_post and h < hidden:
                last_pre = T.make_tensor(pointer_table[num_post], (num_tokens, m), T.float32)
                last_input = T.make_tensor(pointer_table[num_layers + num_post], (num_tokens, hidden), T.bfloat16)
                for i in T.unroll(m):
                    weights[i] = last_pre[t, i]
                for k in T.unroll(VEC):
                    acc[k] = T.float32(0)
                for i in T.unroll(m):
                    for k in T.unroll(VEC):
                        acc[k] = acc[k] + weights[i] * res[i, k]
                for k in T.unroll(VEC):
                    li[k] = T.cast(acc[k], T.bfloat16)
                store16(last_input, (t, h), li, (0,))

    return mhc_multilayer_recompute


@contextlib.contextmanager
def _patched(c: Candidate):
    """kernels_src.mhc.multilayer_recompute building candidate c."""
    import importlib

    module = importlib.import_module(MODULE)
    saved = {"build": module.build, "THREADS": module.THREADS}
    shipped = module.build
    try:
        module.THREADS = c.threads
        if c.staged:
            module.build = lambda mhc_mult, **kw: staged_build(c, mhc_mult)
        else:
            module.build = lambda mhc_mult, **kw: shipped(mhc_mult, min_blocks=c.min_blocks)
        yield
    finally:
        for a, v in saved.items():
            setattr(module, a, v)


def registers(cubin: bytes) -> list[int]:
    """The registers a thread of each kernel in a cubin: the EIATTR_REGCOUNT (0x2f) records of its .nv.info section
    (ELF64; a record is format, attribute, u16 size and a payload of symbol index and count)."""
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx][4]
    out = []
    for name_off, _, _, _, offset, size, _, _, _, _ in sections:
        if cubin[strtab + name_off : cubin.index(b"\0", strtab + name_off)] != b".nv.info":
            continue
        at = offset
        while at < offset + size:
            fmt, attr = cubin[at], cubin[at + 1]
            length = struct.unpack_from("<H", cubin, at + 2)[0] if fmt == 4 else 0
            if attr == 0x2F and fmt == 4:
                out.append(struct.unpack_from("<I", cubin, at + 8)[0])
            at += 4 + length
    return out


def _ctl_identical(artifacts: Path, root: Path) -> str:
    """Whether ctl's cubin is prebuilt/sm90's (the manifest's hash and the file's bytes)."""
    shipped = {
        e["key"]: e["cubin"] for e in json.loads((root / "prebuilt/sm90/manifest.json").read_text())["variants"] if e["kernel"] == KERNEL
    }
    mine = {e["key"]: e["cubin"] for e in json.loads((artifacts / CONTROL / "manifest.json").read_text())["variants"]}
    digest = shipped.get(KEY)
    path = artifacts / CONTROL / "cubins" / f"{mine.get(KEY)}.cubin"
    data = path.read_bytes() if path.is_file() else b""
    prebuilt = root / "prebuilt/sm90/cubins" / f"{digest}.cubin"
    same = (
        mine.get(KEY) == digest and hashlib.sha256(data).hexdigest() == digest and (not prebuilt.is_file() or prebuilt.read_bytes() == data)
    )
    return f"ctl cubin ({KEY}) {'identical to' if same else 'DIFFERS from'} prebuilt/sm90's ({digest[:12] if digest else 'not in it'})"


def _shape(c: Candidate, entry: dict, cubin: bytes, tokens: int = 8192, hidden: int = 7168, sms: int = 132) -> str:
    """Registers, shared memory, blocks an SM (registers, threads and shared memory: 228 KB an SM, 1 KB of it reserved a
    block, a block's own up to 1 KB aligned), grid and waves at the bench shape."""
    regs = max(registers(cubin), default=0)
    threads = entry["launch"]["block"][0]
    warps = threads // 32
    per_warp = -(-regs * 32 // 256) * 256  # allocated in 256-register units a warp
    smem = entry["launch"].get("smem", 0)
    per_sm = min(32, 64 // warps, 65536 // (per_warp * warps)) if regs else 0
    if smem:
        per_sm = min(per_sm, 228 * 1024 // (-(-smem // 1024) * 1024 + 1024))
    blocks = -(-hidden // (8 * threads)) * tokens
    waves = blocks / (per_sm * sms) if per_sm else math.nan
    return f"{regs} registers, {smem} B shared, {per_sm} blocks ({per_sm * warps} warps) an SM, {blocks} blocks, {waves:.2f} waves"


def build(out: Path, only: tuple[str, ...] = ()) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    # A cache of each candidate's own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-recomp10-cache-") as cache:
        for c in CANDIDATES:
            if c.artifacts or (only and c.name not in only):
                continue
            t = time.perf_counter()
            try:
                with _patched(c):
                    build_variants(
                        [Variant.make(KERNEL, {"mhc_mult": MHC})], out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name)
                    )
            except Exception as exc:  # a candidate that fails to build is reported, not fatal
                print(f"{c.name:8s} NOT BUILT: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
                continue
            entry = next(e for e in json.loads((out / c.name / "manifest.json").read_text())["variants"] if e["key"] == KEY)
            cubin = (out / c.name / "cubins" / f"{entry['cubin']}.cubin").read_bytes()
            print(f"{c.name:8s} built in {time.perf_counter() - t:5.1f} s: block {entry['launch']['block'][0]}, "
                  f"grid {entry['launch']['grid']}, {_shape(c, entry, cubin)}  ({c.note})", flush=True)  # fmt: skip
    if (out / CONTROL / "manifest.json").is_file():
        print(_ctl_identical(out, Path.cwd()), flush=True)
    print(f"{out}: {time.perf_counter() - t0:.0f} s", flush=True)


# ---- check and time (GPU), in the child

CHECK_TOKENS = (1, 3, 127, 4097)
CHECK_HIDDEN = 1536
LAYERS = 4
TOKENS, HIDDEN = 8192, 7168  # the bench row
SETS = 2  # 3.3 GB a set: far beyond the 50 MB L2


def _launchers(artifacts: Path, say) -> dict:
    """{name: Kernel} for every candidate whose set loads."""
    from tkaot._kernel import Kernel

    kernels = {}
    for c in CANDIDATES:
        set_dir = artifacts / (c.artifacts or c.name)
        try:
            e = next(e for e in json.loads((set_dir / "manifest.json").read_text())["variants"] if e["key"] == KEY)
            kernels[c.name] = Kernel(
                e["kernel"], e["key"], e["launch"], set_dir / "cubins" / f"{e['cubin']}.cubin", e["cubin"], set_dir.name
            )
        except Exception as exc:
            say(f"{c.name}: not loaded ({type(exc).__name__}: {exc})")
    return kernels


@contextlib.contextmanager
def _serving(launcher):
    """The op's launcher table with `launcher` in it for mhc 4 on the current device."""
    import torch

    from tkaot._mhc import recompute as op

    table = op._RECOMPUTE
    key = (torch.cuda.current_device(), MHC)
    saved = table.cache.get(key)
    table.cache[key] = launcher
    try:
        yield
    finally:
        if saved is None:
            table.cache.pop(key, None)
        else:
            table.cache[key] = saved


def _inputs(tokens: int, hidden: int, num_post: int, seed: int) -> dict:
    """The bench case's inputs (bench/cases/mhc_fused.py), outputs NaN."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def f32(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    def bf16(*shape):
        return f32(*shape).bfloat16()

    def nan(*shape):
        return torch.full(shape, math.nan, dtype=torch.bfloat16, device="cuda")

    return {
        "res": bf16(tokens, MHC, hidden), "pre": [f32(tokens, MHC, 1).sigmoid() for _ in range(LAYERS)],
        "out": [bf16(tokens, hidden) for _ in range(num_post)], "post": [f32(tokens, MHC, 1).sigmoid() for _ in range(num_post)],
        "comb": [f32(tokens, MHC, MHC).softmax(-1) for _ in range(num_post)], "input": [nan(tokens, hidden) for _ in range(LAYERS)],
        "residual": [nan(tokens, MHC, hidden) for _ in range(num_post)],
    }  # fmt: skip


def _call(lib, a) -> None:
    lib.mhc.mhc_multilayer_recompute(a["res"], a["pre"], a["out"], a["post"], a["comb"], a["input"], a["residual"])


def _outputs(a) -> list:
    return [t.clone() for t in a["input"] + a["residual"]]


def _poison(a) -> None:
    for t in a["input"] + a["residual"]:
        t.fill_(math.nan)


def _same(xs, ys) -> bool:
    import torch

    return len(xs) == len(ys) and all(
        x.shape == y.shape and torch.equal(x.contiguous().view(torch.int16), y.contiguous().view(torch.int16)) for x, y in zip(xs, ys)
    )


class Run:
    """The child's state: the candidates' launchers and TileKernels (if it imports)."""

    def __init__(self, artifacts: Path, skip: tuple, say):
        self.say = say
        pdl = {c.name: c.pdl for c in CANDIDATES}
        from tkaot._mhc import recompute as op

        self.kernels = {
            name: k.bind(op._RECOMPUTE.args, pdl=pdl[name]) for name, k in _launchers(artifacts, say).items() if name not in skip
        }
        tk = None
        if "TK" in skip:
            say("TileKernels skipped (it hung before): no TK columns")
        else:
            try:
                import tile_kernels as tk
            except ImportError as exc:
                say(f"TileKernels not importable ({exc}): no TK columns")
        self.tk = tk

    def ours(self, name: str, a: dict) -> list:
        import torch

        import tkaot

        _poison(a)
        with _serving(self.kernels[name]):
            _call(tkaot, a)
        out = _outputs(a)
        torch.cuda.synchronize()
        return out

    def theirs(self, a: dict) -> list:
        import torch

        _poison(a)
        _call(self.tk, a)
        out = _outputs(a)
        torch.cuda.synchronize()
        return out


def check(run: Run) -> None:
    """Phase 1: every candidate's bytes against ctl's, ctl's against TileKernels' (at hidden 7168)."""
    say, bad, done = run.say, 0, 0
    # hidden 1536 against ctl only; against TileKernels at the bench row's hidden and layers (its one compile)
    cases = [(t, CHECK_HIDDEN, p) for p in (LAYERS, LAYERS - 1) for t in CHECK_TOKENS]
    cases += [(t, HIDDEN, LAYERS) for t in CHECK_TOKENS] + [(TOKENS, HIDDEN, LAYERS)]
    failed = dict.fromkeys(run.kernels, 0)
    for tokens, hidden, num_post in cases:
        what = f"{tokens}x{MHC}x{hidden}, {num_post} post"
        a = _inputs(tokens, hidden, num_post, seed=tokens * 31 + num_post)
        outs = {}
        for name in run.kernels:  # each announced: a candidate that hangs or faults is named, and rerun without
            started(name, f"check: {what}")
            outs[name] = run.ours(name, a)
        want = outs.get(CONTROL)
        for name, got in outs.items():
            done += 1
            if want is None:
                break
            if name != CONTROL and not _same(got, want):
                bad += 1
                failed[name] += 1
                say(f"check {name} {what}: DIFFERS from ctl")
            if any(t.isnan().any() for t in got):
                bad += 1
                failed[name] += 1
                say(f"check {name} {what}: NaN left (an element not written)")
        if run.tk is not None and want is not None and hidden == HIDDEN:
            started("TK", what)
            theirs = run.theirs(a)
            done += 1
            if not _same(want, theirs):
                bad += 1
                say(f"check ctl {what}: DIFFERS from TileKernels")
        del a, outs
    for name, n in failed.items():
        say(f"check {name:10s} {'every output = ctl' if not n else f'{n} of {len(cases)} cases WRONG'} ({len(cases)} cases)")
    say(f"checks: {done} outputs, {bad} mismatches (candidates against ctl, ctl against TileKernels)")


def measure(run: Run, emit) -> None:
    """Phase 2: each candidate and TileKernels timed twice at the bench shape, the second pass reversed; emit a row
    (name, shape, µs, passes, verdict) for each."""
    import torch

    import tkaot
    from bench.timing import device_us

    shape = f"{TOKENS}x{MHC}x{HIDDEN}, {LAYERS} layers"
    inputs = [_inputs(TOKENS, HIDDEN, LAYERS, seed=1000 + s) for s in range(SETS)]
    calls = {}
    for name, launcher in run.kernels.items():

        def call(a, launcher=launcher):
            with _serving(launcher):
                _call(tkaot, a)

        calls[name] = call
    if run.tk is not None:
        calls["TK"] = lambda a: _call(run.tk, a)
    outs = {}
    for label, call in calls.items():
        started(label, shape)
        _poison(inputs[0])
        call(inputs[0])
        outs[label] = _outputs(inputs[0])
        torch.cuda.synchronize()
    times: dict = {label: [] for label in calls}
    for order in (list(calls), list(reversed(calls))):
        for label in order:
            started(label, shape)
            times[label].append(device_us(calls[label], inputs)[0])
    for label, (a, b) in times.items():
        verdicts = []
        if CONTROL in outs and label != CONTROL:
            verdicts.append("=ctl" if _same(outs[label], outs[CONTROL]) else "DIFFERS from ctl")
        if "TK" in outs and label != "TK":
            verdicts.append("=TK" if _same(outs[label], outs["TK"]) else "DIFFERS from TK")
        emit((label, shape, (a + b) / 2, f"{a:.1f}/{b:.1f}", " ".join(verdicts) or "-"))


def _part(argv) -> None:
    """Child: the checks, then the timed rows, each call announced (START name|what) first, each row as ROW json."""
    _, artifacts, skip = child_start(argv)
    say = functools.partial(print, flush=True)
    run = Run(artifacts, skip, say)
    if CONTROL in run.kernels:
        say(_ctl_identical(artifacts, Path.cwd()))
    if "check" not in skip:
        check(run)
    measure(run, lambda row: print(ROW + json.dumps(row), flush=True))


# ---- the run (GPU): the phases in a watched child

TOTAL_S = 140  # the whole run's budget (--budget S)
STALL_S = 20  # a candidate silent this long is taken as hung (TileKernels' first calls compile: TK_STALL_S)
TK_STALL_S = 90


def _line(row, base: dict) -> str:
    name, shape, us, passes, verdict = row
    tk, ctl = base.get("TK"), base.get(CONTROL)
    to_tk = f"{us / tk:6.3f}" if tk and not math.isnan(us) else f"{'-':>6s}"
    to_ctl = f"{us / ctl:6.3f}" if ctl and not math.isnan(us) else f"{'-':>6s}"
    return f"{name:10s} {shape:24s} {us:8.1f} {passes:>13s} {to_tk} {to_ctl}  {verdict}"


def time_candidates(artifacts: Path, out: Path, total_s: float = TOTAL_S) -> None:
    start = time.perf_counter()
    deadline = start + total_s
    out.mkdir(parents=True, exist_ok=True)
    say = Log()
    rows: dict = {}
    say(
        f"tune_recomp10: artifacts {artifacts}, budget {total_s:.0f} s; candidates: "
        + ", ".join(f"{c.name} ({c.note})" for c in CANDIDATES)
    )

    def one(skip: list[str]) -> str | None:
        def on_row(row) -> None:
            rows.setdefault(row[0], row)  # a rerun's repeat of a row keeps the first
            say(f"{row[0]:10s} {row[1]:24s} {row[2]:8.1f} {row[3]:>13s}  {row[4]}")

        stop = run_child("bench.tuning.tune_recomp10", "all", artifacts, skip, deadline, say, on_row,
                         stall_s=lambda name: TK_STALL_S if name in ("load", "TK") else STALL_S,
                         on_start=lambda name, what: print(f"  ({name} at {what or '-'})", flush=True))  # fmt: skip
        if stop is None:
            return None
        name, what, how = stop
        say(f"{how} in {name} at {what or '-'}")
        return name if name in NAMES or name in ("check", "TK") else None  # rerun without it

    with_reruns("tune_recomp10", deadline, say, one)  # a rerun checks and times what is left
    base = {name: row[2] for name, row in rows.items()}
    say(f"\n{'candidate':10s} {'shape':24s} {'µs':>8s} {'passes':>13s} {'/TK':>6s} {'/ctl':>6s}  outputs (bench shape)")
    for row in rows.values():
        say(_line(row, base))
    say(f"{time.perf_counter() - start:.0f} s")
    (out / "tune_recomp10.log").write_text("\n".join(say.lines) + "\n")


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["part"]:
        _part(argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("time", "build"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(ARTIFACTS), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the sets go; time: the log's directory")
    parser.add_argument("--only", default="", help="build: these candidates (comma-separated) only")
    parser.add_argument("--budget", type=float, default=TOTAL_S, help="time: the whole run's seconds")
    args = parser.parse_args(argv)
    if args.command == "build":
        args.out.mkdir(parents=True, exist_ok=True)
        build(args.out, tuple(n for n in args.only.split(",") if n))
        return
    import torch

    if not torch.cuda.is_available():
        print("tune_recomp10: no GPU here; nothing timed (the build runs on a CPU: `build --out DIR`)")
        return
    time_candidates(args.artifacts, args.out, args.budget)


if __name__ == "__main__":
    main()
