"""How a row-wise cast kernel spreads (tokens x vectors) over a CTA (static description, no TileLang).

A CTA of `threads` threads covers `rows_per_cta` tokens by `seg_vecs` vectors of
one row: threads [slot * tpr, (slot + 1) * tpr) hold row slot `slot`, each the
`cols` vectors t, t + tpr, ... of the segment, for `rows` tokens spaced `slots`
apart. Every address is then a constant offset from the thread's first one plus
a multiple of the row stride, so the kernel does no division per vector, and
each thread keeps rows * cols loads of at most `vec_bytes` bytes in flight.

`walk` orders the CTAs: "tokens" runs blockIdx.x down the tokens of one row
segment (the CTAs resident at once then touch a few KB of every row, thousands
of strided pieces), "hidden" numbers CTAs along the row first (one flat grid),
so the resident CTAs cover one contiguous band of rows, as a flat copy does.

`one_scale`: when a thread's vectors are no more than the lanes sharing a group,
each group's scale factor is formed by one lane and fetched by the others with
a shuffle, instead of by every lane for every vector (per_token_cast only).

`fp4`: per_token_cast casts bf16 to FP4 by the word helpers of fp4_words (eight
codes a call, fewer instructions a value) rather than the TIR expressions of
common.e2m1_code, and checks no token in CTAs whose tokens are all in range.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_TEXT = re.compile(r"t(\d+)r(\d+)c(\d+)(?:v(\d+))?(h?)(s?)(f?)")


@dataclass(frozen=True)
class RowTiling:
    threads: int  # threads per CTA
    rows: int  # tokens a thread holds
    cols: int  # vectors of one row a thread holds
    vec_bytes: int = 16  # most input bytes one vector load reads
    walk: str = "tokens"  # "tokens" or "hidden": which way consecutive CTAs go
    one_scale: bool = False  # one lane forms each group's scale factor
    fp4: bool = False  # bf16 -> FP4 by the fp4_words helpers, full CTAs unchecked (per_token_cast)

    def threads_per_row(self, vecs_per_row: int, lanes: int = 1) -> int:
        """Threads spanning one row segment: a power of two dividing the row, a multiple of `lanes`."""
        tpr = math.gcd(vecs_per_row // self.cols if vecs_per_row % self.cols == 0 else 1, self.threads)
        if vecs_per_row % (tpr * self.cols) or tpr % lanes:
            raise ValueError(f"tiling {self} does not fit rows of {vecs_per_row} vectors in groups of {lanes} lanes")
        return tpr

    def grid(self, row_ctas, segs: int) -> tuple:
        """The launch grid for `row_ctas` CTAs down the tokens by `segs` row segments."""
        return (row_ctas * segs, 1) if self.walk == "hidden" else (row_ctas, segs)

    def block(self, gx, gy, segs: int) -> tuple:
        """(token block, row segment) of the CTA at grid position (gx, gy)."""
        return (gx // segs, gx % segs) if self.walk == "hidden" else (gx, gy)

    def origin(self, gx, gy, tid, tpr: int, segs: int) -> tuple:
        """(first token, first vector of the row) of thread `tid` in the CTA at (gx, gy), `tpr` threads a row
        segment: its vector u is vector first + u % cols * tpr of token first + u // cols * (threads // tpr)."""
        bx, by = self.block(gx, gy, segs)
        return bx * (self.threads // tpr * self.rows) + tid // tpr, by * (tpr * self.cols) + tid % tpr

    def __str__(self) -> str:
        vec = "" if self.vec_bytes == 16 else f"v{self.vec_bytes}"
        fp4 = "f" if self.fp4 else ""
        return f"t{self.threads}r{self.rows}c{self.cols}{vec}{'h' if self.walk == 'hidden' else ''}{'s' if self.one_scale else ''}{fp4}"

    @staticmethod
    def parse(text: str) -> RowTiling:
        """'t128r4c1' -> RowTiling(128, 4, 1); suffixes: 'v8' 8-byte vectors, 'h' walk="hidden", 's' one_scale, 'f' fp4."""
        m = _TEXT.fullmatch(text)
        if m is None:
            raise ValueError(f"not a row tiling: {text!r} (want t<threads>r<rows>c<cols>[v<bytes>][h][s][f])")
        t, r, c, v, h, s, f = m.groups()
        return RowTiling(int(t), int(r), int(c), int(v or 16), "hidden" if h else "tokens", bool(s), bool(f))
