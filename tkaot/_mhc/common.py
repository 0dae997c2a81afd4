"""Pieces of the mHC ops' input declarations (tkaot/_validate.py) that several ops share."""

from __future__ import annotations

import torch

from tkaot._mhc.kernels import MAX_MHC
from tkaot._op import OpKernels, current_stream
from tkaot._validate import Rule, Tensor

__all__ = [
    "BF16", "F32", "MAX_I24", "current_stream", "elements_rule", "f32", "float_rule", "hidden_rule", "int_rules", "is_int",
    "launcher", "like", "mhc_rule",
]  # fmt: skip

F32, BF16 = torch.float32, torch.bfloat16
MAX_I24 = 2**24  # integers a float32 holds exactly


def is_int(name: str) -> str:
    """The check that an argument is an int (not a bool)."""
    return f"type({name}) is int or (isinstance({name}, int) and not isinstance({name}, bool))"


def int_rules(name: str, low: str, high: str, after: str = "") -> tuple[Rule, Rule]:
    """An int argument in [low, high] (expressions)."""
    return (
        Rule(name, is_int(name), "an int", error="TypeError", after=after),
        Rule(name, f"{low} <= {name} <= {high}", f"in [{{{low}}}, {{{high}}}]", after=after),
    )


def float_rule(name: str) -> Rule:
    """A real-number argument (an int or float, not a bool): it travels to the kernel as float32."""
    return Rule(name, f"isinstance({name}, (int, float)) and not isinstance({name}, bool)", "a float", error="TypeError")


def f32(name: str, shape: tuple, **kw) -> Tensor:
    """A contiguous float32 tensor of one shape."""
    return Tensor(name, (F32,), (shape,), layout="contiguous", **kw)


def like(name: str, other: str) -> Tensor:
    """A contiguous tensor of another one's dtype and shape."""
    return Tensor(name, other, other, layout="contiguous")


# ---- the rules and the launch of the kernels keyed by the expansion rate alone (expand, pre-apply mix, split
# mixes, Sinkhorn, post)


def mhc_rule(tensor: str) -> Rule:
    """The expansion rate, bound as `mhc` from `tensor`'s shape, is one the kernels are written for."""
    return Rule(
        tensor, f"1 <= mhc <= {MAX_MHC}", f"of an expansion rate (mhc_mult) in [1, {MAX_MHC}]",
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


def launcher(kernels: OpKernels, device: int, mhc: int):
    """The kernel's launcher for one device and expansion rate (cached after the first call)."""
    found = kernels.cache.get((device, mhc))
    return found if found is not None else kernels.get(device, mhc)
