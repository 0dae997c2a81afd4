"""What every Ascend kernel module says the same way: the module that takes every value its declaration allows
(`REQUIRES`, `unsupported`), the refusal a builder raises for a value it does not build, and the grid of blocks
that each take a run of `width` elements. Plain Python over TileLang expressions: nothing here names a buffer or a
variable of the lowered kernel, so a kernel written with these lowers as it did written out.
"""

from tilelang.ascend import language as T

REQUIRES: dict[str, int] = {}  # no runtime value is refused


def unsupported(**static) -> str | None:
    """None: every static value the declaration allows is built."""
    return None


def refuse(decl, why: str | None) -> None:
    """Raise, naming the kernel, when `why` (a module's `unsupported`) says a builder was given values it does not build."""
    if why:
        raise ValueError(f"{decl.name} for Ascend: {why}")


def runs(count, width: int):
    """A grid of blocks over `count` elements, `width` a block: (the block count, the first element of `block`)."""
    return T.ceildiv(count, width), lambda block: block * width
