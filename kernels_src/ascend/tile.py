"""Tile sizing shared by the Ascend kernels: how many rows of a given width a block holds in the Unified Buffer."""

# Unified Buffer bytes a kernel's tiles may take: half of what a 950 vector core has, so TileLang's own
# scratch and any double buffering fit beside them
UB_BUDGET = 96 * 1024
MAX_ROWS = 16


def rows_per_block(row_bytes: int, buffers: int) -> int:
    """The largest power of two of rows (at most MAX_ROWS) whose `buffers` row-sized tiles fit UB_BUDGET."""
    rows = MAX_ROWS
    while rows > 1 and rows * row_bytes * buffers > UB_BUDGET:
        rows //= 2
    return rows


def chunk(width: int, most: int = 256) -> int:
    """The largest power of two up to `most` that divides `width`: the columns a SIMT pass takes at a time."""
    c = most
    while width % c:
        c //= 2
    return c


def segment(width: int, unit: int, col_bytes: float) -> int:
    """Columns of a `width`-wide row a block takes: the widest run of whole `unit`s that divides the row and whose
    `col_bytes` a column fit UB_BUDGET (one unit where none does)."""
    units = width // unit
    fits = [d for d in range(1, units + 1) if units % d == 0 and d * unit * col_bytes <= UB_BUDGET]
    return max(fits, default=1) * unit
