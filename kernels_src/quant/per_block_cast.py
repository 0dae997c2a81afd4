"""Per-block cast to FP8 E4M3 or FP4 E2M1 with one scale factor per (block_m x block_k) block.

One CTA per scale block: its threads hold the block in registers as 16-byte
vectors (each thread the same column vector of several rows), reduce the amax
with warp shuffles and one shared-memory exchange between warps, then scale,
round and store. Rows past the last token read as zero and are not written, so
any token count works. Modes as in per_token_cast: "cast", "sf_only",
"precomputed_sf".
"""

import tilelang.language as T

from kernels_src.pdl import kernel_entry
from kernels_src.quant import common
from kernels_src.quant.encode import store_encoded
from tkaot._quant.kernels import PER_BLOCK_CAST

DECL = PER_BLOCK_CAST  # the declaration this module builds (tkaot/_quant/kernels.py)


def check_static(hidden, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode) -> None:
    if mode == "precomputed_sf" and (sf == "ue8m0" or sf_layout == "col"):
        raise ValueError(f"{DECL.name}: precomputed_sf reads row-major, unpacked scale factors only (sf=fp32/pow2, sf_layout=row)")


def build(hidden, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode):
    check_static(hidden, in_dtype, fmt, block_m, block_k, sf, sf_layout, mode)
    vec = 16 // (2 if in_dtype == "bfloat16" else 4)
    row_vecs = block_k // vec  # vectors across one row of a block
    total_vecs = block_m * row_vecs
    threads = min(256, total_vecs // 4)
    rows_per_pass = threads // row_vecs
    passes = block_m // rows_per_pass
    warps = threads // 32
    fp4_out = fmt == "e2m1"
    word_codes = 8 if vec % 8 == 0 else 4
    out_vec = vec // word_codes if fp4_out else vec
    out_storage = ("uint32" if word_codes == 8 else "uint16") if fp4_out else "float8_e4m3"
    out_cols = hidden // word_codes if fp4_out else hidden
    k_blocks = hidden // block_k
    sf_out = common.SfLayout(sf, sf_layout, k_blocks)
    inv_bf16 = in_dtype == "bfloat16" and sf == "pow2" and mode == "precomputed_sf"

    num_tokens = T.dynamic("num_tokens")
    sf_stride = T.dynamic("sf_stride")
    m_blocks = (num_tokens + block_m - 1) // block_m

    @T.prim_func
    def per_block_cast(
        x: T.Tensor[(num_tokens, hidden), in_dtype],
        out: T.Tensor[(num_tokens, out_cols), out_storage],
        out_sf: T.StridedTensor[sf_out.shape(m_blocks), (sf_stride, 1), sf_out.dtype],
    ):
        with T.Kernel(k_blocks, m_blocks, threads=threads) as (kb, mb):
            kernel_entry()
            tid = T.get_thread_binding()
            col = kb * block_k + tid % row_vecs * vec
            x_reg = T.alloc_local((passes, vec), in_dtype)
            xf = T.alloc_local((vec,), "float32")
            o_reg = T.alloc_local((out_vec,), out_storage)
            amax = T.alloc_var("float32", init=0.0)
            warp_max = T.alloc_shared((warps,), "float32")
            inv = T.alloc_var("float32")

            for p in T.unroll(passes):
                row = mb * block_m + p * rows_per_pass + tid // row_vecs
                common.load_or_zero(x_reg, p, x, row, col, num_tokens, vec, in_dtype)

            if mode == "precomputed_sf":
                inv = T.float32(1.0) / common.decode_sf(out_sf[sf_out.index(mb, kb)], sf)
                if inv_bf16:
                    inv = T.Cast("float32", T.Cast("bfloat16", inv))
            else:
                for p in T.unroll(passes):
                    for j in T.unroll(vec):
                        amax = T.max(amax, T.abs(T.Cast("float32", x_reg[p, j])))
                for s in T.unroll(5):
                    amax = T.max(amax, T.shfl_xor(amax, 16 >> s))
                if warps > 1:
                    if tid % 32 == 0:
                        warp_max[tid // 32] = amax
                    T.sync_threads()
                    for w in T.unroll(warps):
                        amax = T.max(amax, warp_max[w])
                stored, inv_value = common.scale_factor(amax, fmt, sf)
                inv = inv_value
                if tid == 0:
                    out_sf[sf_out.index(mb, kb)] = stored
                    if sf_out.pad > 0:
                        if kb == k_blocks - 1:
                            for q in T.unroll(sf_out.pad):
                                out_sf[sf_out.index(mb, k_blocks + q)] = T.uint8(0)

            if mode != "sf_only":
                for p in T.unroll(passes):
                    row = mb * block_m + p * rows_per_pass + tid // row_vecs
                    if row < num_tokens:
                        for j in T.unroll(vec):
                            xf[j] = T.Cast("float32", x_reg[p, j]) * inv
                        store_encoded(xf, o_reg, out, row, col)

    return per_block_cast
