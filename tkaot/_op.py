"""Per-op kernel lookup: static values -> a bound Launcher, cached after the first call.

Every op keeps one OpKernels. The first call with new static values goes
through the registry (and may raise VariantNotBuilt); later calls are one
dict lookup.
"""

from __future__ import annotations

import torch

from tkaot._kernel import Launcher
from tkaot.errors import VariantNotBuilt
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

    def get(self, device: int, *values, general_tiling: str | None = None) -> Launcher:
        """The launcher for `values`. `general_tiling` names a tiling (the last static value) that serves every call
        the asked one serves: where the asked variant is not built but the general one is (a set built before the
        op specialised, or a hand-written shape set), the general one is launched, cached under `values`. With
        neither built, VariantNotBuilt names the asked variant."""
        launcher = self.cache.get((device, *values))
        if launcher is None:
            try:
                kernel = REGISTRY.kernel(self.op, self.kernel, self.key(values), device)
            except VariantNotBuilt as missing:
                if general_tiling is None or general_tiling == values[-1]:
                    raise
                try:
                    kernel = REGISTRY.kernel(self.op, self.kernel, self.key((*values[:-1], general_tiling)), device)
                except VariantNotBuilt:
                    raise missing from None
            launcher = self.cache[(device, *values)] = kernel.bind(self.args)
        return launcher
