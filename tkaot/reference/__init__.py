"""Pure-torch references of tkaot's ops: the meaning the kernels are tested against."""

from tkaot.reference.norm import norm_forward

__all__ = ["norm_forward"]
