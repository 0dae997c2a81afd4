"""Ascend 950 kernels: TileLang's Ascend dialect (`tilelang.ascend.language`), lowered to AscendC.

One module per kernel, named as the CUDA kernel whose declaration (tkaot/_<family>/kernels.py) it builds:
the same `DECL`, so the same static axes, the same variant keys and the same op arguments, in the same
meaning. Each module also says which of the declaration's static values it builds (`unsupported`), and
which runtime values it cannot take yet (`REQUIRES`: argument -> the only value it accepts; the Ascend
launcher refuses other calls with a clear error before anything is launched).

The kernels are written for correctness first, in the dialect's SIMT style: a block (one AI vector core's
turn) takes a tile of rows into the Unified Buffer, computes there in a `T.SimtVF` region and copies
the results out by DMA. Small or scattered pieces (scale factors in any layout, routing tables, outputs whose width
is a runtime value) are read and written from the SIMT region directly in global memory. The block count is
an expression in the dynamic dims (no persistent loop), so the binary does not depend on how many vector
cores a device has. A generic tier's module (`<kernel>_generic`) builds with its specialised kernel's builder, the
width a runtime value: tiles sized for the widest row with copies clipped to the row, or rows cut into segments.
Shared pieces: tile sizing (tile.py), the norms' row RMS (rms.py), quantized input (quant_in.py). None of them has
run on an NPU yet.
"""

# kernel name -> its Ascend module; build_tools/ascend.py reads this table
ASCEND_SOURCES = {
    "rmsnorm": "kernels_src.ascend.rmsnorm",
    "per_token_cast": "kernels_src.ascend.per_token_cast",
    "swiglu": "kernels_src.ascend.swiglu",
    "topk_gate": "kernels_src.ascend.topk_gate",
    "norm_cast": "kernels_src.ascend.norm_cast",
    "moe_topk_gate": "kernels_src.ascend.moe_topk_gate",
    "normalize_weight": "kernels_src.ascend.normalize_weight",
    "rotary": "kernels_src.ascend.rotary",
    "cast": "kernels_src.ascend.cast",
    "cast_back": "kernels_src.ascend.cast_back",
    "per_block_cast": "kernels_src.ascend.per_block_cast",
    "per_channel_cast": "kernels_src.ascend.per_channel_cast",
    "engram_fused_weight": "kernels_src.ascend.engram_fused_weight",
    "engram_sinkhorn_momentum": "kernels_src.ascend.engram_sinkhorn_momentum",
    "engram_grad_w_reduce": "kernels_src.ascend.engram_grad_w_reduce",
    "engram_sinkhorn_step_reduce": "kernels_src.ascend.engram_sinkhorn_step_reduce",
    "engram_hash": "kernels_src.ascend.engram_hash",
    "engram_sinkhorn_finalize": "kernels_src.ascend.engram_sinkhorn_finalize",
    "engram_sinkhorn_step": "kernels_src.ascend.engram_sinkhorn_step",
    "mhc_normw_merge_fwd": "kernels_src.ascend.mhc_normw_merge_fwd",
    "mhc_normw_merge_bwd": "kernels_src.ascend.mhc_normw_merge_bwd",
    "mhc_head_mix_fwd": "kernels_src.ascend.mhc_head_mix_fwd",
    # mHC
    "mhc_expand_fwd": "kernels_src.ascend.mhc_expand_fwd",
    "mhc_expand_bwd": "kernels_src.ascend.mhc_expand_bwd",
    "mhc_head_mix_bwd": "kernels_src.ascend.mhc_head_mix_bwd",
    "mhc_multilayer_recompute": "kernels_src.ascend.mhc_multilayer_recompute",
    "mhc_post_fwd": "kernels_src.ascend.mhc_post_fwd",
    "mhc_post_bwd": "kernels_src.ascend.mhc_post_bwd",
    "mhc_pre_apply_mix_fwd": "kernels_src.ascend.mhc_pre_apply_mix_fwd",
    "mhc_pre_apply_mix_bwd": "kernels_src.ascend.mhc_pre_apply_mix_bwd",
    "mhc_pre_big_fuse": "kernels_src.ascend.mhc_pre_big_fuse",
    "mhc_pre_big_fuse_split": "kernels_src.ascend.mhc_pre_big_fuse_split",
    "mhc_reduce_partials_fwd": "kernels_src.ascend.mhc_reduce_partials_fwd",
    "mhc_reduce_partials_bwd": "kernels_src.ascend.mhc_reduce_partials_bwd",
    "mhc_sinkhorn_fwd": "kernels_src.ascend.mhc_sinkhorn_fwd",
    "mhc_sinkhorn_bwd": "kernels_src.ascend.mhc_sinkhorn_bwd",
    "mhc_split_mixes_fwd": "kernels_src.ascend.mhc_split_mixes_fwd",
    "mhc_split_mixes_bwd": "kernels_src.ascend.mhc_split_mixes_bwd",
    "mhc_split_mixes_bwd_reduce": "kernels_src.ascend.mhc_split_mixes_bwd_reduce",
    # casts, backward, generic tiers, engram gate
    "per_block_cast_lossless": "kernels_src.ascend.per_block_cast_lossless",
    "per_block_cast_generic": "kernels_src.ascend.per_block_cast_generic",
    "per_channel_cast_generic": "kernels_src.ascend.per_channel_cast_generic",
    "per_block_cast_lossless_generic": "kernels_src.ascend.per_block_cast_lossless_generic",
    "batched_transpose_weight_sf": "kernels_src.ascend.batched_transpose_weight_sf",
    "cast_back_generic": "kernels_src.ascend.cast_back_generic",
    "per_token_cast_generic": "kernels_src.ascend.per_token_cast_generic",
    "rmsnorm_backward": "kernels_src.ascend.rmsnorm_backward",
    "rmsnorm_backward_generic": "kernels_src.ascend.rmsnorm_backward_generic",
    "rmsnorm_backward_residual": "kernels_src.ascend.rmsnorm_backward_residual",
    "rmsnorm_backward_plain": "kernels_src.ascend.rmsnorm_backward_plain",
    "weight_grad_reduce": "kernels_src.ascend.weight_grad_reduce",
    "swiglu_backward": "kernels_src.ascend.swiglu_backward",
    "moe_topk_gate_backward": "kernels_src.ascend.moe_topk_gate_backward",
    "rmsnorm_generic": "kernels_src.ascend.rmsnorm_generic",
    "norm_cast_generic": "kernels_src.ascend.norm_cast_generic",
    "swiglu_generic": "kernels_src.ascend.swiglu_generic",
    "topk_gate_generic": "kernels_src.ascend.topk_gate_generic",
    "moe_topk_gate_generic": "kernels_src.ascend.moe_topk_gate_generic",
    "normalize_weight_generic": "kernels_src.ascend.normalize_weight_generic",
    "engram_gate_fwd": "kernels_src.ascend.engram_gate_fwd",
    "engram_gate_bwd": "kernels_src.ascend.engram_gate_bwd",
}
