"""tkaot.engram: TileKernels-compatible Engram ops (n-gram hashing, the gate and its backward, the Sinkhorn
normalisation of the embedding tables), in tkaot/_engram/*.py, loaded on first use. The trainable gate's autograd
function is tkaot.modeling.engram."""

from tkaot._lazy import lazy_family

_MODULES = {
    "tkaot._engram.hash": ("engram_hash",),
    "tkaot._engram.gate": ("engram_gate_bwd", "engram_gate_fwd", "fused_weight", "grad_w_reduce"),
    "tkaot._engram.sinkhorn": (
        "engram_sinkhorn_finalize", "engram_sinkhorn_momentum_update", "engram_sinkhorn_step", "engram_sinkhorn_step_reduce",
    ),
}  # fmt: skip
__getattr__, __dir__, __all__ = lazy_family("engram", _MODULES, globals())
