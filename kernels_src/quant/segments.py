"""The grid of the generic per-token kernels (per_token_cast_generic, cast_back_generic), whose row width is a
runtime value: a CTA of THREADS threads holds SLOTS row slots of SEG_THREADS threads, each thread one vector of a row
segment for ROWS tokens spaced SLOTS apart. The grid's x runs along the row segments and y, then z, down the token
blocks (at most GRID_YZ a dimension), so no thread divides by a runtime value.
"""

import tilelang.language as T

THREADS = 128
SEG_THREADS = 64  # threads a row segment: a row of 8192 bf16 values is 16 segments of 8-element vectors, of 7168 14
ROWS = 4  # tokens a thread (the specialised tilings' 4, so as many loads in flight)
SLOTS = THREADS // SEG_THREADS
ROWS_PER_CTA = SLOTS * ROWS
GRID_YZ = 65535  # the most CTAs a grid's y (and z) dimension holds


def segment_dims():
    """The runtime (num_tokens, hidden, x_stride, sf_stride) both kernels take."""
    return T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("x_stride"), T.dynamic("sf_stride")


def segment_grid(num_tokens, hidden, vec: int) -> tuple:
    """The grid (x, y, z) over rows of `hidden` elements cut into segments of SEG_THREADS vectors of `vec`."""
    token_blocks = T.ceildiv(num_tokens, ROWS_PER_CTA)
    return T.ceildiv(hidden, SEG_THREADS * vec), T.min(token_blocks, GRID_YZ), T.ceildiv(token_blocks, GRID_YZ)


def segment_place(bx, by, bz, tid, vec: int) -> tuple:
    """(the thread's first token, the first column of its vector in every one of its rows)."""
    return (bz * GRID_YZ + by) * ROWS_PER_CTA + tid // SEG_THREADS, (bx * SEG_THREADS + tid % SEG_THREADS) * vec
