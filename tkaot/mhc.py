"""tkaot.mhc: TileKernels-compatible Manifold-Constrained Hyper-Connections ops, forward and backward, in tkaot/_mhc/
(one module an op group), loaded on first use."""

from tkaot._lazy import lazy_family

_MODULES = {
    "tkaot._mhc.expand": ("expand_to_mhc_bwd", "expand_to_mhc_fwd"),
    "tkaot._mhc.pre_apply_mix": ("mhc_pre_apply_mix_bwd", "mhc_pre_apply_mix_fwd"),
    "tkaot._mhc.split_mixes": ("mhc_pre_split_mixes_bwd", "mhc_pre_split_mixes_fwd"),
    "tkaot._mhc.sinkhorn": ("mhc_sinkhorn_bwd", "mhc_sinkhorn_fwd"),
    "tkaot._mhc.post": ("mhc_post_bwd", "mhc_post_fwd"),
    "tkaot._mhc.head_mix": ("mhc_head_compute_mix_fwd", "mhc_head_compute_mix_bwd"),
    "tkaot._mhc.norm_fn": (
        "mhc_fn_normw_merge_fwd", "mhc_fn_normw_merge_bwd",
        "mhc_reduce_partials_and_rmsnorm_fwd", "mhc_reduce_partials_and_rmsnorm_bwd",
    ),
    "tkaot._mhc.big_fuse": ("mhc_pre_big_fuse_fwd",),
    "tkaot._mhc.recompute": ("mhc_multilayer_recompute",),
}  # fmt: skip
__getattr__, __dir__, __all__ = lazy_family("mhc", _MODULES, globals())
