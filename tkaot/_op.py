"""Per-op kernel lookup: static values -> a bound Launcher, cached after the first call.

Every op keeps one OpKernels. The first call with new static values goes
through the registry (and may raise VariantNotBuilt); later calls are one
dict lookup.

Where the specialised variant of a call is not built but its kernel has a generic one
(tkaot/_decl.py, KernelDecl.generic) that is, the generic variant is bound instead, its
runtime axes fixed to the call's values, so the op launches it with the same arguments.
The fallback warns once per variant and process, naming the command that builds the
specialised variant; TKAOT_STRICT=1 refuses it (VariantNotBuilt). Static values no specialised
variant can have (KernelDecl.specialisable) go to the generic variant directly: no warning, and
TKAOT_STRICT does not apply, as nothing faster could be built.
"""

from __future__ import annotations

import os
import threading
import warnings

import torch

from tkaot._ascend import with_npu_streams
from tkaot._decl import KernelDecl, build_command, generic_kernel
from tkaot._kernel import Launcher
from tkaot._validate import Signature, lazy_checker
from tkaot.errors import GenericVariantWarning, VariantNotBuilt
from tkaot.registry import REGISTRY

# Ascend hook (tkaot/_ascend.py): unchanged unless torch_npu is installed, then it also serves NPU device codes
current_stream = with_npu_streams(getattr(torch._C, "_cuda_getCurrentRawStream", None))
STRICT_ENV = "TKAOT_STRICT"

# (arch, kernel, key) of the specialised variants whose fallback has been announced in this process
_WARNED: set[tuple[str, str, str]] = set()
_WARNED_LOCK = threading.Lock()


def strict() -> bool:
    """Whether TKAOT_STRICT forbids falling back to generic variants (1), or allows it (0 or unset)."""
    choice = os.environ.get(STRICT_ENV, "")
    if choice not in ("", "0", "1"):
        raise ValueError(f"{STRICT_ENV}={choice!r}: use 1 (a missing specialised variant raises), 0 or leave it unset")
    return choice == "1"


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
        neither built, the kernel's generic variant serves the call (see the module's docstring); without that,
        VariantNotBuilt names the asked variant."""
        launcher = self.cache.get((device, *values))
        if launcher is None:
            if not self.decl.can_specialise(values):
                launcher = self._generic_only(device, values)
            else:
                try:
                    launcher = REGISTRY.kernel(self.op, self.kernel, self.key(values), device).bind(self.args)
                except VariantNotBuilt as missing:
                    general = self._general(device, values, general_tiling)
                    launcher = general.bind(self.args) if general else self._generic(device, values, missing)
            self.cache[(device, *values)] = launcher
        return launcher

    def _generic_only(self, device: int, values: tuple) -> Launcher:
        """The generic variant's launcher for values no specialised variant can have; VariantNotBuilt names the
        generic variant when it is not built."""
        generic = generic_kernel(self.kernel)
        static, fixed = generic.split(self.decl, values)
        return REGISTRY.kernel(self.op, generic.name, generic.key(static), device).bind(self.args, fixed=fixed)

    def _general(self, device: int, values: tuple, general_tiling: str | None):
        """The general tiling's variant of `values`, if there is one and it is built."""
        if general_tiling is None or general_tiling == values[-1]:
            return None
        try:
            return REGISTRY.kernel(self.op, self.kernel, self.key((*values[:-1], general_tiling)), device)
        except VariantNotBuilt:
            return None

    def _generic(self, device: int, values: tuple, missing: VariantNotBuilt) -> Launcher:
        """The generic variant's launcher for a call whose specialised variant is `missing`, or raise `missing`.
        Where the specialised kernel's axes refuse the call's values (a generic kernel may take more: any multiple
        of 64 for swiglu's hidden, where its tilings need 256), no specialised variant can be built, and the
        warning and TKAOT_STRICT's error say so instead of naming a build command."""
        generic = generic_kernel(self.kernel)
        if generic is None:
            raise missing
        unbuildable = self._unbuildable(values)
        if strict():
            if unbuildable:
                raise VariantNotBuilt(
                    missing.op, missing.kernel, missing.key, missing.nearest,
                    f"(none: {unbuildable}; only the generic {generic.name}, which TKAOT_STRICT=1 refuses, serves it)",
                    missing.searched,
                )  # fmt: skip
            raise missing
        static, fixed = generic.split(self.decl, values)
        try:
            kernel = REGISTRY.kernel(self.op, generic.name, generic.key(static), device)
        except VariantNotBuilt:
            raise missing from None
        arch = REGISTRY.device_arch(device)
        with _WARNED_LOCK:
            first = (arch, self.kernel, missing.key) not in _WARNED
            _WARNED.add((arch, self.kernel, missing.key))
        if first:
            launching = f"launching the generic {generic.name} [{kernel.key}] instead"
            if unbuildable:
                message = (
                    f"{self.op}: no specialised {self.kernel} variant can serve [{missing.key}] ({unbuildable}); "
                    f"{launching} (TKAOT_STRICT=1 makes this an error)."
                )
            else:
                message = (
                    f"{self.op}: no specialised {self.kernel} variant [{missing.key}] is built for {arch}; {launching} "
                    f"(same results, slower). Build the specialised one with:\n    {build_command(self.kernel, missing.key, arch)}\n"
                    f"and put the output directory on TKAOT_PATH (TKAOT_STRICT=1 makes this an error)."
                )
            warnings.warn(message, GenericVariantWarning, stacklevel=3)
        return kernel.bind(self.args, fixed=fixed)

    def _unbuildable(self, values: tuple) -> str:
        """Why the specialised kernel's axes refuse these static values (no variant of it can be built), or ""."""
        for axis, value in zip(self.decl.axes, values):
            try:
                axis.validate(value)
            except ValueError as refused:
                return str(refused)
        return ""


def op_parts(namespace: dict, *ops: tuple[Signature, KernelDecl]) -> tuple[tuple, ...]:
    """For each (signature, kernel) of an op module (namespace: its globals()): the signature's lazy checker, which puts
    the checker in its own place in `namespace` at the first call (tkaot/_validate.py), and the kernel's OpKernels for
    the signature's op."""
    return tuple((lazy_checker(sig, namespace), OpKernels(sig.op, decl)) for sig, decl in ops)
