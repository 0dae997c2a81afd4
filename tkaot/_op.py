"""Per-op kernel lookup: static values -> a bound Launcher, cached after the first call.

Every op keeps one OpKernels. The first call with new static values goes
through the registry (and may raise VariantNotBuilt); later calls are one
dict lookup.
"""

from __future__ import annotations

import torch

from tkaot._decl import KernelDecl
from tkaot._kernel import Launcher
from tkaot.errors import VariantNotBuilt
from tkaot.registry import REGISTRY

current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class OpKernels:
    """The launchers of one kernel for one op, keyed by (device, *static values in the declaration's axis order)."""

    def __init__(self, op: str, decl: KernelDecl):
        if op not in decl.ops:
            raise ValueError(f"{op} is not among the ops kernel {decl.name} declares: {decl.ops}")
        self.op, self.decl, self.kernel, self.args = op, decl, decl.name, decl.args
        # (device, *values) -> Launcher; ops may also key it by their own hashable fast-path tuple
        self.cache: dict[tuple, Launcher] = {}

    def key(self, values: tuple) -> str:
        return self.decl.key(values)

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
