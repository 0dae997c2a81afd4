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

from kernels_src.ascend.quant_in import BYTES
from kernels_src.ascend.tile import segment
from kernels_src.quant import common
from tkaot._quant.kernels import PER_BLOCK_CAST

DECL = PER_BLOCK_CAST
REQUIRES: dict[str, int] = {}
THREADS = 128


def unsupported(hidden, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode) -> str | None:
    """Why this module does not build these static values (None: it does)."""
    if hidden % block_k:
        return f"hidden={hidden} is not a multiple of block_k={block_k}"
    return None


def build(hidden, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode):
    why = unsupported(hidden, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode)
    if why:
        raise ValueError(f"{DECL.name} for Ascend: {why}")
    fp4 = fmt == "e2m1"
    col_bytes = block_m * (BYTES[in_dtype] + (0 if mode == "sf_only" else 0.5 if fp4 else 1) + 4 / block_k)
    width = segment(hidden, block_k, col_bytes)
    segs = hidden // width
    kbs = width // block_k  # k blocks a segment
    k_blocks = hidden // block_k
    sf_out = common.SfLayout(sf, sf_layout, k_blocks)
    out_dtype, out_cols, out_width = ("uint8", hidden // 2, width // 2) if fp4 else ("float8_e4m3fn", hidden, width)
    inv_bf16 = in_dtype == "bfloat16" and sf == "pow2" and mode == "precomputed_sf"  # TileKernels' 1/sf in bf16

    num_tokens = T.dynamic("num_tokens")
    sf_stride = T.dynamic("sf_stride")
    m_blocks = (num_tokens + block_m - 1) // block_m

    def scaled(x_ub, inv_ub, i, c):
        return T.Cast("float32", x_ub[i, c]) * inv_ub[c // block_k]

    @T.prim_func
    def per_block_cast(
        x: T.Tensor[(num_tokens, hidden), in_dtype],
        out: T.Tensor[(num_tokens, out_cols), out_dtype],
        out_sf: T.StridedTensor[sf_out.shape(m_blocks), (sf_stride, 1), sf_out.dtype],
    ):
        with T.Kernel(T.ceildiv(num_tokens, block_m) * segs) as block:
            mb = block // segs
            row = mb * block_m
            col = block % segs * width
            x_ub = T.alloc_shared((block_m, width), in_dtype)
            out_ub = T.alloc_shared((block_m, out_width), out_dtype)
            row_max = T.alloc_shared((block_m, kbs), T.float32)
            inv_ub = T.alloc_shared((kbs,), T.float32)
            T.copy(x[row : row + block_m, col : col + width], x_ub)
            with T.SimtVF(threads=THREADS):
                amax = T.alloc_local((1,), T.float32)
                if mode != "precomputed_sf":
                    for i, q in T.Parallel(block_m, kbs):
                        amax[0] = T.float32(0)
                        for j in T.serial(block_k):
                            amax[0] = T.max(amax[0], T.abs(T.Cast("float32", x_ub[i, q * block_k + j])))
                        row_max[i, q] = T.if_then_else(row + i < num_tokens, amax[0], T.float32(0))
                for q in T.Parallel(kbs):
                    kb = col // block_k + q
                    if mode == "precomputed_sf":
                        inv = T.float32(1.0) / common.decode_sf(out_sf[sf_out.index(mb, kb)], sf)
                        inv_ub[q] = T.Cast("float32", T.Cast("bfloat16", inv)) if inv_bf16 else inv
                    else:
                        amax[0] = T.float32(0)
                        for i in T.serial(block_m):
                            amax[0] = T.max(amax[0], row_max[i, q])
                        stored, inv = common.scale_factor(amax[0], fmt, sf)
                        inv_ub[q] = inv
                        out_sf[sf_out.index(mb, kb)] = stored
                        if sf_out.pad and kb == k_blocks - 1:
                            for p in T.serial(sf_out.pad):
                                out_sf[sf_out.index(mb, k_blocks + p)] = T.uint8(0)
                if mode != "sf_only":
                    for i, b in T.Parallel(block_m, out_width):
                        if fp4:
                            low = common.e2m1_code(scaled(x_ub, inv_ub, i, 2 * b))
                            high = common.e2m1_code(scaled(x_ub, inv_ub, i, 2 * b + 1))
                            out_ub[i, b] = T.Cast("uint8", low | (high << T.uint32(4)))
                        else:
                            out_ub[i, b] = common.to_e4m3(scaled(x_ub, inv_ub, i, b))
            if mode != "sf_only":
                T.copy(out_ub, out[row : row + block_m, col // (2 if fp4 else 1) : (col + width) // (2 if fp4 else 1)])

    return per_block_cast
