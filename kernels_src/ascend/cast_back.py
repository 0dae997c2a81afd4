"""Dequantization for Ascend: E4M3 or packed E2M1 data with block scale factors -> round(data * sf) in bf16 / fp32.

A block takes `rows` tokens by one segment of the row into the Unified Buffer; a SIMT region reads the scale
factor of each (row, input block) in the tile from x_sf (any layout the declaration has: fp32, packed UE8M0,
E4M3; row- or column-major; blocks of one or many rows), then writes every element as the CUDA kernel does
(kernels_src/quant/cast_back.py): the decoded value times its block's scale factor in fp32, rounded once.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import split_block, whole_row_build
from kernels_src.ascend.quant_in import BYTES, STORAGE, Side, block_sides, decode
from kernels_src.ascend.tile import rows_per_block, segment
from kernels_src.quant import common
from tkaot._quant.kernels import CAST_BACK

DECL = CAST_BACK
REQUIRES: dict[str, int] = {}
THREADS = 128


def unsupported(hidden, in_dtype, in_block, in_sf, out_dtype) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    bk = common.block_shape(in_block)[1]
    if hidden % bk:
        return f"hidden={hidden} is not a multiple of the block width {bk}"
    return None


def cast_back_kernel(hidden, width: int | None, in_dtype: str, in_block, in_sf: str, out_dtype: str):
    """The kernel for rows of `hidden` columns: an int, cut into the widest segments that divide it (width None),
    or the generic kernel's runtime value, cut into segments of `width` (the last clipped to the row). The generic
    kernel may also take the input block at run time (`in_block` then its index among the axis's choices): tiles
    sized for the narrowest block (one column), the blocks' scale factors read once a block, then spread to the
    tile's columns, so no runtime block side indexes the elementwise loop."""
    storage, per = STORAGE[in_dtype]
    generic = width is not None
    runtime_block = not isinstance(in_block, str)
    if runtime_block:
        bm, bk = block_sides(CAST_BACK.axis("in_block").choices, in_block)
        col_bytes = 1 / per + BYTES[out_dtype] + 8  # the blocks' and the columns' scale factors, a column wide each
    else:
        bm, bk = (Side(n) for n in common.block_shape(in_block))
        col_bytes = 1 / per + BYTES[out_dtype] + 4 / bk.size
    if generic:
        segs = T.ceildiv(hidden, width)
    else:
        width = segment(hidden, bk.size if bk.size % 2 == 0 else 2, col_bytes)
        segs = hidden // width
    rows = rows_per_block(int(width * col_bytes) + 1, 1)
    sf_in = common.SfLayout.from_input(in_sf, bk.div(hidden))
    scales = width if runtime_block else width // bk.size  # block scale factors a tile row may hold
    # packed E2M1 rows of a runtime width are declared `hidden` bytes wide, twice their width: a dim must stand
    # alone in some extent to be bound (addresses go by x_stride, every access is in the row)
    x_cols = hidden if generic and per > 1 else hidden // per

    num_tokens = T.dynamic("num_tokens")
    x_stride, sf_stride = T.dynamic("x_stride"), T.dynamic("sf_stride")
    if runtime_block:
        sf_rows = bm.div(num_tokens + bm.extent - 1)
        # a leading extent of 1 whose stride binds the runtime block (a dim must stand alone in some extent or stride)
        x_shape, x_strides = (1, num_tokens, x_cols), (in_block, x_stride, 1)
    else:
        sf_rows = num_tokens if bm.size == 1 else (num_tokens + bm.size - 1) // bm.size
        x_shape, x_strides = (num_tokens, x_cols), (x_stride, 1)

    @T.prim_func
    def cast_back(
        x: T.StridedTensor[x_shape, x_strides, storage],
        x_sf: T.StridedTensor[sf_in.shape(sf_rows), (sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden), out_dtype],
    ):
        if generic:
            T.assume(hidden > 0)  # as the op checks
        tiles = T.ceildiv(num_tokens, rows)
        with T.Kernel(tiles * segs) as block:
            row, col = split_block(block, segs, width, rows)
            x_ub = T.alloc_shared((rows, width // per), storage)
            out_ub = T.alloc_shared((rows, width), out_dtype)
            scale_ub = T.alloc_shared((rows, scales), T.float32)
            if runtime_block:
                col_scale = T.alloc_shared((rows, width), T.float32)  # each column's block scale factor
            if generic:
                span = T.min(width, hidden - col)  # the segment's columns in the row
                if runtime_block:
                    T.copy(x[0, row : row + rows, col // per : col // per + span // per], x_ub[:, 0 : span // per])
                else:
                    T.copy(x[row : row + rows, col // per : col // per + span // per], x_ub[:, 0 : span // per])
            else:
                T.copy(x[row : row + rows, col // per : (col + width) // per], x_ub)
            with T.SimtVF(threads=THREADS):
                if runtime_block:
                    # each row's blocks dealt round-robin to the threads, in a loop as long as the tile has blocks
                    # (a parallel loop over every column, unrolled, would repeat the runtime index math in each copy)
                    for t in T.Parallel(THREADS):
                        for i in T.serial(rows):
                            for w in T.serial(T.ceildiv(bk.div(width), THREADS)):
                                q = w * THREADS + t
                                if T.And(T.And(row + i < num_tokens, bk.mul(q) < width), col + bk.mul(q) < hidden):
                                    stored_in = x_sf[sf_in.index(bm.div(row + i), bk.div(col) + q)]
                                    scale_ub[i, q] = common.decode_sf(stored_in, sf_in.kind)
                    # then spread to each column of the tile (dealt the same way)
                    for t in T.Parallel(THREADS):
                        for i in T.serial(rows):
                            for w in T.serial(width // THREADS):
                                col_scale[i, w * THREADS + t] = scale_ub[i, bk.div(w * THREADS + t)]
                else:
                    for i, q in T.Parallel(rows, scales):
                        live = row + i < num_tokens
                        if generic:
                            live = live and col + q * bk.size < hidden
                        stored_in = x_sf[sf_in.index(bm.div(row + i), bk.div(col) + q)]
                        scale_ub[i, q] = T.if_then_else(live, common.decode_sf(stored_in, sf_in.kind), T.float32(0))
                for i, c in T.Parallel(rows, width):
                    if runtime_block:
                        out_ub[i, c] = T.Cast(out_dtype, decode(in_dtype, x_ub, i, c) * col_scale[i, c])
                    else:
                        out_ub[i, c] = T.Cast(out_dtype, decode(in_dtype, x_ub, i, c) * scale_ub[i, c // bk.size])
            if generic:
                T.copy(out_ub[:, 0:span], out[row : row + rows, col : col + span])
            else:
                T.copy(out_ub, out[row : row + rows, col : col + width])

    return cast_back


build = whole_row_build(DECL, unsupported, cast_back_kernel)
