"""Fused inference ops on a GPU against the pure-torch references: apply_rotary,
swiglu_forward(_and_per_token_cast), norm_forward_and_per_token_cast.

Every option, odd token counts, NaN-poisoned outputs; in-place rotary leaves
everything outside the rotated view bit-identical."""

import pytest
import torch

import tkaot
from tkaot import reference

pytestmark = pytest.mark.gpu

TOKENS = [1, 3, 127, 4097]
# One bf16 rounding step (the kernel may fuse a multiply-add the reference rounds twice)
ROPE_TOL = {torch.bfloat16: dict(rtol=2**-7, atol=2**-7), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def cos_sin_cache(rows: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    half = rot_dim // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64, device="cuda") / half)
    angles = torch.arange(rows, dtype=torch.float64, device="cuda")[:, None] * inv_freq
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()


def check_rotary(query_base, query, key_base, key, cache, **kw):
    """Rotate views query/key of the *_base tensors in place; everything outside the views must not change."""
    ref_q, ref_k = reference.apply_rotary(query, cache, key, **kw)
    q_before, k_before = query_base.clone(), None if key_base is None else key_base.clone()
    assert tkaot.transform.apply_rotary(query, cache, key, **kw) is None
    torch.cuda.synchronize()
    tol = ROPE_TOL[query.dtype]
    torch.testing.assert_close(query, ref_q, **tol)
    # Outside the view: NaN poison (and any other data) bit-identical
    mask = torch.ones_like(query_base, dtype=torch.bool)
    _view_mask(mask, query_base, query).fill_(False)
    assert torch.equal(_bits(query_base[mask]), _bits(q_before[mask]))
    if key is not None:
        torch.testing.assert_close(key, ref_k, **tol)
        kmask = torch.ones_like(key_base, dtype=torch.bool)
        _view_mask(kmask, key_base, key).fill_(False)
        assert torch.equal(_bits(key_base[kmask]), _bits(k_before[kmask]))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _view_mask(mask: torch.Tensor, base: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The part of `mask` (shaped like base) that `view` of base covers."""
    offset = view.storage_offset() - base.storage_offset()
    return mask.as_strided(view.shape, view.stride(), mask.storage_offset() + offset)


def poisoned_with_tail(shape, rot_dim, extra, dtype):
    """A tensor of shape (*shape[:-1], extra + rot_dim) holding NaN in its first `extra` columns, and its rot_dim tail view."""
    base = torch.randn(*shape[:-1], extra + rot_dim, dtype=dtype, device="cuda")
    base[..., :extra] = float("nan")
    return base, base[..., extra:]


@pytest.mark.parametrize("rot_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("conjugate", [False, True])
def test_apply_rotary_3d_matches_reference(seed, rot_dim, dtype, interleaved, conjugate):
    cache = cos_sin_cache(8192 + 16, rot_dim)
    for i, tokens in enumerate(TOKENS):
        heads, kv_heads = (16, 1) if i % 2 else (3, 2)
        qb, q = poisoned_with_tail((tokens, heads, rot_dim), rot_dim, 128 if i % 2 else 0, dtype)
        kb, k = poisoned_with_tail((tokens, kv_heads, rot_dim), rot_dim, 64, dtype)
        kw = dict(interleaved=interleaved, conjugate=conjugate)
        if i % 2:
            kw["positions"] = torch.randint(0, 8192, (tokens,), dtype=torch.int64 if i == 3 else torch.int32, device="cuda")
            kw["seqlen_offset"] = 7
        else:
            kw["seqlen_offset"] = 5
        check_rotary(qb, q, kb, k if i < 3 else None, cache, **kw)


@pytest.mark.parametrize("rot_dim", [64, 128])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("with_positions", [False, True])
def test_apply_rotary_4d_matches_reference(seed, rot_dim, interleaved, with_positions):
    batch, seqlen, heads = 3, 127, 5
    cache = cos_sin_cache(512, rot_dim)
    # A strided 4-D view: a tail of a wider head, inside a longer sequence
    base = torch.randn(batch, seqlen + 9, heads, 64 + rot_dim, dtype=torch.bfloat16, device="cuda")
    base[:, :, :, :64] = float("nan")
    q = base[:, 4 : 4 + seqlen, :, 64:]
    kb = torch.randn(batch, seqlen, 1, rot_dim, dtype=torch.bfloat16, device="cuda")
    positions = torch.randint(0, 500, (batch, seqlen), device="cuda", dtype=torch.int64) if with_positions else None
    check_rotary(base, q, kb, kb, cache, positions=positions, interleaved=interleaved, conjugate=False, seqlen_offset=3)


def test_apply_rotary_conjugate_inverts(seed):
    cache = cos_sin_cache(4096, 64)
    q = torch.randn(4097, 8, 64, dtype=torch.float32, device="cuda")
    original = q.clone()
    positions = torch.randint(0, 4096, (4097,), dtype=torch.int32, device="cuda")
    tkaot.transform.apply_rotary(q, cache, positions=positions)
    tkaot.transform.apply_rotary(q, cache, positions=positions, conjugate=True)
    torch.testing.assert_close(q, original, rtol=1e-5, atol=1e-5)


def test_apply_rotary_large_head_count(seed):
    # The bench shape: 8192 tokens x 64 heads x 64, plus DeepSeek's 128 heads
    cache = cos_sin_cache(8192, 64)
    for heads in (64, 128):
        q = torch.randn(8192, heads, 64, dtype=torch.bfloat16, device="cuda")
        check_rotary(q, q, None, None, cache)


def test_apply_rotary_empty_input_launches_nothing():
    cache = cos_sin_cache(16, 64)
    q = torch.empty(0, 4, 64, dtype=torch.bfloat16, device="cuda")
    tkaot.transform.apply_rotary(q, cache)


def test_apply_rotary_cuda_graph(seed):
    cache = cos_sin_cache(1024, 128)
    q = torch.randn(16, 32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(16, 8, 128, dtype=torch.bfloat16, device="cuda")
    positions = torch.randint(0, 1024, (16,), dtype=torch.int64, device="cuda")
    tkaot.transform.apply_rotary(q, cache, k, positions)  # load the module outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tkaot.transform.apply_rotary(q, cache, k, positions)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        positions.copy_(torch.randint(0, 1024, (16,), device="cuda"))
        ref_q, ref_k = reference.apply_rotary(q, cache, k, positions)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(q, ref_q, **ROPE_TOL[torch.bfloat16])
        torch.testing.assert_close(k, ref_k, **ROPE_TOL[torch.bfloat16])
