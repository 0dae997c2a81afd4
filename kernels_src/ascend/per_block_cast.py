"""Per-block cast to FP8 E4M3 or FP4 E2M1 for Ascend: one scale factor per (block_m x block_k) block.

A block takes one m block (block_m rows) by a segment of whole k blocks into the Unified Buffer. In a SIMT region
threads take (row, k block) pairs for the row maxima, then one thread a k block takes the maximum over its
rows (rows past the last token count as zero, as on CUDA), forms the scale factor with the CUDA kernels'
expressions (kernels_src/quant/common.py) and stores it straight to its place in out_sf (every layout the
declaration has, packed UE8M0 with its unused bytes zeroed); then every element is scaled and rounded (E2M1
codes two a byte, the lower-indexed element in the low nibble). Modes "cast", "sf_only" and
"precomputed_sf" as on CUDA (kernels_src/quant/per_block_cast.py).
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import whole_row_build
from kernels_src.ascend.quant_in import BYTES
from kernels_src.ascend.tile import segment
from kernels_src.quant import common
from tkaot._quant.kernels import PER_BLOCK_CAST

DECL = PER_BLOCK_CAST
REQUIRES: dict[str, int] = {}
THREADS = 128
TILE = 128  # rows of a generic tile: the largest block side, a multiple of both
MIN_BLOCK = 32  # the smallest block side


def unsupported(hidden, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if hidden % block_k:
        return f"hidden={hidden} is not a multiple of block_k={block_k}"
    return None


def per_block_cast_kernel(hidden, width, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode):
    """The kernel for rows of `hidden` columns in blocks of block_m x block_k: ints, one m block a tile by the
    widest segment of whole k blocks that divides the row (width None); or the generic kernel's runtime values
    (block sides 32 or 128, sf_layout 0 row / 1 col, hidden a multiple of 128), a tile of TILE rows (whole m
    blocks of either side) by `width` columns (whole k blocks of either side), its inverses kept by 32 x 32 cell."""
    generic = width is not None
    fp4 = fmt == "e2m1"
    if generic:
        rows, chunk = TILE, MIN_BLOCK  # the tile's rows; the columns of each row maximum
        segs = hidden // width
        tile_m = TILE // block_m  # m blocks a tile holds (runtime)
        slots_m, slots_k = TILE // MIN_BLOCK, width // MIN_BLOCK  # room for the most blocks a tile holds; its cells
    else:
        col_bytes = block_m * (BYTES[in_dtype] + (0 if mode == "sf_only" else 0.5 if fp4 else 1) + 4 / block_k)
        width = segment(hidden, block_k, col_bytes)
        segs = hidden // width
        rows, chunk = block_m, block_k
        slots_m, slots_k = 1, width // block_k
    kbs = width // chunk  # row maxima a tile row takes
    k_blocks = hidden // block_k
    out_dtype, out_cols, out_width = ("uint8", hidden // 2, width // 2) if fp4 else ("float8_e4m3fn", hidden, width)
    inv_bf16 = in_dtype == "bfloat16" and sf == "pow2" and mode == "precomputed_sf"  # TileKernels' 1/sf in bf16

    num_tokens = T.dynamic("num_tokens")
    sf_stride = T.dynamic("sf_stride")
    m_blocks = (num_tokens + block_m - 1) // block_m
    if generic:
        packed = sf == "ue8m0"
        # the two leading extents only bind block_m and block_k, and the strides sf_layout (a dim must stand alone in
        # some extent or stride to be bound); entries are at [0, 0, i, j], i * sf_stride + j, in either layout
        bound = m_blocks + k_blocks  # bounds every index of either layout
        sf_shape, sf_strides = (block_m, block_k, bound, common.UE8M0_PACK * bound), (sf_layout, sf_layout, sf_stride, 1)

        def sf_index(m, k):
            col = sf_layout != 0
            if packed:
                pack = common.UE8M0_PACK
                return 0, 0, T.if_then_else(col, k // pack, m), T.if_then_else(col, m * pack + k % pack, k)
            return 0, 0, T.if_then_else(col, k, m), T.if_then_else(col, m, k)

        pad = common.UE8M0_PACK - 1 if packed else 0  # bytes after a row's last k block that may be unused
    else:
        sf_out = common.SfLayout(sf, sf_layout, k_blocks)
        sf_shape, sf_strides = sf_out.shape(m_blocks), (sf_stride, 1)
        sf_index, pad = sf_out.index, sf_out.pad

    def inverse(inv_ub, i, c):
        # the inverse scale factor of element (i, c) of the tile (generic: of its 32 x 32 cell, so no runtime block
        # side indexes the elementwise loop)
        return inv_ub[i // MIN_BLOCK, c // MIN_BLOCK] if generic else inv_ub[c // block_k]

    @T.macro
    def set_cells(inv_ub, bm, bk, inv):
        # (generic) the inverse of the tile's block (bm, bk) into each 32 x 32 cell it covers
        for a in T.serial(block_m // MIN_BLOCK):
            for e in T.serial(block_k // MIN_BLOCK):
                inv_ub[(bm * (block_m // MIN_BLOCK) + a) % slots_m, (bk * (block_k // MIN_BLOCK) + e) % slots_k] = inv

    def scaled(x_ub, inv_ub, i, c):
        return T.Cast("float32", x_ub[i, c]) * inverse(inv_ub, i, c)

    @T.prim_func
    def per_block_cast(
        x: T.Tensor[(num_tokens, hidden), in_dtype],
        out: T.Tensor[(num_tokens, out_cols), out_dtype],
        out_sf: T.StridedTensor[sf_shape, sf_strides, common.SF_DTYPE[sf]],
    ):
        if generic:
            # as the op checks: whole tiles of columns, blocks of 32 or 128
            T.assume(T.And(hidden > 0, hidden % width == 0))
            T.assume(T.And(block_m >= MIN_BLOCK, block_m <= TILE))
            T.assume(T.And(block_k >= MIN_BLOCK, block_k <= TILE))
        with T.Kernel(T.ceildiv(num_tokens, rows) * segs) as block:
            mb = block // segs
            row = mb * rows
            col = block % segs * width
            x_ub = T.alloc_shared((rows, width), in_dtype)
            out_ub = T.alloc_shared((rows, out_width), out_dtype)
            row_max = T.alloc_shared((rows, kbs), T.float32)
            inv_ub = T.alloc_shared((slots_m, slots_k) if generic else (kbs,), T.float32)
            T.copy(x[row : row + rows, col : col + width], x_ub)
            with T.SimtVF(threads=THREADS):
                amax = T.alloc_local((1,), T.float32)
                if mode != "precomputed_sf":
                    for i, q in T.Parallel(rows, kbs):
                        amax[0] = T.float32(0)
                        for j in T.serial(chunk):
                            amax[0] = T.max(amax[0], T.abs(T.Cast("float32", x_ub[i, q * chunk + j])))
                        row_max[i, q] = T.if_then_else(row + i < num_tokens, amax[0], T.float32(0))
                if generic:
                    # one thread a block of the tile: (bm, bk) among the slots, those in the tile
                    for q in T.Parallel(slots_m * slots_k):
                        bm, bk = q // slots_k, q % slots_k
                        m, kb = mb * tile_m + bm, col // block_k + bk
                        if T.And(T.And(bm * block_m < rows, bk * block_k < width), m < m_blocks):
                            if mode == "precomputed_sf":
                                inv = T.float32(1.0) / common.decode_sf(out_sf[sf_index(m, kb)], sf)
                                set_cells(inv_ub, bm, bk, T.Cast("float32", T.Cast("bfloat16", inv)) if inv_bf16 else inv)
                            else:
                                amax[0] = T.float32(0)
                                for i in T.serial(block_m):
                                    for r in T.serial(block_k // chunk):
                                        # (the modulos change no index of the tile's blocks; they bound the indices
                                        # for TileLang's barrier analysis, which then sees these reads apart from inv_ub)
                                        amax[0] = T.max(amax[0], row_max[(bm * block_m + i) % rows, (bk * (block_k // chunk) + r) % kbs])
                                stored, inv = common.scale_factor(amax[0], fmt, sf)
                                set_cells(inv_ub, bm, bk, inv)
                                out_sf[sf_index(m, kb)] = stored
                                if pad and kb == k_blocks - 1:
                                    # the unused bytes of the row's last word
                                    for p in T.serial(pad):
                                        if T.And(k_blocks % common.UE8M0_PACK != 0, k_blocks % common.UE8M0_PACK + p < common.UE8M0_PACK):
                                            out_sf[sf_index(m, k_blocks + p)] = T.uint8(0)
                else:
                    for q in T.Parallel(kbs):
                        kb = col // block_k + q
                        if mode == "precomputed_sf":
                            inv = T.float32(1.0) / common.decode_sf(out_sf[sf_index(mb, kb)], sf)
                            inv_ub[q] = T.Cast("float32", T.Cast("bfloat16", inv)) if inv_bf16 else inv
                        else:
                            amax[0] = T.float32(0)
                            for i in T.serial(block_m):
                                amax[0] = T.max(amax[0], row_max[i, q])
                            stored, inv = common.scale_factor(amax[0], fmt, sf)
                            inv_ub[q] = inv
                            out_sf[sf_index(mb, kb)] = stored
                            if pad and kb == k_blocks - 1:
                                for p in T.serial(pad):
                                    out_sf[sf_index(mb, k_blocks + p)] = T.uint8(0)
                if mode != "sf_only":
                    for i, b in T.Parallel(rows, out_width):
                        if fp4:
                            low = common.e2m1_code(scaled(x_ub, inv_ub, i, 2 * b))
                            high = common.e2m1_code(scaled(x_ub, inv_ub, i, 2 * b + 1))
                            out_ub[i, b] = T.Cast("uint8", low | (high << T.uint32(4)))
                        else:
                            out_ub[i, b] = common.to_e4m3(scaled(x_ub, inv_ub, i, b))
            if mode != "sf_only":
                T.copy(out_ub, out[row : row + rows, col // (2 if fp4 else 1) : (col + width) // (2 if fp4 else 1)])

    return per_block_cast


build = whole_row_build(DECL, unsupported, per_block_cast_kernel)
