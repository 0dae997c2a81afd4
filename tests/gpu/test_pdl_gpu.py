"""Programmatic dependent launch on a GPU: kernels that start before the one ahead of them finishes
must still see every byte it wrote.

A chain where each launch reads what the launch before it wrote — a torch kernel, then
RMSNorm + cast (its bf16 output), SwiGLU of that, rotary in place on the result, RMSNorm + cast
of the rotated rows — eagerly and replayed from a CUDA graph, with every step checked against
the pure-torch reference on the input that step saw; a second chain through the other families
(RMSNorm with a residual, per-token cast, cast back, top-k gate, per-block cast). The same chains
with TKAOT_PDL=0 (plain launches) in a fresh process.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tkaot
from tkaot import _kernel, reference

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
HIDDEN, SWIGLU_HIDDEN, HEAD_DIM = 4096, 2048, 64


def cos_sin_cache(rows: int, rot_dim: int) -> torch.Tensor:
    half = rot_dim // 2
    inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float64, device="cuda") / half)
    angles = torch.arange(rows, dtype=torch.float64, device="cuda")[:, None] * inv_freq
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()


def run_chain(src: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, cache: torch.Tensor) -> dict:
    """The chain on src: every launch consumes the previous one's output, no copy in between."""
    x = src * 3  # a torch kernel writes x just before the first tkaot launch reads it
    (q1, sf1), b1, rstd1, _ = tkaot.quant.norm_forward_and_per_token_cast(x, w1, 1e-6, "e4m3", 32, with_rstd=True, with_out_bf16=True)
    y = tkaot.quant.swiglu_forward(b1, "bf16")
    tkaot.transform.apply_rotary(y.view(-1, SWIGLU_HIDDEN // HEAD_DIM, HEAD_DIM), cache)
    (q2, sf2), b2, rstd2, _ = tkaot.quant.norm_forward_and_per_token_cast(y, w2, 1e-6, "e4m3", 32, with_rstd=True, with_out_bf16=True)
    return dict(x=x, q1=q1, sf1=sf1, b1=b1, rstd1=rstd1, y=y, q2=q2, sf2=sf2, b2=b2, rstd2=rstd2)


def check_chain(got: dict, w1: torch.Tensor, w2: torch.Tensor, cache: torch.Tensor) -> None:
    def same(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    (q1, sf1), b1, _, _ = reference.fused.norm_forward_and_per_token_cast(got["x"], w1, 1e-6, rstd=got["rstd1"])
    assert same(got["q1"], q1) and torch.equal(got["sf1"], sf1) and torch.equal(got["b1"], b1)
    torch.testing.assert_close(got["rstd1"], torch.rsqrt(got["x"].float().square().mean(-1) + 1e-6), rtol=1e-5, atol=0)
    y = reference.fused.swiglu_forward(got["b1"], "bf16")
    rotated, _ = reference.apply_rotary(y.view(-1, SWIGLU_HIDDEN // HEAD_DIM, HEAD_DIM), cache)
    torch.testing.assert_close(got["y"].view_as(rotated), rotated, rtol=2**-7, atol=2**-7)
    (q2, sf2), b2, _, _ = reference.fused.norm_forward_and_per_token_cast(got["y"], w2, 1e-6, rstd=got["rstd2"])
    assert same(got["q2"], q2) and torch.equal(got["sf2"], sf2) and torch.equal(got["b2"], b2)


def run_family_chain(src: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> dict:
    """RMSNorm (+ residual) -> per-token E4M3 cast -> cast back to bf16 -> top-k of its first 256 columns as
    fp32 scores (a torch kernel in between) -> per-block cast of the norm's output."""
    y, _, s = tkaot.quant.norm_forward(src, w, 1e-6, residual=res)
    q, sf = tkaot.quant.per_token_cast(y, "e4m3", 128)
    back = tkaot.quant.per_token_cast_back((q, sf), "bf16", 128)
    scores = back[:, :256].float()
    idx = tkaot.moe.topk_gate(scores, 8)
    bq, bsf = tkaot.quant.per_block_cast(y, "e4m3", (128, 128))
    return dict(y=y, s=s, q=q, sf=sf, back=back, scores=scores, idx=idx, bq=bq, bsf=bsf)


def check_family_chain(got: dict, src: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> None:
    def same(a, b):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    ref_y, _, ref_s = reference.norm_forward(src, w, 1e-6, res)
    assert torch.equal(got["s"], ref_s)
    torch.testing.assert_close(got["y"], ref_y, rtol=2**-7, atol=2**-7)
    q, sf = reference.quant.per_token_cast(got["y"], "e4m3", 128)
    assert same(got["q"], q) and torch.equal(got["sf"], sf)
    assert torch.equal(got["back"], reference.quant.per_token_cast_back((got["q"], got["sf"]), "bf16", 128))
    assert torch.equal(got["idx"].long(), reference.moe.topk_gate(got["scores"], 8).long())
    bq, bsf = reference.quant.per_block_cast(got["y"], "e4m3", (128, 128))
    assert same(got["bq"], bq) and torch.equal(got["bsf"], bsf)


def family_inputs(tokens: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    src = torch.randn(tokens, HIDDEN, generator=g, device="cuda").bfloat16()
    res = torch.randn(tokens, HIDDEN, generator=g, device="cuda").bfloat16()
    return src, res, torch.randn(HIDDEN, generator=g, device="cuda").bfloat16()


@pytest.mark.parametrize("tokens", [1, 127, 4097])
def test_family_chain_eager(tokens):
    for seed in range(3):
        src, res, w = family_inputs(tokens, seed)
        check_family_chain(run_family_chain(src, res, w), src, res, w)


def inputs(tokens: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    src = torch.randn(tokens, HIDDEN, generator=g, device="cuda").bfloat16()
    w1 = torch.randn(HIDDEN, generator=g, device="cuda").bfloat16()
    w2 = torch.randn(SWIGLU_HIDDEN, generator=g, device="cuda").bfloat16()
    return src, w1, w2, cos_sin_cache(tokens, HEAD_DIM)


def test_fused_kernels_launch_with_pdl_here():
    """The GPU suite runs the fused ops through PDL launches (unless TKAOT_PDL=0 says otherwise)."""
    assert _kernel.PDL_ALLOWED == (os.environ.get("TKAOT_PDL", "") != "0")
    src, w1, w2, cache = inputs(3, 0)
    run_chain(src, w1, w2, cache)
    launchers = bound_launchers()
    assert launchers and all(launcher.pdl == _kernel.PDL_ALLOWED for launcher in launchers)


def bound_launchers() -> list:
    """The launcher objects the three ops have bound so far (compiled: the bound method's object)."""
    from tkaot._quant import norm_cast as _norm_cast
    from tkaot._quant import swiglu as _swiglu
    from tkaot._transform import rotary as rotary_ops

    launches = [v for op in (_norm_cast._NORM_CAST, _swiglu._SWIGLU, rotary_ops._ROTARY) for v in op.cache.values()]
    return [getattr(launch, "__self__", launch) for launch in launches]


@pytest.mark.parametrize("tokens", [1, 127, 4097, 16384])
def test_chain_eager(tokens):
    for seed in range(3):
        src, w1, w2, cache = inputs(tokens, seed)
        check_chain(run_chain(src, w1, w2, cache), w1, w2, cache)


def test_chain_in_a_cuda_graph():
    tokens = 8192
    src, w1, w2, cache = inputs(tokens, 7)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_chain(src, w1, w2, cache)  # bind the launchers, load the modules
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            got = run_chain(src, w1, w2, cache)
    torch.cuda.current_stream().wait_stream(stream)
    for seed in range(3):
        fresh, *_ = inputs(tokens, 100 + seed)
        src.copy_(fresh)
        for value in got.values():
            value.view(torch.uint8).fill_(0xFF)  # NaN in every float output
        graph.replay()
        torch.cuda.synchronize()
        check_chain(got, w1, w2, cache)


def test_chain_with_plain_launches():
    code = (
        "import torch, tests.gpu.test_pdl_gpu as t, tkaot._kernel as k\n"
        "assert not k.PDL_ALLOWED\n"
        "for tokens in (3, 4097):\n"
        "    src, w1, w2, cache = t.inputs(tokens, 1)\n"
        "    t.check_chain(t.run_chain(src, w1, w2, cache), w1, w2, cache)\n"
        "assert all(not launcher.pdl for launcher in t.bound_launchers())\n"
        "src, res, w = t.family_inputs(4097, 2)\n"
        "t.check_family_chain(t.run_family_chain(src, res, w), src, res, w)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "TKAOT_PDL": "0", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
