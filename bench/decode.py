"""A decode-style step of several tkaot ops, eager and as a CUDA graph.

One step for a batch of decode tokens of a DeepSeek-V3-sized layer: attention
pre-norm (+ residual) -> FP8 cast of the GEMM input -> rotary on q/k -> FFN
pre-norm (+ residual) -> MoE top-k gate -> SwiGLU + FP8 cast. The GEMMs are
outside tkaot's scope; their outputs are stand-in buffers. Used by the GPU
tests (graph replay and torch.compile equal eager, bit for bit) and by `python -m bench.decode`, which times
a step eager, as a hand-captured CUDA graph, compiled (fullgraph) and compiled with mode="reduce-overhead", the
latter twice: over plain inputs, and over the step's state marked static (`mark_static`: what a user writes for
persistent buffers: no input copies). The rotary writes q and k in place; as in a model, they are the step's own
tensors (stand-ins for the q/k projections' outputs, made inside the step), not its inputs: CUDA graph trees replay
a graph that writes its inputs only when those inputs count as static, and on torch 2.11 (H200 run, session 11) a
step rotating its input q/k in place was compiled without CUDA graphs ("mutated inputs") even with the inputs
marked by torch._dynamo.mark_static_address.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

import tkaot

HIDDEN, HEADS, ROPE, EXPERTS, TOPK, INTER = 7168, 16, 64, 256, 8, 2048


def make_state(tokens: int, seed: int = 0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s, dtype=torch.bfloat16: torch.randn(*s, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    inv_freq = 10000 ** (torch.arange(ROPE // 2, device="cuda") / (ROPE // 2))
    angles = torch.arange(4096, device="cuda", dtype=torch.float32)[:, None] / inv_freq
    return {
        "h": r(tokens, HIDDEN), "res": r(tokens, HIDDEN), "w_attn": r(HIDDEN), "w_ffn": r(HIDDEN),
        "attn_out": r(tokens, HIDDEN), "q": r(tokens, HEADS, ROPE), "k": r(tokens, 1, ROPE),
        "cos_sin": torch.cat([angles.cos(), angles.sin()], dim=1).contiguous(),
        "positions": torch.randint(0, 4096, (tokens,), device="cuda", generator=g, dtype=torch.int64),
        "logits": r(tokens, EXPERTS, dtype=torch.float32), "gate_up": r(tokens, 2 * INTER),
    }  # fmt: skip


def empty_state(tokens: int, device="cuda") -> dict:
    """make_state's tensors, uninitialised (shapes, dtypes and layouts only: for tracing with fake tensors)."""
    e = lambda *s, dtype=torch.bfloat16: torch.empty(*s, device=device, dtype=dtype)
    return {
        "h": e(tokens, HIDDEN), "res": e(tokens, HIDDEN), "w_attn": e(HIDDEN), "w_ffn": e(HIDDEN),
        "attn_out": e(tokens, HIDDEN), "q": e(tokens, HEADS, ROPE), "k": e(tokens, 1, ROPE), "cos_sin": e(4096, ROPE, dtype=torch.float32),
        "positions": e(tokens, dtype=torch.int64), "logits": e(tokens, EXPERTS, dtype=torch.float32), "gate_up": e(tokens, 2 * INTER),
    }  # fmt: skip


def mark_static(state: dict) -> dict:
    """Mark the step's tensors as static inputs of compiled code (fixed addresses across calls, as a serving engine's
    persistent buffers are): mode="reduce-overhead" then replays one CUDA graph that reads and writes them in place,
    with no input copies."""
    for t in state.values():
        torch._dynamo.mark_static_address(t)
    return state


def step(s: dict) -> dict:
    x, _, res1 = tkaot.quant.norm_forward(s["h"], s["w_attn"], 1e-6, residual=s["res"])
    x_fp8, x_sf = tkaot.quant.per_token_cast(x, "e4m3", 128, round_sf=True)
    q, k = s["q"].clone(), s["k"].clone()  # the q/k projections' outputs (GEMMs are outside tkaot's scope)
    tkaot.transform.apply_rotary(q, s["cos_sin"], key=k, positions=s["positions"])
    y, _, res2 = tkaot.quant.norm_forward(s["attn_out"], s["w_ffn"], 1e-6, residual=res1)
    topk_idx, topk_w = tkaot.moe.moe_topk_gate_forward(s["logits"], TOPK, False, 0, 2.5, 0)
    act, act_sf = tkaot.quant.swiglu_forward_and_per_token_cast(s["gate_up"], "e4m3", 128, round_sf=True)
    return {"x_fp8": x_fp8, "x_sf": x_sf, "q": q, "k": k, "y": y, "res2": res2,
            "topk_idx": topk_idx, "topk_w": topk_w, "act": act, "act_sf": act_sf}  # fmt: skip


def capture(state: dict) -> tuple[torch.cuda.CUDAGraph, dict]:
    step(state)  # load every module before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(state)
    return graph, outs


def per_step_us(fn, n: int = 1000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter_ns() - t0) / n / 1000)
    return statistics.median(samples)


def cudagraph_skips() -> int:
    """How many graphs Inductor has compiled without CUDA graphs so far (its skip counter)."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["cudagraph_skips"]


def compiled_us(state: dict, unguarded: bool = False, **options) -> tuple[float, int, float | None]:
    """Per-step µs of torch.compile(step, fullgraph=True, **options) over state, how many graphs Inductor compiled
    without CUDA graphs, and the per-step µs again with guards skipped where the cache holds one entry
    (torch.compiler.set_stance(skip_guard_eval_unsafe=True): a user's choice once shapes settle), if asked."""
    torch._dynamo.reset()
    skips = cudagraph_skips()
    compiled = torch.compile(step, fullgraph=True, **options)
    us = per_step_us(lambda: compiled(state))
    skipped = cudagraph_skips() - skips
    if not unguarded:
        return us, skipped, None
    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
        return us, skipped, per_step_us(lambda: compiled(state))


def main() -> None:
    results, rows = {}, []
    for tokens in (1, 8, 64):
        state = make_state(tokens)
        q0, k0 = state["q"].clone(), state["k"].clone()
        eager = per_step_us(lambda s=state: step(s))
        graph, _ = capture(state)
        state["q"].copy_(q0)
        state["k"].copy_(k0)
        replay = per_step_us(graph.replay)
        del graph
        # torch.compile: the step as one graph of tkaot custom ops (Inductor), then as CUDA graphs (reduce-overhead)
        compiled, _, _ = compiled_us(state)
        plain, plain_skips, _ = compiled_us(state, mode="reduce-overhead")
        static, static_skips, static_unguarded = compiled_us(mark_static(make_state(tokens)), True, mode="reduce-overhead")
        results[tokens] = {
            "eager_us_per_step": round(eager, 2), "graph_us_per_step": round(replay, 2), "compiled_us_per_step": round(compiled, 2),
            "reduce_overhead_us_per_step": round(plain, 2), "reduce_overhead_cudagraph_skipped": bool(plain_skips),
            "reduce_overhead_static_us_per_step": round(static, 2), "reduce_overhead_static_cudagraph_skipped": bool(static_skips),
            "reduce_overhead_static_skip_guards_us_per_step": round(static_unguarded, 2),
            "ops_per_step": 6,
        }  # fmt: skip
        graphs = "skipped" if static_skips else "replayed"
        rows.append((tokens, eager, replay, compiled, plain, static, static_unguarded, graphs))
    print(json.dumps({"decode_step": results}))
    head = ("tokens", "eager", "hand graph", "compiled", "r-o plain", "r-o static", "r-o static no guards", "static graphs")
    print(" | ".join(head))
    for row in rows:
        print(" | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row))


if __name__ == "__main__":
    main()
