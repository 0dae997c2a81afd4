"""RMSNorm backward, pass 1, for the calls with neither a weight nor a residual gradient: the specialised kernel
(kernels_src/norm/rmsnorm_backward.py) with its body's plain form (tiling_body's `form`), which takes both flags as 0.

The other calls keep rmsnorm_backward's and rmsnorm_backward_residual's variants, byte for byte; the op launches this
kernel where neither is given and it is built. It writes rmsnorm_backward's bytes: the same vectors a thread, the
same products and sums in the same order, the same fused multiply-adds. What the plain form leaves out: the weight's
registers and weight-gradient sums (150 registers a thread where the runtime-flag body holds 255), the residual
gradient's third of the stage (x and out_grad alone: 114,752 bytes of shared memory at bf16 7168, not 172,096, so
the SM keeps more L1), every flag's branch (about a third of the loop's instructions), and the block barrier after
the warp sums (one named barrier a row slot instead).
(H200, 8192 tokens, bf16, µs, rmsnorm_backward / this / TileKernels: 7168 98.97 / 91.44 / 91.50; 4096 51.89 / 51.29 /
49.51; 2048 27.59 / 27.56 / 27.11. Also timed, no faster across the three: the shipped source with the flags folded
(3 staged tensors), each vector's stage slot refilled at once, unconditional staged reads, 3 rows staged ahead, the
launch without PDL; bench/results/2026-12-03-H200-s17-tune_normbwd8.log, by bench/tuning/tune_normbwd8.py as of
commit 10b5c84.)
"""

from kernels_src.norm.rmsnorm_backward import PASS_CONFIGS as PASS_CONFIGS
from kernels_src.norm.rmsnorm_backward import StaticTiling, rmsnorm_backward_kernel, tiling_body
from tkaot._quant.kernels import RMSNORM_BACKWARD_PLAIN

DECL = RMSNORM_BACKWARD_PLAIN


def build(hidden: int, dtype: str):
    return rmsnorm_backward_kernel(StaticTiling(hidden, dtype), dtype, static_body=plain_body)


def plain_body(tiling, dtype: str, num_tokens, num_blocks):
    """The body over a StaticTiling, as a macro of the kernel's parameters and its block (both flags taken as 0)."""
    return tiling_body(tiling, dtype, num_tokens, num_blocks, form="plain")
