"""tkaot.moe: TileKernels-compatible MoE routing ops (top-k gates, weight normalisation); in tkaot/_moe/ops.py."""

from tkaot._moe.ops import moe_topk_gate, moe_topk_gate_forward, normalize_weight, topk_gate

__all__ = ["moe_topk_gate", "moe_topk_gate_forward", "normalize_weight", "topk_gate"]
