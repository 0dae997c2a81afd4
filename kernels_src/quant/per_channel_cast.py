"""Per-channel cast to FP8 E4M3: one scale factor per channel for every `block_m` tokens.

A CTA takes block_m rows by `col_vecs` 16-byte column vectors (8 by default: 64
bf16 / 32 fp32 channels); runs of col_vecs threads read whole row segments, so loads
stay coalesced while the reduction runs down the columns: each thread keeps the
per-column amax of its rows, the row slots meet in shared memory, one thread per
channel forms the scale factor, and every thread then scales its registers. UE8M0 scale factors pack
four consecutive token blocks of a channel into one int32.

An input may also be E4M3 data with per-token scale factors in blocks of
`in_block` (1 x 32 or 1 x 128, fp32 / packed UE8M0 / E4M3, row- or column-major):
each value is first decoded in fp32 as data * in_sf, then cast like a bf16/fp32
value: out = E4M3((data * in_sf) * inv), the products in that order (as
TileKernels computes them).
"""

from collections.abc import Callable
from dataclasses import dataclass

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from tkaot._quant.kernels import PER_CHANNEL_CAST

DECL = PER_CHANNEL_CAST  # the declaration this module builds (tkaot/_quant/kernels.py)


# (threads per CTA, column vectors a CTA covers): the tuning knob, see bench/tuning/tune_quant.py
TILING = (256, 8)
# in_dtype -> (storage dtype, bytes per element)
STORAGE = {"bfloat16": ("bfloat16", 2), "float32": ("float32", 4), "e4m3": ("float8_e4m3", 1)}


def check_static(hidden, in_dtype, in_block, in_sf, block_m, sf) -> None:
    """Raise ValueError for a combination no kernel supports (each axis alone is checked by its declaration)."""
    quantized_in = in_dtype == "e4m3"
    if quantized_in != (in_block != "none") or quantized_in != (in_sf != "none"):
        raise ValueError(
            f"{DECL.name}: in_block and in_sf go with e4m3 inputs only, and e4m3 inputs need both "
            f"(in_dtype={in_dtype}, in_block={in_block}, in_sf={in_sf})"
        )


def build(hidden, in_dtype, in_block, in_sf, block_m, sf, tiling: tuple[int, int] | None = None):
    check_static(hidden, in_dtype, in_block, in_sf, block_m, sf)
    quantized_in = in_dtype == "e4m3"
    bk = common.block_shape(in_block)[1] if quantized_in else hidden
    num_threads, col_vecs = tiling or TILING
    slots = num_threads // col_vecs  # rows read at once
    if block_m % slots:
        raise ValueError(
            f"{DECL.name}: tiling {(num_threads, col_vecs)} reads {slots} rows at once, which does not divide block_m={block_m}"
        )
    sf_in = common.SfLayout.from_input(in_sf if quantized_in else "fp32", hidden // bk)

    num_tokens = T.dynamic("num_tokens")
    in_sf_stride = T.dynamic("in_sf_stride")
    rows = Rows(
        hidden=hidden,
        block_m=block_m,
        num_tokens=num_tokens,
        m_blocks=(num_tokens + block_m - 1) // block_m,
        x=T.Tensor[(num_tokens, hidden), STORAGE[in_dtype][0]],
        x_lead=(),
        sf_in=sf_in,
        in_sf_stride=in_sf_stride,
        in_sf_col=lambda col: col // bk,
        passes=block_m // slots,
        generic=False,
    )
    return per_channel_kernel(rows, in_dtype, sf, (num_threads, col_vecs))


@dataclass(frozen=True)
class Rows:
    """The rows a kernel casts: static sizes (build), or the runtime ones of the generic kernel
    (per_channel_cast_generic.py), which builds with per_channel_kernel too."""

    hidden: object  # an int, or the runtime dim
    block_m: object
    num_tokens: object
    m_blocks: object  # token blocks: the grid's y
    x: object  # x's argument type
    x_lead: tuple  # the index x is read at before (row, column): the generic kernel's unit dim
    sf_in: common.SfLayout
    in_sf_stride: object
    in_sf_col: Callable  # a column -> its input scale block
    passes: int  # the most row passes of `slots` rows a block takes
    generic: bool  # a runtime block_m (1 or 4 passes) and hidden


def per_channel_kernel(rows: Rows, in_dtype: str, sf: str, tiling: tuple[int, int]):
    """The kernel over `rows`, in the tiling (threads per CTA, column vectors a CTA covers)."""
    hidden, block_m, num_tokens, m_blocks, sf_in = rows.hidden, rows.block_m, rows.num_tokens, rows.m_blocks, rows.sf_in
    storage, storage_bytes = STORAGE[in_dtype]
    quantized_in = in_dtype == "e4m3"
    vec = 16 // storage_bytes
    num_threads, col_vecs = tiling
    tile_k = col_vecs * vec
    slots = num_threads // col_vecs  # rows read at once
    packed = sf == "ue8m0"
    out_dtype = "float8_e4m3"
    sf_shape = ((m_blocks + 3) // 4, hidden * 4) if packed else (m_blocks, hidden)

    def value(x_reg, in_scale, p, j):
        """The fp32 value of element j of pass p's vector: data * in_sf for E4M3 inputs."""
        if quantized_in:
            return T.Cast("float32", x_reg[p, j]) * in_scale[p]
        return T.Cast("float32", x_reg[p, j])

    def block_pass(p):
        """Whether pass p is one of the block's (static for a static block_m; the generic kernel's 1 or 4)."""
        return p * slots < block_m if rows.generic else True

    @T.macro
    def channel_scale(col_max, col_inv, out_sf, kb, mb, at):
        """The scale factor of channel at[0] of the tile (a 1-tuple: a macro takes a lone expression as a new local):
        the maximum of its row slots' amax, stored, its inverse kept in col_inv."""
        m = T.alloc_var("float32", init=0.0)
        for w in T.unroll(slots):
            m = T.max(m, col_max[w, at[0]])
        stored, inv_value = common.scale_factor(m, "e4m3", sf)
        col_inv[at[0]] = inv_value
        if kb * tile_k + at[0] < hidden:
            if packed:
                out_sf[mb // 4, (kb * tile_k + at[0]) * 4 + mb % 4] = stored
                if mb == m_blocks - 1:
                    for q in T.unroll(3):
                        if mb % 4 + q + 1 < 4:
                            out_sf[mb // 4, (kb * tile_k + at[0]) * 4 + mb % 4 + q + 1] = T.uint8(0)
            else:
                out_sf[mb, kb * tile_k + at[0]] = stored

    @T.prim_func
    def per_channel_cast(
        x: rows.x,
        x_sf: T.StridedTensor[sf_in.shape(num_tokens), (rows.in_sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden), out_dtype],
        out_sf: T.Tensor[sf_shape, common.SF_DTYPE[sf]],
    ):
        with T.Kernel(T.ceildiv(hidden, tile_k), m_blocks, threads=num_threads) as (kb, mb):
            kernel_entry()
            if rows.generic:
                T.assume(hidden % 128 == 0)  # as the op checks: the rows vectorize
            tid = T.get_thread_binding()
            slot = tid // col_vecs
            col = kb * tile_k + tid % col_vecs * vec
            x_reg = T.alloc_local((rows.passes, vec), storage)
            in_scale = T.alloc_local((rows.passes,), "float32")
            amax = T.alloc_local((vec,), "float32")
            inv = T.alloc_local((vec,), "float32")
            xf = T.alloc_local((vec,), "float32")
            o_reg = T.alloc_local((vec,), "float8_e4m3")
            col_max = T.alloc_shared((slots, tile_k), "float32")
            col_inv = T.alloc_shared((tile_k,), "float32")

            for p in T.unroll(rows.passes):
                if block_pass(p):
                    row = mb * block_m + p * slots + slot
                    if row < num_tokens and col < hidden:
                        for j in T.vectorized(vec):
                            x_reg[p, j] = x[rows.x_lead + (row, col + j)]
                        if quantized_in:
                            in_scale[p] = common.decode_sf(x_sf[sf_in.index(row, rows.in_sf_col(col))], sf_in.kind)
                    else:
                        for j in T.vectorized(vec):
                            x_reg[p, j] = T.Cast(storage, 0)
                        if quantized_in:
                            in_scale[p] = T.float32(0)
            for j in T.unroll(vec):
                amax[j] = T.float32(0)
            for p in T.unroll(rows.passes):
                if block_pass(p):
                    for j in T.unroll(vec):
                        amax[j] = T.max(amax[j], T.abs(value(x_reg, in_scale, p, j)))
            for j in T.unroll(vec):
                col_max[slot, tid % col_vecs * vec + j] = amax[j]
            T.sync_threads()

            # One thread per channel of the tile forms its scale factor
            if rows.generic:
                if tid < tile_k:
                    channel_scale(col_max, col_inv, out_sf, kb, mb, (tid,))
            else:
                for c in T.serial(tile_k // num_threads if tile_k > num_threads else 1):
                    channel = c * num_threads + tid
                    if channel < tile_k:
                        channel_scale(col_max, col_inv, out_sf, kb, mb, (channel,))
            T.sync_threads()

            for j in T.unroll(vec):
                inv[j] = col_inv[tid % col_vecs * vec + j]
            for p in T.unroll(rows.passes):
                if block_pass(p):
                    row = mb * block_m + p * slots + slot
                    if row < num_tokens and col < hidden:
                        for j in T.unroll(vec):
                            xf[j] = value(x_reg, in_scale, p, j) * inv[j]
                        for j in T.vectorized(vec):
                            o_reg[j] = common.to_e4m3(xf[j])
                        for j in T.vectorized(vec):
                            out[row, col + j] = o_reg[j]

    return per_channel_cast
