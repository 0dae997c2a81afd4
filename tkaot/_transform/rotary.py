"""tkaot.transform: TileKernels-compatible tensor transforms (rotary position embedding)."""

from __future__ import annotations

import torch

from tkaot import _validate
from tkaot._op import OpKernels, current_stream
from tkaot._transform.kernels import ROTARY
from tkaot._validate import MAX_I32, fail

__all__ = ["apply_rotary"]

_OP = "tkaot.transform.apply_rotary"
_DTYPES = {torch.bfloat16: ("bfloat16", 8), torch.float32: ("float32", 4)}
_ROTARY = OpKernels(_OP, ROTARY)


def _head_rows(name: str, t: torch.Tensor, vec: int) -> tuple[int, int, int]:
    """(batch, token, head) strides of a 4-D view whose rot_dim rows are 16-byte vectors; 0 for size-1 dims."""
    if t.stride(-1) != 1:
        fail(_OP, name, "contiguous in its last dimension", f"strides {t.stride()}")
    if t.data_ptr() % 16:
        fail(_OP, name, "16-byte aligned", f"address {t.data_ptr():#x}")
    strides = []
    for size, stride in zip(t.shape[:-1], t.stride()[:-1]):
        if size == 1:
            stride = 0
        elif stride % vec or not 0 <= stride <= MAX_I32:
            fail(_OP, name, f"strided in multiples of {vec} elements (16 bytes) below 2**31", f"strides {t.stride()}")
        strides.append(stride)
    extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    if extent > MAX_I32 or t.shape[1] * t.shape[2] > MAX_I32:
        fail(_OP, name, "at most 2**31-1 elements apart", f"shape {tuple(t.shape)} strides {t.stride()}")
    return strides[0], strides[1], strides[2]


_F32, _I32, _I64 = torch.float32, torch.int32, torch.int64


class _Fallback(Exception):
    """Input the hot path does not take as is: the checked path validates it argument by argument."""


def apply_rotary(
    query: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    key: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    interleaved: bool = False,
    conjugate: bool = False,
    seqlen_offset: int = 0,
) -> None:
    """Rotate query (and key) in place by the rotary position embedding.

    Args:
        query: (num_tokens, num_heads, rot_dim) or (batch, seqlen, num_heads, rot_dim), bf16 or
            fp32, on a CUDA device; last dimension contiguous, head rows 16-byte aligned (a tail
            view such as `q[..., -rot_dim:]` qualifies when its offset and strides are).
        cos_sin_cache: (max_positions, rot_dim) fp32, last dimension contiguous: cos in
            `[:, :rot_dim // 2]`, sin in `[:, rot_dim // 2:]`; rot_dim is 64 or 128.
        key: optional, like query with its own head count; rotated the same way.
        positions: optional int32/int64 cache rows per token, (num_tokens,) for 3-D inputs or
            (batch, seqlen) for 4-D ones; without it, token t of every batch uses row t.
        interleaved: GPT-J pairs (2i, 2i+1) when True, else NeoX pairs (i, i + rot_dim / 2).
        conjugate: rotate by the negated angle (the inverse rotation).
        seqlen_offset: added to every cache row index.

    Pair (a, b) with angle row (cos, sin) becomes (a cos - b sin, a sin + b cos), computed in
    fp32 and rounded to the input dtype. Returns None.
    """
    # The hot path reads each tensor property once and accepts only plainly valid, non-empty
    # input with one combined condition per tensor; anything else (every invalid input among
    # it) goes through _apply_rotary_checked, which raises the detailed error.
    try:
        device, dtype, qs, qshape, q_ptr = query.get_device(), query.dtype, query.stride(), query.shape, query.data_ptr()
        c_device, c_dtype, cs, cshape, c_ptr = (
            cos_sin_cache.get_device(), cos_sin_cache.dtype, cos_sin_cache.stride(), cos_sin_cache.shape, cos_sin_cache.data_ptr(),
        )  # fmt: skip
        spec = _DTYPES.get(dtype)
        if device < 0 or spec is None or c_device != device or c_dtype is not _F32 or len(cs) != 2 or cs[1] != 1 or c_ptr % 16:
            raise _Fallback
        dtype_name, vec = spec
        cache_rows, rot_dim = cshape
        cache_stride = cs[0] if cache_rows > 1 else 0
        if (rot_dim != 64 and rot_dim != 128) or cache_stride % 4 or cache_rows * max(cache_stride, rot_dim) > MAX_I32:
            raise _Fallback
        if type(seqlen_offset) is not int or not -MAX_I32 <= seqlen_offset <= MAX_I32:
            raise _Fallback
        ndim = len(qs)
        if ndim == 3:
            (seqlen, q_heads, q_rot), (q_ts, q_hs, q_last), batch, q_bs = qshape, qs, 1, 0
        elif ndim == 4:
            (batch, seqlen, q_heads, q_rot), (q_bs, q_ts, q_hs, q_last) = qshape, qs
            if batch == 1:
                q_bs = 0
        else:
            raise _Fallback
        if seqlen == 1:
            q_ts = 0
        if q_heads == 1:
            q_hs = 0
        # strides are non-negative multiples of vec (their OR is), and the extent bounds each one
        any_stride = q_bs | q_ts | q_hs
        if (
            q_rot != rot_dim or q_last != 1 or q_ptr % 16 or not (batch and seqlen and q_heads) or batch > 65535
            or any_stride < 0 or any_stride % vec or seqlen * q_heads > MAX_I32
            or (batch - 1) * q_bs + (seqlen - 1) * q_ts + (q_heads - 1) * q_hs + rot_dim - 1 > MAX_I32
        ):  # fmt: skip
            raise _Fallback
        if key is not None:
            k_device, k_dtype, ks, kshape, k_ptr = key.get_device(), key.dtype, key.stride(), key.shape, key.data_ptr()
            if k_device != device or k_dtype is not dtype or len(ks) != ndim or k_ptr % 16:
                raise _Fallback
            if ndim == 3:
                (k_seqlen, k_heads, k_rot), (k_ts, k_hs, k_last), k_batch, k_bs = kshape, ks, 1, 0
            else:
                (k_batch, k_seqlen, k_heads, k_rot), (k_bs, k_ts, k_hs, k_last) = kshape, ks
                if batch == 1:
                    k_bs = 0
            if seqlen == 1:
                k_ts = 0
            if k_heads == 1:
                k_hs = 0
            any_stride = k_bs | k_ts | k_hs
            if (
                k_batch != batch or k_seqlen != seqlen or k_rot != rot_dim or k_last != 1 or not k_heads
                or any_stride < 0 or any_stride % vec or seqlen * k_heads > MAX_I32
                or (batch - 1) * k_bs + (seqlen - 1) * k_ts + (k_heads - 1) * k_hs + rot_dim - 1 > MAX_I32
            ):  # fmt: skip
                raise _Fallback
        if positions is None:
            pos_ptr = pos_bs = pos_s = has_positions = 0
            if not 0 <= seqlen_offset <= cache_rows - seqlen:
                raise _Fallback
        else:
            p_device, p_dtype, ps, pshape, pos_ptr = (
                positions.get_device(), positions.dtype, positions.stride(), positions.shape, positions.data_ptr(),
            )  # fmt: skip
            if p_device != device or (p_dtype is not _I64 and p_dtype is not _I32) or len(ps) != ndim - 2:
                raise _Fallback
            # int64 positions are read through their low 32-bit word (little-endian)
            words = 2 if p_dtype is _I64 else 1
            if ndim == 3:
                pos_bs, pos_s, p_seqlen, p_batch = 0, ps[0] * words, pshape[0], 1
            else:
                (p_batch, p_seqlen), (pos_bs, pos_s) = pshape, (ps[0] * words, ps[1] * words)
                if batch == 1:
                    pos_bs = 0
            if seqlen == 1:
                pos_s = 0
            if p_batch != batch or p_seqlen != seqlen or pos_bs < 0 or pos_s < 0 or max(pos_bs, pos_s) > MAX_I32:
                raise _Fallback
            has_positions = 1
    except Exception:  # _Fallback, or a non-tensor argument: the checked path raises what applies
        return _apply_rotary_checked(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)
    interleaved = True if interleaved else False
    launcher = _ROTARY.cache.get((device, rot_dim, dtype_name, interleaved))
    if launcher is None:
        launcher = _ROTARY.get(device, rot_dim, dtype_name, interleaved)
    conjugate = 1 if conjugate else 0
    stream = current_stream(device)
    launcher(
        device, stream,
        q_ptr, c_ptr, pos_ptr, has_positions, conjugate, seqlen_offset,
        batch, seqlen, q_heads, cache_rows, q_bs, q_ts, q_hs, cache_stride, pos_bs, pos_s,
    )  # fmt: skip
    if key is not None:
        launcher(
            device, stream,
            k_ptr, c_ptr, pos_ptr, has_positions, conjugate, seqlen_offset,
            batch, seqlen, k_heads, cache_rows, k_bs, k_ts, k_hs, cache_stride, pos_bs, pos_s,
        )  # fmt: skip
    return None


def _apply_rotary_checked(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset) -> None:
    """apply_rotary for any input: each argument validated in turn (the detailed errors), then launched."""
    device = _validate.check_cuda(_OP, "query", query)
    spec = _DTYPES.get(query.dtype)
    if spec is None:
        fail(_OP, "query", "bfloat16 or float32", query.dtype)
    dtype_name, vec = spec
    ndim = query.dim()
    if ndim not in (3, 4):
        fail(_OP, "query", "3-D (num_tokens, num_heads, rot_dim) or 4-D (batch, seqlen, num_heads, rot_dim)", f"shape {tuple(query.shape)}")
    _validate.check_cuda(_OP, "cos_sin_cache", cos_sin_cache, device)
    if cos_sin_cache.dtype != torch.float32:
        fail(_OP, "cos_sin_cache", "torch.float32", cos_sin_cache.dtype)
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] not in (64, 128):
        fail(_OP, "cos_sin_cache", "2-D (max_positions, rot_dim) with rot_dim 64 or 128", f"shape {tuple(cos_sin_cache.shape)}")
    cache_rows, rot_dim = cos_sin_cache.shape
    cache_stride = cos_sin_cache.stride(0) if cache_rows > 1 else 0
    if cos_sin_cache.stride(1) != 1 or cache_stride % 4 or cos_sin_cache.data_ptr() % 16:
        actual = f"strides {cos_sin_cache.stride()} address {cos_sin_cache.data_ptr():#x}"
        fail(_OP, "cos_sin_cache", "contiguous rows, 16-byte aligned", actual)
    if cache_rows * max(cache_stride, rot_dim) > MAX_I32:
        fail(_OP, "cos_sin_cache", "below 2**31 elements", f"shape {tuple(cos_sin_cache.shape)}")
    if query.shape[-1] != rot_dim:
        fail(_OP, "query", f"of last dimension rot_dim={rot_dim} (cos_sin_cache.shape[1])", f"shape {tuple(query.shape)}")
    lead = query.shape[:-2]
    if key is not None:
        _validate.check_cuda(_OP, "key", key, device)
        if key.dtype != query.dtype:
            fail(_OP, "key", f"{query.dtype} like query", key.dtype)
        if key.dim() != ndim or key.shape[:-2] != lead or key.shape[-1] != rot_dim:
            fail(_OP, "key", f"of shape ({', '.join(map(str, lead))}, num_kv_heads, {rot_dim})", f"shape {tuple(key.shape)}")
    if isinstance(seqlen_offset, bool) or not isinstance(seqlen_offset, int):
        raise TypeError(f"{_OP}: seqlen_offset must be an int, got {type(seqlen_offset).__name__}")
    if not -MAX_I32 <= seqlen_offset <= MAX_I32:
        fail(_OP, "seqlen_offset", "within int32", seqlen_offset)
    batch, seqlen = (1, lead[0]) if ndim == 3 else lead
    if batch > 65535:
        fail(_OP, "query", "at most 65535 batches", f"shape {tuple(query.shape)}")

    if positions is None:
        pos_ptr = pos_bstride = pos_stride = 0
        if seqlen and not 0 <= seqlen_offset <= cache_rows - seqlen:
            expected = f"such that rows seqlen_offset .. seqlen_offset+{seqlen} lie in cos_sin_cache's {cache_rows}"
            fail(_OP, "seqlen_offset", expected, seqlen_offset)
    else:
        _validate.check_cuda(_OP, "positions", positions, device)
        if positions.dtype not in (torch.int32, torch.int64):
            fail(_OP, "positions", "torch.int32 or torch.int64", positions.dtype)
        if positions.shape != lead:
            fail(_OP, "positions", f"of shape {tuple(lead)}", tuple(positions.shape))
        # int64 positions are read through their low 32-bit word (little-endian)
        words = 2 if positions.dtype == torch.int64 else 1
        pstrides = [0 if size == 1 else stride * words for size, stride in zip(positions.shape, positions.stride())]
        if any(not 0 <= s <= MAX_I32 for s in pstrides):
            fail(_OP, "positions", "non-negative strides below 2**31", positions.stride())
        pos_bstride, pos_stride = (0, pstrides[0]) if ndim == 3 else pstrides
        pos_ptr = positions.data_ptr()

    launches = []
    for name, x in (("query", query), ("key", key)):
        if x is not None and x.numel():
            view = x.unsqueeze(0) if ndim == 3 else x
            launches.append((view, view.shape[2], _head_rows(name, view, vec)))
    if not launches:
        return None
    launcher = _ROTARY.get(device, rot_dim, dtype_name, bool(interleaved))
    stream = current_stream(device)
    for view, num_heads, (bs, ts, hs) in launches:
        launcher(
            device, stream,
            view.data_ptr(), cos_sin_cache.data_ptr(), pos_ptr, int(positions is not None), int(bool(conjugate)), seqlen_offset,
            batch, seqlen, num_heads, cache_rows, bs, ts, hs, cache_stride, pos_bstride, pos_stride,
        )  # fmt: skip
