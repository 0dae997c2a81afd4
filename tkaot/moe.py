"""tkaot.moe: TileKernels-compatible MoE routing ops (top-k gates, weight normalisation), in tkaot/_moe/ops.py,
loaded on first use."""

from tkaot._lazy import lazy_family

_MODULES = {
    "tkaot._moe.ops": ("moe_topk_gate", "moe_topk_gate_forward", "normalize_weight", "topk_gate"),
    "tkaot._moe.backward": ("moe_topk_gate_backward",),
}
__getattr__, __dir__, __all__ = lazy_family("moe", _MODULES, globals())
