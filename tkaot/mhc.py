"""tkaot.mhc: TileKernels-compatible Manifold-Constrained Hyper-Connections (mHC) kernels, forward and backward,
in tkaot/_mhc/ (one module an op group), loaded on first use."""

from tkaot._lazy import lazy_family

_MODULES = {
    "tkaot._mhc.expand": ("expand_to_mhc_bwd", "expand_to_mhc_fwd"),
    "tkaot._mhc.pre_apply_mix": ("mhc_pre_apply_mix_bwd", "mhc_pre_apply_mix_fwd"),
    "tkaot._mhc.split_mixes": ("mhc_pre_split_mixes_bwd", "mhc_pre_split_mixes_fwd"),
    "tkaot._mhc.sinkhorn": ("mhc_sinkhorn_bwd", "mhc_sinkhorn_fwd"),
    "tkaot._mhc.post": ("mhc_post_bwd", "mhc_post_fwd"),
}
__getattr__, __dir__, __all__ = lazy_family("mhc", _MODULES, globals())
