"""Helpers shared by the test modules (CPU and GPU)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_on_threads(worker: Callable[[int, threading.Barrier], None], count: int = 8) -> None:
    """Call worker(i, barrier) for i in range(count), each on a thread of its own, and wait for all of them.

    barrier (count parties) lets the workers start their real work at the same moment; the first
    exception a worker raised fails the calling test.
    """
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        try:
            worker(i, barrier)
        except BaseException as exc:  # reported on the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
