"""Trainable layers over tkaot's ops, as TileKernels' tile_kernels.modeling: `tkaot.modeling.engram` (the Engram gate's
autograd function). Importing them loads no kernel."""

from tkaot.modeling import engram  # noqa: F401

__all__ = ["engram"]
