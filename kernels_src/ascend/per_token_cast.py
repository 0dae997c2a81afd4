"""Per-token cast to FP8 E4M3 for Ascend: one scale factor per `group` columns of a row.

A block takes `rows` tokens into the Unified Buffer; in a SIMT region each thread takes (row, group) pairs,
finds the group's largest magnitude and forms its scale factor and inverse with the CUDA kernels' own
expressions (kernels_src/quant/common.py: clamp, division, power-of-two rounding), then every element is
scaled by its group's inverse and rounded to E4M3. Built for bf16 / fp32 inputs, row-major fp32 or
power-of-two scale factors, mode "cast" without stochastic rounding; other values of the declaration's axes
are not built for Ascend yet (`unsupported` says why).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.tile import chunk, rows_per_block
from kernels_src.quant.common import scale_factor
from tkaot._quant.kernels import PER_TOKEN_CAST

DECL = PER_TOKEN_CAST
REQUIRES: dict[str, int] = {}
THREADS = 128


def unsupported(hidden, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if in_dtype not in ("bfloat16", "float32") or in_block != "none" or in_sf != "none":
        return "bf16 / fp32 inputs only"
    if fmt != "e4m3":
        return "E4M3 output only"
    if sf not in ("fp32", "pow2") or sf_layout != "row":
        return "row-major fp32 or pow2 scale factors only"
    if mode != "cast" or stochastic:
        return "mode=cast with round-to-nearest only"
    if hidden % group:
        return f"hidden={hidden} is not a multiple of group={group}"
    return None


def build(hidden, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic):
    why = unsupported(hidden, in_dtype, in_block, in_sf, fmt, group, sf, sf_layout, mode, stochastic)
    if why:
        raise ValueError(f"{DECL.name} for Ascend: {why}")
    elem = 2 if in_dtype == "bfloat16" else 4
    rows = rows_per_block(hidden * (elem + 1), 2)
    groups = hidden // group
    cols = chunk(hidden)

    num_tokens = T.dynamic("num_tokens")
    x_stride, sf_stride, in_sf_stride = T.dynamic("x_stride"), T.dynamic("sf_stride"), T.dynamic("in_sf_stride")

    @T.prim_func
    def per_token_cast(
        x: T.StridedTensor[(num_tokens, hidden), (x_stride, 1), in_dtype],
        x_sf: T.StridedTensor[(num_tokens, 1), (in_sf_stride, 1), T.float32],
        out: T.Tensor[(num_tokens, hidden), T.float8_e4m3fn],
        out_sf: T.StridedTensor[(num_tokens, groups), (sf_stride, 1), T.float32],
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows)) as block:
            row = block * rows
            x_ub = T.alloc_shared((rows, hidden), in_dtype)
            out_ub = T.alloc_shared((rows, hidden), T.float8_e4m3fn)
            sf_ub = T.alloc_shared((rows, groups), T.float32)
            inv_ub = T.alloc_shared((rows, groups), T.float32)
            T.copy(x[row : row + rows, :], x_ub)
            with T.SimtVF(threads=THREADS):
                amax = T.alloc_local((1,), T.float32)  # each thread's running maximum
                # (row, group) pairs dealt round-robin to all threads: one uniform loop, no partial barrier
                for t in T.Parallel(THREADS):
                    for w in T.serial(T.ceildiv(rows * groups, THREADS)):
                        pair = w * THREADS + t
                        if pair < rows * groups:
                            i, g = pair // groups, pair % groups
                            amax[0] = T.float32(0)
                            for j in T.serial(group):
                                amax[0] = T.max(amax[0], T.abs(T.cast(x_ub[i, g * group + j], "float32")))
                            stored, inv = scale_factor(amax[0], fmt, sf)
                            sf_ub[i, g] = stored
                            inv_ub[i, g] = inv
                for k in T.serial(hidden // cols):
                    for i, j in T.Parallel(rows, cols):
                        c = k * cols + j
                        out_ub[i, c] = T.cast(T.cast(x_ub[i, c], "float32") * inv_ub[i, c // group], T.float8_e4m3fn)
            T.copy(out_ub, out[row : row + rows, :])
            T.copy(sf_ub, out_sf[row : row + rows, :])

    return per_token_cast
