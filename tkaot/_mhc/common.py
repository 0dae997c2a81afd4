"""Pieces of the mHC ops' input declarations (tkaot/_validate.py) that several ops share."""

from __future__ import annotations

import torch

from tkaot._validate import Rule, Tensor

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
