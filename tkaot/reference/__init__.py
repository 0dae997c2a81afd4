"""Pure-torch references of tkaot's ops: the meaning the kernels are tested against.

The reference of an op takes the op's arguments, bound by the op's own signature (takes_arguments_of):
its def names the ones it needs; the defaults are the op's.
"""

from tkaot.reference import (
    fused,  # noqa: F401
    mhc,  # noqa: F401
)
from tkaot.reference.norm import norm_forward
from tkaot.reference.rope import apply_rotary

__all__ = ["norm_forward", "apply_rotary"]
from tkaot.reference import (
    backward,  # noqa: E402,F401
    engram,  # noqa: E402,F401
    quant,  # noqa: E402,F401
)
from tkaot.reference import moe as moe  # noqa: E402 (explicit re-export)
