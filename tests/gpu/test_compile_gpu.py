"""torch.compile and torch.export of tkaot ops on a GPU: bit for bit what eager launches return.

fullgraph=True with the default backend (Inductor) over bench/decode.py's step and over single ops (given buffers,
in-place ops, pairs, layouts); mode="reduce-overhead" (CUDA graphs) replaying the step as its inputs change in place;
a dynamic token count; torch.export of the step, run through the exported module. Given buffers are NaN-poisoned
first, so an unwritten element shows.
"""

from __future__ import annotations

import pytest
import torch

import tkaot
from bench import decode

pytestmark = pytest.mark.gpu
TOKENS = [1, 3, 127, 4097]


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_identical(got, want, where="") -> None:
    """Every leaf of two results: None alike, or tensors of the same shape, dtype and strides, equal bit for bit."""
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_identical(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (tuple, list)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_identical(g, w, f"{where}[{i}]")
    elif isinstance(want, torch.Tensor):
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride()), where
        assert torch.equal(as_bits(got), as_bits(want)), where
    else:
        assert got == want, where


def run_step(fn, state: dict, q0: torch.Tensor, k0: torch.Tensor) -> dict:
    """fn(state) from the same q and k (the step rotates them in place); the outputs cloned."""
    state["q"].copy_(q0)
    state["k"].copy_(k0)
    out = fn(state)
    torch.cuda.synchronize()
    return {k: v.clone() for k, v in out.items()}


@pytest.mark.parametrize("tokens", TOKENS)
def test_fullgraph_decode_step_is_bit_identical_to_eager(tokens):
    state = decode.make_state(tokens, seed=tokens)
    q0, k0 = state["q"].clone(), state["k"].clone()
    eager = run_step(decode.step, state, q0, k0)
    torch._dynamo.reset()
    compiled = torch.compile(decode.step, fullgraph=True)
    assert_identical(run_step(compiled, state, q0, k0), eager)
    assert_identical(run_step(compiled, state, q0, k0), eager)  # again, on the compiled code


def assert_replays_match_eager(state: dict, tokens: int, seeds: range) -> None:
    """reduce-overhead over state (warm-up, recording, then replays), each call on fresh values copied in place: eager's bits."""
    torch._dynamo.reset()
    compiled = torch.compile(decode.step, fullgraph=True, mode="reduce-overhead")
    for seed in seeds:
        fresh = decode.make_state(tokens, seed=seed)
        q0, k0 = fresh["q"].clone(), fresh["k"].clone()
        for name, value in fresh.items():
            state[name].copy_(value)
        got = run_step(compiled, state, q0, k0)
        for name, value in fresh.items():
            state[name].copy_(value)
        assert_identical(got, run_step(decode.step, state, q0, k0), f"seed {seed}")


def test_reduce_overhead_replays_the_decode_step_exactly():
    assert_replays_match_eager(decode.make_state(8, seed=1), 8, range(50, 56))


def test_reduce_overhead_over_static_state_replays_cuda_graphs():
    """The step's state marked static (bench.decode.mark_static): Inductor keeps CUDA graphs (the step writes only its
    own tensors) and copies no input, and the replays give eager's bits as the state changes in place."""
    from torch._dynamo.utils import counters

    skips = counters["inductor"]["cudagraph_skips"]
    assert_replays_match_eager(decode.mark_static(decode.make_state(8, seed=2)), 8, range(70, 75))
    assert counters["inductor"]["cudagraph_skips"] == skips


def test_dynamic_token_count_is_bit_identical_to_eager():
    torch._dynamo.reset()
    compiled = torch.compile(decode.step, fullgraph=True, dynamic=True)
    for tokens in TOKENS:
        state = decode.make_state(tokens, seed=7 + tokens)
        q0, k0 = state["q"].clone(), state["k"].clone()
        assert_identical(run_step(compiled, state, q0, k0), run_step(decode.step, state, q0, k0), f"{tokens} tokens")


def test_exported_decode_step_runs_bit_identical_to_eager():
    state = decode.make_state(5, seed=3)
    q0, k0 = state["q"].clone(), state["k"].clone()

    class Step(torch.nn.Module):
        def forward(self, s):
            return decode.step(s)

    ep = torch.export.export(Step(), (state,))
    module = ep.module()
    assert_identical(run_step(module, state, q0, k0), run_step(decode.step, state, q0, k0))


def nan_like(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(t)
    out.view(torch.uint8).fill_(0xFF) if out.element_size() == 1 else out.fill_(float("nan") if out.is_floating_point() else -7)
    return out


def _norm_into(x, w, r, out, residual_out):
    return tkaot.quant.norm_forward(x, w, 1e-6, residual=r, out=out, residual_out=residual_out, with_rstd=True)


def _norm_cast(x, w, r):
    return tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, residual=r, use_tma_aligned_col_major_sf=True,
                                                       round_sf=True, with_out_bf16=True, with_rstd=True)  # fmt: skip


def _casts(x):
    data, sf = tkaot.quant.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    back = tkaot.quant.per_token_cast_back((data, sf), "fp32", 32)
    blocks = tkaot.quant.per_block_cast(x, "e4m3", (128, 128), round_sf=True)
    return data, sf, back, blocks, tkaot.quant.per_channel_cast(x, "e4m3", 128), tkaot.quant.cast(x, torch.float8_e4m3fn)


def _gate(logits, bias, out_idx, out_w, scores):
    idx, w = tkaot.moe.moe_topk_gate_forward(logits, 6, True, 2, 1.5, 1, bias=bias, out=(out_idx, out_w), scores=scores)
    denominator, normalized = tkaot.moe.normalize_weight(w)
    return idx, w, denominator, normalized, tkaot.moe.topk_gate(scores, 4)


def _swiglu(x, count):
    return tkaot.quant.swiglu_forward(x, "fp32", clamp_value=2.0, clamped_count=count), tkaot.quant.swiglu_forward_and_per_token_cast(
        x, "e4m3", 32, use_tma_aligned_col_major_sf=True
    )


def _round_trip(x):
    tkaot.quant.per_token_cast_and_cast_back(x, "e4m3", 128)
    return x


@pytest.mark.parametrize("tokens", TOKENS)
def test_single_ops_fullgraph_are_bit_identical_to_eager(tokens):
    g = torch.Generator(device="cuda").manual_seed(tokens)
    r = lambda *s, dtype=torch.bfloat16: torch.randn(*s, generator=g, device="cuda").to(dtype)
    x, w, res = r(tokens, 2048), r(2048), r(tokens, 2048)  # a width the default set builds for every op below
    logits, bias = r(tokens, 256, dtype=torch.float32), r(256, dtype=torch.float32)
    gate_up = r(tokens, 2048)  # drawn once: eager and compiled calls see the same input
    cases = [
        (_norm_into, lambda: (x, w, res, nan_like(x), nan_like(x))),
        (_norm_cast, lambda: (x, w, res)),
        (_casts, lambda: (x,)),
        (_gate, lambda: (logits, bias, nan_like(torch.empty(tokens, 8, dtype=torch.int64, device="cuda")),
                         nan_like(torch.empty(tokens, 8, device="cuda")), nan_like(logits))),
        (_swiglu, lambda: (gate_up, torch.zeros(4, dtype=torch.int64, device="cuda"))),
        (_round_trip, lambda: (x.clone(),)),
    ]  # fmt: skip
    for fn, make_args in cases:
        torch._dynamo.reset()
        eager = fn(*make_args())
        compiled = torch.compile(fn, fullgraph=True)(*make_args())
        torch.cuda.synchronize()
        assert_identical(compiled, eager, fn.__name__)
