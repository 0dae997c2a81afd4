"""The generic per-block cast: per_block_cast with the row width `hidden`, the scale block (block_m x block_k, each
32 or 128) and the sf layout runtime values.

It serves the calls whose specialised per_block_cast variant is not built, and writes the same
bytes: a block's amax is the largest magnitude of its elements (a maximum: the order in which
threads combine it changes nothing, and no NaN survives fmaxf), its scale factor is
common.scale_factor of that amax, and each element is E4M3 / E2M1 of (x * inv), with the
specialised kernel's expressions and its 16-byte vectors (8 bf16 or 4 fp32 values).

A CTA of 256 threads takes a 128 x 128 tile, which holds whole blocks of every size: a thread
holds one vector column of the tile for 8 (bf16) or 16 (fp32) rows, `rows_per_pass` apart. The
tile's rows fall in four quarters of 32 rows, each inside one block row: a thread folds its
vectors into one amax a quarter (one for the whole tile when block_m is 128), the lanes of a
block reduce it with warp shuffles (how many depends on block_k: a uniform branch a step), and
one lane a block and warp folds it into shared memory with an atomic max of its fp32 bits
(amax >= 0, so the bits order as the values do). After one barrier every thread scales its
vectors by its quarter's block, and one thread a block stores the scale factor. Rows past the
last token read as zero and are not written; blocks wholly past it store no scale factor.

The sf layout is a runtime 0 (row: m_blocks x k_blocks) or 1 (col: k_blocks x m_blocks, each
with the row stride sf_stride; packed UE8M0 bytes go four k blocks a word in either). The two
leading dims of out_sf only bind block_m, block_k and sf_layout (a dim must stand alone in some
extent or stride to be bound); out_sf is read and written at [0, 0, i, j] (i * sf_stride + j).
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from kernels_src.quant.encode import store_encoded
from kernels_src.quant.per_block_cast import check_static
from tkaot._quant.kernels import PER_BLOCK_CAST_GENERIC

DECL = PER_BLOCK_CAST_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

THREADS = 256
TILE = 128  # rows and channels of a CTA's tile: the largest block, a multiple of every block
QUARTER = 32  # rows of the smallest block
QUARTERS = TILE // QUARTER
MAX_BLOCKS = (TILE // QUARTER) ** 2  # blocks in a tile (of 32 x 32)


def build(in_dtype, fmt, sf, mode):
    check_static(TILE, in_dtype, fmt, TILE, TILE, sf, "row", mode)  # the specialised kernel's rules (the op checks the layout)
    vec = 16 // (2 if in_dtype == "bfloat16" else 4)  # as in the specialised kernel
    row_threads = TILE // vec  # threads across a tile row: 16 (bf16) or 32 (fp32)
    rows_per_pass = THREADS // row_threads
    passes = TILE // rows_per_pass
    quarter_passes = QUARTER // rows_per_pass  # a quarter's rows are the thread's vectors [q * quarter_passes, ...)
    fp4_out = fmt == "e2m1"
    word_codes = 8 if vec % 8 == 0 else 4
    out_vec = vec // word_codes if fp4_out else vec
    out_storage = ("uint32" if word_codes == 8 else "uint16") if fp4_out else "float8_e4m3"
    packed = sf == "ue8m0"
    sf_dtype = common.SF_DTYPE[sf]
    inv_bf16 = in_dtype == "bfloat16" and sf == "pow2" and mode == "precomputed_sf"  # as in the specialised kernel

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    sf_stride = T.dynamic("sf_stride")
    block_m = T.dynamic("block_m")
    block_k = T.dynamic("block_k")
    sf_layout = T.dynamic("sf_layout")
    out_cols = hidden // word_codes if fp4_out else hidden
    m_blocks = T.ceildiv(num_tokens, block_m)
    k_blocks = hidden // block_k
    # bounds of either layout's indices: rows (m or k blocks), and columns (k or m blocks, four bytes a word packed)
    sf_rows = m_blocks + k_blocks
    sf_cols = 4 * (m_blocks + k_blocks)

    def shift(size):
        """log2 of a block side, 32 or 128 (5 or 7), without a branch."""
        return 5 + (size >> 6)

    def sf_at(m, k):
        """(i, j): out_sf[0, 0, i, j] holds the scale factor of block (m, k) in the runtime layout."""
        return common.runtime_sf_index(m, k, sf_layout, packed)

    def tile_block(q, tile_col):
        """The shared-memory slot of the block in quarter q of the tile, at column tile_col."""
        return (q * QUARTER >> shift(block_m)) * (TILE >> shift(block_k)) + (tile_col >> shift(block_k))

    @T.prim_func
    def per_block_cast_generic(
        x: T.Tensor[(num_tokens, hidden), in_dtype],
        out: T.Tensor[(num_tokens, out_cols), out_storage],
        out_sf: T.StridedTensor[(block_m, block_k, sf_rows, sf_cols), (sf_layout, sf_layout, sf_stride, 1), sf_dtype],
    ):
        with T.Kernel(hidden // TILE, T.ceildiv(num_tokens, TILE), threads=THREADS) as (kt, mt):
            kernel_entry()
            T.assume(hidden % TILE == 0)  # as the op checks: whole tiles, and the rows vectorize
            tid = T.get_thread_binding()
            lane = tid % 32
            tile_col = tid % row_threads * vec
            col = kt * TILE + tile_col
            first_row = mt * TILE + tid // row_threads
            blocks_k = TILE >> shift(block_k)  # blocks across a tile: 1 or 4
            x_reg = T.alloc_local((passes, vec), in_dtype)
            xf = T.alloc_local((vec,), "float32")
            o_reg = T.alloc_local((out_vec,), out_storage)
            quarter_amax = T.alloc_local((QUARTERS,), "float32")
            quarter_inv = T.alloc_local((QUARTERS,), "float32")
            block_amax = T.alloc_shared((MAX_BLOCKS,), "uint32")  # fp32 bits of each block's amax, by tile row-major

            if mode != "precomputed_sf":
                if tid < MAX_BLOCKS:
                    block_amax[tid] = T.uint32(0)
            for p in T.unroll(passes):
                row = first_row + p * rows_per_pass
                common.load_or_zero(x_reg, p, x, row, col, num_tokens, vec, in_dtype)

            if mode == "precomputed_sf":
                for q in T.unroll(QUARTERS):
                    m = (mt * TILE + q * QUARTER) >> shift(block_m)
                    quarter_inv[q] = T.float32(0)
                    if m < m_blocks:
                        i, j = sf_at(m, col >> shift(block_k))
                        quarter_inv[q] = T.float32(1.0) / common.decode_sf(out_sf[0, 0, i, j], sf)
                        if inv_bf16:
                            quarter_inv[q] = T.Cast("float32", T.Cast("bfloat16", quarter_inv[q]))
            else:
                for q in T.unroll(QUARTERS):
                    quarter_amax[q] = T.float32(0)
                    for p in T.unroll(quarter_passes):
                        for j in T.unroll(vec):
                            quarter_amax[q] = T.max(quarter_amax[q], T.abs(T.Cast("float32", x_reg[q * quarter_passes + p, j])))
                if block_m == TILE:  # one block row: quarter 0 carries the tile's
                    for q in T.unroll(1, QUARTERS):
                        quarter_amax[0] = T.max(quarter_amax[0], quarter_amax[q])
                T.sync_threads()  # block_amax is zeroed
                for q in T.unroll(QUARTERS):
                    if q == 0 or block_m != TILE:
                        # the lanes of one block row segment, then the warp's other row (bf16: 16 lanes a row)
                        for s in T.unroll(row_threads.bit_length() - 1):
                            if (vec << s) < block_k:
                                quarter_amax[q] = T.max(quarter_amax[q], T.shfl_xor(quarter_amax[q], 1 << s))
                        for s in T.unroll(row_threads.bit_length() - 1, 5):
                            quarter_amax[q] = T.max(quarter_amax[q], T.shfl_xor(quarter_amax[q], 1 << s))
                        if lane < row_threads and tile_col % block_k == 0:
                            T.atomic_max(block_amax[tile_block(q, tile_col)], common.f32_bits(quarter_amax[q]))
                T.sync_threads()
                for q in T.unroll(QUARTERS):
                    _, inv = common.scale_factor(common.f32_from_bits(block_amax[tile_block(q, tile_col)]), fmt, sf)
                    quarter_inv[q] = inv
                # One thread a block of the tile stores its scale factor
                if tid < (TILE >> shift(block_m)) * blocks_k:
                    m = mt * (TILE >> shift(block_m)) + tid // blocks_k
                    k = kt * blocks_k + tid % blocks_k
                    if m < m_blocks:
                        stored, _ = common.scale_factor(common.f32_from_bits(block_amax[tid]), fmt, sf)
                        i, j = sf_at(m, k)
                        out_sf[0, 0, i, j] = stored
                        if packed:
                            if k == k_blocks - 1:  # the unused bytes of the row's last word
                                for pad in T.unroll(1, common.UE8M0_PACK):
                                    partial = k_blocks % common.UE8M0_PACK  # k blocks in the last word
                                    if partial != 0 and partial + pad <= common.UE8M0_PACK:
                                        i, j = sf_at(m, k + pad)
                                        out_sf[0, 0, i, j] = T.uint8(0)

            if mode != "sf_only":
                for p in T.unroll(passes):
                    row = first_row + p * rows_per_pass
                    if row < num_tokens:
                        for j in T.unroll(vec):
                            xf[j] = T.Cast("float32", x_reg[p, j]) * quarter_inv[p // quarter_passes]
                        store_encoded(xf, o_reg, out, row, col)

    return per_block_cast_generic
