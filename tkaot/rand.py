"""tkaot.rand: TileKernels-compatible random tensors (randn, randn_like, set_seed).

On CUDA, TileKernels' randn is torch.randn, and so is tkaot's: the same numbers as TileKernels for the same
seed, reproducible under torch.manual_seed (which set_seed calls), an offset kept per device, and safe inside
CUDA graphs (each replay draws fresh numbers). A kernel of our own would have to keep all of that and be
faster to be worth shipping; none is until a measurement says so (bench/cases/backward.py times randn beside
torch and TileKernels).
"""

from __future__ import annotations

import torch

__all__ = ["randn", "randn_like", "set_seed"]


def randn(
    *size: int | tuple[int, ...],
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> torch.Tensor:
    """Standard normal samples (mean 0, variance 1) of the given shape.

    Args:
        size: the shape, as integers (randn(2, 3)) or one tuple (randn((2, 3))).
        dtype: torch's default dtype when None.
        device: "cuda" (the current CUDA device) when None.

    Returns the values torch.randn draws from the device's default generator: after set_seed(s) (or
    torch.manual_seed(s)) the same calls give the same tensors.
    """
    shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    return torch.randn(shape, dtype=dtype, device="cuda" if device is None else device)


def randn_like(input: torch.Tensor) -> torch.Tensor:
    """randn of input's shape, dtype and device."""
    return randn(input.shape, dtype=input.dtype, device=input.device)


def set_seed(seed: int) -> None:
    """Seed the generators randn draws from: torch's, on the CPU and every CUDA device."""
    torch.manual_seed(seed)
