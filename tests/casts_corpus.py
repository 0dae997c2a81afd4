"""The calls of tests/test_casts_contract.py: every cast op, each option, valid and broken one thing at a time.

A call is data: the op's name, an id, and its arguments, where `T` describes a tensor made when the call runs (CPU
memory standing in for a CUDA device's, or a meta tensor where it is too large to allocate, for invalid calls only).
Valid calls cover each op's options (formats, scale-factor kinds and layouts, quantized inputs and their blocks, given
out buffers, stochastic rounding, odd token counts, padded and sliced rows); invalid ones break one thing of a valid
call (a dtype, rank, shape, stride, alignment, device, option, limit or argument type).

The record (tests/data/casts_contract.jsonl) was written from GPU-verified code; records changed since, by id, each an
invalid call that launches nothing either way:
- per_token_cast/bad-out-not-pair, per_token_cast/bad-out-tensor, per_block_cast/bad-out-not-pair: an out= that is not
  a (data, sf) pair raises TypeError naming the op (the declared unpacking of out), where Python's tuple unpacking
  raised ValueError (and a two-row tensor was split into its rows as data and sf).
- added with that change: the bad-out-two-rows, bad-out-triple and bad-out-tensor calls, and the too-wide calls (rows
  over the kernels' MAX_CAST_HIDDEN channels, which reached keys outside the declarations; now ValueError).
"""

from __future__ import annotations

import itertools

import torch

from tests.helpers import dense

BF16, F32, F16, FP8, I8, U8, I32 = torch.bfloat16, torch.float32, torch.float16, torch.float8_e4m3fn, torch.int8, torch.uint8, torch.int32
KINDS = {  # sf kind -> (round_sf, use_packed_ue8m0, use_e4m3_sf)
    "fp32": (False, False, False), "pow2": (True, False, False), "ue8m0": (True, True, False), "e4m3": (False, False, True),
}  # fmt: skip
SF_DTYPE = {"fp32": F32, "pow2": F32, "ue8m0": I32, "e4m3": FP8}


class T:
    """A tensor made when its call runs: `shape` with `strides` (dense when None) at element `offset` of its memory.

    device: the CUDA device it stands on (-1: none, a CPU tensor); meta: a meta tensor (no memory); fill: "pow2"
    (fp32 powers of two), "spread" (ones and one 2**-20), "ue8m0" (packed exponent bytes), "bytes" (0, 1, 2, ... as bytes)
    or a number, else zeros.
    """

    def __init__(self, shape, dtype=BF16, strides=None, offset=0, device=0, fill=None, meta=False):
        self.shape, self.dtype, self.offset, self.device, self.fill, self.meta = tuple(shape), dtype, offset, device, fill, meta
        self.strides = tuple(strides) if strides is not None else dense(self.shape)

    def make(self) -> torch.Tensor:
        if self.meta:
            t = torch.empty_strided(self.shape, self.strides, dtype=self.dtype, device="meta")
        else:
            span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides)) if all(self.shape) else 0
            base = torch.zeros(span + self.offset, dtype=self.dtype)
            if self.fill == "pow2":
                base.copy_(torch.exp2(torch.arange(base.numel()) % 9 - 4.0))
            elif self.fill == "ue8m0":
                base.fill_(0x7A7B7C7D)  # exponent bytes 122 .. 125
            elif self.fill == "spread":  # powers of two, one 2**-20 among ones: too far below its neighbours
                base.fill_(1.0)[0] = 2.0**-20
            elif self.fill == "bytes":
                base.view(torch.uint8).copy_(torch.arange(base.numel(), dtype=torch.int32) % 256)
            elif self.fill is not None:
                base.fill_(self.fill)
            t = base.as_strided(self.shape, self.strides, self.offset)
        if self.device != 0:
            t._device_index = self.device
        return t

    def __repr__(self) -> str:
        return f"T({self.shape}, {self.dtype}, {self.strides}, {self.offset})"


def col(shape, dtype=F32, pitch=None, **kw) -> T:
    """A column-major (tokens, cols) tensor: unit token stride, `pitch` (default: tokens) between columns."""
    return T(shape, dtype, (1, pitch or max(shape[0], 1)), **kw)


def rows(tokens, width, dtype, style, **kw) -> T:
    """A (tokens, width) tensor with rows laid out as `style`: dense, padded (16 bytes more a row), sliced (from a wider
    tensor, at a 16-byte offset), or one row at an odd stride (any stride serves a single row)."""
    vec = 16 // dtype.itemsize
    if style == "padded":
        return T((tokens, width), dtype, (width + vec, 1), **kw)
    if style == "sliced":
        return T((tokens, width), dtype, (width + 4 * vec, 1), offset=vec, **kw)
    return T((tokens, width), dtype, **kw)


class Call:
    def __init__(self, op: str, id: str, *args, **kwargs):
        self.op, self.id, self.args, self.kwargs = op, f"{op}/{id}", args, kwargs


def sf_tensor(tokens: int, groups: int, kind: str, layout: str, fill=None, **kw) -> T:
    """A scale-factor tensor of `kind` for a (tokens, groups) grid, row- or column-major (padded: a pitch past tokens)."""
    cols = -(-groups // 4) if kind == "ue8m0" else groups
    dtype = SF_DTYPE[kind]
    if layout == "row":
        return T((tokens, cols), dtype, fill=fill, **kw)
    pitch = tokens + 4 if layout == "padded" else tokens
    return col((tokens, cols), dtype, pitch=pitch, fill=fill, **kw)


NAMES = {BF16: "bf16", F32: "fp32", F16: "fp16", FP8: "fp8", torch.float8_e5m2: "e5m2", I8: "i8", U8: "u8", I32: "i32"}


def cycle(values, i):
    return values[i % len(values)]


# ---- per-token casts ------------------------------------------------------------------------------------------------


def per_token_cast_calls() -> list[Call]:
    op, calls = "per_token_cast", []
    combos = itertools.product((BF16, F32), ("e4m3", "e2m1"), (16, 32, 64, 128), KINDS, (False, True))
    for i, (dtype, fmt, group, kind, col_major) in enumerate(combos):
        tokens, hidden, style = cycle((1, 3, 130), i), cycle((256, 7168), i // 3), cycle(("dense", "padded", "sliced"), i // 7)
        stochastic = i % 5 < 2
        round_sf, packed, e4m3_sf = KINDS[kind]
        calls.append(Call(op, f"{NAMES[dtype]}-{fmt}-{group}-{kind}-{'col' if col_major else 'row'}-{'sto' if stochastic else 'rne'}-"
                              f"{tokens}x{hidden}-{style}", rows(tokens, hidden, dtype, style), fmt, group,
                          use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed,
                          use_e4m3_sf=e4m3_sf, stochastic_cast=stochastic))  # fmt: skip
    # one row: any row stride; no rows at all
    calls.append(Call(op, "one-row-odd-stride", T((1, 512), BF16, (515, 1)), "e4m3", 128))
    calls.append(Call(op, "no-tokens", T((0, 512)), "e4m3", 128))
    calls.append(Call(op, "no-tokens-col", T((0, 512)), "e4m3", 64, use_tma_aligned_col_major_sf=True))
    calls.append(Call(op, "list-flags", T((3, 512)), "e4m3", 32, None, 1, 1, 1, 0, 1))  # truthy ints as TileKernels' callers pass
    # given out buffers
    for i, (fmt, kind, layout) in enumerate(itertools.product(("e4m3", "e2m1"), KINDS, ("row", "col", "padded"))):
        tokens, group = cycle((1, 3, 130), i), cycle((32, 128), i)
        round_sf, packed, e4m3_sf = KINDS[kind]
        data = T((tokens, 512 if fmt == "e4m3" else 256), FP8 if fmt == "e4m3" else I8)
        sf = sf_tensor(tokens, 512 // group, kind, layout)
        calls.append(Call(op, f"out-{fmt}-{kind}-{layout}-{tokens}-{group}", T((tokens, 512), cycle((BF16, F32), i)), fmt, group,
                          use_tma_aligned_col_major_sf=layout != "row", round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf,
                          out=(data, sf)))  # fmt: skip
    calls.append(Call(op, "out-list", T((3, 512)), "e4m3", 128, out=[T((3, 512), FP8), T((3, 4), F32)]))
    calls.append(Call(op, "out-one-row-strides", T((1, 512)), "e4m3", 128, out=(T((1, 512), FP8, (1024, 1)), T((1, 4), F32, (9, 1)))))
    # quantized (data, sf) inputs
    blocks = ((1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (128, 128))
    combos = itertools.product(("e4m3", "e2m1"), blocks, ("fp32", "ue8m0", "e4m3"), ("row", "col"))
    for i, (in_fmt, block, in_kind, layout) in enumerate(combos):
        tokens, hidden = cycle((1, 3, 130), i), cycle((256, 7168), i // 3)
        fmt, group, kind, col_major = cycle(("e4m3", "e2m1"), i // 2), cycle((16, 32, 64, 128), i), cycle(tuple(KINDS), i // 5), i % 7 < 3
        data = T((tokens, hidden if in_fmt == "e4m3" else hidden // 2), FP8 if in_fmt == "e4m3" else I8)
        sf = sf_tensor(-(-tokens // block[0]), hidden // block[1], in_kind, layout)
        round_sf, packed, e4m3_sf = KINDS[kind]
        calls.append(Call(op, f"pair-{in_fmt}-{block[0]}x{block[1]}-{in_kind}-{layout}-{tokens}x{hidden}-to-{fmt}-{group}-{kind}",
                          (data, sf), fmt, group, x_block_size=cycle((block, list(block)), i), use_tma_aligned_col_major_sf=col_major,
                          round_sf=round_sf, use_packed_ue8m0=packed, use_e4m3_sf=e4m3_sf, stochastic_cast=i % 5 == 0))  # fmt: skip
    calls.append(Call(op, "pair-list-padded-rows", [T((3, 512), FP8, (528, 1)), T((3, 4), F32)], "e4m3", 128, (1, 128)))
    calls.append(Call(op, "pair-with-out", (T((3, 512), FP8), T((3, 4), F32)), "e2m1", 32, (1, 128),
                      out=(T((3, 256), I8), T((3, 16), F32))))  # fmt: skip
    calls.append(Call(op, "pair-ue8m0-col", (T((5, 2048), FP8), col((5, 4), I32)), "e4m3", 64, (1, 128)))
    calls.append(Call(op, "pair-col-padded-sf", (T((5, 512), FP8), col((5, 4), pitch=8)), "e4m3", 128, (1, 128)))
    calls.append(Call(op, "pair-one-block-col-sf", (T((3, 512), FP8), T((1, 4), F32, (1, 1))), "e4m3", 128, (128, 128)))
    calls += partial_group_calls(op) + oblong_block_calls()
    calls += per_token_cast_invalid()
    return calls


# ---- calls TileKernels takes that tkaot once refused (issue 15) -------------------------------------------------------
# Their records were appended to tests/data/casts_contract.jsonl from code checked on CPU only (the kernels they launch,
# per_token_cast_generic's partial last group and the per-block / per-channel input blocks, await the GPU tests of
# tests/gpu/test_generic_gpu.py and test_casts_gpu.py); "per_token_cast/partial-group-192" replaced the record of the
# call once named "bad-x-width-not-group", which raised. Every other record is as verified.


def partial_group_calls(op: str) -> list[Call]:
    """Rows of 64 * odd channels in groups of 128: the last group holds 64 channels and has its own sf."""
    calls = [Call(op, "partial-group-192", T((3, 192)), "e4m3", 128)] if op == "per_token_cast" else []
    kinds = ("fp32", "pow2", "e4m3") if op == "per_token_cast_with_precomputed_sf" else tuple(KINDS)
    for i, (fmt, kind) in enumerate(itertools.product(("e4m3", "e2m1"), kinds)):
        tokens, hidden, col_major = cycle((1, 3, 130), i), cycle((64, 320, 1088), i), op != "per_token_cast_with_precomputed_sf" and i % 2
        round_sf, packed, e4m3_sf = KINDS[kind]
        flags = dict(round_sf=round_sf, use_e4m3_sf=e4m3_sf)
        name = f"partial-group-{fmt}-{kind}-{'col' if col_major else 'row'}-{tokens}x{hidden}"
        x = rows(tokens, hidden, cycle((BF16, F32), i // 2), cycle(("dense", "padded"), i // 3))
        if op == "per_token_cast_with_precomputed_sf":
            calls.append(Call(op, name, x, fmt, 128, sf_tensor(tokens, -(-hidden // 128), kind, "row"), **flags))
            continue
        flags.update(use_tma_aligned_col_major_sf=bool(col_major), use_packed_ue8m0=packed)
        if op == "per_token_cast_with_sf_only":
            given = sf_tensor(tokens, -(-hidden // 128), kind, "col" if col_major else "row") if i % 3 == 0 else None
            calls.append(Call(op, name, x, fmt, 128, out_sf=given, **flags))
        else:
            calls.append(Call(op, name, x, fmt, 128, stochastic_cast=i % 4 == 1, **flags))
    return calls


def oblong_block_calls() -> list[Call]:
    """per_token_cast of (data, sf) inputs in the per-block casts' 32 x 128 and 128 x 32 blocks."""
    op, calls = "per_token_cast", []
    combos = itertools.product(("e4m3", "e2m1"), ((32, 128), (128, 32)), ("fp32", "ue8m0", "e4m3"), ("row", "col"))
    for i, (in_fmt, block, in_kind, layout) in enumerate(combos):
        tokens, hidden = cycle((1, 33, 130), i), cycle((256, 7168), i // 3)
        fmt, group, kind = cycle(("e4m3", "e2m1"), i // 2), cycle((32, 64, 128), i), cycle(tuple(KINDS), i // 5)
        data = T((tokens, hidden if in_fmt == "e4m3" else hidden // 2), FP8 if in_fmt == "e4m3" else I8)
        sf = sf_tensor(-(-tokens // block[0]), hidden // block[1], in_kind, layout)
        round_sf, packed, e4m3_sf = KINDS[kind]
        calls.append(Call(op, f"pair-{in_fmt}-{block[0]}x{block[1]}-{in_kind}-{layout}-{tokens}x{hidden}-to-{fmt}-{group}-{kind}",
                          (data, sf), fmt, group, x_block_size=block, round_sf=round_sf, use_packed_ue8m0=packed,
                          use_e4m3_sf=e4m3_sf))  # fmt: skip
    calls.append(Call(op, "bad-pair-block-per-channel", (T((40, 512), FP8), T((2, 512), F32)), "e4m3", 128, (32, 1)))
    return calls


def per_token_cast_invalid() -> list[Call]:
    op, x = "per_token_cast", lambda: T((3, 512))
    pair = lambda **kw: (T((3, 512), FP8), T((3, 4), F32, **kw))
    out = lambda data=None, sf=None: (data or T((3, 512), FP8), sf or T((3, 4), F32))
    bad = [
        ("x-fp16", T((3, 512), F16), "e4m3", 128),
        ("x-int32", T((3, 512), I32), "e4m3", 128),
        ("x-1d", T((512,)), "e4m3", 128),
        ("x-3d", T((1, 3, 512)), "e4m3", 128),
        ("x-list", [1.0, 2.0], "e4m3", 128),
        ("x-none", None, "e4m3", 128),
        ("x-triple", (T((3, 512), FP8), T((3, 4), F32), T((3, 4), F32)), "e4m3", 128, (1, 128)),
        ("x-cpu", T((3, 512), device=-1), "e4m3", 128),
        ("x-last-dim-strided", T((3, 512), BF16, (1, 3)), "e4m3", 128),
        ("x-misaligned", T((3, 512), offset=1), "e4m3", 128),
        ("x-row-stride", T((3, 512), BF16, (516, 1)), "e4m3", 128),
        ("x-row-stride-fp32", T((3, 512), F32, (514, 1)), "e4m3", 128),
        ("x-row-stride-huge", T((3, 512), BF16, (2**31, 1), meta=True), "e4m3", 128),
        ("x-width-not-64", T((3, 96)), "e4m3", 32),
        ("x-too-many", T((2**22, 2048), meta=True), "e4m3", 128),
        ("x-no-width", T((3, 0)), "e4m3", 128),
        ("x-too-wide", T((1, 65600)), "e4m3", 64),
        ("fmt", x(), "e5m2", 128),
        ("fmt-none", x(), None, 128),
        ("group", x(), "e4m3", 48),
        ("group-str", x(), "e4m3", "128"),
        ("group-none", x(), "e4m3", None),
        ("x-block-for-tensor", x(), "e4m3", 128, (1, 128)),
    ]
    calls = [Call(op, f"bad-{name}", *args) for name, *args in bad]
    calls += [
        Call(op, "bad-packed-without-round", x(), "e4m3", 128, use_packed_ue8m0=True),
        Call(op, "bad-round-and-e4m3", x(), "e4m3", 128, round_sf=True, use_e4m3_sf=True),
        Call(op, "bad-out-not-pair", x(), "e4m3", 128, out=(T((3, 512), FP8),)),
        Call(op, "bad-out-tensor", x(), "e4m3", 128, out=T((3, 512), FP8)),
        Call(op, "bad-out0-dtype", x(), "e4m3", 128, out=out(data=T((3, 512), I8))),
        Call(op, "bad-out0-shape", x(), "e4m3", 128, out=out(data=T((3, 256), FP8))),
        Call(op, "bad-out0-e2m1-shape", x(), "e2m1", 32, out=(T((3, 512), I8), T((3, 16), F32))),
        Call(op, "bad-out0-padded", x(), "e4m3", 128, out=out(data=T((3, 512), FP8, (528, 1)))),
        Call(op, "bad-out0-misaligned", x(), "e4m3", 128, out=out(data=T((3, 512), FP8, offset=8))),
        Call(op, "bad-out0-device", x(), "e4m3", 128, out=out(data=T((3, 512), FP8, device=1))),
        Call(op, "bad-out0-cpu", x(), "e4m3", 128, out=out(data=T((3, 512), FP8, device=-1))),
        Call(op, "bad-out0-list", x(), "e4m3", 128, out=([0] * 512, T((3, 4), F32))),
        Call(op, "out0-none", x(), "e4m3", 128, out=(None, T((3, 4), F32))),
        Call(op, "out1-none", x(), "e4m3", 128, out=(T((3, 512), FP8), None)),
        Call(op, "bad-out1-dtype", x(), "e4m3", 128, out=out(sf=T((3, 4), BF16))),
        Call(op, "bad-out1-e4m3-dtype", x(), "e4m3", 128, use_e4m3_sf=True, out=out()),
        Call(op, "bad-out1-packed-shape", x(), "e4m3", 128, round_sf=True, use_packed_ue8m0=True, out=out(sf=T((3, 4), I32))),
        Call(op, "bad-out1-shape", x(), "e4m3", 128, out=out(sf=T((3, 3), F32))),
        Call(op, "bad-out1-3d", x(), "e4m3", 128, out=out(sf=T((1, 3, 4), F32))),
        Call(op, "bad-out1-col-for-row", x(), "e4m3", 128, out=out(sf=col((3, 4)))),
        Call(op, "bad-out1-row-for-col", x(), "e4m3", 128, use_tma_aligned_col_major_sf=True, out=out()),
        Call(op, "bad-out1-row-gap", x(), "e4m3", 128, out=out(sf=T((3, 4), F32, (4, 2), meta=True))),
        Call(op, "bad-out1-col-short-pitch", x(), "e4m3", 128, use_tma_aligned_col_major_sf=True, out=out(sf=col((3, 4), pitch=2))),
        Call(op, "bad-out1-huge-stride", x(), "e4m3", 128, out=out(sf=T((3, 4), F32, (2**29, 1), meta=True))),
        Call(op, "bad-out1-device", x(), "e4m3", 128, out=out(sf=T((3, 4), F32, device=1))),
        Call(op, "bad-out1-list", x(), "e4m3", 128, out=(T((3, 512), FP8), [1.0] * 4)),
        Call(op, "bad-out-two-rows", T((2, 512)), "e4m3", 128, out=T((2, 512), FP8)),
        Call(op, "bad-out-triple", x(), "e4m3", 128, out=(T((3, 512), FP8), T((3, 4), F32), None)),
        Call(op, "bad-pair-too-wide", (T((1, 65664), FP8), T((1, 513), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-no-block", pair(), "e4m3", 128),
        Call(op, "bad-pair-block", pair(), "e4m3", 128, (1, 100)),
        Call(op, "bad-pair-block-32x128", pair(), "e4m3", 128, (32, 128)),
        Call(op, "bad-pair-block-text", pair(), "e4m3", 128, "1x128"),
        Call(op, "bad-pair-block-floats", pair(), "e4m3", 128, (1.0, 128.0)),
        Call(op, "bad-pair-block-triple", pair(), "e4m3", 128, (1, 128, 1)),
        Call(op, "bad-pair-data-bf16", (T((3, 512)), T((3, 4), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-data-list", ([0] * 512, T((3, 4), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-data-misaligned", (T((3, 512), FP8, offset=4), T((3, 4), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-data-row-stride", (T((3, 512), FP8, (520, 1)), T((3, 4), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-data-1d", (T((512,), FP8), T((3, 4), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-data-cpu", (T((3, 512), FP8, device=-1), T((3, 4), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-sf-fp16", (T((3, 512), FP8), T((3, 4), F16)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-sf-1d", (T((3, 512), FP8), T((12,), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-sf-shape", (T((3, 512), FP8), T((3, 3), F32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-sf-packed-shape", (T((3, 512), FP8), T((3, 4), I32)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-sf-device", (T((3, 512), FP8), T((3, 4), F32, device=1)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-sf-list", (T((3, 512), FP8), [1.0] * 4), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-sf-gap", (T((3, 512), FP8), T((3, 4), F32, (8, 2), meta=True)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-sf-huge", (T((3, 512), FP8), T((3, 4), F32, (2**29, 1), meta=True)), "e4m3", 128, (1, 128)),
        Call(op, "bad-pair-width-not-block", (T((3, 480), FP8), T((3, 4), F32)), "e4m3", 32, (1, 128)),
        Call(op, "bad-pair-width-not-64", (T((3, 96), FP8), T((3, 3), F32)), "e4m3", 32, (1, 32)),
    ]  # fmt: skip
    return calls


def per_token_cast_with_sf_only_calls() -> list[Call]:
    op, calls = "per_token_cast_with_sf_only", []
    combos = itertools.product((BF16, F32), ("e4m3", "e2m1"), KINDS, ("row", "col", "padded"), (False, True))
    for i, (dtype, fmt, kind, layout, given) in enumerate(combos):
        tokens, hidden, group, style = (
            cycle((1, 3, 130), i),
            cycle((256, 7168), i // 3),
            cycle((16, 32, 64, 128), i),
            cycle(("dense", "sliced"), i // 5),
        )
        if layout == "padded" and not given:
            continue
        round_sf, packed, e4m3_sf = KINDS[kind]
        out_sf = sf_tensor(tokens, hidden // group, kind, layout) if given else None
        name = f"{NAMES[dtype]}-{fmt}-{kind}-{layout}-{'given' if given else 'new'}-{tokens}x{hidden}-{group}"
        x = rows(tokens, hidden, dtype, style)
        calls.append(Call(op, name, x, fmt, group, layout != "row", round_sf, packed, e4m3_sf, out_sf=out_sf))
    calls += partial_group_calls(op)
    x = T((3, 512))
    calls += [
        Call(op, "bad-x-fp16", T((3, 512), F16), "e4m3", 128),
        Call(op, "bad-x-pair", (T((3, 512), FP8), T((3, 4), F32)), "e4m3", 128),
        Call(op, "bad-x-list", [0.0], "e4m3", 128),
        Call(op, "bad-x-row-stride", T((3, 512), BF16, (516, 1)), "e4m3", 128),
        Call(op, "bad-x-too-wide", T((1, 65600)), "e4m3", 64),
        Call(op, "bad-fmt", x, "fp8", 128),
        Call(op, "bad-group", x, "e4m3", 256),
        Call(op, "bad-packed-without-round", x, "e4m3", 128, use_packed_ue8m0=True),
        Call(op, "bad-round-and-e4m3", x, "e4m3", 128, round_sf=True, use_e4m3_sf=True),
        Call(op, "bad-out-sf-dtype", x, "e4m3", 128, out_sf=T((3, 4), FP8)),
        Call(op, "bad-out-sf-shape", x, "e4m3", 128, out_sf=T((3, 8), F32)),
        Call(op, "bad-out-sf-col-for-row", x, "e4m3", 128, out_sf=col((3, 4))),
        Call(op, "bad-out-sf-row-for-col", x, "e4m3", 128, True, out_sf=T((3, 4), F32)),
        Call(op, "bad-out-sf-device", x, "e4m3", 128, out_sf=T((3, 4), F32, device=1)),
        Call(op, "bad-out-sf-cpu", x, "e4m3", 128, out_sf=T((3, 4), F32, device=-1)),
        Call(op, "bad-out-sf-list", x, "e4m3", 128, out_sf=[[1.0] * 4] * 3),
        Call(op, "bad-out-sf-packed-dtype", x, "e4m3", 128, round_sf=True, use_packed_ue8m0=True, out_sf=T((3, 1), F32)),
    ]  # fmt: skip
    return calls


def per_token_cast_with_precomputed_sf_calls() -> list[Call]:
    op, calls = "per_token_cast_with_precomputed_sf", []
    combos = itertools.product((BF16, F32), ("e4m3", "e2m1"), ("fp32", "pow2", "e4m3"), (False, True))
    for i, (dtype, fmt, kind, given) in enumerate(combos):
        tokens, hidden, group, style = (
            cycle((1, 3, 130), i),
            cycle((256, 7168), i // 3),
            cycle((16, 32, 64, 128), i),
            cycle(("dense", "padded", "sliced"), i // 2),
        )
        round_sf, _, e4m3_sf = KINDS[kind]
        data = T((tokens, hidden if fmt == "e4m3" else hidden // 2), FP8 if fmt == "e4m3" else I8) if given else None
        calls.append(Call(op, f"{NAMES[dtype]}-{fmt}-{kind}-{'given' if given else 'new'}-{tokens}x{hidden}-{group}-{style}",
                          rows(tokens, hidden, dtype, style), fmt, group, sf_tensor(tokens, hidden // group, kind, "row"),
                          round_sf=round_sf, use_e4m3_sf=e4m3_sf, out=data))  # fmt: skip
    calls += partial_group_calls(op)
    calls.append(Call(op, "one-row-sf-strided", T((1, 512)), "e4m3", 128, T((1, 4), F32, (64, 1))))
    calls.append(Call(op, "one-column-sf-col", T((4, 128)), "e4m3", 128, col((4, 1))))
    x, sf = T((3, 512)), T((3, 4), F32)
    calls += [
        Call(op, "bad-sf-col", x, "e4m3", 128, col((3, 4))),
        Call(op, "bad-sf-col-major-asked", x, "e4m3", 128, sf, True),
        Call(op, "bad-sf-packed", x, "e4m3", 128, T((3, 1), I32), round_sf=True, use_packed_ue8m0=True),
        Call(op, "bad-sf-dtype", x, "e4m3", 128, T((3, 4), FP8)),
        Call(op, "bad-sf-e4m3-dtype", x, "e4m3", 128, sf, use_e4m3_sf=True),
        Call(op, "bad-sf-shape", x, "e4m3", 128, T((3, 2), F32)),
        Call(op, "bad-sf-none", x, "e4m3", 128, None),
        Call(op, "bad-sf-list", x, "e4m3", 128, [1.0]),
        Call(op, "bad-sf-device", x, "e4m3", 128, T((3, 4), F32, device=1)),
        Call(op, "bad-out-dtype", x, "e4m3", 128, sf, out=T((3, 512), BF16)),
        Call(op, "bad-out-shape", x, "e4m3", 128, sf, out=T((4, 512), FP8)),
        Call(op, "bad-out-padded", x, "e4m3", 128, sf, out=T((3, 512), FP8, (528, 1))),
        Call(op, "bad-out-device", x, "e4m3", 128, sf, out=T((3, 512), FP8, device=1)),
        Call(op, "bad-out-list", x, "e4m3", 128, sf, out=[0]),
        Call(op, "bad-x-pair", (T((3, 512), FP8), sf), "e4m3", 128, sf),
        Call(op, "bad-x-fp8", T((3, 512), FP8), "e4m3", 128, sf),
        Call(op, "bad-x-too-wide", T((1, 65600)), "e4m3", 64, T((1, 1025), F32)),
        Call(op, "bad-fmt", x, "e3m2", 128, sf),
        Call(op, "bad-round-and-e4m3", x, "e4m3", 128, T((3, 4), FP8), round_sf=True, use_e4m3_sf=True),
    ]  # fmt: skip
    return calls


def per_token_cast_and_cast_back_calls() -> list[Call]:
    op, calls = "per_token_cast_and_cast_back", []
    combos = itertools.product((BF16, F32), ("e4m3", "e2m1"), (16, 32, 64, 128), ("fp32", "pow2", "e4m3"))
    for i, (dtype, fmt, group, kind) in enumerate(combos):
        tokens, hidden, style = cycle((1, 3, 130), i), cycle((256, 7168), i // 3), cycle(("dense", "padded", "sliced"), i // 4)
        round_sf, _, e4m3_sf = KINDS[kind]
        name = f"{NAMES[dtype]}-{fmt}-{group}-{kind}-{tokens}x{hidden}-{style}"
        calls.append(Call(op, name, rows(tokens, hidden, dtype, style), fmt, group, round_sf, e4m3_sf))
    calls += [
        Call(op, "bad-x-last-dim-strided", T((3, 512), BF16, (1, 3)), "e4m3", 128),
        Call(op, "bad-x-one-column-strided", T((3, 1), BF16, (1, 2)), "e4m3", 128),
        Call(op, "bad-x-fp8", T((3, 512), FP8), "e4m3", 128),
        Call(op, "bad-x-pair", (T((3, 512), FP8), T((3, 4), F32)), "e4m3", 128),
        Call(op, "bad-x-list", [1.0], "e4m3", 128),
        Call(op, "bad-x-1d", T((512,)), "e4m3", 128),
        Call(op, "bad-x-cpu", T((3, 512), device=-1), "e4m3", 128),
        Call(op, "bad-x-row-stride", T((3, 512), BF16, (516, 1)), "e4m3", 128),
        Call(op, "bad-x-width", T((3, 320)), "e4m3", 128),
        Call(op, "bad-x-too-wide", T((1, 65600)), "e4m3", 64),
        Call(op, "bad-fmt", T((3, 512)), "e4m4", 128),
        Call(op, "bad-group", T((3, 512)), "e4m3", 8),
        Call(op, "bad-round-and-e4m3", T((3, 512)), "e4m3", 128, True, True),
    ]  # fmt: skip
    return calls


# ---- cast backs ------------------------------------------------------------------------------------------------------


def cast_back_calls() -> list[Call]:
    calls = []
    blocks = ((1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (128, 128))
    combos = itertools.product(("e4m3", "e2m1"), blocks, ("fp32", "ue8m0", "e4m3"), ("row", "col", "padded"))
    for i, (in_fmt, block, kind, layout) in enumerate(combos):
        tokens, hidden, fmt, style = (
            cycle((1, 3, 130), i),
            cycle((256, 7168), i // 3),
            cycle(("bf16", "fp32"), i // 2),
            cycle(("dense", "padded"), i // 5),
        )
        dtype = FP8 if in_fmt == "e4m3" else I8
        data = rows(tokens, hidden if in_fmt == "e4m3" else hidden // 2, dtype, style)
        sf = sf_tensor(-(-tokens // block[0]), hidden // block[1], kind, layout)
        size = cycle((block, list(block)), i)
        calls.append(Call("cast_back", f"{in_fmt}-{block[0]}x{block[1]}-{kind}-{layout}-{tokens}x{hidden}-{fmt}-{style}", (data, sf),
                          fmt, size))  # fmt: skip
        if block[0] == 1:
            calls.append(Call("per_token_cast_back", f"{in_fmt}-{block[1]}-{kind}-{layout}-{tokens}x{hidden}-{fmt}-{style}", [data, sf],
                              fmt, block[1]))  # fmt: skip
    calls += cast_back_block_calls()
    pair = lambda: (T((3, 512), FP8), T((3, 4), F32))
    for op, block in (("cast_back", (1, 128)), ("per_token_cast_back", 128)):
        calls += [
            Call(op, "bad-fmt", pair(), "fp16", block),
            Call(op, "bad-special-fmt", pair(), "bf16", block, "ue8m0"),
            Call(op, "bad-x-tensor", T((3, 512), FP8), "bf16", block),
            Call(op, "bad-x-none", None, "bf16", block),
            Call(op, "bad-x-triple", (*pair(), T((1,))), "bf16", block),
            Call(op, "bad-data-bf16", (T((3, 512)), T((3, 4), F32)), "bf16", block),
            Call(op, "bad-data-list", ([1], T((3, 4), F32)), "bf16", block),
            Call(op, "bad-data-row-stride", (T((3, 512), FP8, (520, 1)), T((3, 4), F32)), "bf16", block),
            Call(op, "bad-data-last-dim", (T((3, 512), FP8, (1, 3)), T((3, 4), F32)), "bf16", block),
            Call(op, "bad-data-3d", (T((1, 3, 512), FP8), T((3, 4), F32)), "bf16", block),
            Call(op, "bad-data-cpu", (T((3, 512), FP8, device=-1), T((3, 4), F32)), "bf16", block),
            Call(op, "bad-sf-fp16", (T((3, 512), FP8), T((3, 4), F16)), "bf16", block),
            Call(op, "bad-sf-shape", (T((3, 512), FP8), T((3, 2), F32)), "bf16", block),
            Call(op, "bad-sf-device", (T((3, 512), FP8), T((3, 4), F32, device=1)), "bf16", block),
            Call(op, "bad-sf-cpu", (T((3, 512), FP8), T((3, 4), F32, device=-1)), "bf16", block),
            Call(op, "bad-sf-list", (T((3, 512), FP8), [1.0]), "bf16", block),
            Call(op, "bad-width-not-64", (T((3, 96), FP8), T((3, 3), F32)), "bf16", (1, 32) if op == "cast_back" else 32),
            Call(op, "bad-width-not-block", (T((3, 448), FP8), T((3, 4), F32)), "bf16", block),
            Call(op, "bad-too-many", (T((2**25, 1024), FP8, meta=True), T((2**25, 8), F32, meta=True)), "bf16", block),
            Call(op, "bad-too-wide", (T((1, 65664), FP8), T((1, 513), F32)), "bf16", block),
        ]  # fmt: skip
    calls += [
        Call("cast_back", "bad-block", pair(), "bf16", (1, 256)),
        Call("cast_back", "bad-block-none", pair(), "bf16", None),
        Call("cast_back", "bad-block-int", pair(), "bf16", 128),
        Call("per_token_cast_back", "bad-group", pair(), "bf16", 256),
        Call("per_token_cast_back", "bad-group-none", pair(), "bf16", None),
    ]
    return calls


def cast_back_block_calls() -> list[Call]:
    """cast_back of the per-block casts' 32 x 128 and 128 x 32 blocks and of per_channel_cast's (m, 1) blocks (sf
    row-major; UE8M0 packs four token blocks a word). Recorded from CPU-checked code (see partial_group_calls)."""
    calls = []
    combos = itertools.product(("e4m3", "e2m1"), ((32, 128), (128, 32)), ("fp32", "ue8m0", "e4m3"), ("row", "col"))
    for i, (in_fmt, block, kind, layout) in enumerate(combos):
        tokens, hidden, fmt = cycle((1, 33, 130), i), cycle((256, 7168), i // 3), cycle(("bf16", "fp32"), i // 2)
        data = T((tokens, hidden if in_fmt == "e4m3" else hidden // 2), FP8 if in_fmt == "e4m3" else I8)
        sf = sf_tensor(-(-tokens // block[0]), hidden // block[1], kind, layout)
        calls.append(Call("cast_back", f"{in_fmt}-{block[0]}x{block[1]}-{kind}-{layout}-{tokens}x{hidden}-{fmt}", (data, sf), fmt, block))
    for i, (in_fmt, m, kind) in enumerate(itertools.product(("e4m3", "e2m1"), (32, 128), ("fp32", "ue8m0", "e4m3"))):
        tokens, hidden, fmt = cycle((1, 33, 130, 300), i), cycle((256, 7168), i // 2), cycle(("bf16", "fp32"), i // 3)
        data = T((tokens, hidden if in_fmt == "e4m3" else hidden // 2), FP8 if in_fmt == "e4m3" else I8)
        m_blocks = -(-tokens // m)
        sf = T((-(-m_blocks // 4), hidden), I32, fill="ue8m0") if kind == "ue8m0" else T((m_blocks, hidden), SF_DTYPE[kind])
        calls.append(Call("cast_back", f"{in_fmt}-{m}x1-{kind}-row-{tokens}x{hidden}-{fmt}", (data, sf), fmt, (m, 1)))
    calls += [
        Call("cast_back", "bad-per-channel-sf-col", (T((40, 512), FP8), col((2, 512))), "bf16", (32, 1)),
        Call("cast_back", "bad-per-channel-ue8m0-packed-along-k", (T((40, 512), FP8), T((2, 128), I32)), "bf16", (32, 1)),
        Call("cast_back", "bad-per-channel-sf-shape", (T((40, 512), FP8), T((1, 512), F32)), "bf16", (32, 1)),
    ]
    return calls


# ---- per-block and per-channel casts ---------------------------------------------------------------------------------

BLOCKS = ((32, 32), (32, 128), (128, 32), (128, 128))


def per_block_cast_calls() -> list[Call]:
    calls = []
    combos = itertools.product((BF16, F32), ("e4m3", "e2m1"), BLOCKS, ("fp32", "pow2", "ue8m0"), (False, True))
    for i, (dtype, fmt, block, kind, col_major) in enumerate(combos):
        tokens, hidden = cycle((1, 33, 130, 300), i), cycle((128, 512, 7168), i // 4)
        round_sf, packed, _ = KINDS[kind]
        name = f"{NAMES[dtype]}-{fmt}-{block[0]}x{block[1]}-{kind}-{'col' if col_major else 'row'}-{tokens}x{hidden}"
        size = cycle((block, list(block)), i // 3)
        calls.append(Call("per_block_cast", name, T((tokens, hidden), dtype), fmt, size, col_major, round_sf, packed))
        if i % 2 == 0:
            m_blocks, k_blocks = -(-tokens // block[0]), hidden // block[1]
            layout = ("col", "padded")[i % 4 // 2] if col_major else "row"
            data = T((tokens, hidden if fmt == "e4m3" else hidden // 2), FP8 if fmt == "e4m3" else I8)
            calls.append(Call("per_block_cast", f"out-{name}-{layout}", T((tokens, hidden), dtype), fmt, block, col_major, round_sf, packed,
                              out=(data, sf_tensor(m_blocks, k_blocks, kind, layout))))  # fmt: skip
            calls.append(Call("per_block_cast_with_sf_only", name, T((tokens, hidden), dtype), fmt, block, col_major, round_sf, packed))
            calls.append(Call("per_block_cast_with_sf_only", f"given-{name}-{layout}", T((tokens, hidden), dtype), fmt, block, col_major,
                              round_sf, packed, out_sf=sf_tensor(m_blocks, k_blocks, kind, layout)))  # fmt: skip
            if kind != "ue8m0" and not col_major:
                calls.append(Call("per_block_cast_with_precomputed_sf", name, T((tokens, hidden), dtype), fmt, block,
                                  sf_tensor(m_blocks, k_blocks, kind, "row"), round_sf=round_sf,
                                  out=data if i % 4 == 0 else None))  # fmt: skip
    calls.append(Call("per_block_cast", "no-tokens", T((0, 512)), "e4m3", (128, 128)))
    calls.append(Call("per_block_cast", "most-blocks", T((65535 * 32, 128), meta=True), "e4m3", (32, 32)))
    x = T((300, 512))
    for op in ("per_block_cast", "per_block_cast_with_sf_only"):
        calls += [
            Call(op, "bad-x-fp16", T((300, 512), F16), "e4m3", (128, 128)),
            Call(op, "bad-x-fp8", T((300, 512), FP8), "e4m3", (128, 128)),
            Call(op, "bad-x-pair", (T((300, 512), FP8), T((3, 4), F32)), "e4m3", (128, 128)),
            Call(op, "bad-x-list", [1.0], "e4m3", (128, 128)),
            Call(op, "bad-x-1d", T((512,)), "e4m3", (128, 128)),
            Call(op, "bad-x-3d", T((1, 300, 512)), "e4m3", (128, 128)),
            Call(op, "bad-x-cpu", T((300, 512), device=-1), "e4m3", (128, 128)),
            Call(op, "bad-x-padded", T((300, 512), BF16, (520, 1)), "e4m3", (128, 128)),
            Call(op, "bad-x-sliced", T((300, 512), BF16, (1024, 1)), "e4m3", (128, 128)),
            Call(op, "one-row-strided", T((1, 512), BF16, (1024, 1)), "e4m3", (128, 128)),
            Call(op, "bad-x-last-dim", T((300, 512), BF16, (1, 300)), "e4m3", (128, 128)),
            Call(op, "bad-x-misaligned", T((300, 512), offset=4), "e4m3", (128, 128)),
            Call(op, "bad-x-width", T((300, 576)), "e4m3", (128, 128)),
            Call(op, "bad-x-width-64", T((300, 64)), "e4m3", (32, 32)),
            Call(op, "bad-x-too-wide", T((1, 65664)), "e4m3", (128, 128)),
            Call(op, "bad-x-too-many", T((65535 * 128 + 1, 128), meta=True), "e4m3", (128, 128)),
            Call(op, "bad-x-too-many-32", T((65535 * 32 + 1, 128), meta=True), "e4m3", (32, 128)),
            Call(op, "bad-fmt", x, "e8m0", (128, 128)),
            Call(op, "bad-block", x, "e4m3", (64, 128)),
            Call(op, "bad-block-one", x, "e4m3", 128),
            Call(op, "bad-block-floats", x, "e4m3", (128.0, 128.0)),
            Call(op, "bad-block-none", x, "e4m3", None),
            Call(op, "bad-packed-without-round", x, "e4m3", (128, 128), use_packed_ue8m0=True),
        ]  # fmt: skip
    out = lambda data=None, sf=None: (data or T((300, 512), FP8), sf or T((3, 4), F32))
    calls += [
        Call("per_block_cast", "bad-out0-dtype", x, "e4m3", (128, 128), out=out(data=T((300, 512), I8))),
        Call("per_block_cast", "bad-out0-shape", x, "e2m1", (128, 128), out=(T((300, 512), I8), T((3, 4), F32))),
        Call("per_block_cast", "bad-out0-padded", x, "e4m3", (128, 128), out=out(data=T((300, 512), FP8, (528, 1)))),
        Call("per_block_cast", "out0-one-row-strided", T((1, 512)), "e4m3", (128, 128),
             out=(T((1, 512), FP8, (1024, 1)), T((1, 4), F32))),
        Call("per_block_cast", "bad-out0-device", x, "e4m3", (128, 128), out=out(data=T((300, 512), FP8, device=1))),
        Call("per_block_cast", "bad-out1-shape", x, "e4m3", (128, 128), out=out(sf=T((3, 3), F32))),
        Call("per_block_cast", "bad-out1-dtype", x, "e4m3", (128, 128), out=out(sf=T((3, 4), FP8))),
        Call("per_block_cast", "bad-out1-col-for-row", x, "e4m3", (128, 128), out=out(sf=col((3, 4)))),
        Call("per_block_cast", "bad-out1-row-for-col", x, "e4m3", (128, 128), True, out=out()),
        Call("per_block_cast", "bad-out1-device", x, "e4m3", (128, 128), out=out(sf=T((3, 4), F32, device=1))),
        Call("per_block_cast", "bad-out-not-pair", x, "e4m3", (128, 128), out=[T((300, 512), FP8)]),
        Call("per_block_cast", "bad-out-tensor", x, "e4m3", (128, 128), out=T((300, 512), FP8)),
        Call("per_block_cast", "bad-out1-list", x, "e4m3", (128, 128), out=(T((300, 512), FP8), [0.0])),
        Call("per_block_cast_with_sf_only", "bad-out-sf-shape", x, "e4m3", (32, 32), round_sf=True, use_packed_ue8m0=True,
             out_sf=T((10, 16), I32)),
        Call("per_block_cast_with_sf_only", "bad-out-sf-col-short-pitch", x, "e4m3", (128, 128), True, out_sf=col((3, 4), pitch=2)),
        Call("per_block_cast_with_sf_only", "bad-out-sf-huge", x, "e4m3", (128, 128), out_sf=T((3, 4), F32, (2**29, 1), meta=True)),
        Call("per_block_cast_with_precomputed_sf", "bad-sf-shape", x, "e4m3", (128, 128), T((1, 3), F32)),
        Call("per_block_cast_with_precomputed_sf", "bad-sf-col", x, "e4m3", (128, 128), col((3, 4))),
        Call("per_block_cast_with_precomputed_sf", "bad-sf-col-asked", x, "e4m3", (128, 128), T((3, 4), F32), True),
        Call("per_block_cast_with_precomputed_sf", "bad-sf-packed", x, "e4m3", (128, 128), T((3, 1), I32), round_sf=True,
             use_packed_ue8m0=True),
        Call("per_block_cast_with_precomputed_sf", "bad-sf-dtype", x, "e4m3", (128, 128), T((3, 4), BF16)),
        Call("per_block_cast_with_precomputed_sf", "bad-sf-none", x, "e4m3", (128, 128), None),
        Call("per_block_cast_with_precomputed_sf", "bad-sf-device", x, "e4m3", (128, 128), T((3, 4), F32, device=1)),
        Call("per_block_cast_with_precomputed_sf", "bad-out-shape", x, "e4m3", (128, 128), T((3, 4), F32), out=T((300, 256), FP8)),
        Call("per_block_cast_with_precomputed_sf", "bad-out-dtype", x, "e2m1", (128, 128), T((3, 4), F32), out=T((300, 256), FP8)),
        Call("per_block_cast_with_precomputed_sf", "bad-x-fp16", T((300, 512), F16), "e4m3", (128, 128), T((3, 4), F32)),
        Call("per_block_cast_with_precomputed_sf", "bad-block", x, "e4m3", (128, 64), T((3, 8), F32)),
    ]  # fmt: skip
    return calls


def per_channel_cast_calls() -> list[Call]:
    op, calls = "per_channel_cast", []
    for i, (dtype, block_m, kind) in enumerate(itertools.product((BF16, F32), (32, 128), ("fp32", "pow2", "ue8m0"))):
        tokens, hidden = cycle((1, 33, 130, 300, 600), i), cycle((128, 512, 7168), i)
        round_sf, packed, _ = KINDS[kind]
        name = f"{NAMES[dtype]}-{block_m}-{kind}-{tokens}x{hidden}"
        calls.append(Call(op, name, T((tokens, hidden), dtype), "e4m3", block_m, round_sf, None, packed))
    combos = itertools.product(
        (32, 128), ("fp32", "ue8m0", "e4m3"), ("row", "col", "padded", "sliced"), (32, 128), ("fp32", "pow2", "ue8m0")
    )
    for i, (group, in_kind, layout, block_m, kind) in enumerate(combos):
        if i % 2:
            continue
        tokens, hidden = cycle((1, 33, 200, 300), i // 2), cycle((128, 512, 7168), i // 3)
        groups = hidden // group
        if layout == "sliced":  # a slice along tokens of a column-major sf
            cols = -(-groups // 4) if in_kind == "ue8m0" else groups
            sf = col((tokens, cols), SF_DTYPE[in_kind], pitch=tokens + 56)
        else:
            sf = sf_tensor(tokens, groups, in_kind, layout)
        round_sf, packed, _ = KINDS[kind]
        calls.append(Call(op, f"pair-{group}-{in_kind}-{layout}-{block_m}-{kind}-{tokens}x{hidden}", (T((tokens, hidden), FP8), sf), "e4m3",
                          block_m, round_sf, group, packed))  # fmt: skip
    x, pair = T((256, 512)), lambda: (T((256, 512), FP8), T((256, 4), F32))
    calls += [
        Call(op, "bad-fmt", x, "e2m1", 128),
        Call(op, "bad-block-m", x, "e4m3", 64),
        Call(op, "bad-block-m-none", x, "e4m3", None),
        Call(op, "bad-packed-without-round", x, "e4m3", 128, use_packed_ue8m0=True),
        Call(op, "bad-group-for-tensor", x, "e4m3", 128, num_per_channels=128),
        Call(op, "bad-x-fp16", T((256, 512), F16), "e4m3", 128),
        Call(op, "bad-x-fp8", T((256, 512), FP8), "e4m3", 128),
        Call(op, "bad-x-list", [1.0], "e4m3", 128),
        Call(op, "bad-x-list-with-group", [1.0], "e4m3", 128, num_per_channels=128),
        Call(op, "bad-x-none", None, "e4m3", 128),
        Call(op, "bad-x-1d", T((512,)), "e4m3", 128),
        Call(op, "bad-x-cpu", T((256, 512), device=-1), "e4m3", 128),
        Call(op, "bad-x-padded", T((256, 512), BF16, (520, 1)), "e4m3", 128),
        Call(op, "bad-x-misaligned", T((256, 512), offset=2), "e4m3", 128),
        Call(op, "bad-x-too-wide", T((1, 65664)), "e4m3", 128),
        Call(op, "bad-pair-too-wide", (T((1, 65664), FP8), T((1, 513), F32)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-x-width", T((256, 192)), "e4m3", 128),
        Call(op, "bad-x-too-many", T((65535 * 32 + 1, 128), meta=True), "e4m3", 32),
        Call(op, "bad-pair-no-group", pair(), "e4m3", 128),
        Call(op, "bad-pair-group-64", (T((256, 512), FP8), T((256, 8), F32)), "e4m3", 128, num_per_channels=64),
        Call(op, "bad-pair-data-e2m1", (T((256, 256), I8), T((256, 4), F32)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-data-bf16", (T((256, 512)), T((256, 4), F32)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-data-list", ([1.0], T((256, 4), F32)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-data-padded", (T((256, 512), FP8, (528, 1)), T((256, 4), F32)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-data-sliced", (T((256, 512), FP8, (1024, 1)), T((256, 4), F32)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-data-cpu", (T((256, 512), FP8, device=-1), T((256, 4), F32)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-sf-shape", (T((256, 512), FP8), T((256, 3), F32)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-sf-dtype", (T((256, 512), FP8), T((256, 4))), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-sf-device", (T((256, 512), FP8), T((256, 4), F32, device=1)), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-sf-list", (T((256, 512), FP8), [1.0]), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-triple", (*pair(), None), "e4m3", 128, num_per_channels=128),
        Call(op, "bad-pair-width", (T((256, 192), FP8), T((256, 6), F32)), "e4m3", 128, num_per_channels=32),
    ]  # fmt: skip
    return calls


# ---- cast --------------------------------------------------------------------------------------------------------------

CAST_DTYPES = (F32, BF16, F16, FP8)
STOCHASTIC = ((F32, BF16), (F32, FP8), (BF16, FP8))


def cast_calls() -> list[Call]:
    op, calls = "cast", []
    shapes = ((3, 5), (7168,), (2, 3, 512), (0, 512), (1,), (130, 7168))
    for i, (src, dst) in enumerate((a, b) for a in CAST_DTYPES for b in CAST_DTYPES if a != b):
        for j, stochastic in enumerate((False, True) if (src, dst) in STOCHASTIC else (False,)):
            shape = cycle(shapes, 2 * i + j)
            calls.append(
                Call(
                    op,
                    f"{NAMES[src]}-{NAMES[dst]}-{'sto' if stochastic else 'rne'}-{'x'.join(map(str, shape))}",
                    T(shape, src),
                    dst,
                    stochastic,
                )
            )
    e5m2 = torch.float8_e5m2  # appended to the record later (E5M2 both ways, no FP8 to FP8), before its first GPU run
    for i, (src, dst) in enumerate([(a, e5m2) for a in (F32, BF16, F16)] + [(e5m2, b) for b in (F32, BF16, F16)]):
        shape = cycle(shapes, i)
        calls.append(Call(op, f"{NAMES[src]}-{NAMES[dst]}-rne-{'x'.join(map(str, shape))}", T(shape, src), dst, False))
    calls += [Call(op, "bad-fp8-to-fp8", T((3, 8), FP8), e5m2), Call(op, "bad-fp8-to-fp8-back", T((3, 8), e5m2), FP8)]
    calls.append(Call(op, "one-element-offset", T((1,), F32, offset=4), BF16))
    calls.append(Call(op, "scalar", T((), F32), BF16))
    calls.append(Call(op, "stochastic-int", T((4, 4), F32), BF16, 1))
    calls += [
        Call(op, "bad-x-int8", T((3, 5), I8), F32),
        Call(op, "bad-x-list", [1.0], F32),
        Call(op, "bad-x-none", None, F32),
        Call(op, "bad-x-cpu", T((3, 5), F32, device=-1), BF16),
        Call(op, "bad-dtype-int8", T((3, 5), F32), I8),
        Call(op, "bad-dtype-str", T((3, 5), F32), "bfloat16"),
        Call(op, "bad-dtype-none", T((3, 5), F32), None),
        Call(op, "bad-same-dtype", T((3, 5), F32), F32),
        Call(op, "bad-stochastic-pair", T((3, 5), BF16), F16, True),
        Call(op, "bad-stochastic-fp8-in", T((3, 5), FP8), F32, True),
        Call(op, "bad-transposed", T((512, 4), F32, (1, 512)), BF16),
        Call(op, "bad-sliced", T((4, 512), F32, (1024, 1)), BF16),
        Call(op, "bad-misaligned", T((4, 5), F32, offset=1), BF16),
        Call(op, "bad-misaligned-fp8", T((40,), FP8, offset=8), BF16),
        Call(op, "bad-too-many", T((2**31 - 2**16 + 1,), F32, meta=True), BF16),
    ]  # fmt: skip
    return calls


# ---- weight casts ------------------------------------------------------------------------------------------------------

IN_BLOCKS = ((1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (128, 128))
OUT_BLOCKS = ((1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (32, 128), (128, 32), (128, 128))


def per_block_cast_lossless_calls() -> list[Call]:
    op, calls, i = "per_block_cast_lossless", [], 0
    for block, in_kind, layout in itertools.product(IN_BLOCKS, ("fp32", "ue8m0"), ("row", "col", "padded")):
        for out_block in OUT_BLOCKS:
            if out_block[0] % block[0] or out_block[1] % block[1]:
                continue
            i += 1
            if i % 2 and out_block not in (block, (128, 128)):
                continue
            tokens, hidden = cycle((1, 3, 130, 300), i), cycle((128, 512, 7168), i // 4)
            col_major, packed = i % 3 == 1, i % 4 >= 2
            fill = "pow2" if in_kind == "fp32" else "ue8m0"
            sf = sf_tensor(-(-tokens // block[0]), hidden // block[1], "fp32" if in_kind == "fp32" else "ue8m0", layout, fill=fill)
            size, out_size = cycle((block, list(block)), i // 2), cycle((out_block, list(out_block)), i // 3)
            name = (f"{block[0]}x{block[1]}-{in_kind}-{layout}-to-{out_block[0]}x{out_block[1]}-"
                    f"{'col' if col_major else 'row'}-{'packed' if packed else 'pow2'}-{tokens}x{hidden}")  # fmt: skip
            x = (T((tokens, hidden // 2), I8), sf)
            calls.append(Call(op, name, x, "e4m3", size, out_size, col_major, packed or i % 5 == 0, packed))
    calls.append(Call(op, "no-tokens", (T((0, 256), I8), T((0, 4), I32)), "e4m3", (1, 32), (128, 128)))
    calls.append(Call(op, "padded-rows", (T((3, 256), I8, (272, 1)), T((3, 16), F32, fill="pow2")), "e4m3", (1, 32), (1, 128)))
    calls.append(Call(op, "zero-scales", (T((3, 256), I8), T((3, 16), F32)), "e4m3", (1, 32), (1, 128)))
    fp4 = lambda: (T((256, 256), I8), T((256, 4), I32, fill="ue8m0"))
    calls += [
        Call(op, "bad-fmt", fp4(), "e2m1", (1, 32), (128, 128)),
        Call(op, "bad-x-tensor", T((256, 256), I8), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-x-list", [1], "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-x-triple", (*fp4(), None), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-data-fp8", (T((256, 512), FP8), T((256, 4), F32, fill="pow2")), "e4m3", (1, 128), (128, 128)),
        Call(op, "bad-data-list", ([1], T((256, 4), I32)), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-data-row-stride", (T((256, 256), I8, (264, 1)), T((256, 4), I32)), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-data-misaligned", (T((256, 256), I8, offset=8), T((256, 4), I32)), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-data-cpu", (T((256, 256), I8, device=-1), T((256, 4), I32)), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-sf-e4m3", (T((256, 256), I8), T((256, 16), FP8)), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-sf-fp16", (T((256, 256), I8), T((256, 16), F16)), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-sf-shape", (T((256, 256), I8), T((256, 3), I32)), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-sf-device", (T((256, 256), I8), T((256, 4), I32, device=1)), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-sf-list", (T((256, 256), I8), [1]), "e4m3", (1, 32), (128, 128)),
        Call(op, "bad-out-block", fp4(), "e4m3", (1, 32), (64, 128)),
        Call(op, "bad-out-block-none", fp4(), "e4m3", (1, 32), None),
        Call(op, "bad-out-block-smaller", fp4(), "e4m3", (1, 32), (1, 16)),
        Call(op, "bad-out-block-rows", (T((256, 256), I8), T((8, 16), F32, fill="pow2")), "e4m3", (32, 32), (1, 128)),
        Call(op, "bad-in-block", fp4(), "e4m3", (1, 24), (128, 128)),
        Call(op, "bad-in-block-none", fp4(), "e4m3", None, (128, 128)),
        Call(op, "bad-packed-without-round", fp4(), "e4m3", (1, 32), (128, 128), use_packed_ue8m0=True),
        Call(op, "bad-width", (T((256, 96), I8), T((256, 2), I32)), "e4m3", (1, 32), (1, 32)),
        Call(op, "bad-too-wide", (T((1, 65664 // 2), I8), T((1, 513), F32)), "e4m3", (1, 128), (1, 128)),
        Call(op, "bad-too-many", (T((65535 * 128 + 1, 64), I8, meta=True), T((65535 * 128 + 1, 1), I32, meta=True)), "e4m3", (1, 32),
             (1, 128)),
        Call(op, "bad-not-pow2", (T((3, 256), I8), T((3, 16), F32, fill=3.0)), "e4m3", (1, 32), (1, 128)),
        Call(op, "bad-spread", (T((3, 256), I8), T((3, 16), F32, fill="spread")), "e4m3", (1, 32), (1, 128)),
    ]  # fmt: skip
    return calls


def batched_transpose_weight_sf_calls() -> list[Call]:
    op, calls = "batched_transpose_weight_sf", []
    pow2 = lambda *shape: T(shape, F32, fill="pow2")
    sf0 = lambda n, packs_k, g=None: T((n, packs_k) if g is None else (g, n, packs_k), I32, (1, n) if g is None else (packs_k * n, 1, n))
    for block in (32, 128):
        calls += [
            Call(op, f"{block}-one", [pow2(56, 12)], block, [False], [None]),
            Call(op, f"{block}-one-transposed", [pow2(56, 12)], block, [True], [None]),
            Call(op, f"{block}-grouped", [pow2(3, 16, 20)], block, [True], [None]),
            Call(op, f"{block}-mixed", [pow2(4, 8), pow2(2, 4, 12), pow2(8, 4)], block, [False, True, False], [None, None, None]),
        ]
    calls += [
        Call(op, "odd-blocks", [pow2(56, 14), pow2(3, 16, 13)], 128, [False, True], [None, None]),
        Call(op, "given", [pow2(4, 4)], 128, [False], [(sf0(512, 1), T((512, 1), I32, (1, 512)))]),
        Call(op, "given-transposed-list", [pow2(4, 4)], 128, [True], [[sf0(512, 1), T((1, 512), I32)]]),
        Call(op, "given-grouped", [pow2(3, 16, 14)], 128, [True], [(sf0(2048, 4, 3), T((3, 4, 1792), I32))]),
        Call(op, "given-and-new", [pow2(4, 4), pow2(4, 4)], 128, [False, False], [None, (sf0(512, 1), T((512, 1), I32, (1, 512)))]),
        Call(op, "tuple-args", (pow2(4, 4),), 128, (False,), (None,)),
        Call(op, "no-rows", [pow2(0, 14)], 128, [False], [None]),
        Call(op, "empty", [], 128, [], []),
        Call(op, "bad-block", [pow2(4, 4)], 64, [False], [None]),
        Call(op, "bad-block-float", [pow2(4, 4)], 128.0, [False], [None]),
        Call(op, "bad-lengths", [pow2(4, 4)], 128, [False, True], [None]),
        Call(op, "bad-sf-bf16", [T((4, 4))], 128, [False], [None]),
        Call(op, "bad-sf-1d", [pow2(4)], 128, [False], [None]),
        Call(op, "bad-sf-4d", [pow2(1, 1, 4, 4)], 128, [False], [None]),
        Call(op, "bad-sf-strided", [T((4, 4), F32, (8, 1), fill="pow2")], 128, [False], [None]),
        Call(op, "bad-sf-list", [[1.0]], 128, [False], [None]),
        Call(op, "bad-sf-cpu", [T((4, 4), F32, device=-1, fill="pow2")], 128, [False], [None]),
        Call(op, "bad-sf-devices", [pow2(4, 4), T((4, 4), F32, device=1, fill="pow2")], 128, [False, False], [None, None]),
        Call(op, "bad-sf-n", [pow2(4, 4), pow2(3, 4)], 32, [False, False], [None, None]),
        Call(op, "bad-sf-no-groups", [pow2(0, 4, 4)], 128, [False], [None]),
        Call(op, "bad-sf-huge", [T((2**17, 2**17), F32, meta=True)], 128, [False], [None]),
        Call(op, "bad-not-pow2", [T((4, 4), F32, fill=3.0)], 128, [False], [None]),
        Call(op, "bad-out-single", [pow2(4, 4)], 128, [False], [(T((512, 1), I32),)]),
        Call(op, "bad-out-tensor", [pow2(4, 4)], 128, [False], [T((512, 1), I32)]),
        Call(op, "bad-out0-strides", [pow2(4, 4)], 128, [False], [(T((512, 2), I32, (2, 1)), T((512, 1), I32, (1, 512)))]),
        Call(op, "bad-out1-layout", [pow2(4, 4)], 128, [True], [(sf0(512, 1), sf0(512, 1))]),
        Call(op, "bad-out0-dtype", [pow2(4, 4)], 128, [False], [(T((512, 1), F32, (1, 512)), T((512, 1), I32, (1, 512)))]),
        Call(op, "bad-out0-misaligned", [pow2(4, 4)], 128, [False], [(T((512, 1), I32, (1, 512), offset=1), T((512, 1), I32, (1, 512)))]),
        Call(op, "bad-out1-cpu", [pow2(4, 4)], 128, [False], [(sf0(512, 1), T((512, 1), I32, (1, 512), device=-1))]),
        Call(op, "bad-out1-device", [pow2(4, 4)], 128, [False], [(sf0(512, 1), T((512, 1), I32, (1, 512), device=1))]),
        Call(op, "bad-out1-list", [pow2(4, 4)], 128, [False], [(sf0(512, 1), [0])]),
    ]  # fmt: skip
    return calls


def unpack_from_e2m1fn_x2_calls() -> list[Call]:
    op = "unpack_from_e2m1fn_x2"
    return [
        Call(op, "int8-2d", T((3, 8), I8, fill="bytes")),
        Call(op, "uint8-1d-bf16", T((16,), U8, fill="bytes"), BF16),
        Call(op, "int8-3d-cpu", T((2, 2, 8), I8, fill="bytes", device=-1)),
        Call(op, "int8-strided", T((4, 8), I8, (16, 2), fill="bytes"), F16),
        Call(op, "bad-0d", T((), I8)),
        Call(op, "bad-fp32", T((3, 8), F32)),
        Call(op, "bad-list", [1, 2]),
    ]


ALL = {
    "per_token_cast": per_token_cast_calls,
    "per_token_cast_with_sf_only": per_token_cast_with_sf_only_calls,
    "per_token_cast_with_precomputed_sf": per_token_cast_with_precomputed_sf_calls,
    "per_token_cast_and_cast_back": per_token_cast_and_cast_back_calls,
    "cast_back": cast_back_calls,
    "per_block_cast": per_block_cast_calls,
    "per_channel_cast": per_channel_cast_calls,
    "cast": cast_calls,
    "per_block_cast_lossless": per_block_cast_lossless_calls,
    "batched_transpose_weight_sf": batched_transpose_weight_sf_calls,
    "unpack_from_e2m1fn_x2": unpack_from_e2m1fn_x2_calls,
}
