"""A decode-style sequence of tkaot ops captured in one CUDA graph replays exactly like eager launches."""

import pytest
import torch

from bench import decode

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens", [1, 3, 64])
def test_decode_step_graph_replay_matches_eager(tokens):
    state = decode.make_state(tokens, seed=tokens)
    graph, graph_outs = decode.capture(state)
    for trial in range(3):
        fresh = decode.make_state(tokens, seed=100 + trial)
        for name, value in fresh.items():
            state[name].copy_(value)
        q_before, k_before = state["q"].clone(), state["k"].clone()
        inputs = {id(v) for v in state.values()}
        for value in graph_outs.values():
            if id(value) in inputs:
                continue  # q and k are rotated in place: they are inputs as well as outputs
            if value.is_floating_point():
                value.fill_(float("nan"))
            else:
                value.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        # eager on the same inputs (rotary is in place: restore q/k first)
        replayed = {name: value.clone() for name, value in graph_outs.items()}
        state["q"].copy_(q_before)
        state["k"].copy_(k_before)
        eager = decode.step(state)
        torch.cuda.synchronize()
        for name, value in eager.items():
            got = replayed[name]
            assert got.shape == value.shape and got.dtype == value.dtype, name
            as_bits = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t
            assert torch.equal(as_bits(got), as_bits(value)), name
