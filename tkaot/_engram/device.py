"""The one device fact tkaot.engram's ops need: how many SMs a device has (TileKernels sizes its per-CTA partials,
grad_w_partial and col_sumsq_partial, by it, and tkaot returns the same shapes)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count
