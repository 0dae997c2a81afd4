"""tkaot.transform: TileKernels-compatible tensor transforms (rotary position embedding); in tkaot/_transform/rotary.py."""

from tkaot._transform.rotary import apply_rotary

__all__ = ["apply_rotary"]
