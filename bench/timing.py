"""Timing primitives: device time by CUDA-graph replay (or events), host time per call, the copy ceiling."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def _events_ms(fn: Callable[[], None], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def device_us(call: Callable[[dict], object], inputs: list[dict], reps: int = 30, calls_per_replay: int | None = None) -> tuple[float, str]:
    """(median device µs per call, "graph" or "events"): a CUDA graph of calls over rotating inputs, replayed `reps` times.

    Falls back to event-timed eager loops if the callable cannot be captured.
    """
    n = calls_per_replay or max(len(inputs), 8)
    for i in range(3):  # warm up: module loads, JIT compiles, allocator
        call(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            for i in range(n):  # warm the capture stream too
                call(inputs[i % len(inputs)])
            stream.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                for i in range(n):
                    call(inputs[i % len(inputs)])
        graph.replay()
        torch.cuda.synchronize()
        times = _events_ms(graph.replay, reps)
        mode = "graph"
    except Exception:
        torch.cuda.synchronize()

        def loop():
            for i in range(n):
                call(inputs[i % len(inputs)])

        times = _events_ms(loop, reps)
        mode = "events"
    return statistics.median(times) * 1000.0 / n, mode


def host_us(
    call: Callable[[], object], n: int = 20000, rounds: int = 5, chunk: int = 200, stat=statistics.median, clock=time.perf_counter_ns
) -> float:
    """Host µs per call of `call`: `stat` (the median) over `rounds` loops of `n` calls.

    The calls run in chunks of `chunk`, the device drained between chunks and only the calls timed, so the
    launch queue never fills: a figure is the host's own cost, never a wait on the GPU. `clock`: wall time by
    default; time.thread_time_ns counts only this thread's CPU time (the driver's work in the launch included), which
    a busy or preempting host disturbs far less."""
    for _ in range(200):
        call()
    torch.cuda.synchronize()
    results = []
    for _ in range(rounds):
        spent = 0
        for _ in range(n // chunk):
            t0 = clock()
            for _ in range(chunk):
                call()
            spent += clock() - t0
            torch.cuda.synchronize()
        results.append(spent / (n // chunk * chunk) / 1000.0)
    return stat(results)


def copy_ceiling_tbps(nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth (bytes read + bytes written) in TB/s."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = _events_ms(lambda: dst.copy_(src), reps)
    return 2 * nbytes / (statistics.median(times) * 1e-3) / 1e12
