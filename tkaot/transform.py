"""tkaot.transform: TileKernels-compatible tensor transforms (rotary position embedding), in
tkaot/_transform/rotary.py, loaded on first use."""

from tkaot._lazy import lazy_family

_MODULES = {"tkaot._transform.rotary": ("apply_rotary",)}
__getattr__, __dir__, __all__ = lazy_family("transform", _MODULES, globals())
