"""Dequantize E4M3 or packed E2M1 data with block scale factors: out = round(data * sf) in bf16 or fp32.

Each thread takes one 16-byte input vector (fewer bytes when a scale block is
narrower), reads the vector's one scale factor, and writes its outputs with
16-byte stores. The vector index is flattened over (token, vector in row), so
one cubin serves every token count.
"""

import tilelang.language as T

from kernels_src.axes import Axis
from kernels_src.quant import common

KERNEL = "cast_back"
OPS = ("tkaot.quant.cast_back", "tkaot.quant.per_token_cast_back")
MAX_HIDDEN = 65536

AXES = (
    Axis("hidden", int, check=lambda h: 0 < h <= MAX_HIDDEN and h % 64 == 0, rule=f"a multiple of 64 in (0, {MAX_HIDDEN}]"),
    Axis("in_dtype", str, choices=("e4m3", "e2m1")),
    Axis("in_block", str, choices=common.IN_BLOCKS[1:]),
    Axis("in_sf", str, choices=common.IN_SF[1:]),
    Axis("out_dtype", str, choices=("bfloat16", "float32")),
)
DYNAMIC_DIMS = ("num_tokens",)

NUM_THREADS = 128
VECS_PER_THREAD = 2


def check_static(hidden, in_dtype, in_block, in_sf, out_dtype) -> None:
    bm, bk = common.block_shape(in_block)
    if hidden % bk:
        raise ValueError(f"{KERNEL}: hidden={hidden} is not a multiple of the block width {bk} (in_block={in_block})")


def build(hidden, in_dtype, in_block, in_sf, out_dtype):
    check_static(hidden, in_dtype, in_block, in_sf, out_dtype)
    fp4_in = in_dtype == "e2m1"
    per_byte = 2 if fp4_in else 1
    storage = "uint8" if fp4_in else "float8_e4m3"
    bm, bk = common.block_shape(in_block)
    vec = min(16 * per_byte, bk)
    regs = vec // per_byte
    vecs_per_row = hidden // vec
    block_vecs = NUM_THREADS * VECS_PER_THREAD
    sf_in = common.SfLayout.from_input(in_sf, hidden // bk)

    num_tokens = T.dynamic("num_tokens")
    x_stride = T.dynamic("x_stride")
    sf_stride = T.dynamic("sf_stride")
    sf_rows = num_tokens if bm == 1 else (num_tokens + bm - 1) // bm

    @T.prim_func
    def cast_back(
        x: T.StridedTensor[(num_tokens, hidden // per_byte), (x_stride, 1), storage],
        x_sf: T.StridedTensor[sf_in.shape(sf_rows), (sf_stride, 1), sf_in.dtype],
        out: T.Tensor[(num_tokens, hidden), out_dtype],
    ):
        with T.Kernel(T.ceildiv(num_tokens * vecs_per_row, block_vecs), threads=NUM_THREADS) as block:
            T.assume(x_stride % 16 == 0)
            tid = T.get_thread_binding()
            x_reg = T.alloc_local((VECS_PER_THREAD, regs), storage)
            scale = T.alloc_local((VECS_PER_THREAD,), "float32")
            o_reg = T.alloc_local((vec,), out_dtype)
            for u in T.unroll(VECS_PER_THREAD):
                i = block * block_vecs + u * NUM_THREADS + tid
                if i < num_tokens * vecs_per_row:
                    for j in T.vectorized(regs):
                        x_reg[u, j] = x[i // vecs_per_row, i % vecs_per_row * regs + j]
                    scale[u] = common.decode_sf(x_sf[sf_in.index(i // vecs_per_row // bm, i % vecs_per_row * vec // bk)], sf_in.kind)
            for u in T.unroll(VECS_PER_THREAD):
                i = block * block_vecs + u * NUM_THREADS + tid
                if i < num_tokens * vecs_per_row:
                    for j in T.unroll(vec):
                        if fp4_in:
                            o_reg[j] = T.Cast(
                                out_dtype, common.e2m1_value(T.Cast("uint32", x_reg[u, j // 2]) >> T.uint32(4 * (j % 2))) * scale[u]
                            )
                        else:
                            o_reg[j] = T.Cast(out_dtype, T.Cast("float32", x_reg[u, j]) * scale[u])
                    for j in T.vectorized(vec):
                        out[i // vecs_per_row, i % vecs_per_row * vec + j] = o_reg[j]

    return cast_back
