"""Byte-for-byte comparison of one call made to tkaot and to TileKernels (tests/gpu/test_parity_gpu.py).

What is compared: every tensor the call returns (shape, dtype, strides where a dimension has more than one element,
which input it aliases, then its bytes) and the whole storage of every input tensor the returned ones do not alias
(in-place updates, out= buffers nobody returns, and inputs that must stay untouched). A call's `trims` cut bytes
TileKernels leaves unspecified out of a returned tensor first; its `adjacent` outputs (stochastic rounding) are
compared level by level instead: each pair of values must be the same or neighbouring levels of the format. Its
`close` outputs, or inputs written in place (sums TileKernels adds in an order of its own), are compared by value,
each within its (rtol, atol).
"""

from __future__ import annotations

import torch


def flatten(value, path: str = "ret") -> dict[str, object]:
    """{path: leaf} of a nested tuple/list result ('ret', 'ret[0]', 'ret[0][1]', ...)."""
    if isinstance(value, (tuple, list)):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{path}[{i}]"))
        return out
    return {path: value}


def inputs(args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """{path: tensor} of every tensor among a call's arguments ('args[0]', 'kw.out[1]', ...)."""
    leaves = flatten(tuple(args), "args")
    for name, value in kwargs.items():
        leaves.update(flatten(value, f"kw.{name}"))
    return {p: t for p, t in leaves.items() if isinstance(t, torch.Tensor)}


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under t, as flat bytes."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def dense_bytes(t: torch.Tensor) -> torch.Tensor:
    """t's elements in row-major order as bytes, shape (t.numel(), itemsize); a view when t is contiguous."""
    flat = t.reshape(-1)  # a view where t is contiguous (whatever the strides of its size-1 dimensions), else a copy
    if flat.numel() > 1 and flat.stride(0) != 1:  # a strided view flattens to a strided view (a column of scales)
        flat = flat.contiguous()
    return flat.view(torch.uint8).reshape(t.numel(), t.element_size())


# Elements compared at a time: the parity suite runs 16 processes on one GPU, and a whole-tensor `a != b` over a
# few-GiB output (plus dense copies of both sides) ran it out of memory.
CHUNK = 1 << 26


def _aliases(t: torch.Tensor, named: dict[str, torch.Tensor]) -> str | None:
    for path, inp in named.items():
        if inp.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() and inp.data_ptr() == t.data_ptr():
            return path
    return None


def _strides(t: torch.Tensor) -> tuple:
    return tuple(s if n > 1 else None for s, n in zip(t.stride(), t.shape))


def describe_difference(what: str, ours: torch.Tensor, theirs: torch.Tensor, limit: int = 3) -> str | None:
    """None when ours and theirs hold the same bytes, else how many bytes differ, where, and both values there."""
    a, b = dense_bytes(ours), dense_bytes(theirs)
    bad_bytes, at = 0, []
    for start in range(0, a.shape[0], CHUNK):
        differs = a[start : start + CHUNK] != b[start : start + CHUNK]
        bad_bytes += int(differs.sum())
        if bad_bytes and len(at) < limit:
            at += (differs.any(dim=-1).nonzero()[: limit - len(at), 0] + start).tolist()
    if bad_bytes == 0:
        return None
    shown = []
    for flat in at:
        index = _unravel(flat, ours.shape)
        va, vb = ours[index], theirs[index]
        ha, hb = a[flat].tolist(), b[flat].tolist()
        shown.append(f"at {index}: tkaot {_value(va)} ({_hex(ha)}) vs TileKernels {_value(vb)} ({_hex(hb)})")
    return f"{what}: {bad_bytes} of {a.numel()} bytes differ; " + "; ".join(shown)


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return tuple(reversed(index))


def _value(v: torch.Tensor):
    return v.float().item() if v.dtype.is_floating_point else v.item()


def _hex(raw: list[int]) -> str:
    return "0x" + "".join(f"{byte:02x}" for byte in reversed(raw))  # little-endian bytes, most significant first


def level_rank(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """Each value's position among the format's levels, ordered by value (-max ... -0=+0 ... +max), so two values
    are neighbouring levels exactly when their ranks differ by one. fmt: 'bf16', 'e4m3', or 'e2m1' (int8, two
    codes a byte, low nibble first)."""
    if fmt == "e2m1":
        b = t.view(torch.uint8).to(torch.int32)
        codes = torch.stack([b & 0xF, b >> 4], dim=-1)
        sign, magnitude = codes >> 3, codes & 0x7
    else:
        bits = t.view(torch.int16 if fmt == "bf16" else torch.uint8).to(torch.int32)
        width = 16 if fmt == "bf16" else 8
        sign, magnitude = (bits >> (width - 1)) & 1, bits & ((1 << (width - 1)) - 1)
    return torch.where(sign == 1, -magnitude, magnitude)


def describe_non_adjacent(what: str, ours: torch.Tensor, theirs: torch.Tensor, fmt: str) -> str | None:
    """None when every pair of values is equal or neighbouring levels and, over 65536 values or more, tkaot's levels
    are not biased against TileKernels' (mean rank difference within 0.02: both round without bias, so it is 0 up
    to noise of about 1/sqrt(n)); else what is wrong."""
    if ours.shape != theirs.shape:
        return f"{what}: shapes {tuple(ours.shape)} vs {tuple(theirs.shape)}"
    diff = level_rank(ours.contiguous(), fmt) - level_rank(theirs.contiguous(), fmt)
    far = (diff.abs() > 1).nonzero()
    if far.numel():
        index = tuple(far[0].tolist())
        return f"{what}: {far.shape[0]} values more than one {fmt} level apart, first at {index}: level diff {int(diff[index])}"
    if diff.numel() >= 65536:
        bias = diff.float().mean().item()
        if abs(bias) > 0.02:
            return f"{what}: tkaot's levels sit {bias:+.4f} levels from TileKernels' on average (both should be unbiased)"
    return None


def describe_not_close(what: str, ours: torch.Tensor, theirs: torch.Tensor, rtol: float, atol: float) -> str | None:
    """None when every pair of values is within atol + rtol * |TileKernels'| (NaN only against NaN), else the worst."""
    a, b = ours.float(), theirs.float()
    bad = ~torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    first = tuple(bad.nonzero()[0].tolist())
    shown = f"tkaot {a[first].item()} vs TileKernels {b[first].item()}"
    return f"{what}: {int(bad.sum())} of {a.numel()} values beyond rtol {rtol} / atol {atol}, first at {first}: {shown}"


def compare_calls(ours_call, ours_result, theirs_call, theirs_result, trims=None, adjacent=None, close=None) -> tuple[list[str], bool]:
    """(problems, whether a tolerance was used) comparing the tkaot call to the TileKernels one."""
    trims, adjacent, close = trims or {}, adjacent or {}, close or {}
    problems: list[str] = []
    ours_in, theirs_in = inputs(ours_call[0], ours_call[1]), inputs(theirs_call[0], theirs_call[1])
    ours_out, theirs_out = flatten(ours_result), flatten(theirs_result)
    if ours_out.keys() != theirs_out.keys():
        return [f"results differ in structure: tkaot {sorted(ours_out)} vs TileKernels {sorted(theirs_out)}"], False
    aliased = set()
    for path, theirs in theirs_out.items():
        ours = ours_out[path]
        if not isinstance(theirs, torch.Tensor) or not isinstance(ours, torch.Tensor):
            if type(ours) is not type(theirs) or (theirs is not None and ours != theirs):
                problems.append(f"{path}: tkaot {ours!r} vs TileKernels {theirs!r}")
            continue
        meta = [(ours.shape, theirs.shape, "shape"), (ours.dtype, theirs.dtype, "dtype"), (_strides(ours), _strides(theirs), "strides")]
        alias_ours, alias_theirs = _aliases(ours, ours_in), _aliases(theirs, theirs_in)
        meta.append((alias_ours, alias_theirs, "aliases"))
        wrong = [f"{name} {a} vs {b}" for a, b, name in meta if a != b]
        if wrong:
            problems.append(f"{path}: tkaot vs TileKernels " + ", ".join(wrong))
            continue
        if alias_theirs is not None:
            aliased.add(alias_theirs)
        trim = trims.get(path, lambda t: t)
        if path in adjacent:
            problem = describe_non_adjacent(path, trim(ours), trim(theirs), adjacent[path])
        elif path in close:
            problem = describe_not_close(path, trim(ours), trim(theirs), *close[path])
        else:
            problem = describe_difference(path, trim(ours), trim(theirs))
        if problem:
            problems.append(problem)
    # Inputs: whole storages, each once, unless a returned tensor (compared above, trimmed) views it
    seen = set()
    for path, theirs in theirs_in.items():
        key = theirs.untyped_storage().data_ptr()
        if path in aliased or key in seen or any(theirs_in[p].untyped_storage().data_ptr() == key for p in aliased):
            continue
        seen.add(key)
        if path in close:  # written in place, summed in another order: by value, over the tensor itself
            problem = describe_not_close(f"{path} (after the call)", ours_in[path], theirs, *close[path])
        else:
            problem = describe_difference(f"{path} (its storage, after the call)", storage_bytes(ours_in[path]), storage_bytes(theirs))
        if problem:
            problems.append(problem)
    return problems, bool(adjacent or close)
