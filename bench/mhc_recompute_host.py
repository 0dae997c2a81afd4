"""Host cost of tkaot.mhc.mhc_multilayer_recompute per call, without a GPU: meta tensors stand in for CUDA ones and a
no-op stands in for the launcher, so what is timed is the op's own Python (checks of every layer's tensors, the
address list) plus building the int64 table (recompute.pointer_table; on a GPU the op also pins it and
copies it to the device asynchronously, which bench/run.py's host timing on a GPU includes).

    python -m bench.mhc_recompute_host
"""

from __future__ import annotations

import time

import torch

import tkaot
from tkaot import _op
from tkaot._mhc import recompute


def _args(layers: int, tokens: int = 1, m: int = 4, hidden: int = 7168):
    def t(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device="meta")

    return (
        t(tokens, m, hidden, dtype=torch.bfloat16),
        [t(tokens, m, 1) for _ in range(layers)],
        [t(tokens, hidden, dtype=torch.bfloat16) for _ in range(layers)],
        [t(tokens, m, 1) for _ in range(layers)],
        [t(tokens, m, m) for _ in range(layers)],
        [t(tokens, hidden, dtype=torch.bfloat16) for _ in range(layers)],
        [t(tokens, m, hidden, dtype=torch.bfloat16) for _ in range(layers)],
    )


def _per_call_us(fn, repeats: int = 2000) -> float:
    for _ in range(100):
        fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1e6


def main() -> None:
    torch.Tensor.get_device = lambda self: 0  # meta tensors read as CUDA device 0
    _op.OpKernels.get = lambda self, device, *values, **kw: lambda *args: None  # the launch: a no-op
    recompute.current_stream = lambda device: 0
    for layers in (1, 4, 16, 61):
        args = _args(layers)
        addresses = [0] * (6 * layers)
        op = _per_call_us(lambda args=args: tkaot.mhc.mhc_multilayer_recompute(*args))
        table = _per_call_us(lambda addresses=addresses: recompute.pointer_table(addresses, torch.device("cpu")))
        print(f"{layers:3d} layers: {op:6.1f} us per call, of which the table tensor {table:5.1f} us ({6 * layers} addresses)")


if __name__ == "__main__":
    main()
