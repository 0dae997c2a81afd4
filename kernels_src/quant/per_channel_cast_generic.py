"""The generic per-channel cast: per_channel_cast with the row width `hidden`, the token block `block_m` (32 or 128)
and, for E4M3 inputs, their scale block `in_block` (1 x 32 or 1 x 128) runtime values.

It serves the calls whose specialised per_channel_cast variant is not built, and writes the same
bytes: the specialised kernel's tiling (kernels_src/quant/per_channel_cast.py: a CTA of 256
threads takes block_m rows by 8 column vectors, 32 rows at a time), with the number of 32-row
passes (1 or 4) a uniform runtime bound on loops unrolled for 4. Every value is the specialised
kernel's expression (data * in_sf, then * inv), each channel's amax the maximum over the same
rows (order-free), its scale factor common.scale_factor of it; the column-wise reduction and the
stores are the specialised kernel's.

in_block reaches the kernel as its index among the axis's choices (0 "none", 1 "1x32", 2 "1x128"),
so the input scale block is 2**(3 + 2 * in_block) channels wide. x's leading dim only binds block_m
(its extent) and in_block (its stride): a dim must stand alone in some extent or stride to be
bound; x is read at [0, row, col].
"""

import tilelang.language as T

from kernels_src.pdl import PDL_SOURCE, pdl_entry
from kernels_src.quant import common
from kernels_src.quant.per_channel_cast import STORAGE, TILING, check_static
from tkaot._quant.kernels import PER_CHANNEL_CAST_GENERIC

DECL = PER_CHANNEL_CAST_GENERIC  # the declaration this module builds (tkaot/_quant/kernels.py)

MAX_BLOCK_M = 128


def build(in_dtype, in_sf, sf):
    quantized_in = in_dtype == "e4m3"
    in_block = "1x128" if quantized_in else "none"  # any block the input may have: checked like the specialised kernel
    check_static(MAX_BLOCK_M, in_dtype, in_block, in_sf, MAX_BLOCK_M, sf)
    storage, storage_bytes = STORAGE[in_dtype]
    vec = 16 // storage_bytes
    num_threads, col_vecs = TILING  # the specialised kernel's
    tile_k = col_vecs * vec
    slots = num_threads // col_vecs  # rows read at once
    max_passes = MAX_BLOCK_M // slots
    packed = sf == "ue8m0"
    out_dtype = "float8_e4m3"

    num_tokens = T.dynamic("num_tokens")
    hidden = T.dynamic("hidden")
    in_sf_stride = T.dynamic("in_sf_stride")
    block_m = T.dynamic("block_m")
    in_block_index = T.dynamic("in_block")
    bk_shift = 3 + 2 * in_block_index  # log2 of the input scale block's width: 5 (1 x 32) or 7 (1 x 128)
    sf_in = common.SfLayout.from_input(in_sf if quantized_in else "fp32", hidden >> bk_shift if quantized_in else 1)
    m_blocks = T.ceildiv(num_tokens, block_m)
    sf_shape = ((m_blocks + 3) // 4, hidden * 4) if packed else (m_blocks, hidden)

    def value(x_reg, in_scale, p, j):
        """The fp32 value of element j of pass p's vector: data * in_sf for E4M3 inputs (the specialised kernel's)."""
        if quantized_in:
            return T.Cast("float32", x_reg[p, j]) * in_scale[p]
        return T.Cast("float32", x_reg[p, j])

    @T.prim_func
    def per_channel_cast_generic(
        x: T.StridedTensor[(block_m, num_tokens, hidden), (in_block_index, hidden, 1), storage],
        x_sf: T.StridedTensor[sf_in.shape(num_tokens), (in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden), out_dtype],
        out_sf: T.Tensor[sf_shape, common.SF_DTYPE[sf]],
    ):
        with T.Kernel(T.ceildiv(hidden, tile_k), m_blocks, threads=num_threads) as (kb, mb):
            T.import_source(PDL_SOURCE)
            pdl_entry()  # kernels_src/pdl.py: before any memory access
            T.assume(hidden % 128 == 0)  # as the op checks: the rows vectorize
            tid = T.get_thread_binding()
            slot = tid // col_vecs
            col = kb * tile_k + tid % col_vecs * vec
            x_reg = T.alloc_local((max_passes, vec), storage)
            in_scale = T.alloc_local((max_passes,), "float32")
            amax = T.alloc_local((vec,), "float32")
            inv = T.alloc_local((vec,), "float32")
            xf = T.alloc_local((vec,), "float32")
            o_reg = T.alloc_local((vec,), "float8_e4m3")
            col_max = T.alloc_shared((slots, tile_k), "float32")
            col_inv = T.alloc_shared((tile_k,), "float32")

            for p in T.unroll(max_passes):
                if p * slots < block_m:  # the block's passes: 1 or 4
                    row = mb * block_m + p * slots + slot
                    if row < num_tokens and col < hidden:
                        for j in T.vectorized(vec):
                            x_reg[p, j] = x[0, row, col + j]
                        if quantized_in:
                            in_scale[p] = common.decode_sf(x_sf[sf_in.index(row, col >> bk_shift)], sf_in.kind)
                    else:
                        for j in T.vectorized(vec):
                            x_reg[p, j] = T.Cast(storage, 0)
                        if quantized_in:
                            in_scale[p] = T.float32(0)
            for j in T.unroll(vec):
                amax[j] = T.float32(0)
            for p in T.unroll(max_passes):
                if p * slots < block_m:
                    for j in T.unroll(vec):
                        amax[j] = T.max(amax[j], T.abs(value(x_reg, in_scale, p, j)))
            for j in T.unroll(vec):
                col_max[slot, tid % col_vecs * vec + j] = amax[j]
            T.sync_threads()

            # One thread per channel of the tile forms its scale factor
            if tid < tile_k:
                m = T.alloc_var("float32", init=0.0)
                for w in T.unroll(slots):
                    m = T.max(m, col_max[w, tid])
                stored, inv_value = common.scale_factor(m, "e4m3", sf)
                col_inv[tid] = inv_value
                if kb * tile_k + tid < hidden:
                    if packed:
                        out_sf[mb // 4, (kb * tile_k + tid) * 4 + mb % 4] = stored
                        if mb == m_blocks - 1:
                            for q in T.unroll(3):
                                if mb % 4 + q + 1 < 4:
                                    out_sf[mb // 4, (kb * tile_k + tid) * 4 + mb % 4 + q + 1] = T.uint8(0)
                    else:
                        out_sf[mb, kb * tile_k + tid] = stored
            T.sync_threads()

            for j in T.unroll(vec):
                inv[j] = col_inv[tid % col_vecs * vec + j]
            for p in T.unroll(max_passes):
                if p * slots < block_m:
                    row = mb * block_m + p * slots + slot
                    if row < num_tokens and col < hidden:
                        for j in T.unroll(vec):
                            xf[j] = value(x_reg, in_scale, p, j) * inv[j]
                        for j in T.vectorized(vec):
                            o_reg[j] = common.to_e4m3(xf[j])
                        for j in T.vectorized(vec):
                            out[row, col + j] = o_reg[j]

    return per_channel_cast_generic
