"""One process driving two GPUs, and a two-rank tensor-parallel step under torchrun (skipped below 2 GPUs).

Ops take their device from their tensors: on cuda:1 while cuda:0 is current they load their modules on cuda:1,
launch on cuda:1's current stream, and return what the same call returns with cuda:1 current, bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tkaot
from bench import decode

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]
ROOT = Path(__file__).resolve().parents[2]


def on(device: str, state: dict) -> dict:
    return {k: v.to(device) for k, v in state.items()}


def as_bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("tokens", [1, 3, 127, 4097])
def test_ops_run_on_the_tensors_device_not_the_current_one(tokens):
    with torch.cuda.device(0):
        base = decode.make_state(tokens, seed=tokens)
    with torch.cuda.device(1):
        reference = decode.step(on("cuda:1", base))  # cuda:1 current
        torch.cuda.synchronize()
    with torch.cuda.device(0):
        state = on("cuda:1", base)
        got = decode.step(state)  # cuda:0 current, every tensor on cuda:1
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0
    for name, value in reference.items():
        assert got[name].device == torch.device("cuda:1"), name
        assert torch.equal(as_bits(got[name]), as_bits(value)), name
    on0 = decode.step(on("cuda:0", base))  # and what cuda:0 computes (same arch): the same bytes
    for name, value in reference.items():
        assert torch.equal(as_bits(on0[name].cpu()), as_bits(value.cpu())), name


def test_captured_on_cuda1_while_cuda0_is_current():
    with torch.cuda.device(1):
        state = decode.make_state(8, seed=2)
        graph, outs = decode.capture(state)
    q0, k0 = state["q"].clone(), state["k"].clone()
    graph.replay()
    torch.cuda.synchronize(1)
    replayed = {k: v.clone() for k, v in outs.items()}
    state["q"].copy_(q0)
    state["k"].copy_(k0)
    with torch.cuda.device(0):
        eager = decode.step(state)
    torch.cuda.synchronize(1)
    for name, value in eager.items():
        assert torch.equal(as_bits(replayed[name]), as_bits(value)), name


def test_preload_covers_each_device():
    from tkaot.registry import REGISTRY

    counts = [tkaot.preload(device=0), tkaot.preload(device="cuda:1")]
    assert counts[0] == counts[1] > 0
    loaded = list(REGISTRY._kernels.values())
    assert loaded and all({0, 1} <= set(k.functions) for k in loaded)


def test_tensor_parallel_step_under_torchrun(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517",
         str(ROOT / "tests" / "gpu" / "tp_step.py")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("rank ")]
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout + proc.stderr
    assert all(line.endswith("local pipeline: True, references: True") for line in lines), lines
