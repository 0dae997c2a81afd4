"""Per-op kernel lookup: static values -> a bound Launcher, cached after the first call.

Every op keeps one OpKernels. The first call with new static values goes
through the registry (and may raise VariantNotBuilt); later calls are one
dict lookup.
"""

from __future__ import annotations

import torch

from tkaot._kernel import Launcher
from tkaot.registry import REGISTRY

current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class OpKernels:
    """The launchers of one kernel for one op, keyed by (device, *static values in axis order)."""

    def __init__(self, op: str, kernel: str, axes: tuple[str, ...], args: tuple[str, ...]):
        self.op, self.kernel, self.axes, self.args = op, kernel, axes, args
        # (device, *values) -> Launcher; ops may also key it by their own hashable fast-path tuple
        self.cache: dict[tuple, Launcher] = {}

    def key(self, values: tuple) -> str:
        return ",".join(f"{a}={_text(v)}" for a, v in zip(self.axes, values))

    def get(self, device: int, *values) -> Launcher:
        launcher = self.cache.get((device, *values))
        if launcher is None:
            launcher = REGISTRY.kernel(self.op, self.kernel, self.key(values), device).bind(self.args)
            self.cache[(device, *values)] = launcher
        return launcher
