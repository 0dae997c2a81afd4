"""tkaot: TileKernels' LLM kernels compiled ahead of time, launched without JIT.

    import tkaot
    out, rstd, residual_out = tkaot.quant.norm_forward(x, weight, 1e-6)

Importing tkaot loads neither TileLang nor a compiler; kernels are read from
prebuilt artifact sets the first time an op needs them (or by preload()).
"""

__version__ = "0.1.0"

import importlib  # noqa: E402

from tkaot.errors import (  # noqa: E402
    ArtifactError,
    CudaDriverError,
    GenericVariantWarning,
    ManifestError,
    NoGPUError,
    TkaotError,
    UnsupportedArchError,
    VariantNotBuilt,
)

# The op families load on first use, so `import tkaot` costs only what its first call needs
_LAZY = ("quant", "moe", "transform", "mhc", "engram", "rand", "modeling", "reference", "registry")


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f"tkaot.{name}")
    raise AttributeError(f"module 'tkaot' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def preload(device=None, generic: bool = False) -> int:
    """Load every kernel of the device's artifact sets now, so no call stalls later.

    device: an index, "cuda:1" or a torch.device; the current device when None (or "cuda"). Each device loads its
    own modules: call it once per device a process drives.

    The generic tier's variants (fallbacks for calls no specialised variant serves) load too only with
    `generic=True`; otherwise each loads at its first call. Returns the number of kernels loaded.
    """
    from tkaot.registry import REGISTRY

    if isinstance(device, str):  # "cuda:1"
        import torch

        device = torch.device(device)
    index = device if device is None or isinstance(device, int) else device.index  # torch.device("cuda"): the current one
    return REGISTRY.preload(index, generic)


def launcher_kind() -> str:
    """Which launch path ops use in this process: "compiled" (the C extension) or "abi" (cffi).

    The compiled one ships in the platform wheel; TKAOT_LAUNCHER=abi forces the other.
    """
    from tkaot._kernel import LAUNCHER_KIND

    return LAUNCHER_KIND


__all__ = [
    "ArtifactError",
    "CudaDriverError",
    "GenericVariantWarning",
    "ManifestError",
    "NoGPUError",
    "TkaotError",
    "UnsupportedArchError",
    "VariantNotBuilt",
    "engram",
    "launcher_kind",
    "mhc",
    "modeling",
    "moe",
    "preload",
    "quant",
    "rand",
    "transform",
]
