"""What the Ascend kernel modules write the same way: the answers of a module that takes every value its declaration
allows (`REQUIRES`, `unsupported`), the refusal a builder raises for a value it does not build, the cast modules'
builder (that refusal, then the kernel over whole rows), argument types as factories, a block's place in a two-level
grid, a tile staged into the Unified Buffer and a column's split-K sum.

A tile or variable made here is named by the kernel statement that takes it, and a macro here is given Vars only
under their own names (TileLang names a Var after the macro parameter it is bound to), so a kernel written with these
lowers to the TIR it had written out.
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


def whole_row_build(decl, unsupported, kernel):
    """A cast module's `build`: refuse the static values its `unsupported` names, else its kernel over whole rows,
    kernel(hidden, None, the other values by name) (the module's generic tier passes a segment width instead)."""

    def build(hidden, **static):
        refuse(decl, unsupported(hidden, **static))
        return kernel(hidden, None, **static)

    return build


def tensor(dtype, *shape):
    """A tensor type of this dtype and shape, as a factory: a prim_func annotation calls it, so every argument gets a
    buffer of its own (arguments that share one buffer object lose their names)."""
    return lambda: T.Tensor[shape, dtype]


def fp32(*shape):
    """A float32 tensor type of this shape, as a factory (`tensor`)."""
    return tensor(T.float32, *shape)


def split_block(block, count, width, outer_width=None):
    """Where `block` starts in a grid whose blocks run `count` to a row of tiles: (its row, times `outer_width` where
    given; its first element along the row, `width` a block)."""
    outer = block // count if outer_width is None else block // count * outer_width
    return outer, block % count * width


def stage(region, shape, dtype, cols=None):
    """A Unified Buffer tile of `shape` holding `region` (a slice of a global tensor), copied in by DMA (into the
    tile's first `cols` columns where given). The statement that takes the result names the tile."""
    tile = T.alloc_shared(shape, dtype)
    T.evaluate(T.copy(region, tile if cols is None else tile[:, 0:cols]))  # a statement: this is no macro
    return tile


@T.macro
def sum_column(acc, partials, first, j):
    """acc[0] = the sum over p of partials[p, first + j], p = 0, 1, ... in order from zero (zero past the last
    column): one SIMT thread's column of a split-K sum, the CUDA kernels' order."""
    acc[0] = T.float32(0)
    if first + j < partials.shape[1]:
        for p in T.serial(partials.shape[0]):
            acc[0] = acc[0] + partials[p, first + j]
