"""The launch path under load: many threads on their own streams, and a million launches without growth."""

import gc
import os
import threading

import pytest
import torch

import tkaot
from tkaot import reference

pytestmark = pytest.mark.gpu
TOL = dict(rtol=2**-7, atol=2**-7)


def test_eight_threads_on_their_own_streams(seed):
    hidden, tokens = 4096, 257
    weight = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
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
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


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
