"""What the mHC ops share: their rules on the expansion rate, the hidden size and scalar arguments, and the
launch of a kernel keyed by the expansion rate alone."""

from __future__ import annotations

import torch

from tkaot._mhc.kernels import MAX_MHC
from tkaot._op import OpKernels, current_stream
from tkaot._validate import Rule

BF16, F32 = torch.bfloat16, torch.float32


def mhc_rule(tensor: str) -> Rule:
    """The expansion rate, bound from `tensor`'s shape, is one the kernels are written for."""
    return Rule(
        tensor, f"1 <= mhc <= {MAX_MHC}", f"of an expansion rate (mhc) in [1, {MAX_MHC}]",
        actual=f"f'shape {{tuple(h_{tensor})}}'", after=tensor,
    )  # fmt: skip


def hidden_rule(tensor: str) -> Rule:
    """Rows are read as 16-byte vectors of 8 bf16: the hidden size is a multiple of 8."""
    return Rule(
        tensor, "hidden % 8 == 0", "of a hidden size that is a multiple of 8 (16-byte rows)",
        actual=f"f'shape {{tuple(h_{tensor})}}'", after=tensor,
    )  # fmt: skip


def elements_rule(tensor: str, count: str) -> Rule:
    """The kernels number `count` elements in 32-bit arithmetic."""
    return Rule(tensor, f"{count} <= _MAX_I32", "below 2**31 elements", actual=f"f'shape {{tuple(h_{tensor})}}'", after=tensor)


def real_rule(name: str) -> Rule:
    """A float argument: an int or a float, not a bool."""
    check = f"type({name}) is float or type({name}) is int or (isinstance({name}, (int, float)) and not isinstance({name}, bool))"
    return Rule(name, check, "a float", error="TypeError")


def int_rules(name: str, low: int) -> tuple[Rule, Rule]:
    """An int argument (not a bool) in [low, 2**31 - 1]."""
    is_int = f"type({name}) is int or (isinstance({name}, int) and not isinstance({name}, bool))"
    return (
        Rule(name, is_int, "an int", error="TypeError"),
        Rule(name, f"{low} <= {name} <= _MAX_I32", f"in [{low}, 2**31 - 1]"),
    )


def launcher(kernels: OpKernels, device: int, mhc: int):
    """The kernel's launcher for one device and expansion rate (cached after the first call)."""
    found = kernels.cache.get((device, mhc))
    return found if found is not None else kernels.get(device, mhc)


__all__ = ["BF16", "F32", "current_stream", "elements_rule", "hidden_rule", "int_rules", "launcher", "mhc_rule", "real_rule"]
