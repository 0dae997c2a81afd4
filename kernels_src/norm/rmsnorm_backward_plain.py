"""RMSNorm backward, pass 1, for the calls with neither a weight nor a residual gradient: the specialised kernel
(kernels_src/norm/rmsnorm_backward.py) with its body's plain form (tiling_body's `form`), which takes both flags as 0.

The other calls keep rmsnorm_backward's and rmsnorm_backward_residual's variants, byte for byte; the op launches this
kernel where neither is given and it is built. It writes rmsnorm_backward's bytes: the same vectors a thread, the
same products and sums in the same order, the same fused multiply-adds. What the plain form leaves out: the weight's
registers and weight-gradient sums (148 registers a thread at bf16 7168 where the runtime-flag body holds 255), the
residual gradient's third of the stage (x and out_grad alone: 114,752 bytes of shared memory at bf16 7168, not
172,096, so the SM keeps more L1), every flag's branch, and the block barrier after the warp sums (one named barrier
a row slot instead). What it does as TileKernels' norm_backward does: each block runs its own rows' count, so a
block of one row slot (8192) checks no row; x * rstd and out_grad * out_scale are held in fp32 across the reduction;
each vector's stage slots are refilled as soon as the thread reads it.
(H200, 8192 tokens, bf16, µs, the previous plain body / this / TileKernels, one run: 8192 101.79 / 95.01 / 95.89;
4096 51.93 / 51.89 / 49.21; 7168 92.26 / 90.84 / 91.33. Also timed, no faster across the three: the own row count
alone, out_scale taken as 1 (alone, or with this body: 94.60 / 51.93 / 90.63, within noise, and a second kernel for
out_scale != 1), a grid of 2 blocks an SM, the launch without PDL; f014b86:bench/results/2026-12-03-H200-s18-tune_normbwd11.log,
by bench/tuning/tune_normbwd11.py as of commit 8ea7c2b.)
Where a row takes 128 threads and at most 5 vectors a thread (bf16 4096 and 5120) the block is one row slot of 128
threads, 2 blocks an SM (norm_backward_plain_block, which the op's grid follows too): the same rows in
flight, no row checks. (H200, µs, two slots / one / TileKernels: 4096 51.04 / 48.40 / 49.07; 5120 64.39 / 60.74 /
62.35; 7168 91.73 / 94.04 / 91.78, so 7168 keeps two; f014b86:bench/results/2026-12-03-H200-s19-tune_normbwd12.log, by
bench/tuning/tune_normbwd12.py as of commit 74313ae.)
"""

from kernels_src.norm.rmsnorm_backward import PASS_CONFIGS as PASS_CONFIGS
from kernels_src.norm.rmsnorm_backward import StaticTiling, rmsnorm_backward_kernel, tiling_body
from tkaot._quant.kernels import RMSNORM_BACKWARD_PLAIN, norm_backward_plain_block

DECL = RMSNORM_BACKWARD_PLAIN


def build(hidden: int, dtype: str):
    threads = norm_backward_plain_block(hidden, dtype)[0]  # one row slot a block of 128 at bf16 4096 and 5120
    return rmsnorm_backward_kernel(StaticTiling(hidden, dtype, threads), dtype, static_body=plain_body)


def plain_body(tiling, dtype: str, num_tokens, num_blocks):
    """The body over a StaticTiling, as a macro of the kernel's parameters and its block (both flags taken as 0)."""
    return tiling_body(tiling, dtype, num_tokens, num_blocks, form="plain")
