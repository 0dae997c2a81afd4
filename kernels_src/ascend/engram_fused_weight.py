"""The Engram gate's fused RMSNorm weight for Ascend: weight_fused = float(weight_hidden) * float(weight_embed).

A block copies `BLOCK` elements of both weights into the Unified Buffer, multiplies them in fp32 in a SIMT region
(the product of two bf16 values is exact in fp32, so every element equals the CUDA kernel's) and copies the
products back; the last block's copies stop at numel.
"""

from tilelang.ascend import language as T

from kernels_src.ascend.common import REQUIRES as REQUIRES  # every value the declaration allows
from kernels_src.ascend.common import stage
from kernels_src.ascend.common import unsupported as unsupported
from kernels_src.engram.fused_weight import fused_weight_kernel
from tkaot._engram.kernels import FUSED_WEIGHT

DECL = FUSED_WEIGHT
BLOCK = 8192
THREADS = 256


def elementwise_tiles(first, size, *inputs):
    """The Unified Buffer tiles of a block of an elementwise kernel (this one, engram_sinkhorn_momentum.py): the run of
    `size` elements from `first` of each (tensor, dtype) in inputs, staged (stage), then an fp32 tile for a result.
    The statement that takes them names the tiles."""
    staged = [stage(tensor[first : first + size], (size,), dtype) for tensor, dtype in inputs]
    return (*staged, T.alloc_shared((size,), T.float32))


def build(dtype: str):
    @T.macro
    def body(numel, weight_hidden, weight_embed, weight_fused):
        with T.Kernel(T.ceildiv(numel, BLOCK)) as block:
            first = block * BLOCK
            h_ub, e_ub, f_ub = elementwise_tiles(first, BLOCK, (weight_hidden, dtype), (weight_embed, dtype))
            with T.SimtVF(threads=THREADS):
                for j in T.Parallel(BLOCK):
                    f_ub[j] = T.Cast("float32", h_ub[j]) * T.Cast("float32", e_ub[j])
            T.copy(f_ub, weight_fused[first : first + BLOCK])

    return fused_weight_kernel(dtype, body)
