"""How a row-wise cast kernel spreads (tokens x vectors) over a CTA (static description, no TileLang).

A CTA of `threads` threads covers `rows_per_cta` tokens by `seg_vecs` vectors of
one row: threads [slot * tpr, (slot + 1) * tpr) hold row slot `slot`, each the
`cols` vectors t, t + tpr, ... of the segment, for `rows` tokens spaced `slots`
apart. Every address is then a constant offset from the thread's first one plus
a multiple of the row stride, so the kernel does no division per vector, and
each thread keeps rows * cols 16-byte loads in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RowTiling:
    threads: int  # threads per CTA
    rows: int  # tokens a thread holds
    cols: int  # vectors of one row a thread holds

    def threads_per_row(self, vecs_per_row: int, lanes: int = 1) -> int:
        """Threads spanning one row segment: a power of two dividing the row, a multiple of `lanes`."""
        tpr = math.gcd(vecs_per_row // self.cols if vecs_per_row % self.cols == 0 else 1, self.threads)
        if vecs_per_row % (tpr * self.cols) or tpr % lanes:
            raise ValueError(f"tiling {self} does not fit rows of {vecs_per_row} vectors in groups of {lanes} lanes")
        return tpr

    @staticmethod
    def parse(text: str) -> RowTiling:
        """'t128r4c1' -> RowTiling(128, 4, 1)."""
        t, rest = text[1:].split("r")
        r, c = rest.split("c")
        return RowTiling(int(t), int(r), int(c))
