"""The generic per-token cast for Ascend: per_token_cast with the row width `hidden` a runtime value.

The Ascend per_token_cast's builder (kernels_src/ascend/per_token_cast.py) with hidden a runtime value: a block
takes a segment of SEGMENT columns of its rows (the last one clipped to the row). A row may end inside a group
(hidden is a multiple of 64, not always of the group: such rows are this kernel's alone); that group's amax is
taken over its columns in the row, and its scale factor stored like any other. Every amax, scale factor and
rounded value is the specialised kernel's expression on the same inputs (an amax is a maximum, nothing is
summed), so both write the same bytes.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.per_token_cast import REQUIRES, per_token_cast_kernel
from tkaot._quant.kernels import PER_TOKEN_CAST_GENERIC

DECL = PER_TOKEN_CAST_GENERIC
REQUIRES = dict(REQUIRES)
SEGMENT = 1024  # columns a block takes: a multiple of every group and input block width
# The group and the sf layout are runtime values here too, so the variants that differ only in them share one
# kernel (build_tools/ascend.py: each variant's entry fixes their values): a quarter of the default set's lowerings
RUNTIME_AXES = ("group", "sf_layout")


def unsupported(in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(in_dtype, in_block, in_sf, fmt, sf, mode, stochastic):
    group, sf_layout = T.dynamic("group"), T.dynamic("sf_layout")
    return per_token_cast_kernel(T.dynamic("hidden"), SEGMENT, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic)
