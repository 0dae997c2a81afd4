"""The generic cast back for Ascend: cast_back with the row width `hidden` a runtime value.

The Ascend cast_back's builder (kernels_src/ascend/cast_back.py) with hidden a runtime value: a block takes a
segment of SEGMENT columns of its rows (the last one clipped to the row). Every element is its data times its
block's scale factor in fp32, rounded once, the specialised kernel's expression, so both write the same bytes.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.cast_back import REQUIRES, cast_back_kernel
from tkaot._quant.kernels import CAST_BACK_GENERIC

DECL = CAST_BACK_GENERIC
REQUIRES = dict(REQUIRES)
SEGMENT = 1024  # columns a block takes: a multiple of every block width
# The input block is a runtime value too (its index among the axis's choices), so the variants that differ only in
# it share one kernel (build_tools/ascend.py: each variant's entry fixes its value)
RUNTIME_AXES = ("in_block",)


def unsupported(in_dtype, in_block, in_sf, out_dtype) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    return None


def build(in_dtype: str, in_sf: str, out_dtype: str):
    return cast_back_kernel(T.dynamic("hidden"), SEGMENT, in_dtype, T.dynamic("in_block"), in_sf, out_dtype)
