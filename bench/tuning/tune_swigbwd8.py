"""Time candidates for swiglu_backward's fp32-x variants (swiglu_backward_and_per_token_cast, fmt bf16 / fp32) beside TileKernels.

The bench row `swiglu_backward_and_per_token_cast | 8192x8192 fp32 x, bf16 grad -> bf16` ran at 1.05x TileKernels'
time (tenth session: 120.57 µs against 114.42) while the bf16-x rows are at or under it. It is served by the variant
x_dtype=float32,grad_dtype=bfloat16,fmt=bf16,group=0,sf=none (kernels_src/fused/swiglu_backward.py). Its lowered CUDA
and SASS: a warp a row, 4 rows a block (128 threads, 48 registers: 10 blocks an SM, so 2048 blocks at 8192 rows run
1.55 waves), each lane 4 columns of a 128-column chunk (vector_elems: 16 bytes of the widest operand, here x), so a
chunk is 2 LDG.128 (gate, up) + 1 LDG.64 (dy) a lane, then the math, then 2 STG.64, and the next chunk's loads wait
for this chunk's stores (a runtime-width loop, nothing hoisted): 40 bytes a lane in flight, and none during the math
and stores. TileKernels (tile_kernels/quant/swiglu_backward_cuda.py, the same call): a block of 64 threads a row,
hidden a compile-time constant, 512 columns an iteration, so a thread loads 2 x (float4 gate, float4 up, 8-byte dy)
striped 256 columns apart (80 bytes in flight a thread, every access coalesced), stores 2 x 2 8-byte words, and
prefetches the next 512 columns of x and dy into L2 (prefetch.global.L2) before the math; 56 registers, 18 blocks
an SM, 8192 blocks (3.4 waves). Same store widths as ours; the difference is bytes in flight a thread, the L2
prefetch, and the wave tail.

Candidates (only the fp32-x variants are built: the bf16-x and E4M3 variants keep the shipped cubins):
  ctl        the shipped kernel, unpatched; its cubins must be the bytes of prebuilt/sm90's (checked at build and run)
  v8         the shipped body with 8 columns a lane (vector_elems patched: 4 LDG.128 of x, LDG.128 dy, 2 STG.128)
  v8w2       v8 at 2 rows a block (64 threads: a finer grid, 4096 blocks)
  s2         this file's body: 2 chunks of 128 columns a lane-iteration, striped (4 columns a lane in each, as now),
             all loads of both chunks before the math: 80 bytes in flight a lane, same accesses as ctl
  s2p        s2 plus prefetch.global.L2 of the next 256 columns of gate, up and dy before the math (TileKernels' hint)
  s2p2       s2 with the prefetch two iterations ahead
  s4         4 chunks an iteration (160 bytes in flight a lane)
  s2pw2      s2p at 2 rows a block
  s1d, s2d   ctl's chunks (s2's pairs), the next iteration's loads issued into a second set of registers before this
             iteration's math (a software pipeline: loads always in flight, more registers)
  s2dm8,s4m8 s2d and s4 (86 and 88 registers: 5 blocks an SM) held to 64 registers, 8 blocks an SM
Registers (the bench variant's cubin, as built here): ctl 48 (10 blocks an SM), v8 / v8w2 61, s2 64, s2p / s2p2 62, s4 88,
s2pw2 79, s1d 63, s2d 86, s2dm8 64 with a few spills to local memory, s4m8 64 with many (40 STL): those two are there
to show whether occupancy or bytes in flight a lane matters more. The prefetch candidates' loads are plain LDG, not
LDG.CONSTANT (the prefetch's asm clobbers memory), as in TileKernels' kernel.
Columns a lane owns and the order it adds weight_grad are ctl's in the s* bodies (so every output is ctl's bytes);
v8's lanes own other columns, so its weight_grad may differ from ctl's in the last bits (x_grad and act_out may not).

On a CPU with TileLang and nvcc (about 11 s a variant, 4 variants a candidate):

    python -m bench.tuning.tune_swigbwd8 build --out tune-artifacts/swigbwd8 [--only s2,s2p]

then on the GPU, from the tree's root with PYTHONPATH set to it (tile_kernels importable):

    python -m bench.tuning.tune_swigbwd8 --artifacts tune-artifacts/swigbwd8 --out DIR

Checks before timing, each candidate through the op (tkaot.quant.swiglu_backward_and_per_token_cast, the candidate's
launcher put in the op's kernel table): at 1, 3, 127, 4097 and 8192 tokens and hidden 4096, 2048 and 1088 (an odd
number of 64-column halves), fp32 x with a bf16 grad to bf16 (plus fp32 grad / fp32 output at 127 tokens), plain and
with weights, routed scaling, clamp, recompute and an expert layout: every output's bytes against ctl's (the shipped
kernel) and against the torch reference (tkaot.reference), and on the plain bf16 call at 8192 tokens against
TileKernels'. Then each candidate is timed by CUDA-graph replay over rotating input sets larger than L2
(bench.timing.device_us, median) at 8192 tokens, hidden 4096 and 2048, beside TileKernels on the same inputs. Prints
each row as it goes and a table last (candidate, shape, µs, TK µs, ratio, bytes = ctl, bytes = TK); writes
DIR/tune_swigbwd8.log.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ARTIFACTS = "tune-artifacts/swigbwd8"
KERNEL = "swiglu_backward"
MODULE = "kernels_src.fused.swiglu_backward"
BENCH_KEY = "x_dtype=float32,grad_dtype=bfloat16,fmt=bf16,group=0,sf=none"
# The fp32-x variants of the default set (build_tools/shapesets/fused.toml): the only ones a candidate replaces
FP32_X = [(g, f) for g in ("bfloat16", "float32") for f in ("bf16", "fp32")]


@dataclass(frozen=True)
class Candidate:
    name: str  # also its artifact set's directory
    body: str  # "shipped" (kernels_src/fused/swiglu_backward.py, patched values) or "striped" (this file's body)
    vec: int  # columns a lane owns in a chunk of 32 * vec
    unroll: int  # chunks an iteration (striped only)
    prefetch: int  # iterations ahead the L2 prefetch reaches (0: none; striped only)
    warps: int  # rows a block
    note: str
    pipeline: bool = False  # striped only: the next iteration's loads issued before this one's math (registers)
    min_blocks: int = 0  # striped only: blocks an SM the registers must allow (0: the compiler's choice)


CANDIDATES = (
    Candidate("ctl", "shipped", 4, 1, 0, 4, "the shipped kernel (cubins = prebuilt/sm90's)"),
    Candidate("v8", "shipped", 8, 1, 0, 4, "shipped body, 8 columns a lane: 4 LDG.128 x, LDG.128 dy, 2 STG.128"),
    Candidate("v8w2", "shipped", 8, 1, 0, 2, "v8 at 2 rows a block"),
    Candidate("s2", "striped", 4, 2, 0, 4, "2 chunks an iteration, striped, loads first: 80 B in flight a lane"),
    Candidate("s2p", "striped", 4, 2, 1, 4, "s2 + L2 prefetch of the next iteration's x and dy"),
    Candidate("s2p2", "striped", 4, 2, 2, 4, "s2 + L2 prefetch two iterations ahead"),
    Candidate("s4", "striped", 4, 4, 0, 4, "4 chunks an iteration: 160 B in flight a lane"),
    Candidate("s2pw2", "striped", 4, 2, 1, 2, "s2p at 2 rows a block"),
    Candidate("s1d", "striped", 4, 1, 0, 4, "ctl's chunks, the next chunk's loads before this one's math", pipeline=True),
    Candidate("s2d", "striped", 4, 2, 0, 4, "s2, the next iteration's loads before this one's math", pipeline=True),
    Candidate("s2dm8", "striped", 4, 2, 0, 4, "s2d capped at 64 registers (8 blocks an SM)", pipeline=True, min_blocks=8),
    Candidate("s4m8", "striped", 4, 4, 0, 4, "s4 capped at 64 registers (8 blocks an SM)", min_blocks=8),
)  # fmt: skip


# ---- the striped body (a candidate; fmt bf16 / fp32 only)

PREFETCH_SOURCE = """
__device__ __forceinline__ int tkaot_tune_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(__cvta_generic_to_global(p)) : "memory");
    return 0;
}
"""


def striped_build(c: Candidate, x_dtype: str, grad_dtype: str, fmt: str):
    """shipped build's plain path (no E4M3 cast), `c.unroll` chunks of 32 * c.vec columns an iteration: lane i owns
    columns [i * vec, (i + 1) * vec) of each chunk, as the shipped kernel does, and loads every chunk of the iteration
    before its math; with c.prefetch, the lines of the iteration c.prefetch ahead are prefetched into L2 first."""
    import tilelang.language as T

    from kernels_src.fused import swiglu_args
    from kernels_src.fused import swiglu_backward as sb
    from kernels_src.fused.swiglu_math import expert_search
    from kernels_src.pdl import PDL_SOURCE, pdl_entry

    if fmt == "e4m3" or x_dtype == "e4m3":
        raise ValueError("the striped body has no E4M3 path")
    vec, unroll, ahead, warps, pipeline = c.vec, c.unroll, c.prefetch, c.warps, c.pipeline
    chunk = 32 * vec
    span = unroll * chunk
    x_t, out_t = sb._DTYPES[x_dtype], sb._OUT[fmt]
    x_line, g_line = 128 // sb._BYTES[x_dtype], 128 // sb._BYTES[grad_dtype]  # elements a 128-byte line
    x_lines, g_lines = span // x_line, span // g_line  # lines an iteration reads of gate (and of up), of dy
    n = unroll * vec

    dims = swiglu_args.backward_dims()
    num_rows, hidden, num_experts = dims.num_rows, dims.hidden, dims.num_experts

    @T.macro
    def load(x, act_x_grad, row, lane, it, gate_buf, up_buf, dy_buf):
        """Iteration it's gate, up and dy columns of the lane's row (nothing past hidden)."""
        for k in T.unroll(unroll):
            col = it * span + k * chunk + lane * vec
            if col < hidden:
                for j in T.vectorized(vec):
                    gate_buf[k * vec + j] = x[row, col + j]
                for j in T.vectorized(vec):
                    up_buf[k * vec + j] = x[row, hidden + col + j]
                for j in T.vectorized(vec):
                    dy_buf[k * vec + j] = act_x_grad[row, col + j]

    @T.macro
    def body(
        x, x_sf, act_x_grad, topk_weights, psum_num_tokens_per_expert, x_grad, x_grad_fp8, x_grad_sf, weight_grad, act_out, moe, recompute
    ):
        with T.Kernel(T.ceildiv(num_rows, warps), threads=warps * 32) as block:
            T.import_source(sb.SILU_FMA + PDL_SOURCE + (PREFETCH_SOURCE if ahead else ""))
            if c.min_blocks:
                T.annotate_min_blocks_per_sm(c.min_blocks)
            pdl_entry()
            T.assume(hidden % 64 == 0)
            tid = T.get_thread_binding()
            lane = tid % 32
            row = block * warps + tid // 32
            gate_in = T.alloc_local((n,), x_t)
            up_in = T.alloc_local((n,), x_t)
            dy_in = T.alloc_local((n,), grad_dtype)
            gate_next = T.alloc_local((n,), x_t)  # the next iteration's loads (pipeline only)
            up_next = T.alloc_local((n,), x_t)
            dy_next = T.alloc_local((n,), grad_dtype)
            xg_out = T.alloc_local((n,), out_t)
            yg_out = T.alloc_local((n,), out_t)
            act_res = T.alloc_local((n,), out_t)
            acc = T.alloc_var(T.float32)
            w = T.alloc_var(T.float32)
            padding = T.alloc_var(T.int32)
            lo = T.alloc_var(T.int32)
            hi = T.alloc_var(T.int32)
            prev = T.alloc_var(T.int32)
            g = T.alloc_var(T.float32)
            u = T.alloc_var(T.float32)
            dy = T.alloc_var(T.float32)
            s = T.alloc_var(T.float32)
            den = T.alloc_var(T.float32)
            ws = T.alloc_var(T.float32)
            act = T.alloc_var(T.float32)
            xg = T.alloc_var(T.float32)
            yg = T.alloc_var(T.float32)
            clamp_x = T.alloc_var(T.int32)
            clamp_y = T.alloc_var(T.int32)

            if row < num_rows:
                padding = 0
                if moe.has_psum != 0:
                    expert_search(psum_num_tokens_per_expert, row, num_experts, moe.search_steps, lo, hi)
                    prev = 0
                    if lo > 0:
                        prev = psum_num_tokens_per_expert[lo - 1]
                    if row < T.ceildiv(prev, moe.alignment) * moe.alignment:
                        padding = 1
                w = 1.0
                if moe.has_weights != 0 and padding == 0:
                    w = topk_weights[row] * moe.routed_scaling_factor
                acc = 0.0
                if pipeline and padding == 0:
                    load(x, act_x_grad, row, lane, 0, gate_next, up_next, dy_next)
                for it in T.serial(T.ceildiv(hidden, span)):
                    if padding == 0:
                        if pipeline:
                            for i in T.unroll(n):
                                gate_in[i] = gate_next[i]
                                up_in[i] = up_next[i]
                                dy_in[i] = dy_next[i]
                            load(
                                x, act_x_grad, row, lane, it + 1, gate_next, up_next, dy_next
                            )  # the next iteration's, before this one's math
                        else:
                            load(x, act_x_grad, row, lane, it, gate_in, up_in, dy_in)
                        if ahead:
                            ahead_col = (it + ahead) * span
                            if lane < x_lines and ahead_col + lane * x_line < hidden:
                                T.call_extern("int32", "tkaot_tune_prefetch_l2", T.address_of(x[row, ahead_col + lane * x_line]))
                                T.call_extern("int32", "tkaot_tune_prefetch_l2", T.address_of(x[row, hidden + ahead_col + lane * x_line]))
                            if lane < g_lines and ahead_col + lane * g_line < hidden:
                                T.call_extern("int32", "tkaot_tune_prefetch_l2", T.address_of(act_x_grad[row, ahead_col + lane * g_line]))
                    for k in T.unroll(unroll):
                        col = it * span + k * chunk + lane * vec
                        if col < hidden:
                            for j in T.unroll(vec):
                                i = k * vec + j
                                if padding == 0:
                                    g = T.cast(gate_in[i], T.float32)
                                    u = T.cast(up_in[i], T.float32)
                                    clamp_x = 0
                                    clamp_y = 0
                                    if moe.has_clamp != 0:
                                        clamp_x = T.if_then_else(g > moe.clamp_value, 1, 0)
                                        clamp_y = T.if_then_else(u > moe.clamp_value or u < -moe.clamp_value, 1, 0)
                                        g = T.min(g, moe.clamp_value)
                                        u = T.max(T.min(u, moe.clamp_value), -moe.clamp_value)
                                    dy = T.cast(dy_in[i], T.float32)
                                    den = 1 + T.exp(-g)
                                    s = 1.0 / den
                                    if moe.has_weights != 0 or recompute != 0:
                                        act = T.call_extern("float32", "tkaot_silu_refined", g, s, den) * u
                                        if moe.has_weights != 0:
                                            acc += dy * act
                                        if recompute != 0:
                                            act_res[i] = T.cast(act * w, out_t)
                                    ws = dy * w * s
                                    xg = T.if_then_else(clamp_x != 0, T.float32(0), ws * u * (1 + g * (1 - s)))
                                    yg = T.if_then_else(clamp_y != 0, T.float32(0), ws * g)
                                else:
                                    xg = 0.0
                                    yg = 0.0
                                    act_res[i] = T.cast(0, out_t)
                                xg_out[i] = T.cast(xg, out_t)
                                yg_out[i] = T.cast(yg, out_t)
                            for j in T.vectorized(vec):
                                x_grad[row, col + j] = xg_out[k * vec + j]
                            for j in T.vectorized(vec):
                                x_grad[row, hidden + col + j] = yg_out[k * vec + j]
                            if recompute != 0:
                                for j in T.vectorized(vec):
                                    act_out[row, col + j] = act_res[k * vec + j]
                if moe.has_weights != 0:
                    for i in T.unroll(5):
                        acc += T.shfl_xor(acc, 1 << i)
                    if lane == 0:
                        weight_grad[row] = T.if_then_else(padding != 0, T.float32(0), acc * moe.routed_scaling_factor)

    return swiglu_args.backward("swiglu_backward", dims, x_t, grad_dtype, out_t, sb.FP8, False, body)


# ---- build (CPU)


@contextlib.contextmanager
def _patched(c: Candidate):
    """The kernel module as candidate c builds it (fp32-x variants only; other variants are the shipped build)."""
    module = importlib.import_module(MODULE)
    saved = {a: getattr(module, a) for a in ("build", "vector_elems", "WARPS")}
    shipped_build, shipped_vec = saved["build"], saved["vector_elems"]

    def build(x_dtype, grad_dtype, fmt, group, sf):
        if x_dtype != "float32" or c.name == "ctl":
            return shipped_build(x_dtype, grad_dtype, fmt, group, sf)
        if c.body == "striped":
            return striped_build(c, x_dtype, grad_dtype, fmt)
        module.vector_elems = lambda xd, gd, f: c.vec if xd == "float32" else shipped_vec(xd, gd, f)
        module.WARPS = c.warps
        try:
            return shipped_build(x_dtype, grad_dtype, fmt, group, sf)
        finally:
            module.vector_elems, module.WARPS = shipped_vec, saved["WARPS"]

    try:
        module.build = build
        yield
    finally:
        for a, v in saved.items():
            setattr(module, a, v)


def _key(grad_dtype: str, fmt: str) -> str:
    return f"x_dtype=float32,grad_dtype={grad_dtype},fmt={fmt},group=0,sf=none"


def _shipped(root: Path) -> dict[str, str]:
    """{key: cubin sha256} of prebuilt/sm90's fp32-x variants."""
    entries = json.loads((root / "prebuilt" / "sm90" / "manifest.json").read_text())["variants"]
    return {e["key"]: e["cubin"] for e in entries if e["kernel"] == KERNEL and e["key"].startswith("x_dtype=float32,")}


def _ctl_identical(artifacts: Path, root: Path) -> str:
    """Whether ctl's cubins are prebuilt/sm90's (manifest hashes and the files' bytes)."""
    shipped = _shipped(root)
    entries = {e["key"]: e["cubin"] for e in json.loads((artifacts / "ctl" / "manifest.json").read_text())["variants"]}
    bad = []
    for key, digest in shipped.items():
        mine = artifacts / "ctl" / "cubins" / f"{entries.get(key)}.cubin"
        data = mine.read_bytes() if mine.is_file() else b""
        prebuilt = root / "prebuilt" / "sm90" / "cubins" / f"{digest}.cubin"
        if (
            entries.get(key) != digest
            or hashlib.sha256(data).hexdigest() != digest
            or (prebuilt.is_file() and prebuilt.read_bytes() != data)
        ):
            bad.append(key)
    return (
        f"ctl cubins identical to prebuilt/sm90's ({len(shipped)} fp32-x variants)"
        if not bad
        else f"ctl DIFFERS from prebuilt/sm90 at {bad}"
    )


def build(out: Path, only: tuple[str, ...] = ()) -> None:
    from build_tools.artifacts import BuildCache
    from build_tools.build import build_variants
    from build_tools.ops import Variant

    t0 = time.perf_counter()
    # A cache of each candidate's own: a patched builder does not change the kernel's source hash
    with tempfile.TemporaryDirectory(prefix="tune-swigbwd8-cache-") as cache:
        for c in CANDIDATES:
            if only and c.name not in only:
                continue
            t = time.perf_counter()
            variants = [
                Variant.make(KERNEL, {"x_dtype": "float32", "grad_dtype": g, "fmt": f, "group": 0, "sf": "none"}) for g, f in FP32_X
            ]
            try:
                with _patched(c):
                    build_variants(variants, out / c.name, "sm90", jobs=1, cache=BuildCache(Path(cache) / c.name))
            except Exception as exc:  # a candidate that fails to build is reported, not fatal
                print(f"{c.name:8s} NOT BUILT: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            print(f"{c.name:8s} built in {time.perf_counter() - t:5.1f} s  ({c.note})", flush=True)
    print(_ctl_identical(out, Path.cwd()), flush=True)
    print(f"{out}: {time.perf_counter() - t0:.0f} s", flush=True)


# ---- check and time (GPU)

TOKENS = (1, 3, 127, 4097, 8192)
CHECK_HIDDEN = (4096, 2048, 1088)  # the bench width, a smaller one, one with a half chunk at the end
TIME_HIDDEN = (4096, 2048)
TK_BUDGET_S = 100  # past this, TileKernels is not compiled for the second width (the run stays under 3 minutes)
SETS = 3  # rotating input sets: 3 x 448 MB at 8192 x 4096, far beyond L2
EXTRA = ("weights", "clamp", "recompute", "experts")  # one call with all of them


def _launchers(set_dir: Path) -> dict:
    """{key: Kernel} of a candidate's artifact set."""
    from tkaot._kernel import Kernel

    entries = json.loads((set_dir / "manifest.json").read_text())["variants"]
    cubins = set_dir / "cubins"
    return {e["key"]: Kernel(e["kernel"], e["key"], e["launch"], cubins / f"{e['cubin']}.cubin", e["cubin"], set_dir.name) for e in entries}


@contextlib.contextmanager
def _serving(kernels: dict):
    """The op's kernel table with the candidate's fp32-x launchers in it (other variants: the shipped ones)."""
    from tkaot._quant import swiglu_backward as op

    table = op._KERNEL
    saved = dict(table.cache)
    table.cache.clear()
    original_get = table.get
    assert "get" not in vars(table), "_serving does not nest"

    def get(device, *values, **kw):
        key = table.key(values)
        if key in kernels:
            launcher = table.cache.get((device, *values))
            if launcher is None:
                launcher = table.cache[(device, *values)] = kernels[key].bind(table.args)
            return launcher
        return original_get(device, *values, **kw)

    table.get = get  # an instance attribute over the method
    try:
        yield
    finally:
        del table.get
        table.cache.clear()
        table.cache.update(saved)


def _inputs(tokens: int, hidden: int, grad_dtype, seed: int) -> dict:
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, 2 * hidden, generator=g, device="cuda") * 3
    dy = torch.randn(tokens, hidden, generator=g, device="cuda").to(grad_dtype)
    w = torch.rand(tokens, generator=g, device="cuda")
    experts = 4
    cuts = sorted(torch.randint(0, tokens + 1, (experts - 1,), generator=g, device="cuda").tolist())
    psum = torch.tensor([*cuts, tokens], dtype=torch.int32, device="cuda")
    return {"x": x, "dy": dy, "w": w, "psum": psum}


def _kwargs(a: dict, extra: bool) -> dict:
    if not extra:
        return {}
    return dict(topk_weights=a["w"], routed_scaling_factor=2.5, clamp_value=4.0, do_recompute=True, psum_num_tokens_per_expert=a["psum"])


def _bytes(result) -> list:
    """The result's tensors (pairs flattened) as raw bytes, for comparing bit patterns (NaNs included)."""
    import torch

    flat = []
    for t in result:
        flat.extend(t if isinstance(t, tuple) else [t])
    return [t.contiguous().view(-1).view(torch.uint8) for t in flat]


def _same(got, want) -> bool:
    import torch

    a, b = _bytes(got), _bytes(want)
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def _verdict(got, want, weight_grad_at: int | None = None) -> str:
    """'=' when every output's bytes match; '~' when only weight_grad (a row sum, at index weight_grad_at) differs, within
    the GPU tests' tolerance (tests/gpu/test_backward_gpu.py: rtol 1e-4, atol 4e-3); else which outputs differ."""
    import torch

    a, b = _bytes(got), _bytes(want)
    bad, near = [], []
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape == y.shape and torch.equal(x, y):
            continue
        if i == weight_grad_at and torch.allclose(got[i], want[i], rtol=1e-4, atol=4e-3):
            near.append(i)
        else:
            bad.append(i)
    if bad or len(a) != len(b):
        return "differs@" + ",".join(map(str, bad or ["count"]))
    return "~" if near else "="


def check(sets: dict, say) -> dict[str, str]:
    """Each candidate's outputs, byte for byte, against ctl's (the shipped kernel) and the torch reference's on every
    check case (ctl's and the reference's computed once a case); {candidate: summary verdict}."""
    import torch

    import tkaot
    from tkaot import reference

    problems: dict[str, list[str]] = {name: [] for name in sets}
    near = dict.fromkeys(sets, 0)
    t0 = time.perf_counter()
    for hidden in CHECK_HIDDEN:
        for tokens in TOKENS:
            cases = [("bfloat16", "bf16", extra) for extra in (False, True)]
            if tokens == 127:
                cases += [(gd, f, extra) for gd, f in FP32_X if (gd, f) != ("bfloat16", "bf16") for extra in (False, True)]
            for grad_dtype, fmt, extra in cases:
                a = _inputs(tokens, hidden, getattr(torch, grad_dtype), seed=tokens + hidden)
                kw = _kwargs(a, extra)
                with _serving(sets["ctl"]):
                    want = tkaot.quant.swiglu_backward_and_per_token_cast(a["x"], a["dy"], fmt, 128, **kw)
                ref = reference.backward.swiglu_backward_and_per_token_cast(
                    a["x"], a["dy"], fmt, 128, kw.get("psum_num_tokens_per_expert"), kw.get("topk_weights"),
                    kw.get("routed_scaling_factor"), False, False, False, kw.get("clamp_value"), kw.get("do_recompute", False),
                )  # fmt: skip
                at = 1 if extra else None  # (x_grad, weight_grad, act_out) with weights
                case = f"{tokens}x{hidden} {grad_dtype}->{fmt}{' +weights,clamp,recompute,experts' if extra else ''}"
                for name, kernels in sets.items():
                    try:
                        with _serving(kernels):
                            got = tkaot.quant.swiglu_backward_and_per_token_cast(a["x"], a["dy"], fmt, 128, **kw)
                        torch.cuda.synchronize()
                    except Exception as exc:
                        problems[name].append(f"{case}: FAILED {type(exc).__name__}: {str(exc)[:80]}")
                        continue
                    v_ctl, v_ref = _verdict(got, want, at), _verdict(got, ref, at)
                    near[name] += v_ctl == "~"
                    if v_ctl.startswith("differs") or v_ref.startswith("differs"):
                        problems[name].append(f"{case}: ctl {v_ctl} ref {v_ref}")
    verdicts = {}
    for name in sets:
        for p in problems[name][:4]:
            say(f"  {name}: {p}")
        if problems[name]:
            verdicts[name] = f"{len(problems[name])} cases DIFFER"
        elif near[name]:
            verdicts[name] = f"= ctl but weight_grad ~ctl in {near[name]} cases; = ref"
        else:
            verdicts[name] = "all bytes = ctl; = ref (weight_grad within tol)"
        say(f"{name:8s} check: {verdicts[name]}")
    say(f"checks: {time.perf_counter() - t0:.1f} s")
    return verdicts


def measure(artifacts: Path, say, start: float) -> list[tuple]:
    """The checks, then the timed rows (candidate, shape, µs, TK µs, ratio, =ctl, =TK, check verdict). TileKernels is
    timed before and after the candidates (its first call at a width compiles it: the 2048 row skips it once TK_BUDGET_S
    has passed), ctl again after them, so drift shows."""
    import torch

    import tkaot
    from bench.timing import device_us

    say(_ctl_identical(artifacts, Path.cwd()))
    sets = {}
    for c in CANDIDATES:
        try:
            sets[c.name] = _launchers(artifacts / c.name)
        except Exception as exc:
            say(f"{c.name}: not loaded ({type(exc).__name__}: {exc})")
    if "ctl" not in sets:
        raise SystemExit("ctl (the shipped kernel) did not load: nothing to compare with")
    ctl = sets["ctl"]
    try:
        import tile_kernels as tk
    except ImportError:
        tk = None
        say("tile_kernels not importable: no TK columns")
    verdicts = check(sets, say)
    rows = []
    for hidden in TIME_HIDDEN:
        shape = f"8192x{2 * hidden} fp32 x, bf16 grad -> bf16"
        nbytes = 8192 * hidden * (2 * 4 + 2 + 2 * 2)  # x read, dy read, x_grad written
        inputs = [_inputs(8192, hidden, torch.bfloat16, seed=100 + i) for i in range(SETS)]

        def call(a):
            return tkaot.quant.swiglu_backward_and_per_token_cast(a["x"], a["dy"], "bf16", 128)

        def tk_call(a):
            return tk.quant.swiglu_backward_and_per_token_cast(a["x"], a["dy"], "bf16", 128)

        theirs, tk_times = None, []
        use_tk = tk is not None and (hidden == TIME_HIDDEN[0] or time.perf_counter() - start < TK_BUDGET_S)
        if use_tk:
            t = time.perf_counter()
            theirs = tk_call(inputs[0])
            torch.cuda.synchronize()
            tk_times.append(device_us(tk_call, inputs)[0])
            say(f"{'TK':8s} {shape:36s} {tk_times[-1]:8.2f} µs (first call and timing {time.perf_counter() - t:.0f} s)")
        with _serving(ctl):
            want = call(inputs[0])
        measured = []
        for name, kernels in [*sets.items(), ("ctl(again)", ctl)]:
            with _serving(kernels):
                got = call(inputs[0])
                torch.cuda.synchronize()
                us, mode = device_us(call, inputs)
            same_ctl = "yes" if _same(got, want) else "NO"
            same_tk = "-" if theirs is None else ("yes" if _same(got, theirs) else "NO")
            measured.append((name, us, same_ctl, same_tk))
            say(f"{name:10s} {shape:36s} {us:8.2f} µs ({mode}, {nbytes / us / 1e6:.2f} TB/s)  =ctl {same_ctl}  =TK {same_tk}")
        if use_tk:
            tk_times.append(device_us(tk_call, inputs)[0])
            say(f"{'TK(again)':10s} {shape:36s} {tk_times[-1]:8.2f} µs")
        tk_us = sum(tk_times) / len(tk_times) if tk_times else None
        for name, us, same_ctl, same_tk in measured:
            ratio = us / tk_us if tk_us else float("nan")
            rows.append((name, shape, us, tk_us, ratio, same_ctl, same_tk, verdicts.get(name.removesuffix("(again)"), "-")))
        del inputs
    return rows


def time_candidates(artifacts: Path, out: Path) -> None:
    import torch

    from bench.timing import copy_ceiling_tbps

    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    t0 = time.perf_counter()
    say(f"device: {torch.cuda.get_device_name()}; {SETS} rotating input sets; candidates: {', '.join(c.name for c in CANDIDATES)}")
    rows = measure(artifacts, say, t0)
    say(f"copy ceiling {copy_ceiling_tbps(1 << 30):.2f} TB/s")
    say("")
    say(f"{'candidate':10s} {'shape':36s} {'µs':>8s} {'TK µs':>8s} {'ratio':>6s} {'=ctl':>4s} {'=TK':>4s}  check")
    for name, shape, us, tk_us, ratio, same_ctl, same_tk, verdict in rows:
        say(f"{name:10s} {shape:36s} {us:8.2f} {tk_us or 0:8.2f} {ratio:6.3f} {same_ctl:>4s} {same_tk:>4s}  {verdict}")
    say(f"{time.perf_counter() - t0:.0f} s")
    (out / "tune_swigbwd8.log").write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=("time", "build"), default="time")
    parser.add_argument("--artifacts", type=Path, default=Path(ARTIFACTS), help="the candidates' artifact sets")
    parser.add_argument("--out", type=Path, required=True, help="build: where the sets go; time: the log's directory")
    parser.add_argument("--only", default="", help="build: these candidates (comma-separated) only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "build":
        build(args.out, tuple(n for n in args.only.split(",") if n))
    else:
        time_candidates(args.artifacts, args.out)


if __name__ == "__main__":
    main()
