"""Input checks shared by every op: one clear exception per problem, before any launch."""

from __future__ import annotations

import torch

MAX_I32 = 2**31 - 1


def fail(op: str, name: str, expected: str, actual) -> None:
    raise ValueError(f"{op}: {name} must be {expected}, got {actual}")


def check_cuda(op: str, name: str, t, device_index: int | None = None) -> int:
    """t is a CUDA tensor (on device_index when given); returns its device index."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        fail(op, name, "a CUDA tensor", f"a tensor on {t.device}")
    index = t.get_device()
    if device_index is not None and index != device_index:
        fail(op, name, f"on cuda:{device_index} like the input", f"cuda:{index}")
    return index


def check_like(op: str, name: str, t, shape, dtype, device_index: int) -> None:
    check_cuda(op, name, t, device_index)
    if t.dtype != dtype:
        fail(op, name, f"{dtype}", t.dtype)
    if t.shape != shape:
        fail(op, name, f"of shape {tuple(shape)}", tuple(t.shape))


def check_rows(op: str, name: str, t, vec: int) -> None:
    """Rows of t are 16-byte aligned vectors: last dim contiguous, strides and address aligned."""
    strides = t.stride()
    if strides[-1] != 1:
        fail(op, name, "contiguous in its last dimension", f"strides {strides}")
    if t.data_ptr() % 16:
        fail(op, name, "16-byte aligned", f"address {t.data_ptr():#x}")
    shape = t.shape
    for dim in range(len(shape) - 1):
        if shape[dim] > 1 and (strides[dim] % vec or strides[dim] > MAX_I32):
            fail(op, name, f"strided in multiples of {vec} elements (16 bytes) below 2**31", f"strides {strides}")
