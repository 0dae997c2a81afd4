"""A norm_forward launch with every argument pre-built: the floor the launch path is measured against."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrebuiltLaunch:
    x: torch.Tensor
    weight: torch.Tensor
    out: torch.Tensor
    fn: object  # CUfunction
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    stream: int
    params: object  # void *[], pointing into storage
    storage: bytearray  # kept alive for params
    values: tuple  # the op's argument values the params were packed from, in _NORM.args order


def prebuilt_norm_launch(hidden: int = 7168) -> PrebuiltLaunch:
    """The (1, hidden) bf16 norm_forward kernel with weight, its arguments packed once, module loaded."""
    import tkaot.quant
    from tkaot import _cuda
    from tkaot._quant.norm import _NORM
    from tkaot.registry import REGISTRY

    x = torch.randn(1, hidden, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    out, _, _ = tkaot.quant.norm_forward(x, w, 1e-6)  # loads the module
    dev = x.get_device()
    # the ABI launcher's layout, whichever launcher the op uses: the floor is a bare cffi call
    kernel = REGISTRY.kernel(_NORM.op, _NORM.kernel, _NORM.key((hidden, "bfloat16", True, False, False)), dev)
    launcher = kernel.bind(_NORM.args, "abi")
    values = (x.data_ptr(), w.data_ptr(), 0, out.data_ptr(), 0, 0, 1e-6, 1.0, 1, 1, 0, hidden, 0, 0, 0, hidden, 0, 0)
    storage = bytearray(launcher._size)
    base = _cuda.ffi.cast("char *", _cuda.ffi.from_buffer(storage))
    params = _cuda.ffi.new("void *[]", len(launcher._offsets))
    for i, off in enumerate(launcher._offsets):
        params[i] = base + off
    launcher._pack_into(storage, 0, *values)
    return PrebuiltLaunch(
        x, w, out, kernel.load(dev), launcher._grid(values), launcher._block, launcher._smem,
        torch._C._cuda_getCurrentRawStream(dev), params, storage, values,
    )  # fmt: skip
