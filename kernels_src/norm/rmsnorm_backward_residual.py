"""RMSNorm backward, pass 1, for the calls with a residual gradient: the specialised kernel
(kernels_src/norm/rmsnorm_backward.py) with its body's residual form (tiling_body's `residual`), which takes the
residual gradient as given.

The calls without one keep rmsnorm_backward's variant, byte for byte; the op launches this kernel where a residual
gradient is given and it is built. It writes rmsnorm_backward's bytes: the same vectors a thread, the same products
and sums in the same order, the same fused multiply-adds. Two changes to the body:
- x * rstd and the (weighted, scaled) gradient are held in fp32 registers from the dot product to the stores, rather
  than the staged bf16 / fp32 vectors held and both products computed again (the same products, so the same values);
- the row's warp-sum barrier is one of each row slot's threads (bar.sync 1 + slot), not the block's, so a block's row
  slots need not wait for each other (where a block holds more than one).
(H200, 8192 x 7168, µs, rmsnorm_backward / this / TileKernels: bf16 weight 122.91 / 118.70 / 117.76; bf16 no weight
117.41 / 113.74 / 112.59; fp32 weight 226.64 / 225.87 / 227.18. Also timed, no faster: holding the gradient only,
refilling each residual vector's stage slot at once, evict-first stores, L2 hints on the copies, the residual gradient
read directly into registers.)
"""

from kernels_src.norm.rmsnorm_backward import PASS_CONFIGS as PASS_CONFIGS
from kernels_src.norm.rmsnorm_backward import StaticTiling, rmsnorm_backward_kernel, tiling_body
from tkaot._quant.kernels import RMSNORM_BACKWARD_RESIDUAL

DECL = RMSNORM_BACKWARD_RESIDUAL


def build(hidden: int, dtype: str):
    return rmsnorm_backward_kernel(StaticTiling(hidden, dtype), dtype, static_body=residual_body)


def residual_body(tiling, dtype: str, num_tokens, num_blocks):
    """The body over a StaticTiling, as a macro of the kernel's parameters and its block (has_residual taken as 1)."""
    return tiling_body(tiling, dtype, num_tokens, num_blocks, form="residual")
