"""Lossless FP4 -> FP8, weight scale-factor transposes and per-channel casts of FP8 inputs on a GPU, against the torch
references: every variant of the quant shape set, bit-exact values and scale factors (padding bytes included),
every output allocation poisoned (0xFF: NaN for floats) so unwritten elements show, odd token counts and block
counts; the lossless cast also against the decoded input, exactly; the value checks; CUDA-graph capture."""

import pytest
import torch

import tkaot
from tests.gpu.test_casts_gpu import assert_bytes_equal, make_input, prequantized, shapeset_variants, variant_id
from tkaot.reference import quant as ref

pytestmark = pytest.mark.gpu

TOKENS = [1, 3, 127, 128, 300, 1031]


@pytest.fixture
def poisoned(monkeypatch):
    """Every CUDA tensor torch.empty makes while the test runs (the ops' outputs among them) starts as 0xFF bytes."""
    empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        if t.is_cuda:
            t.untyped_storage().fill_(0xFF)
        return t

    monkeypatch.setattr(torch, "empty", poisoned_empty)


def blocks(text: str) -> tuple[int, int]:
    m, k = text.split("x")
    return int(m), int(k)


# ---- per_block_cast_lossless -----------------------------------------------------------------------------------


def random_fp4(tokens: int, hidden: int, block: tuple[int, int], in_sf: str, spread: int = 11):
    """Random E2M1 bytes with power-of-two scale factors (UE8M0 or fp32, row- or column-major).

    Exponents sit at most 2**spread below a base shared by each 128 x 128 region (every output block lies in
    one), and the first region's base is below 2**-121, so its output scale factor is 0 (exponent 0).
    Returns ((data, sf), exponents as int32 (sf rows, sf cols)).
    """
    kind, _, col = in_sf.partition("_")
    data = torch.randint(-128, 128, (tokens, hidden // 2), dtype=torch.int8, device="cuda")
    m, k = -(-tokens // block[0]), hidden // block[1]
    per_region = (128 // block[0], 128 // block[1])
    base = torch.randint(12, 240, (-(-m // per_region[0]), -(-k // per_region[1])), dtype=torch.int32, device="cuda")
    base[0, 0] = 5
    exps = (ref.expand_blocks(base, per_region, (m, k)) - torch.randint(0, spread + 1, (m, k), device="cuda")).clamp(min=0)
    sf = ref.store_sf((exps.int() << 23).view(torch.float32), kind, bool(col))
    return (data, sf), exps.int()


def lossless_flags(v: dict) -> dict:
    return dict(use_tma_aligned_col_major_sf=v["sf_layout"] == "col", round_sf=v["sf"] == "ue8m0", use_packed_ue8m0=v["sf"] == "ue8m0")


LOSSLESS = shapeset_variants("per_block_cast_lossless")


@pytest.mark.parametrize("v", LOSSLESS, ids=variant_id)
def test_per_block_cast_lossless_is_bit_exact(seed, poisoned, v):
    in_block, out_block = blocks(v["in_block"]), blocks(v["out_block"])
    for tokens in TOKENS:
        (data, sf), exps = random_fp4(tokens, v["hidden"], in_block, v["in_sf"])
        want_x, want_sf = ref.per_block_cast_lossless((data, sf), "e4m3", in_block, out_block, **lossless_flags(v))
        got_x, got_sf = tkaot.quant.per_block_cast_lossless((data, sf), "e4m3", in_block, out_block, **lossless_flags(v))
        torch.cuda.synchronize()
        assert_bytes_equal(got_x, want_x, f"data, {tokens} tokens")
        assert got_sf.stride() == want_sf.stride() or got_sf.shape[0] == 1
        assert_bytes_equal(got_sf, want_sf, f"sf, {tokens} tokens")
        # and lossless, independently of the reference: the same value for every element. The output sf is
        # read as 2**(exponent - 127): an fp32 sf whose exponent is 0 is stored as 0.0 (as TileKernels does)
        out_grid = (-(-tokens // out_block[0]), v["hidden"] // out_block[1])
        out_scale = torch.exp2(ref.sf_exponents(got_sf, out_grid).double() - 127)
        in_scale = torch.exp2(exps.double() - 127)
        shape = (tokens, v["hidden"])
        decoded_in = ref.unpack_e2m1(data).double() * ref.expand_blocks(in_scale, in_block, shape)
        decoded_out = got_x.float().double() * ref.expand_blocks(out_scale, out_block, shape)
        assert torch.equal(decoded_in, decoded_out), f"{tokens} tokens: the cast lost values"


def test_per_block_cast_lossless_strided_rows_and_no_tokens(seed):
    (data, sf), _ = random_fp4(300, 2048 + 256, (1, 32), "ue8m0")
    rows = data[:, :1024]  # a row stride of 1152 bytes
    sf = sf[:, :16]
    sf = torch.empty(sf.shape, dtype=sf.dtype, device="cuda").copy_(sf)
    want = ref.per_block_cast_lossless((rows, sf), "e4m3", (1, 32), (128, 128))
    got = tkaot.quant.per_block_cast_lossless((rows, sf), "e4m3", (1, 32), (128, 128))
    assert_bytes_equal(got[0], want[0], "data")
    assert_bytes_equal(got[1], want[1], "sf")
    out, out_sf = tkaot.quant.per_block_cast_lossless((data[:0, :1024], sf[:0]), "e4m3", (1, 32), (128, 128))
    assert out.shape == (0, 2048) and out_sf.shape == (0, 16)


def test_per_block_cast_lossless_refuses_what_is_not_lossless(seed):
    (data, sf), exps = random_fp4(256, 2048, (1, 32), "ue8m0", spread=0)
    exps[130, 5] -= 12  # 2**12 below its 128 x 128 block's largest
    bad = ref.store_sf((exps << 23).view(torch.float32), "ue8m0", False)
    with pytest.raises(ValueError, match=r"scale factor at \[130, 5\] 2\*\*12 below it"):
        tkaot.quant.per_block_cast_lossless((data, bad), "e4m3", (1, 32), (128, 128))
    (data, sf), exps = random_fp4(256, 2048, (1, 16), "fp32")
    with pytest.raises(ValueError, match="positive powers of two"):
        tkaot.quant.per_block_cast_lossless((data, sf * 1.5), "e4m3", (1, 16), (128, 128))
    tkaot.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 16), (128, 128))
    torch.cuda.synchronize()


def test_per_block_cast_lossless_in_a_cuda_graph(seed):
    (data, sf), _ = random_fp4(256, 7168, (1, 32), "ue8m0")
    tkaot.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (128, 128))  # load the kernel first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the value check is skipped while capturing
        out, out_sf = tkaot.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (128, 128))
    for _ in range(2):
        (new_data, new_sf), _ = random_fp4(256, 7168, (1, 32), "ue8m0")
        data.copy_(new_data)
        sf.copy_(new_sf)
        graph.replay()
        torch.cuda.synchronize()
        want = ref.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (128, 128))
        assert_bytes_equal(out, want[0], "data")
        assert_bytes_equal(out_sf, want[1], "sf")


def test_per_block_cast_lossless_past_the_bound_while_capturing(seed):
    """While a graph is captured the op cannot check values: blocks far below their output block's largest take
    the kernel's general path (round to nearest E4M3, 0 past 2**-126), which must still match the reference."""
    valid, _ = random_fp4(256, 2048, (1, 32), "ue8m0")
    tkaot.quant.per_block_cast_lossless(valid, "e4m3", (1, 32), (128, 128))  # load the kernel before capturing
    data = valid[0]
    exps = torch.full((256, 64), 200, dtype=torch.int32, device="cuda")  # e_out = 194 in every output block
    exps[:, 1::4] -= torch.randint(6, 140, (256, 16), dtype=torch.int32, device="cuda")  # shifts 0 .. -133
    sf = ref.store_sf((exps << 23).view(torch.float32), "ue8m0", False)
    with pytest.raises(ValueError, match="within 2\\*\\*11"):
        tkaot.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (128, 128))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, out_sf = tkaot.quant.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (128, 128))
    graph.replay()
    torch.cuda.synchronize()
    want = ref.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (128, 128))
    assert_bytes_equal(out, want[0], "data")
    assert_bytes_equal(out_sf, want[1], "sf")


# ---- batched_transpose_weight_sf -------------------------------------------------------------------------------


def weight_sf(shape) -> torch.Tensor:
    """Random power-of-two fp32 scale factors (a few zeros among them)."""
    exps = torch.randint(0, 255, shape, dtype=torch.int32, device="cuda")
    exps[exps < 3] = 0
    return (exps << 23).view(torch.float32)


def poisoned_outs(reference_pair) -> tuple[torch.Tensor, torch.Tensor]:
    pair = []
    for t in reference_pair:
        out = torch.empty_strided(t.shape, t.stride(), dtype=torch.int32, device="cuda")
        out.untyped_storage().fill_(0xFF)
        pair.append(out)
    return tuple(pair)


# (n blocks, k blocks), or (groups, n blocks, k blocks): odd block counts (partly filled packed words), one-block
# weights, and DeepSeek-V3's expert and dense shapes
SHAPES = {
    128: [(56, 14), (3, 5, 7), (1, 1), (2, 1, 9), (256, 32, 56), (256, 56, 16), (144, 56)],
    32: [(4, 12), (3, 8, 20), (2, 36, 4), (8, 128, 224), (576, 56)],
}


def layout(t: torch.Tensor) -> tuple:
    """Shape and the strides that matter: a dimension of size 1 may have any stride."""
    return tuple(t.shape), tuple(s for n, s in zip(t.shape, t.stride()) if n != 1)


@pytest.mark.parametrize("block_size", [32, 128])
def test_batched_transpose_weight_sf_is_bit_exact(seed, poisoned, block_size):
    shapes = SHAPES[block_size]
    sf = [weight_sf(s) for s in shapes]
    transpose = [i % 2 == 1 for i in range(len(sf))]
    want = ref.batched_transpose_weight_sf(sf, block_size, transpose)
    outs = [poisoned_outs(w) if i % 3 == 2 else None for i, w in enumerate(want)]  # some caller buffers, some new
    got = tkaot.quant.batched_transpose_weight_sf(sf, block_size, transpose, outs)
    torch.cuda.synchronize()
    assert len(got) == len(sf)
    for i, ((g0, g1), (w0, w1)) in enumerate(zip(got, want)):
        assert g0.dtype == g1.dtype == torch.int32
        assert (layout(g0), layout(g1)) == (layout(w0), layout(w1)), shapes[i]
        if outs[i] is not None:
            assert g0 is outs[i][0] and g1 is outs[i][1]
        assert_bytes_equal(g0, w0, f"sf0 of {shapes[i]}")
        assert_bytes_equal(g1, w1, f"sf1 of {shapes[i]}")


def test_batched_transpose_weight_sf_refuses_other_values_and_captures(seed):
    good = weight_sf((3, 16, 56))
    bad = good.clone()
    bad[1, 2, 3] = 3.0
    with pytest.raises(ValueError, match=r"sf\[1\] must be positive powers of two"):
        tkaot.quant.batched_transpose_weight_sf([good, bad], 128, [False, False], [None, None])
    bad[1, 2, 3] = -1.0
    with pytest.raises(ValueError, match=r"sf\[0\] must be positive powers of two"):
        tkaot.quant.batched_transpose_weight_sf([bad], 128, [False], [None])
    outs = tkaot.quant.batched_transpose_weight_sf([good], 128, [True], [None])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tkaot.quant.batched_transpose_weight_sf([good], 128, [True], outs)
    good.copy_(weight_sf((3, 16, 56)))
    graph.replay()
    torch.cuda.synchronize()
    want = ref.batched_transpose_weight_sf([good], 128, [True])[0]
    assert_bytes_equal(outs[0][0], want[0], "sf0")
    assert_bytes_equal(outs[0][1], want[1], "sf1")


# ---- per_channel_cast of pre-quantized FP8 ---------------------------------------------------------------------

PER_CHANNEL_FP8 = [v for v in shapeset_variants("per_channel_cast") if v["in_dtype"] == "e4m3"]


@pytest.mark.parametrize("v", PER_CHANNEL_FP8, ids=variant_id)
def test_per_channel_cast_of_fp8_is_bit_exact(seed, poisoned, v):
    kind, npc = v["sf"], blocks(v["in_block"])[1]
    flags = dict(round_sf=kind in ("pow2", "ue8m0"), use_packed_ue8m0=kind == "ue8m0")
    for tokens in TOKENS + [128 * 5]:
        (data, sf), _ = prequantized(tokens, v)
        want_x, want_sf = ref.per_channel_cast((data, sf), "e4m3", v["block_m"], num_per_channels=npc, **flags)
        got_x, got_sf = tkaot.quant.per_channel_cast((data, sf), "e4m3", v["block_m"], num_per_channels=npc, **flags)
        torch.cuda.synchronize()
        assert_bytes_equal(got_x, want_x, f"data, {tokens} tokens")
        assert_bytes_equal(got_sf, want_sf, f"sf, {tokens} tokens")


def test_per_channel_cast_of_fp8_with_a_token_slice_of_column_major_sf(seed):
    """TileKernels: column-major input sf supports slicing along tokens (its token stride stays the full one)."""
    x = make_input(1000, 2048, torch.bfloat16)
    data, sf = ref.block_cast(x, "e4m3", (1, 128), sf_kind="ue8m0", col_major_sf=True)
    for tokens in (1, 300, 999):
        part = (data[:tokens], sf[:tokens])
        want = ref.per_channel_cast(part, "e4m3", 128, True, 128, True)
        got = tkaot.quant.per_channel_cast(part, "e4m3", 128, True, 128, True)
        assert_bytes_equal(got[0], want[0], f"data, {tokens} tokens")
        assert_bytes_equal(got[1], want[1], f"sf, {tokens} tokens")
