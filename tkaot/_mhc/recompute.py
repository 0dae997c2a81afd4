"""tkaot.mhc.mhc_multilayer_recompute: rebuild several layers' residual streams and layer inputs in one launch.

The per-layer tensors reach the kernel through one int64 table of their addresses, built per call: a
Python list of data_ptr()s packed into an array, one pinned host tensor, one asynchronous copy on the
current stream (the host buffer comes from torch's pinned-memory cache, which keeps it until the copy
has run). That and the checks of every layer's tensors are the whole per-call host cost
(bench/mhc_recompute_host.py measures it without a GPU).
"""

from __future__ import annotations

import array

import torch

from tkaot._compile import allocates_nothing, compiler, is_dynamo_compiling, traced
from tkaot._mhc.kernels import MAX_RECOMPUTE_MULT, MULTILAYER_RECOMPUTE, recompute_mix_piece
from tkaot._op import OpKernels, current_stream
from tkaot._validate import MAX_I32, fail, not_a_tensor

__all__ = ["mhc_multilayer_recompute"]

_OP = "tkaot.mhc.mhc_multilayer_recompute"
_VEC = 8  # bf16 elements the kernel moves at once (16 bytes)
_F32, _BF16 = torch.float32, torch.bfloat16
_RECOMPUTE = OpKernels(_OP, MULTILAYER_RECOMPUTE)


def _residual_dims(initial_residual) -> tuple[int, int, int, int]:
    """(device, num_tokens, mhc_mult, hidden) of initial_residual (..., mhc_mult, hidden), or raise."""
    if not isinstance(initial_residual, torch.Tensor):
        not_a_tensor(_OP, "initial_residual", initial_residual)
    device = initial_residual.get_device()
    if device < 0:
        fail(_OP, "initial_residual", "a CUDA tensor", f"a tensor on {initial_residual.device}")
    if initial_residual.dtype is not _BF16:
        fail(_OP, "initial_residual", "torch.bfloat16", initial_residual.dtype)
    shape = initial_residual.shape
    if len(shape) < 2:
        fail(_OP, "initial_residual", "(..., mhc_mult, hidden)", f"shape {tuple(shape)}")
    mhc_mult, hidden = shape[-2], shape[-1]
    if not MULTILAYER_RECOMPUTE.axis("mhc_mult").allows(mhc_mult):
        fail(_OP, "initial_residual", f"of mhc_mult (dim -2) in [1, {MAX_RECOMPUTE_MULT}]", f"shape {tuple(shape)}")
    if hidden % _VEC or hidden == 0:
        fail(_OP, "initial_residual", f"of a hidden size (last dim) that is a positive multiple of {_VEC}", f"shape {tuple(shape)}")
    if not initial_residual.is_contiguous():
        fail(_OP, "initial_residual", "contiguous", f"strides {initial_residual.stride()}")
    if initial_residual.data_ptr() % 16:
        fail(_OP, "initial_residual", "16-byte aligned", f"address {initial_residual.data_ptr():#x}")
    num_tokens = initial_residual.numel() // (mhc_mult * hidden)
    if num_tokens > MAX_I32 // max(hidden // (_VEC * 128), 1) or num_tokens > 65535 * 32768:
        fail(_OP, "initial_residual", "of fewer than 2**31 tokens", num_tokens)
    return device, num_tokens, mhc_mult, hidden


def _lengths(pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list, residual_list) -> tuple[int, int]:
    """(num_layers, num_post) from the lists' lengths, or raise."""
    lists = {
        "pre_mix_list": pre_mix_list, "layer_output_list": layer_output_list, "post_mix_list": post_mix_list,
        "comb_mix_list": comb_mix_list, "layer_input_list": layer_input_list, "residual_list": residual_list,
    }  # fmt: skip
    for name, value in lists.items():
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{_OP}: {name} must be a list of tensors, got {type(value).__name__}")
    num_layers, num_post = len(pre_mix_list), len(layer_output_list)
    if num_layers == 0:
        fail(_OP, "pre_mix_list", "non-empty (one pre mix a layer)", "an empty list")
    if len(layer_input_list) != num_layers:
        fail(_OP, "layer_input_list", f"of {num_layers} tensors like pre_mix_list", f"{len(layer_input_list)}")
    for name in ("post_mix_list", "comb_mix_list", "residual_list"):
        if len(lists[name]) != num_post:
            fail(_OP, name, f"of {num_post} tensors like layer_output_list", f"{len(lists[name])}")
    if num_post not in (num_layers - 1, num_layers):
        fail(_OP, "layer_output_list", f"of num_layers ({num_layers}) or num_layers - 1 tensors", f"{num_post}")
    return num_layers, num_post


def _addresses(name: str, tensors, dtype: torch.dtype, numel: int, device: int, align: int, out: list) -> None:
    """Append each tensor's data_ptr() to out, after checking it is a contiguous tensor of `dtype` and `numel`
    elements on `device` (any shape: the kernel reads it as a dense (num_tokens, ...) array)."""
    for i, t in enumerate(tensors):
        try:
            t_dtype, t_device, t_numel, ptr = t.dtype, t.get_device(), t.numel(), t.data_ptr()
        except AttributeError:
            not_a_tensor(_OP, f"{name}[{i}]", t)
        if t_device != device:
            fail(_OP, f"{name}[{i}]", "on the device of initial_residual", f"a tensor on {t.device}")
        if t_dtype is not dtype:
            fail(_OP, f"{name}[{i}]", str(dtype), t_dtype)
        if t_numel != numel:
            fail(_OP, f"{name}[{i}]", f"of {numel} elements", f"shape {tuple(t.shape)}")
        if not t.is_contiguous():
            fail(_OP, f"{name}[{i}]", "contiguous", f"strides {t.stride()}")
        if ptr % align:
            fail(_OP, f"{name}[{i}]", f"{align}-byte aligned", f"address {ptr:#x}")
        out.append(ptr)


def pointer_table(addresses: list[int], device: torch.device) -> torch.Tensor:
    """The addresses as an int64 tensor on `device`: for a CUDA device one pinned host tensor, copied asynchronously
    on the current stream."""
    host = torch.frombuffer(array.array("q", addresses), dtype=torch.int64)  # 3-4x cheaper than torch.tensor(list)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def mhc_multilayer_recompute(
    initial_residual: torch.Tensor,
    pre_mix_list: list[torch.Tensor],
    layer_output_list: list[torch.Tensor],
    post_mix_list: list[torch.Tensor],
    comb_mix_list: list[torch.Tensor],
    layer_input_list: list[torch.Tensor],
    residual_list: list[torch.Tensor],
) -> None:
    """Recompute L consecutive mHC layers' inputs and residual streams from the first residual, in place.

    With res = initial_residual (num_tokens, M, hidden) and, for layer l:
      layer_input_list[l] = bf16(sum over i of pre_mix_list[l][:, i] * res[:, i])   (i in order, from zero)
      residual_list[l][:, o] = bf16(post_mix_list[l][:, o] * layer_output_list[l]
                                    + sum over i of comb_mix_list[l][:, i, o] * res[:, i]);  res = residual_list[l]
    for l < P = len(layer_output_list), which is L or L - 1 (the last layer then gets only its input).

    Args:
        initial_residual: (..., M, hidden) bf16, contiguous, 16-byte aligned; M in [1, 8] (4 in
            DeepSeek's models), hidden a multiple of 8; num_tokens = numel / (M * hidden).
        pre_mix_list: L float32 tensors of num_tokens * M elements (e.g. (b, s, M, 1)), contiguous; 16-byte
            aligned when M % 4 == 0, else 4-byte (see below).
        layer_output_list: P bf16 tensors of num_tokens * hidden elements.
        post_mix_list: P float32 tensors of num_tokens * M elements, aligned as pre_mix_list.
        comb_mix_list: P float32 tensors of num_tokens * M * M elements, (input stream, output stream), aligned
            as pre_mix_list.
        layer_input_list: L bf16 output tensors of num_tokens * hidden elements.
        residual_list: P bf16 output tensors of num_tokens * M * hidden elements.

    Every tensor contiguous and on initial_residual's device; bf16 ones 16-byte aligned. The kernel copies the next
    layer's mixes to shared memory by cp.async while a layer computes, a 16-byte piece at a time when M % 4 == 0
    (DeepSeek's M = 4), so the mix tensors must then be 16-byte aligned: a view one float into a buffer is refused.
    TileKernels asks less of them: its T.async_copy moves the mixes one float a thread (4-byte cp.async), so 4-byte
    alignment is enough there; torch's own allocations are far more aligned than either. Layer counts, hidden size
    and tokens are runtime values: one cubin per M.
    """
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_mhc_multilayer_recompute(
            initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list, residual_list,
        )  # fmt: skip
    device, num_tokens, mhc_mult, hidden = _residual_dims(initial_residual)
    num_layers, num_post = _lengths(pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list, residual_list)
    mixes, rows = num_tokens * mhc_mult, num_tokens * hidden
    mix_align = 4 * recompute_mix_piece(mhc_mult)  # the kernel's cp.async of a mix row: 16-byte pieces or floats
    addresses: list[int] = []
    _addresses("pre_mix_list", pre_mix_list, _F32, mixes, device, mix_align, addresses)
    _addresses("layer_input_list", layer_input_list, _BF16, rows, device, 16, addresses)
    _addresses("residual_list", residual_list, _BF16, rows * mhc_mult, device, 16, addresses)
    _addresses("layer_output_list", layer_output_list, _BF16, rows, device, 16, addresses)
    _addresses("post_mix_list", post_mix_list, _F32, mixes, device, mix_align, addresses)
    _addresses("comb_mix_list", comb_mix_list, _F32, mixes * mhc_mult, device, mix_align, addresses)
    if num_tokens == 0:
        return None
    launcher = _RECOMPUTE.cache.get((device, mhc_mult))
    if launcher is None:
        launcher = _RECOMPUTE.cache[device, mhc_mult] = _RECOMPUTE.get(device, mhc_mult)
    table = pointer_table(addresses, initial_residual.device)
    launcher(
        device, current_stream(device),
        initial_residual.data_ptr(), table.data_ptr(), num_layers, num_post, num_tokens, hidden, len(addresses),
    )  # fmt: skip
    return None


_traced_mhc_multilayer_recompute = traced(
    mhc_multilayer_recompute, allocates_nothing, mutates=("layer_input_list", "residual_list"), outputs=0
)
