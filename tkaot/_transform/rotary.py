"""tkaot.transform: TileKernels-compatible tensor transforms (rotary position embedding)."""

from __future__ import annotations

import torch

from tkaot._compile import compiler, is_dynamo_compiling, traced
from tkaot._op import OpKernels, current_stream
from tkaot._transform.kernels import ROTARY
from tkaot._validate import Let, Rule, Signature, Tensor, lazy_checker

__all__ = ["apply_rotary"]

_LEAD = (("seqlen",), ("batch", "seqlen"))  # tokens of a 3-D input, or batch and seqlen of a 4-D one
_WITHIN = "at most 2**31-1 elements apart"


def _within(heads: str, bs: str, ts: str, hs: str, rot: str) -> str:
    """The check that a (batch, seqlen, heads, rot) view's rows and furthest element are within int32."""
    return f"seqlen * {heads} <= _MAX_I32 and (batch - 1) * {bs} + (seqlen - 1) * {ts} + ({heads} - 1) * {hs} + {rot} - 1 <= _MAX_I32"


def _head_view(name: str, prefix: str, rot: str) -> tuple:
    """The (batch, token, head) strides of query or key, 0 where that dim has size 1 (any stride is fine there), and
    the check that the view lies within int32 offsets."""
    bs, ts, hs, heads = f"{prefix}_bs", f"{prefix}_ts", f"{prefix}_hs", f"{prefix}_heads"
    return (
        Let(bs, f"s_{name}[0] if batch > 1 else 0", after=name),
        Let(ts, f"s_{name}[-3] if seqlen > 1 else 0", after=name),
        Let(hs, f"s_{name}[-2] if {heads} > 1 else 0", after=name),
        Rule(name, _within(heads, bs, ts, hs, rot), _WITHIN, actual=f"f'shape {{tuple(h_{name})}} strides {{s_{name}}}'", after=name),
    )


# int64 positions are read through their low 32-bit word (little-endian): their strides count in words
_WORDS = "(2 if t_positions is torch.int64 else 1)"
SIGNATURE = Signature(
    "tkaot.transform.apply_rotary",
    tensors=(
        Tensor(
            "query", (torch.bfloat16, torch.float32), ((*_LEAD[0], "q_heads", "q_rot"), (*_LEAD[1], "q_heads", "q_rot")),
            what="3-D (num_tokens, num_heads, rot_dim) or 4-D (batch, seqlen, num_heads, rot_dim)",
        ),
        Tensor("cos_sin_cache", (torch.float32,), (("cache_rows", "rot_dim"),), what="2-D (max_positions, rot_dim) with rot_dim 64 or 128"),
        Tensor("key", "query", ((*_LEAD[0], "k_heads", "rot_dim"), (*_LEAD[1], "k_heads", "rot_dim")), optional=True),
        Tensor("positions", (torch.int32, torch.int64), _LEAD, layout="any", optional=True),
    ),
    scalars=("seqlen_offset",),
    dims=(
        "dtype", "batch", "seqlen", "q_heads", "k_heads", "cache_rows", "rot_dim", "cache_stride",
        "q_bs", "q_ts", "q_hs", "k_bs", "k_ts", "k_hs", "pos_bs", "pos_s",
    ),
    defaults={"batch": 1, "k_heads": 0, "k_bs": 0, "k_ts": 0, "k_hs": 0, "pos_bs": 0, "pos_s": 0},
    rules=(
        Rule("query", "batch <= 65535", "at most 65535 batches", actual="f'shape {tuple(h_query)}'", after="query"),
        *_head_view("query", "q", "q_rot"),
        Rule("cos_sin_cache", "rot_dim == 64 or rot_dim == 128", "2-D (max_positions, rot_dim) with rot_dim 64 or 128",
             actual="f'shape {tuple(h_cos_sin_cache)}'", after="cos_sin_cache"),
        Let("cache_stride", "s_cos_sin_cache[0] if cache_rows > 1 else 0", after="cos_sin_cache"),
        Rule("cos_sin_cache", "cache_rows * max(cache_stride, rot_dim) <= _MAX_I32", "below 2**31 elements",
             actual="f'shape {tuple(h_cos_sin_cache)}'", after="cos_sin_cache"),
        Rule("query", "q_rot == rot_dim", "of last dimension rot_dim={rot_dim} (cos_sin_cache.shape[1])",
             actual="f'shape {tuple(h_query)}'", after="cos_sin_cache"),
        Rule("key", "len(h_key) == len(h_query)", "{len(h_query)}-D like query",
             actual="f'shape {tuple(h_key)}'", after="key"),
        *_head_view("key", "k", "rot_dim"),
        Rule("key", "seqlen * (q_heads + k_heads) <= _MAX_I32", "such that seqlen * (query heads + key heads) = "
             "{seqlen} * ({q_heads} + {k_heads}) is at most 2**31-1 (one launch rotates both)",
             actual="f'shape {tuple(h_key)}'", after="key"),
        Rule("positions", "len(h_positions) == len(h_query) - 2", "of shape {tuple(h_query[:-2])}",
             actual="tuple(h_positions)", after="positions"),
        Let("pos_bs", f"s_positions[0] * {_WORDS} if batch > 1 else 0", after="positions"),
        Let("pos_s", f"s_positions[-1] * {_WORDS} if seqlen > 1 else 0", after="positions"),
        Rule("positions", "0 <= pos_bs <= _MAX_I32 and 0 <= pos_s <= _MAX_I32", "non-negative strides below 2**31",
             actual="s_positions", after="positions"),
        Rule("seqlen_offset", "type(seqlen_offset) is int or (isinstance(seqlen_offset, int) and not isinstance(seqlen_offset, bool))",
             "an int", error="TypeError"),
        Rule("seqlen_offset", "-_MAX_I32 <= seqlen_offset <= _MAX_I32", "within int32"),
        Rule(
            "seqlen_offset", "positions is not None or seqlen == 0 or 0 <= seqlen_offset <= cache_rows - seqlen",
            "such that rows seqlen_offset .. seqlen_offset+{seqlen} lie in cos_sin_cache's {cache_rows}",
        ),
        Let("dtype", "t_query"),
    ),
    returns=(
        "device", "dtype", "batch", "seqlen", "q_heads", "k_heads", "cache_rows", "rot_dim", "cache_stride",
        "q_bs", "q_ts", "q_hs", "k_bs", "k_ts", "k_hs", "pos_bs", "pos_s", "p_query", "p_cos_sin_cache", "p_key", "p_positions",
    ),
)  # fmt: skip


_check = lazy_checker(SIGNATURE, globals(), "_check")


_ROTARY = OpKernels(SIGNATURE.op, ROTARY)
_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


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
    if is_dynamo_compiling() or compiler._is_compiling_flag:  # torch.compile / export: one custom op (tkaot/_compile.py)
        return _traced_apply_rotary(query, cos_sin_cache, key, positions, interleaved, conjugate, seqlen_offset)
    (
        device, dtype, batch, seqlen, q_heads, k_heads, cache_rows, rot_dim, cache_stride,
        q_bs, q_ts, q_hs, k_bs, k_ts, k_hs, pos_bs, pos_s, q_ptr, c_ptr, k_ptr, pos_ptr,
    ) = _check(query, cos_sin_cache, key, positions, seqlen_offset)  # fmt: skip
    if not (batch and seqlen and (q_heads or k_heads)):
        return None
    interleaved = True if interleaved else False
    fast_key = (device, rot_dim, dtype, interleaved)
    launcher = _ROTARY.cache.get(fast_key)
    if launcher is None:
        launcher = _ROTARY.cache[fast_key] = _ROTARY.get(device, rot_dim, _DTYPE_NAMES[dtype], interleaved)
    has_positions = 0 if positions is None else 1
    conjugate = 1 if conjugate else 0
    # query and key in one grid (k_heads 0 and a null key pointer without one): kernels_src/transform/rotary.py
    launcher(
        device, current_stream(device),
        q_ptr, k_ptr, c_ptr, pos_ptr, has_positions, conjugate, seqlen_offset,
        batch, seqlen, q_heads, k_heads, cache_rows, q_bs, q_ts, q_hs, k_bs, k_ts, k_hs, cache_stride, pos_bs, pos_s,
    )  # fmt: skip
    return None


def _fake(new, query, cos_sin_cache, key=None, positions=None, interleaved=False, conjugate=False, seqlen_offset=0):
    """apply_rotary allocates nothing: it rotates query and key in place (tracing, tkaot/_compile.py)."""
    return None


_traced_apply_rotary = traced(apply_rotary, _fake, mutates=("query", "key"), outputs=0)
