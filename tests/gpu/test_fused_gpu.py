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


@pytest.fixture
def rotary_launches(monkeypatch):
    """The rotary launches from here on, each as its key pointer: the op's launchers wrapped (its cache starts empty)."""
    from tkaot._transform import rotary as rotary_ops

    launches = []
    get = rotary_ops._ROTARY.get

    def counted(*args, **kwargs):
        launcher = get(*args, **kwargs)

        def launch(*launch_args):
            launches.append(launch_args[3])  # (device, stream, query, key, ...): the key pointer, 0 without one
            return launcher(*launch_args)

        return launch

    monkeypatch.setattr(rotary_ops._ROTARY, "cache", {})
    monkeypatch.setattr(rotary_ops._ROTARY, "get", counted)
    return launches


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("four_d", [False, True])
@pytest.mark.parametrize("with_positions", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rot_dim", [64, 128])
def test_apply_rotary_query_and_key_in_one_launch(seed, rotary_launches, tokens, four_d, with_positions, interleaved, dtype, rot_dim):
    """query and key rotated by one launch are bit-identical to each rotated alone by the query-only call, NaN
    poison around both views untouched."""
    lead = (2, tokens) if four_d else (tokens,)
    cache = cos_sin_cache(tokens + 16, rot_dim)
    qb, q = poisoned_with_tail((*lead, 16, rot_dim), rot_dim, 64, dtype)
    kb, k = poisoned_with_tail((*lead, 3, rot_dim), rot_dim, 32, dtype)  # other head count and strides than query's
    kw = dict(interleaved=interleaved, conjugate=tokens == 3, seqlen_offset=3 if with_positions else 16)
    if with_positions:
        kw["positions"] = torch.randint(0, tokens + 13, lead, dtype=torch.int64 if tokens == 127 else torch.int32, device="cuda")
    q_alone, k_alone = qb.clone(), kb.clone()
    tkaot.transform.apply_rotary(q_alone[..., 64:], cache, **kw)
    tkaot.transform.apply_rotary(k_alone[..., 32:], cache, **kw)
    assert rotary_launches == [0, 0]  # each alone: one launch, no key
    tkaot.transform.apply_rotary(q, cache, k, **kw)
    torch.cuda.synchronize()
    assert len(rotary_launches) == 3 and rotary_launches[2] == k.data_ptr()  # both: one launch
    assert torch.equal(_bits(qb), _bits(q_alone)) and torch.equal(_bits(kb), _bits(k_alone))
    assert not qb[..., 64:].isnan().any() and qb[..., :64].isnan().all() and kb[..., :32].isnan().all()


def test_apply_rotary_key_with_a_headless_query(seed, rotary_launches):
    """A query of no heads leaves every row of the one launch to the key."""
    cache = cos_sin_cache(64, 64)
    q = torch.empty(5, 0, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(5, 4, 64, dtype=torch.bfloat16, device="cuda")
    k_alone = k.clone()
    tkaot.transform.apply_rotary(k_alone, cache, seqlen_offset=2)
    tkaot.transform.apply_rotary(q, cache, k, seqlen_offset=2)
    torch.cuda.synchronize()
    assert len(rotary_launches) == 2 and torch.equal(_bits(k), _bits(k_alone))


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


# --- swiglu_forward / swiglu_forward_and_per_token_cast

SWIGLU_HIDDENS = [768, 1536, 2048, 4096, 14336, 18432]
SF_OPTIONS = [  # (round_sf, use_packed_ue8m0)
    (False, False),
    (True, False),
    (True, True),
]


def swiglu_inputs(tokens, hidden, dtype, *, psum=False, weights=False, scale=None):
    x = torch.randn(tokens, 2 * hidden, dtype=dtype, device="cuda") * 4
    kw = {}
    if psum:
        # Experts with 0, 1, 130 and the rest of the tokens, each segment starting 128-aligned
        counts = [0, 1, 130]
        ends, begin = [], 0
        for c in counts:
            start = -(-begin // 128) * 128
            ends.append(start + c)
            begin = start + c
        if tokens > ends[-1] + 128:
            start = -(-ends[-1] // 128) * 128
            ends.append(start + (tokens - start) // 2)
        kw["psum_num_tokens_per_expert"] = torch.tensor([min(e, tokens) for e in ends], dtype=torch.int32, device="cuda")
    if weights:
        kw["topk_weights"] = torch.rand(tokens, device="cuda")
        kw["routed_scaling_factor"] = scale
    return x, kw


def valid_rows(x, kw):
    return reference.fused.psum_row_mask(x.shape[0], kw.get("psum_num_tokens_per_expert")).cuda()


@pytest.mark.parametrize("hidden", SWIGLU_HIDDENS)
@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
def test_swiglu_forward_matches_reference_bit_exact(seed, hidden, fmt):
    for i, tokens in enumerate(TOKENS):
        x, kw = swiglu_inputs(tokens, hidden, torch.bfloat16, psum=i == 3, weights=i % 2 == 1, scale=2.5 if i == 1 else None)
        got = tkaot.quant.swiglu_forward(x, fmt, **kw)
        want = reference.fused.swiglu_forward(x, fmt, **kw)
        rows = valid_rows(x, kw)
        assert got.dtype == want.dtype and got.shape == (tokens, hidden)
        assert torch.equal(got[rows], want[rows])


@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
def test_swiglu_forward_fp32_input(seed, fmt):
    for tokens in TOKENS:
        x, kw = swiglu_inputs(tokens, 2048, torch.float32, weights=True, scale=0.5)
        assert torch.equal(tkaot.quant.swiglu_forward(x, fmt, **kw), reference.fused.swiglu_forward(x, fmt, **kw))


@pytest.mark.parametrize("with_psum", [False, True])
def test_swiglu_clamp_and_counts(seed, with_psum):
    for tokens in (3, 4097):
        x, kw = swiglu_inputs(tokens, 2048, torch.bfloat16, psum=with_psum, weights=True)
        got_count = torch.tensor([5, 6, 7, 8], dtype=torch.int64, device="cuda")
        want_count = got_count.clone()
        got = tkaot.quant.swiglu_forward(x, "fp32", clamp_value=3.0, clamped_count=got_count, **kw)
        want = reference.fused.swiglu_forward(x, "fp32", clamp_value=3.0, clamped_count=want_count, **kw)
        rows = valid_rows(x, kw)
        assert torch.equal(got[rows], want[rows])
        assert torch.equal(got_count, want_count)
        assert want_count[0] > 5 and want_count[2] > 7
        # clamping without counting
        got = tkaot.quant.swiglu_forward(x, "bf16", clamp_value=3.0, **kw)
        assert torch.equal(got[rows], reference.fused.swiglu_forward(x, "bf16", clamp_value=3.0, **kw)[rows])


@pytest.mark.parametrize("hidden", SWIGLU_HIDDENS)
@pytest.mark.parametrize("group", [128, 32])
@pytest.mark.parametrize("round_sf, packed", SF_OPTIONS)
@pytest.mark.parametrize("col_major", [False, True])
def test_swiglu_forward_and_per_token_cast_bit_exact(seed, hidden, group, round_sf, packed, col_major):
    for i, tokens in enumerate(TOKENS):
        x, kw = swiglu_inputs(tokens, hidden, torch.bfloat16, psum=i == 2, weights=i != 0, scale=1.5 if i == 3 else None)
        if i == 1:
            x[0, :hidden] = 0  # an all-zero gate half: amax floor
        opts = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
        out, sf = tkaot.quant.swiglu_forward_and_per_token_cast(x, "e4m3", group, **kw, **opts)
        want_out, want_sf = reference.fused.swiglu_forward_and_per_token_cast(x, "e4m3", group, **kw, **opts)
        rows = valid_rows(x, kw)
        assert out.dtype == torch.float8_e4m3fn and out.shape == (tokens, hidden)
        assert sf.dtype == want_sf.dtype and sf.shape == want_sf.shape and sf.stride() == want_sf.stride()
        assert torch.equal(out[rows].view(torch.uint8), want_out[rows].view(torch.uint8))
        assert torch.equal(sf[rows], want_sf[rows])


def test_swiglu_cast_bench_shape_with_clamp(seed):
    x, kw = swiglu_inputs(8192, 2048, torch.bfloat16, weights=True, scale=2.0)
    count, want_count = torch.zeros(4, dtype=torch.int64, device="cuda"), torch.zeros(4, dtype=torch.int64, device="cuda")
    out, sf = tkaot.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, **kw, round_sf=True, clamp_value=6.0, clamped_count=count)
    want_out, want_sf = reference.fused.swiglu_forward_and_per_token_cast(
        x, "e4m3", 128, **kw, round_sf=True, clamp_value=6.0, clamped_count=want_count
    )
    assert torch.equal(out.view(torch.uint8), want_out.view(torch.uint8)) and torch.equal(sf, want_sf)
    assert torch.equal(count, want_count) and count[3] == 8192 * 2048


def test_swiglu_unquantized_through_the_cast_entry_point(seed):
    x, _ = swiglu_inputs(127, 1536, torch.bfloat16)
    out = tkaot.quant.swiglu_forward_and_per_token_cast(x, "bf16", None)
    assert isinstance(out, torch.Tensor) and torch.equal(out, reference.fused.swiglu_forward(x, "bf16"))


def _every_bf16_gate(admissible_first: bool) -> torch.Tensor:
    """All 65536 bf16 patterns as gates, 2048 a row. With admissible_first, the gates the "bits" check
    admits (above -87.5, finite) come first and the rest after, so only one 8-gate vector mixes both and
    every admissible gate is divided on the lean path."""
    bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
    gates = bits.view(torch.bfloat16)
    if admissible_first:
        f = gates.float()
        admitted = (f > -87.5) & torch.isfinite(f)
        gates = torch.cat([gates[admitted], gates[~admitted]])
    return gates.reshape(32, 2048).cuda()


@pytest.mark.parametrize("admissible_first", [False, True])
def test_swiglu_lean_division_is_ieee_division_for_every_bf16_gate(seed, admissible_first):
    """The shipped tiling's lean division (kernels_src/fused/swiglu.py, tkaot_div_gate behind
    tkaot_gates_ok) equals IEEE division for every bf16 gate, bit for bit: fp32 output, up 1 and random,
    with weights, and with clamps (a clamped gate takes IEEE division); the E4M3 cast of the same rows too."""
    g = _every_bf16_gate(admissible_first)
    up = torch.randn(32, 2048, device="cuda").bfloat16()
    cases = [
        dict(x=torch.cat([g, torch.ones_like(g)], dim=1)),
        dict(x=torch.cat([g, up], dim=1)),
        dict(x=torch.cat([g, up], dim=1), topk_weights=torch.rand(32, device="cuda"), routed_scaling_factor=2.5),
        dict(x=torch.cat([g, up * 8], dim=1), clamp_value=6.0),
        dict(x=torch.cat([g, up], dim=1), clamp_value=3.0e38),
    ]
    for kw in cases:
        got = tkaot.quant.swiglu_forward(fmt="fp32", **kw)
        want = reference.fused.swiglu_forward(fmt="fp32", **kw)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
        # The quantized path checks 16 adjacent gates at once (tkaot_gates_ok2) and takes the same division.
        # Groups holding a NaN output are left out: the kernel's amax (fmaxf) skips NaN, the reference's
        # (torch.amax) is NaN, so the group's sf and other values differ by design there
        q, sf = tkaot.quant.swiglu_forward_and_per_token_cast(fmt="e4m3", num_per_channels=128, **kw)
        want_q, want_sf = reference.fused.swiglu_forward_and_per_token_cast(fmt="e4m3", num_per_channels=128, **kw)
        finite = ~want.view(32, 16, 128).isnan().any(-1)
        assert finite.sum() >= 500  # of 512 groups
        groups = q.view(torch.uint8).view(32, 16, 128)
        assert torch.equal(groups[finite], want_q.view(torch.uint8).view(32, 16, 128)[finite])
        assert torch.equal(sf[finite], want_sf[finite])
        assert q.float().isnan()[want.isnan()].all()  # NaN outputs stay NaN


def test_swiglu_empty_input():
    x = torch.empty(0, 4096, dtype=torch.bfloat16, device="cuda")
    out, sf = tkaot.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128)
    assert out.shape == (0, 2048) and sf.shape == (0, 16)


# --- norm_forward_and_per_token_cast

NORM_HIDDENS = [512, 1536, 2048, 4096, 5120, 7168, 8192]
# rstd: the kernel's rsqrt and summation order differ from torch's
RSTD_TOL = dict(rtol=1e-5, atol=0)
NORM_TOL = {torch.bfloat16: dict(rtol=2**-7, atol=2**-7), torch.float32: dict(rtol=1e-5, atol=1e-5)}


def norm_sf_strides(shape, cols, col_major):
    """The strides norm_forward_and_per_token_cast's sf has, in elements."""
    tokens = shape[-2]
    if not col_major:
        return (tokens * cols, cols, 1) if len(shape) == 3 else (cols, 1)
    pitch = -(-tokens // 4) * 4
    return (cols * pitch, 1, pitch) if len(shape) == 3 else (1, pitch)


def check_norm_cast(x, weight, residual, *, round_sf=False, packed=False, col_major=False, out_scale=1.0, eps=1e-6, out=None):
    with_residual = residual is not None
    residual_out = torch.full_like(x, float("nan")) if with_residual else None
    out_bf16 = torch.full(x.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    (q, sf), y_bf16, rstd, norm_input = tkaot.quant.norm_forward_and_per_token_cast(
        x, weight, eps, "e4m3", 32, residual=residual, out_scale=out_scale, use_tma_aligned_col_major_sf=col_major,
        round_sf=round_sf, use_packed_ue8m0=packed, with_out_bf16=True, out=out, out_bf16=out_bf16,
        residual_out=residual_out, with_rstd=True,
    )  # fmt: skip
    torch.cuda.synchronize()
    # rstd against the reference's, then everything else reproduced bit for bit from the kernel's rstd
    (_, _), ref_y, ref_rstd, ref_sum = reference.fused.norm_forward_and_per_token_cast(x, weight, eps, residual, out_scale)
    torch.testing.assert_close(rstd, ref_rstd, **RSTD_TOL)
    torch.testing.assert_close(y_bf16.float(), ref_y.bfloat16().float(), **NORM_TOL[torch.bfloat16])
    (want_q, want_sf), want_y, _, want_sum = reference.fused.norm_forward_and_per_token_cast(
        x, weight, eps, residual, out_scale, round_sf, packed, rstd=rstd
    )
    assert y_bf16 is out_bf16 and torch.equal(y_bf16, want_y.bfloat16())
    assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert sf.dtype == want_sf.dtype and sf.shape == want_sf.shape
    if out is None:
        assert sf.stride() == norm_sf_strides(x.shape, sf.shape[-1], col_major)
    assert torch.equal(sf, want_sf)
    if with_residual:
        assert norm_input is residual_out and torch.equal(norm_input, ref_sum)
    else:
        assert norm_input is x
    return q, sf


@pytest.mark.parametrize("hidden", NORM_HIDDENS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("round_sf, packed", SF_OPTIONS)
def test_norm_forward_and_per_token_cast_matches_reference(seed, hidden, dtype, round_sf, packed):
    for i, tokens in enumerate(TOKENS):
        x = torch.randn(tokens, hidden, dtype=dtype, device="cuda") * 3
        weight = torch.randn(hidden, dtype=dtype, device="cuda") if i % 2 == 0 else None
        residual = torch.randn(tokens, hidden, dtype=dtype, device="cuda") if i >= 2 else None
        if i == 1:
            x[0, :64] = 0  # zero groups: the amax floor
        check_norm_cast(x, weight, residual, round_sf=round_sf, packed=packed, col_major=i == 3, out_scale=0.5 if i == 2 else 1.0)


@pytest.mark.parametrize("round_sf, packed", SF_OPTIONS)
@pytest.mark.parametrize("col_major", [False, True])
def test_norm_cast_batched_strided(seed, round_sf, packed, col_major):
    hidden = 7168
    base = torch.randn(3, 130, hidden + 64, dtype=torch.bfloat16, device="cuda")
    x = base[:, 1:128, :hidden]  # a 3-D view with row and batch strides
    weight = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn(3, 127, hidden, dtype=torch.bfloat16, device="cuda")
    check_norm_cast(x, weight, residual, round_sf=round_sf, packed=packed, col_major=col_major)
    check_norm_cast(x[1], weight, None, round_sf=round_sf, packed=packed, col_major=col_major)


@pytest.mark.parametrize("hidden", [4096, 7168])
@pytest.mark.parametrize("tokens", [1, 127, 4097])
def test_norm_cast_residual_in_place(seed, hidden, tokens):
    """The residual updated in place (residual_out is residual), neither bf16 output nor rstd asked: the residual
    tiling's plainest call, as a layer makes it."""
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda") * 3
    weight = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    residual = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda")
    # the kernel's rstd (its reduction order), from a call on a copy, so that the reference reproduces it bit for bit
    _, _, rstd, _ = tkaot.quant.norm_forward_and_per_token_cast(x, weight, 1e-6, "e4m3", 32, residual=residual.clone(), with_rstd=True)
    ref = reference.fused.norm_forward_and_per_token_cast(x, weight, 1e-6, residual.clone(), rstd=rstd)
    (want_q, want_sf), _, _, want_sum = ref
    torch.testing.assert_close(rstd, reference.fused.norm_forward_and_per_token_cast(x, weight, 1e-6, residual)[2], **RSTD_TOL)
    data = torch.full((tokens, hidden), float("nan"), device="cuda").to(torch.float8_e4m3fn)
    sf = torch.full((tokens, hidden // 32), float("nan"), device="cuda")
    (q, got_sf), none, rstd, norm_input = tkaot.quant.norm_forward_and_per_token_cast(
        x, weight, 1e-6, "e4m3", 32, residual=residual, residual_out=residual, out=(data, sf)
    )
    torch.cuda.synchronize()
    assert q is data and got_sf is sf and none is None and rstd is None and norm_input is residual
    assert torch.equal(residual, want_sum)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(got_sf, want_sf)


def test_norm_cast_into_given_buffers(seed):
    x = torch.randn(127, 1536, dtype=torch.bfloat16, device="cuda")
    data = torch.empty(127, 1536, dtype=torch.float8_e4m3fn, device="cuda")
    sf = torch.full((127, 1536 // 32 // 4), -1, dtype=torch.int32, device="cuda")
    q, got_sf = check_norm_cast(x, None, None, round_sf=True, packed=True, out=(data, sf))
    assert q is data and got_sf is sf


def test_norm_cast_unquantized_is_norm_forward(seed):
    x = torch.randn(127, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    out, none, rstd, norm_input = tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "bf16", None, with_rstd=True)
    ref, ref_rstd, _ = reference.norm_forward(x, w, 1e-6, with_rstd=True)
    assert none is None and norm_input is x
    torch.testing.assert_close(out, ref, **NORM_TOL[torch.bfloat16])
    torch.testing.assert_close(rstd, ref_rstd, **RSTD_TOL)


def test_norm_cast_empty_input():
    x = torch.empty(0, 7168, dtype=torch.bfloat16, device="cuda")
    (q, sf), _, rstd, _ = tkaot.quant.norm_forward_and_per_token_cast(x, None, 1e-6, "e4m3", 32, with_rstd=True)
    assert q.shape == (0, 7168) and sf.shape == (0, 224) and rstd.shape == (0,)


def test_norm_cast_cuda_graph(seed):
    x = torch.randn(16, 7168, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(7168, dtype=torch.bfloat16, device="cuda")
    tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, round_sf=True)  # load outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (q, sf), _, rstd, _ = tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, round_sf=True, with_rstd=True)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        (want_q, want_sf), _, _, _ = reference.fused.norm_forward_and_per_token_cast(x, w, 1e-6, round_sf=True, rstd=rstd)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(sf, want_sf)


@pytest.mark.parametrize("col_major", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_norm_cast_out_pair_with_one_buffer_given(seed, col_major, packed):
    """out=(data, None) allocates the sf (any layout) and out=(None, sf) the data, as TileKernels does: the bytes
    equal those of a call that allocates both, and the given buffer is the one returned."""
    x = torch.randn(127, 2048, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(2048, dtype=torch.bfloat16, device="cuda")
    flags = dict(round_sf=packed, use_packed_ue8m0=packed, use_tma_aligned_col_major_sf=col_major)
    (want_data, want_sf), *_ = tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, **flags)
    data = torch.full_like(want_data, float("nan"))
    (got_data, got_sf), *_ = tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, out=(data, None), **flags)
    assert got_data is data and _bits(got_data).equal(_bits(want_data))
    assert got_sf.shape == want_sf.shape and got_sf.stride() == want_sf.stride() and _bits(got_sf).equal(_bits(want_sf))
    if not col_major:
        sf = torch.full_like(want_sf, -1)
        (got_data, got_sf), *_ = tkaot.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", 32, out=(None, sf), **flags)
        assert got_sf is sf and _bits(got_sf).equal(_bits(want_sf)) and _bits(got_data).equal(_bits(want_data))


# --- norm_forward_and_per_token_cast against TileKernels, byte for byte

TK_NORM_HIDDENS = [2048, 7168]


def _same_bytes(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Equal shapes, dtypes and bits (NaN payloads and signed zeros included), with a count of what differs."""
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, ours.dtype, theirs.shape, theirs.dtype)
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[ours.element_size()]
    a, b = ours.contiguous().view(bits), theirs.contiguous().view(bits)
    differ = int((a != b).sum())
    assert differ == 0, f"{what}: {differ} of {a.numel()} elements differ"


def check_norm_cast_against_tile_kernels(tk, x, weight, residual, *, round_sf, packed, col_major=False, out_scale=1.0):
    """tkaot, TileKernels and the reference (given TileKernels' rstd) on one call: every output's bytes."""
    kw = dict(
        residual=residual, out_scale=out_scale, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
        use_packed_ue8m0=packed, with_out_bf16=True, with_rstd=True,
    )  # fmt: skip
    out_bf16 = torch.full(x.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    residual_out = None if residual is None else torch.full_like(x, float("nan"))
    (q, sf), y, rstd, norm_input = tkaot.quant.norm_forward_and_per_token_cast(
        x, weight, 1e-6, "e4m3", 32, out_bf16=out_bf16, residual_out=residual_out, **kw
    )
    (tq, tsf), ty, trstd, tnorm_input = tk.quant.norm_forward_and_per_token_cast(x, weight, 1e-6, "e4m3", 32, **kw)
    torch.cuda.synchronize()
    _same_bytes(rstd, trstd, "rstd")
    _same_bytes(y, ty, "out_bf16")
    _same_bytes(q, tq, "values")
    _same_bytes(sf, tsf, "sf")
    _same_bytes(norm_input, tnorm_input, "norm_input")
    # The reference: every step after the row reduction, from TileKernels' rstd
    (want_q, want_sf), want_y, _, want_sum = reference.fused.norm_forward_and_per_token_cast(
        x, weight, 1e-6, residual, out_scale, round_sf, packed, rstd=trstd
    )
    _same_bytes(want_y.bfloat16(), ty, "reference out_bf16")
    _same_bytes(want_q, tq, "reference values")
    if not col_major:
        _same_bytes(want_sf, tsf, "reference sf")
    _same_bytes(want_sum, tnorm_input, "reference norm_input")


@pytest.mark.parametrize("hidden", TK_NORM_HIDDENS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("round_sf, packed", SF_OPTIONS)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("with_weight", [False, True])
def test_norm_cast_bytes_match_tile_kernels(seed, hidden, dtype, round_sf, packed, with_residual, with_weight):
    tk = pytest.importorskip("tile_kernels")
    for tokens in TOKENS:
        x = torch.randn(tokens, hidden, dtype=dtype, device="cuda") * 3
        weight = torch.randn(hidden, dtype=dtype, device="cuda") if with_weight else None
        residual = torch.randn(tokens, hidden, dtype=dtype, device="cuda") if with_residual else None
        if tokens == 3:
            x[1, :64] = 0  # zero groups: the amax floor
        check_norm_cast_against_tile_kernels(tk, x, weight, residual, round_sf=round_sf, packed=packed)


@pytest.mark.parametrize("round_sf, packed", SF_OPTIONS)
def test_norm_cast_bytes_match_tile_kernels_col_major_scaled(seed, round_sf, packed):
    """TMA-aligned column-major sf and an out_scale, with weight and residual, batched rows included."""
    tk = pytest.importorskip("tile_kernels")
    hidden = 7168
    weight = torch.randn(hidden, dtype=torch.bfloat16, device="cuda")
    for shape in [(127, hidden), (2, 4097, hidden)]:
        x = torch.randn(*shape, dtype=torch.bfloat16, device="cuda") * 3
        residual = torch.randn(*shape, dtype=torch.bfloat16, device="cuda")
        check_norm_cast_against_tile_kernels(tk, x, weight, residual, round_sf=round_sf, packed=packed, col_major=True, out_scale=0.5)
