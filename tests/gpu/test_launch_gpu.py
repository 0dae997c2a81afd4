"""The launch path under load: many threads on their own streams, and a million launches without growth."""

import gc
import os
import threading

import pytest
import torch

import tkaot
from tests.helpers import run_on_threads
from tkaot import reference

pytestmark = pytest.mark.gpu
TOL = dict(rtol=2**-7, atol=2**-7)


def test_eight_threads_on_their_own_streams(seed):
    hidden, tokens = 4096, 257
    weight = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")

    def worker(i: int, barrier: threading.Barrier) -> None:
        stream = torch.cuda.Stream()
        gen = torch.Generator(device="cuda").manual_seed(seed + i)
        with torch.cuda.stream(stream):
            xs = [torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda", generator=gen) for _ in range(4)]
            barrier.wait()
            for _ in range(50):
                outs = [tkaot.quant.norm_forward(x, weight, 1e-6, with_rstd=True) for x in xs]
            stream.synchronize()
            for x, (out, rstd, _) in zip(xs, outs):
                ref, ref_rstd, _ = reference.norm_forward(x, weight, 1e-6, with_rstd=True)
                torch.testing.assert_close(out, ref, **TOL)
                torch.testing.assert_close(rstd, ref_rstd, rtol=1e-5, atol=0)

    run_on_threads(worker, 8)


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_million_launches_without_growth():
    from tkaot.registry import REGISTRY

    x = torch.randn(1, 7168, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(7168, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(x)
    for _ in range(10_000):  # settle allocator and caches
        tkaot.quant.norm_forward(x, w, 1e-6, out=out)
    torch.cuda.synchronize()
    gc.collect()
    modules_before = sum(len(k._modules) for k in REGISTRY._kernels.values())
    rss_before = _rss_bytes()
    for i in range(1_000_000):
        tkaot.quant.norm_forward(x, w, 1e-6, out=out)
        if i % 100_000 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    gc.collect()
    growth = _rss_bytes() - rss_before
    modules_after = sum(len(k._modules) for k in REGISTRY._kernels.values())
    assert modules_after == modules_before
    assert growth < 8 << 20, f"host memory grew by {growth / 2**20:.1f} MiB over 10**6 launches"
    ref, _, _ = reference.norm_forward(x, w, 1e-6)
    torch.testing.assert_close(out, ref, **TOL)


# ---- the compiled launcher against the ABI one, on the real driver ----------------------------------------

needs_compiled = pytest.mark.skipif(
    tkaot.launcher_kind() != "compiled", reason="the compiled launcher is not in use here (not built, or TKAOT_LAUNCHER=abi)"
)


class OneLauncher:
    """Swap the launcher an op cached under `key` for one of the given kind, and back."""

    def __init__(self, op_kernels, key):
        self.cache, self.key, self.args = op_kernels.cache, key, op_kernels.args
        self.active = self.cache[key]
        self.kernel = getattr(self.active, "__self__", self.active).kernel  # the compiled launcher is a bound method

    def use(self, kind: str):
        self.cache[self.key] = self.kernel.bind(self.args, kind)

    def restore(self):
        self.cache[self.key] = self.active


@needs_compiled
def test_both_launchers_write_the_same_bits(seed):
    from tkaot._moe.ops import _GATE
    from tkaot._quant.norm import _NORM

    dev = torch.cuda.current_device()
    # norm: every parameter type (pointers, f32 eps and scale, i32 dims and strides), a 3-D strided input
    x = torch.randn(3, 40, 7168 + 64, dtype=torch.bfloat16, device="cuda")[:, 3:, :7168]
    w, residual = torch.randn(7168, dtype=torch.bfloat16, device="cuda"), torch.randn(3, 37, 7168, dtype=torch.bfloat16, device="cuda")
    tkaot.quant.norm_forward(x, w, 1e-6, residual, with_rstd=True)  # loads and caches the launcher
    logits = torch.randn(61, 256, device="cuda")
    tkaot.moe.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0)
    swaps = [OneLauncher(_NORM, (dev, 7168, torch.bfloat16, True, True, True)), OneLauncher(_GATE, (dev, 256, 8))]
    results = {}
    try:
        for kind in ("abi", "compiled"):
            for s in swaps:
                s.use(kind)
            out, residual_out = torch.full_like(residual, float("nan")), torch.full_like(residual, float("nan"))
            _, rstd, _ = tkaot.quant.norm_forward(x, w, 1e-6, residual, 0.5, out=out, residual_out=residual_out, with_rstd=True)
            idx, weights = torch.full((61, 8), -1, dtype=torch.int64, device="cuda"), torch.full((61, 8), float("nan"), device="cuda")
            tkaot.moe.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0, out=(idx, weights))
            results[kind] = (out, residual_out, rstd, idx, weights)
    finally:
        for s in swaps:
            s.restore()
    torch.cuda.synchronize()
    for abi, compiled in zip(results["abi"], results["compiled"]):
        assert torch.equal(abi, compiled)
    out, residual_out, rstd, idx, weights = results["compiled"]
    ref_out, ref_rstd, ref_sum = reference.norm_forward(x, w, 1e-6, residual, 0.5, with_rstd=True)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(rstd, ref_rstd, rtol=1e-5, atol=0)
    assert torch.equal(residual_out, ref_sum)
    want = reference.moe.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0)
    assert torch.equal(idx, want.topk_idx)
    torch.testing.assert_close(weights, want.topk_weights, rtol=1e-5, atol=1e-6)


@needs_compiled
def test_a_thread_without_a_context_launches_both_ways():
    """A plain thread has no current CUDA context: the first launch fails with INVALID_CONTEXT, the
    launcher binds torch's context and launches again (the error path of each launcher)."""
    from tkaot._quant.norm import _NORM

    dev = torch.cuda.current_device()
    x = torch.randn(5, 4096, dtype=torch.bfloat16, device="cuda")
    tkaot.quant.norm_forward(x, None, 1e-6)
    swap = OneLauncher(_NORM, (dev, 4096, torch.bfloat16, False, False, False))
    outs, errors = {}, []
    try:
        for kind in ("abi", "compiled"):
            swap.use(kind)
            launcher, out = _NORM.cache[swap.key], torch.full_like(x, float("nan"))
            values = (x.data_ptr(), 0, 0, out.data_ptr(), 0, 0, 1e-6, 1.0, 1, 5, 0, 4096, 0, 0, 0, 4096, 0, 0)
            torch.cuda.synchronize()

            def run(launcher=launcher, values=values):
                try:
                    launcher(dev, 0, *values)  # the legacy default stream: nothing of torch's touched
                except BaseException as exc:
                    errors.append(exc)

            thread = threading.Thread(target=run)
            thread.start()
            thread.join()
            outs[kind] = out
    finally:
        swap.restore()
    torch.cuda.synchronize()
    assert not errors, errors[0]
    assert torch.equal(outs["abi"], outs["compiled"])
    torch.testing.assert_close(outs["compiled"], reference.norm_forward(x, None, 1e-6)[0], **TOL)


def test_the_compiled_launcher_is_used_where_it_is_built():
    import importlib.util

    if os.environ.get("TKAOT_LAUNCHER") == "abi" or importlib.util.find_spec("tkaot._launch") is None:
        assert tkaot.launcher_kind() == "abi"
    else:
        assert tkaot.launcher_kind() == "compiled"
