"""Parity cases: for each public op of tkaot, random calls that TileKernels 2.1.0 accepts, the same call for both.

A case is data: the op ("quant.per_token_cast": tkaot.quant.per_token_cast and tile_kernels.quant.per_token_cast),
a label (its options in words), its static configuration, and `build(device) -> Call`, which makes fresh inputs from
the case's seed: two builds hold the same bytes, so each library gets its own copy of every input it may write
(out= buffers, apply_rotary's query and key, unmapped_topk_idx, in-place casts, clamp counters).

Each op's generator draws, from a `random.Random` seeded by the op's name (and TKAOT_PARITY_SEED), a few static
configurations (TKAOT_PARITY_CONFIGS, default 4): the options TileKernels compiles a kernel for (hidden size, dtypes,
formats, sf kind and layout, flags, eps, clamp value, ...). It then spreads TKAOT_PARITY_CASES calls (default 12) over
them, each with its own token count (1, 3, 127 and 4097 always among them; multiples of 128 where TileKernels asks
for them) and its own runtime options (out= buffers, 3-D inputs, strides, psum layouts, scaling factors, ep_rank, ...).
A TileKernels JIT compile takes seconds, so a configuration is reused across calls; its per-token cast compiles
once more above 4096 tokens, its cast once per numel divisibility class, its rotary once per head count.

Sizes are drawn half from the models tkaot serves and half uniformly from what TileKernels accepts; the options are
every one TileKernels takes for the op, with these exceptions, each for a reason:
  - swiglu's clamp_value is never negative: tkaot refuses a negative clamp (README), and TileKernels' results for
    one differ between its counting and non-counting paths;
  - x_special_fmt is always None (TileKernels asserts it), scoring_func always 'sqrtsoftplus' (likewise);
  - dtypes are those TileKernels asserts or documents: bf16/fp32 activations; cast's fp32, bf16, fp16, E4M3 and E5M2,
    FP8 to FP8 aside (CUDA has no direct conversion). SwiGLU and the in-place round trip assert no dtype and would
    compile for fp16 as well; fp16 is not drawn for them.
Bytes TileKernels leaves unwritten are not compared: rows between experts of a psum layout, and the padding bytes of
packed UE8M0 rows (each case's `trims`).

Non-deterministic outputs: TileKernels' stochastic rounding (per_token_cast's stochastic_cast, cast's
stochastic_rounding) takes its random bits from a hash of the values, tkaot's from another hash, so those values
are compared level by level (tests/parity_compare.py: equal or neighbouring levels, and no bias over 65536 values);
their scale factors are compared byte for byte. force_random routes are deterministic in both (curand's Philox
stream keyed by ep_rank), so they are compared byte for byte.
"""

from __future__ import annotations

import math
import os
import random
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import torch

from tests.parity_inputs import BF16, E4M3, F32, PACK, Gen, align, ceil_div, psum_layout, psum_rows

CASES_PER_OP = int(os.environ.get("TKAOT_PARITY_CASES", "12"))
CONFIGS_PER_OP = int(os.environ.get("TKAOT_PARITY_CONFIGS", "4"))
SEED = int(os.environ.get("TKAOT_PARITY_SEED", "0"))
ODD_TOKENS = (1, 3, 127, 4097)
BLOCK_TOKENS = (128, 384, 4096, 8192)  # ops that take multiples of 128 tokens only
MAX_TOKENS = 8192
STOCHASTIC = "values level by level (equal or neighbouring levels, unbiased), sf byte for byte: different hashes"


@dataclass
class Call:
    """One call's arguments; `trims` cut bytes TileKernels leaves unspecified out of returned tensors (by result
    path, tests/parity_compare.py), `adjacent` names the returned tensors compared level by level, with their format,
    `close` the returned or input tensors compared by value, with their tolerance relative to the largest value."""

    args: tuple
    kwargs: dict
    trims: dict[str, Callable] = field(default_factory=dict)
    adjacent: dict[str, str] = field(default_factory=dict)
    # returned or written-in-place tensors both libraries sum in their own order: path -> assert_close's rtol, atol
    close: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    op: str  # "family.name", the same in tkaot and tile_kernels
    label: str
    config: str  # the static configuration: calls sharing it share TileKernels' compiled kernel
    params: dict
    make: Callable[[Gen, dict], Call]
    seed: int
    tolerance: str | None = None  # how outputs TileKernels computes non-deterministically are compared

    def build(self, device) -> Call:
        return self.make(Gen(device, self.seed), self.params)


# -- drawing


def token_counts(rng: random.Random, n: int, fixed=ODD_TOKENS, multiple: int = 1) -> list[int]:
    """n token counts: `fixed` first, then log-uniform in [multiple, 8192], rounded down to multiples of `multiple`."""
    counts = list(fixed[:n])
    while len(counts) < n:
        t = int(2 ** rng.uniform(math.log2(multiple), 13))
        counts.append(min(MAX_TOKENS, max(multiple, t // multiple * multiple)))
    return counts


def pick_size(rng: random.Random, multiple: int, limit: int, models=()) -> int:
    """Half the time a size a served model uses (that fits), else uniform over the multiples of `multiple` up to limit."""
    fitting = [h for h in models if h % multiple == 0 and h <= limit]
    if fitting and rng.random() < 0.5:
        return rng.choice(fitting)
    return multiple * rng.randint(1, limit // multiple)


def pick(rng: random.Random, allowed, served=()):
    """Half the time one of the `served` values (the ones models use) that is allowed, else any allowed value."""
    allowed = list(allowed)
    fitting = [v for v in served if v in allowed]
    return rng.choice(fitting if fitting and rng.random() < 0.5 else allowed)


def label_of(p: dict) -> str:
    words = [f"{p['tokens']} tokens"] if "tokens" in p else []
    for key, value in p.items():
        if key == "tokens" or value is None or value is False or (type(value) is int and value == 0):
            continue
        words.append(key if value is True else f"{key}={value}")
    return ", ".join(words)


def assemble(op, rng, draw_config, draw_call, make, fixed=ODD_TOKENS, multiple=1, tolerance=None) -> list[Case]:
    """CASES_PER_OP cases over min(CONFIGS_PER_OP, CASES_PER_OP) configurations, round robin over the token counts.
    draw_call(rng, config, tokens) -> the call's runtime options; tolerance(params) -> None or how it is compared."""
    k = max(1, min(CONFIGS_PER_OP, CASES_PER_OP))
    configs = covering(rng, draw_config, k)
    cases = []
    for i, tokens in enumerate(token_counts(rng, CASES_PER_OP, fixed, multiple)):
        config = configs[i % k]
        params = {"tokens": tokens, **config, **draw_call(rng, config, tokens)}
        static = ", ".join(f"{key}={value}" for key, value in config.items())
        tol = tolerance(params) if tolerance else None
        cases.append(Case(op, label_of(params), static, params, make, rng.getrandbits(31), tol))
    return cases


SIZE_KEYS = ("hidden", "experts", "heads")


def covering(rng, draw_config, k: int) -> list[dict]:
    """k configurations picked from 8 k draws, greedily, each adding the most option values not picked yet (sizes
    aside), a value of an option that takes n values counting 1/n, so that rare options show up even with few
    configurations and no option crowds out the others (exact fractions: the same picks whatever the set order)."""
    candidates = [draw_config(rng) for _ in range(8 * k)]
    values = Counter(key for key, _ in {f for c in candidates for f in _features(c)})
    picked, seen = [], set()
    for _ in range(k):
        best = max(candidates, key=lambda c: sum(Fraction(1, values[key]) for key, _ in _features(c) - seen))
        candidates.remove(best)
        picked.append(best)
        seen |= _features(best)
    return picked


def _features(config: dict) -> set:
    return {(key, value) for key, value in config.items() if key not in SIZE_KEYS}


def no_call_options(rng, config, tokens) -> dict:
    return {}


# -- trims: bytes TileKernels leaves unspecified


def first_bytes(n: int) -> Callable:
    """Packed UE8M0 sf (int32, 4 exponent bytes each): only the first n bytes of each row are written."""

    def trim(t: torch.Tensor) -> torch.Tensor:
        dense = torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)
        return dense.view(torch.uint8)[..., :n]

    return trim


def first_packed_rows(n: int) -> Callable:
    """UE8M0 sf packed along tokens (per_channel_cast): 4 token blocks an int32; only the first n are written."""

    def trim(t: torch.Tensor) -> torch.Tensor:
        dense = torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)
        blocks = dense.view(torch.uint8).reshape(t.shape[0], t.shape[1], PACK).permute(0, 2, 1)
        return blocks.reshape(t.shape[0] * PACK, t.shape[1])[:n]

    return trim


def rows_only(rows: torch.Tensor, then: Callable | None = None) -> Callable:
    return lambda t: (then or (lambda v: v))(t[rows])


def sf_trims(paths, groups: int, packed: bool) -> dict:
    return {path: first_bytes(groups) for path in paths} if packed and groups % PACK else {}


# -- shared option draws

FP8_SF = {  # sf kind -> the cast flags that ask for it
    "fp32": {},
    "pow2": {"round_sf": True},
    "ue8m0": {"round_sf": True, "use_packed_ue8m0": True},
    "e4m3": {"use_e4m3_sf": True},
}


def sf_flags(kind: str, col_major: bool) -> dict:
    return {**FP8_SF[kind], **({"use_tma_aligned_col_major_sf": True} if col_major else {})}


def out_sf_buffer(gen: Gen, rows: int, groups: int, kind: str, lead=()) -> torch.Tensor:
    """A poisoned row-major sf buffer of the kind's dtype (packed: int32, 4 groups each)."""
    if kind == "ue8m0":
        return gen.poisoned(*lead, rows, ceil_div(groups, PACK), dtype=torch.int32)
    return gen.poisoned(*lead, rows, groups, dtype=E4M3 if kind == "e4m3" else F32)


def quantized_input(gen: Gen, tokens: int, hidden: int, data_fmt: str, block, sf_kind: str, col_major: bool):
    """(data, sf) TileKernels reads as a quantized input: E4M3 or E2M1 (int8) data, sf of block `block`."""
    data = gen.fp8(tokens, hidden) if data_fmt == "e4m3" else gen.fp4(tokens, hidden)
    rows, cols = ceil_div(tokens, block[0]), ceil_div(hidden, block[1])
    values = gen.sf_values(rows, cols, sf_kind)
    return data, gen.sf_tensor(values, sf_kind, col_major, col_pack=block[1] == 1)


# ---- norm_forward / norm_forward_and_per_token_cast

NORM_HIDDEN = (512, 1536, 2048, 4096, 5120, 7168, 8192)


def _norm_static(rng) -> dict:
    return {
        "dtype": rng.choice(["bfloat16", "float32"]),
        "weight": rng.random() < 0.7,
        "residual": rng.random() < 0.5,
        "eps": rng.choice([1e-6, 1e-5]),
        "out_scale": rng.choice([1.0, 1.0, 0.5, 2.5]),
        "with_rstd": rng.random() < 0.5,
    }


def _norm_layout(rng, config) -> dict:
    return {
        "batch": rng.choice([0, 0, 1, 3]) if not config.get("mega_moe_block_m") else 0,
        "row_pad": rng.choice([0, 0, 16, 64]),
        "residual_out": rng.random() < (0.5 if config["residual"] else 0.1),  # without residual: accepted, untouched
    }


def _norm_inputs(gen: Gen, p: dict):
    dtype = getattr(torch, p["dtype"])
    lead = (p["batch"],) if p["batch"] else ()
    shape = (*lead, p["tokens"], p["hidden"])
    x = gen.activations(*shape, dtype=dtype, row_pitch=p["hidden"] + p["row_pad"])
    weight = gen.randn(p["hidden"], dtype=dtype) if p["weight"] else None
    kwargs = {"residual": gen.activations(*shape, dtype=dtype) if p["residual"] else None, "out_scale": p["out_scale"]}
    if p["residual_out"]:
        kwargs["residual_out"] = gen.poisoned(*shape, dtype=dtype)
    return x, weight, kwargs, shape, lead


def norm_forward_cases(rng) -> list[Case]:
    def config(rng):
        return {"hidden": pick_size(rng, 16, 8192, NORM_HIDDEN), **_norm_static(rng)}

    def call(rng, config, tokens):
        return {**_norm_layout(rng, config), "out": rng.random() < 0.4}

    def make(gen, p):
        x, weight, kwargs, shape, _ = _norm_inputs(gen, p)
        if p["out"]:
            kwargs["out"] = gen.poisoned(*shape, dtype=x.dtype)
        return Call((x, weight, p["eps"]), {**kwargs, "with_rstd": p["with_rstd"]})

    return assemble("quant.norm_forward", rng, config, call, make)


def norm_cast_cases(rng) -> list[Case]:
    def config(rng):
        quantized = rng.random() < 0.8
        c = {"hidden": pick_size(rng, 32 if quantized else 16, 8192, NORM_HIDDEN), **_norm_static(rng), "quantized": quantized}
        if quantized:
            c["sf"] = rng.choice(["fp32", "pow2", "ue8m0"])
            c["col_major"] = rng.random() < 0.3
            c["with_out_bf16"] = rng.random() < 0.5
            c["mega_moe_block_m"] = 0
            if c["sf"] != "fp32" and rng.random() < 0.25:
                c["hidden"] = pick_size(rng, 128, 8192, NORM_HIDDEN)
                c["mega_moe_block_m"] = rng.choice([64, 128, 192, 256])
        return c

    def call(rng, config, tokens):
        c = {**_norm_layout(rng, config), "out": rng.choice(["none", "data", "data+sf"])}
        if not config["quantized"] or config.get("col_major"):
            c["out"] = rng.choice(["none", "data"])  # given sf buffers are row-major; unquantized: (out, None)
        c["out_bf16"] = config.get("with_out_bf16", False) and rng.random() < 0.5
        if config.get("mega_moe_block_m"):
            c["mega_rows_pad"] = rng.choice([0, 128])
        return c

    def make(gen, p):
        x, weight, kwargs, shape, lead = _norm_inputs(gen, p)
        groups = p["hidden"] // 32
        if p["quantized"]:
            fmt, group, kind = "e4m3", 32, p["sf"]
            flags = sf_flags(kind, p["col_major"])
            kwargs.update(flags, with_out_bf16=p["with_out_bf16"])
        else:
            fmt, group, kind = ("bf16" if p["dtype"] == "bfloat16" else "fp32"), None, None
        if p["out"] != "none":
            data = gen.poisoned(*shape, dtype=E4M3 if p["quantized"] else x.dtype)
            sf = out_sf_buffer(gen, p["tokens"], groups, kind, lead) if p["out"] == "data+sf" else None
            kwargs["out"] = (data, sf)
        if p["out_bf16"]:
            kwargs["out_bf16"] = gen.poisoned(*shape, dtype=BF16)
        if p.get("mega_moe_block_m"):
            bm = p["mega_moe_block_m"]
            rows = ceil_div(p["tokens"], bm) * align(bm, 128) + p["mega_rows_pad"]
            kwargs["mega_moe_sf"] = gen.poisoned(p["hidden"] // 128, rows, dtype=torch.int32).T[: p["tokens"]]
            kwargs["mega_moe_block_m"] = bm
        call = Call((x, weight, p["eps"], fmt, group), {**kwargs, "with_rstd": p["with_rstd"]})
        if p["quantized"]:
            call.trims = sf_trims(["ret[0][1]"], groups, p["sf"] == "ue8m0")
        return call

    return assemble("quant.norm_forward_and_per_token_cast", rng, config, call, make)


# ---- swiglu_forward / swiglu_forward_and_per_token_cast

SWIGLU_HIDDEN = (768, 1536, 2048, 4096, 6144, 12288, 14336, 18432)


def _swiglu_static(rng) -> dict:
    c = {"dtype": rng.choice(["bfloat16", "bfloat16", "float32"]), "experts": rng.choice([0, 0, 1, 3, 8])}
    c["weights"] = rng.random() < 0.6
    c["scaling"] = c["weights"] and rng.random() < 0.5
    c["clamp"] = rng.choice([None, None, 0.0, 3.0, 7.5])
    c["count"] = c["clamp"] is not None and rng.random() < 0.6
    return c


def swiglu_call(rng, config, tokens) -> dict:
    c = {}
    if config["experts"]:
        c["psum"] = tuple(psum_layout(rng, tokens, config["experts"]))
    if config["scaling"]:
        c["routed_scaling_factor"] = rng.choice([0.5, 2.5])
    return c


def swiglu_options(gen: Gen, p: dict) -> dict:
    """The keyword arguments of a SwiGLU call (forward or backward) that its parameters ask for."""
    kwargs = {}
    if p["experts"]:
        kwargs["psum_num_tokens_per_expert"] = gen.tensor(list(p["psum"]), torch.int32)
    if p["weights"]:
        kwargs["topk_weights"] = gen.rand(p["tokens"])
    if p["scaling"]:
        kwargs["routed_scaling_factor"] = p["routed_scaling_factor"]
    if p["clamp"] is not None:
        kwargs["clamp_value"] = p["clamp"]
    return kwargs


def _swiglu_inputs(gen: Gen, p: dict):
    x = gen.activations(p["tokens"], 2 * p["hidden"], dtype=getattr(torch, p["dtype"])) * 4
    kwargs = swiglu_options(gen, p)
    if p["count"]:
        kwargs["clamped_count"] = gen.randint(0, 100, 4)
    rows = gen.tensor(psum_rows(p["tokens"], list(p["psum"])), torch.bool) if p["experts"] else None
    return x, kwargs, rows


def swiglu_forward_cases(rng) -> list[Case]:
    def config(rng):
        return {"hidden": pick_size(rng, 64, 16384, SWIGLU_HIDDEN), "fmt": rng.choice(["bf16", "fp32"]), **_swiglu_static(rng)}

    def make(gen, p):
        x, kwargs, rows = _swiglu_inputs(gen, p)
        return Call((x, p["fmt"]), kwargs, trims={"ret": rows_only(rows)} if rows is not None else {})

    return assemble("quant.swiglu_forward", rng, config, swiglu_call, make)


def swiglu_cast_cases(rng) -> list[Case]:
    def config(rng):
        fmt, group = rng.choice([("e4m3", 128), ("e4m3", 128), ("e4m3", 32), ("bf16", None), ("fp32", None)])
        # 128-channel groups need 4-element vectors per lane: hidden a multiple of 128
        c = {"hidden": pick_size(rng, 128 if group == 128 else 64, 16384, SWIGLU_HIDDEN), "fmt": fmt, "group": group}
        if group:
            c["sf"] = rng.choice(["fp32", "pow2", "ue8m0"])
            c["col_major"] = rng.random() < 0.4
        return {**c, **_swiglu_static(rng)}

    def make(gen, p):
        x, kwargs, rows = _swiglu_inputs(gen, p)
        call = Call((x, p["fmt"], p["group"]), kwargs)
        if not p["group"]:
            call.trims = {"ret": rows_only(rows)} if rows is not None else {}
            return call
        call.kwargs.update(sf_flags(p["sf"], p["col_major"]))
        groups = p["hidden"] // p["group"]
        packed = first_bytes(groups) if p["sf"] == "ue8m0" and groups % PACK else None
        if rows is not None:
            call.trims = {"ret[0]": rows_only(rows), "ret[1]": rows_only(rows, packed)}
        elif packed:
            call.trims = {"ret[1]": packed}
        return call

    return assemble("quant.swiglu_forward_and_per_token_cast", rng, config, swiglu_call, make)


# ---- the casts live in tests/parity_cast_cases.py; MoE routing and rotary here

MOE_EXPERTS = (64, 128, 256)
GATE_OPTIONS = ("mask", "bias", "image", "fixed", "unmapped", "physical", "random", "scores")


def moe_gate_cases(rng, op: str = "moe.moe_topk_gate_forward") -> list[Case]:
    def config(rng):
        experts = pick_size(rng, 4, 512, MOE_EXPERTS)
        use_shared = rng.random() < 0.6
        shared = rng.choice([1, 2]) if use_shared else rng.choice([0, 0, 1])  # ignored unless use_shared_as_routed
        topk = pick(rng, [k for k in range(1, 33) if k <= experts and k + (shared if use_shared else 0) <= 32], (6, 8))
        chosen = {name: rng.random() < 0.4 for name in GATE_OPTIONS}
        chosen["unmapped"] = chosen["unmapped"] or chosen["fixed"]
        return {"experts": experts, "topk": topk, "use_shared": use_shared, "shared": shared, **chosen}

    def call(rng, config, tokens):
        return {
            "scale": rng.choice([1.0, 2.5]),
            "ep_rank": rng.randint(0, 63),
            "out": rng.random() < 0.5,
            "unmapped_pad": rng.choice([0, 3]),
            "duplicates": rng.randint(1, 4),
        }

    def make(gen, p):
        tokens, experts, topk = p["tokens"], p["experts"], p["topk"]
        shared = p["shared"] if p["use_shared"] else 0
        kwargs = {}
        if p["mask"]:
            kwargs["mask"] = gen.bools(tokens, 0.8)
        if p["bias"]:
            kwargs["bias"] = gen.randn(experts) * 0.3
            kwargs["bias"][9::9] = kwargs["bias"][0]
        if p["image"]:
            kwargs["image_bias"] = gen.randn(experts) * 0.3
            kwargs["image_token_mask"] = gen.bools(tokens, 0.5)
        if p["unmapped"]:
            base = gen.poisoned(tokens, topk + p["unmapped_pad"], dtype=torch.int64)
            if p["fixed"]:  # the fixed routes are read from it: distinct experts of each token
                base[:, :topk] = gen.rand(tokens, experts).argsort(dim=1)[:, :topk]
                kwargs["fix_routing_mask"] = gen.bools(tokens, 0.4)
            kwargs["unmapped_topk_idx"] = base[:, :topk]
        if p["physical"]:
            logical = experts + shared
            kwargs["to_physical_map"] = gen.randint(0, 4 * logical, logical, p["duplicates"], dtype=torch.int32)
            kwargs["logical_count"] = gen.randint(1, p["duplicates"] + 1, logical, dtype=torch.int32)
        if p["random"]:
            kwargs["force_random"] = gen.bools(tokens, 0.3)
        if p["out"]:
            kwargs["out"] = (gen.poisoned(tokens, topk + shared, dtype=torch.int64), gen.poisoned(tokens, topk + shared, dtype=F32))
        if p["scores"]:
            kwargs["scores"] = gen.poisoned(tokens, experts, dtype=F32)
        logits = gen.logits(tokens, experts)
        return Call((logits, topk, p["use_shared"], p["shared"], p["scale"], p["ep_rank"]), kwargs)

    return assemble(op, rng, config, call, make)


def topk_gate_cases(rng) -> list[Case]:
    def config(rng):
        experts = pick_size(rng, 1, 512, (8, *MOE_EXPERTS))
        return {"experts": experts, "topk": pick(rng, range(1, min(32, experts) + 1), (1, 4, 6, 8))}

    def make(gen, p):
        scores = gen.randint(-20, 20, p["tokens"], p["experts"]).float() / 4  # many exact ties
        return Call((scores, p["topk"]), {})

    return assemble("moe.topk_gate", rng, config, no_call_options, make)


def normalize_weight_cases(rng) -> list[Case]:
    def make(gen, p):
        weights = gen.rand(p["tokens"], p["topk"]) * 3
        weights[0] = 0  # a row summing to nothing
        return Call((weights,), {})

    return assemble("moe.normalize_weight", rng, lambda rng: {"topk": pick(rng, range(1, 33), (6, 8, 9))}, no_call_options, make)


ROTARY_HEADS = (1, 8, 16, 32, 64, 128)


def apply_rotary_cases(rng) -> list[Case]:
    def config(rng):
        return {
            "dtype": rng.choice(["bfloat16", "float32"]),
            "rot_dim": rng.choice([64, 128]),
            "heads": pick_size(rng, 1, 128, ROTARY_HEADS),
            "key_heads": rng.choice([None, 1, 2, 8]),
            "positions": rng.choice([None, "int32", "int64"]),
            "interleaved": rng.random() < 0.5,
            "conjugate": rng.random() < 0.3,
            "four_d": rng.choice([None, "batch 1", "batch > 1"]),
            "head_pad": rng.choice([0, 0, 64]),  # rotate the tail of a wider head
            "cache_pad": rng.choice([0, 0, 32]),  # a cos/sin cache view of wider rows
        }

    def call(rng, config, tokens):
        return {"batch": rng.randint(2, 3) if config["four_d"] == "batch > 1" else 1, "seqlen_offset": rng.choice([0, 5])}

    def make(gen, p):
        dtype, rot = getattr(torch, p["dtype"]), p["rot_dim"]
        lead = (p["batch"], p["tokens"]) if p["four_d"] else (p["tokens"],)

        def heads(n):
            return gen.randn(*lead, n, rot + p["head_pad"], dtype=dtype)[..., p["head_pad"] :]

        rows = max(p["tokens"], 64) + p["seqlen_offset"] + 5
        cache = (gen.rand(rows, rot + p["cache_pad"]) * 2 - 1)[:, :rot]
        kwargs = {"interleaved": p["interleaved"], "conjugate": p["conjugate"], "seqlen_offset": p["seqlen_offset"]}
        if p["key_heads"]:
            kwargs["key"] = heads(p["key_heads"])
        if p["positions"]:
            kwargs["positions"] = gen.randint(0, rows - p["seqlen_offset"], *lead, dtype=getattr(torch, p["positions"]))
        return Call((heads(p["heads"]), cache), kwargs)

    return assemble("transform.apply_rotary", rng, config, call, make)


# ---- Engram (tkaot.engram)

ENGRAM_HIDDEN = (2048, 4096, 5120, 7168)  # the default list's sizes TileKernels' gate takes (multiples of 256, >= 512)
SINKHORN_HEAD_DIMS = (256, 5120)  # TileKernels' tests' (the head_dims tkaot builds)


def _engram_gate_data(gen: Gen, p: dict, hc: int):
    x = gen.activations(p["tokens"], hc, p["hidden"])
    kv = gen.activations(p["tokens"], hc + 1, p["hidden"])
    wh, we = gen.randn(hc, p["hidden"], dtype=BF16), gen.randn(hc, p["hidden"], dtype=BF16)
    mask = gen.bools(p["tokens"], 0.3) if p["mask"] else None
    return x, kv, wh, we, mask


def engram_hash_cases(rng) -> list[Case]:  # 3-grams: the order the default set builds (TileKernels tests)
    def config(rng):
        return {"ngram": 3, "layers": rng.randint(1, 3), "tables": pick(rng, range(1, 9), (8,)),
                "mask": rng.random() < 0.4}  # fmt: skip

    def make(gen, p):
        ids = gen.randint(0, 2**31 - 1, p["tokens"], p["ngram"], dtype=torch.int32)
        mult = gen.randint(-(2**40), 2**40, p["layers"], p["ngram"])
        vocab = gen.randint(1000, 500000, p["layers"], p["ngram"] - 1, p["tables"], dtype=torch.int32)
        offsets = torch.cumsum(vocab.reshape(p["layers"], -1), dim=1, dtype=torch.int32) - vocab.reshape(p["layers"], -1)
        mask = gen.bools(p["tokens"], 0.3) if p["mask"] else None
        return Call((ids, mult, vocab, offsets.contiguous(), mask), {})

    return assemble("engram.engram_hash", rng, config, no_call_options, make)


def engram_fused_weight_cases(rng) -> list[Case]:
    def config(rng):
        return {"hc": pick(rng, range(1, 9), (4,)), "hidden": pick_size(rng, 256, 16384, ENGRAM_HIDDEN)}

    def make(gen, p):  # no token dimension: the token count only varies the seed
        return Call((gen.randn(p["hc"], p["hidden"], dtype=BF16), gen.randn(p["hc"], p["hidden"], dtype=BF16)), {})

    return assemble("engram.fused_weight", rng, config, no_call_options, make)


def engram_gate_fwd_cases(rng) -> list[Case]:
    def config(rng):
        save = rng.random() < 0.5
        return {"hidden": max(512, pick_size(rng, 256, 16384, ENGRAM_HIDDEN)), "hc": pick(rng, range(1, 9), (4,)), "save": save,
                "mask": rng.random() < 0.4, "inplace": not save and rng.random() < 0.5, "eps": rng.choice([1e-20, 1e-6]),
                "clamp": rng.choice([1e-6, 0.05])}  # fmt: skip

    def make(gen, p):
        x, kv, wh, we, mask = _engram_gate_data(gen, p, p["hc"])
        fused = wh.float() * we.float()
        call = Call((x, kv, fused, p["eps"], p["clamp"], p["save"], mask, p["inplace"]), {})
        if mask is not None and p["save"]:  # TileKernels leaves the saved values of image tokens unwritten
            call.trims = {f"ret[{i}]": rows_only(~mask) for i in range(1, 5)}
        return call

    return assemble("engram.engram_gate_fwd", rng, config, no_call_options, make)


def engram_gate_bwd_cases(rng) -> list[Case]:
    def config(rng):
        return {"hidden": max(512, pick_size(rng, 256, 16384, ENGRAM_HIDDEN)), "mask": rng.random() < 0.4,
                "clamp": rng.choice([1e-6, 0.05])}  # fmt: skip

    def make(gen, p):
        from tkaot.reference import engram

        x, kv, wh, we, mask = _engram_gate_data(gen, p, 4)
        fused = wh.float() * we.float()
        _, dot, gate, rx, rk = engram.engram_gate_fwd(x, kv, fused, 1e-20, p["clamp"], True, mask)
        grad_out = gen.randn(p["tokens"], 4, p["hidden"], dtype=BF16)
        return Call((grad_out, x, kv, fused, dot, gate, rx, rk, p["clamp"], mask), {})

    return assemble("engram.engram_gate_bwd", rng, config, no_call_options, make)


def engram_grad_w_reduce_cases(rng) -> list[Case]:
    def config(rng):
        return {"partials": rng.choice([132, 113, 64, 8]), "hc": 4, "hidden": pick_size(rng, 256, 16384, ENGRAM_HIDDEN)}

    def make(gen, p):
        shape = (p["hc"], p["hidden"])
        partial = gen.randn(p["partials"], *shape)
        return Call((partial, gen.randn(*shape, dtype=BF16), gen.randn(*shape, dtype=BF16), gen.randn(*shape), gen.randn(*shape)), {})

    return assemble("engram.grad_w_reduce", rng, config, no_call_options, make)


def engram_momentum_cases(rng) -> list[Case]:
    def config(rng):
        return {"grad": rng.choice(["bfloat16", "float32"]), "momentum": rng.choice(["bfloat16", "float32"]),
                "nesterov": rng.random() < 0.5, "beta1": rng.choice([0.9, 0.95, 0.99])}  # fmt: skip

    def make(gen, p):  # tokens * 256 elements
        numel = p["tokens"] * 256
        grad, momentum = gen.randn(numel, dtype=getattr(torch, p["grad"])), gen.randn(numel, dtype=getattr(torch, p["momentum"]))
        return Call((grad, momentum, p["beta1"], p["nesterov"]), {})

    return assemble("engram.engram_sinkhorn_momentum_update", rng, config, no_call_options, make)


def _sinkhorn_matrix(gen: Gen, p: dict):
    matrix = gen.randn(p["tokens"], p["head_dim"])
    return matrix, gen.rand(p["tokens"]) + 0.5, gen.rand(p["head_dim"]) + 0.5


def engram_sinkhorn_step_cases(rng) -> list[Case]:
    def make(gen, p):  # tokens: the matrix's rows
        return Call((*_sinkhorn_matrix(gen, p), 1e-20), {})

    return assemble("engram.engram_sinkhorn_step", rng, lambda rng: {"head_dim": rng.choice(SINKHORN_HEAD_DIMS)}, no_call_options, make)


def engram_sinkhorn_step_reduce_cases(rng) -> list[Case]:
    def config(rng):
        return {"partials": rng.choice([396, 339, 3]), "head_dim": pick_size(rng, 256, 8192, SINKHORN_HEAD_DIMS)}

    def make(gen, p):  # no token dimension: the token count only varies the seed
        return Call((gen.rand(p["partials"], p["head_dim"]), gen.poisoned(p["head_dim"], dtype=F32)), {})

    return assemble("engram.engram_sinkhorn_step_reduce", rng, config, no_call_options, make)


def engram_sinkhorn_finalize_cases(rng) -> list[Case]:
    def call(rng, config, tokens):
        return {"out": rng.random() < 0.5}

    def make(gen, p):  # tokens: the matrix's rows
        kwargs = {"out": gen.poisoned(p["tokens"], p["head_dim"], dtype=F32)} if p["out"] else {}
        return Call((*_sinkhorn_matrix(gen, p), 1e-20, p["head_dim"] ** 0.5), kwargs)

    return assemble("engram.engram_sinkhorn_finalize", rng, lambda rng: {"head_dim": rng.choice(SINKHORN_HEAD_DIMS)}, call, make)


# ---- the registry


def _generators() -> dict[str, Callable[[random.Random], list[Case]]]:
    from tests import parity_backward_cases as backward
    from tests import parity_cast_cases as casts
    from tests import parity_mhc_cases as mhc
    from tests import parity_mhc_fused_cases as mhc_fused

    return {
        "quant.norm_forward": norm_forward_cases,
        "quant.norm_forward_and_per_token_cast": norm_cast_cases,
        "quant.swiglu_forward": swiglu_forward_cases,
        "quant.swiglu_forward_and_per_token_cast": swiglu_cast_cases,
        "quant.per_token_cast": casts.per_token_cast_cases,
        "quant.per_token_cast_with_sf_only": casts.per_token_sf_only_cases,
        "quant.per_token_cast_with_precomputed_sf": casts.per_token_precomputed_cases,
        "quant.per_token_cast_back": casts.per_token_cast_back_cases,
        "quant.cast_back": casts.cast_back_cases,
        "quant.per_token_cast_and_cast_back": casts.per_token_round_trip_cases,
        "quant.per_block_cast": casts.per_block_cast_cases,
        "quant.per_block_cast_with_sf_only": casts.per_block_sf_only_cases,
        "quant.per_block_cast_with_precomputed_sf": casts.per_block_precomputed_cases,
        "quant.per_block_cast_lossless": casts.lossless_cases,
        "quant.per_channel_cast": casts.per_channel_cases,
        "quant.batched_transpose_weight_sf": casts.transpose_weight_sf_cases,
        "quant.cast": casts.cast_cases,
        "quant.unpack_from_e2m1fn_x2": casts.unpack_e2m1_cases,
        "moe.moe_topk_gate_forward": moe_gate_cases,
        "moe.moe_topk_gate": lambda rng: moe_gate_cases(rng, "moe.moe_topk_gate"),
        "moe.topk_gate": topk_gate_cases,
        "moe.normalize_weight": normalize_weight_cases,
        "transform.apply_rotary": apply_rotary_cases,
        "mhc.expand_to_mhc_fwd": mhc.expand_fwd_cases,
        "mhc.expand_to_mhc_bwd": mhc.expand_bwd_cases,
        "mhc.mhc_pre_apply_mix_fwd": mhc.pre_apply_mix_fwd_cases,
        "mhc.mhc_pre_apply_mix_bwd": mhc.pre_apply_mix_bwd_cases,
        "mhc.mhc_pre_split_mixes_fwd": mhc.split_fwd_cases,
        "mhc.mhc_pre_split_mixes_bwd": mhc.split_bwd_cases,
        "mhc.mhc_sinkhorn_fwd": mhc.sinkhorn_fwd_cases,
        "mhc.mhc_sinkhorn_bwd": mhc.sinkhorn_bwd_cases,
        "mhc.mhc_post_fwd": mhc.post_fwd_cases,
        "mhc.mhc_post_bwd": mhc.post_bwd_cases,
        "mhc.mhc_head_compute_mix_fwd": mhc_fused.head_mix_fwd_cases,
        "mhc.mhc_head_compute_mix_bwd": mhc_fused.head_mix_bwd_cases,
        "mhc.mhc_fn_normw_merge_fwd": mhc_fused.normw_merge_fwd_cases,
        "mhc.mhc_fn_normw_merge_bwd": mhc_fused.normw_merge_bwd_cases,
        "mhc.mhc_reduce_partials_and_rmsnorm_fwd": mhc_fused.reduce_fwd_cases,
        "mhc.mhc_reduce_partials_and_rmsnorm_bwd": mhc_fused.reduce_bwd_cases,
        "mhc.mhc_pre_big_fuse_fwd": mhc_fused.pre_big_fuse_cases,
        "mhc.mhc_multilayer_recompute": mhc_fused.multilayer_recompute_cases,
        "engram.engram_hash": engram_hash_cases,
        "engram.fused_weight": engram_fused_weight_cases,
        "engram.engram_gate_fwd": engram_gate_fwd_cases,
        "engram.engram_gate_bwd": engram_gate_bwd_cases,
        "engram.grad_w_reduce": engram_grad_w_reduce_cases,
        "engram.engram_sinkhorn_momentum_update": engram_momentum_cases,
        "engram.engram_sinkhorn_step": engram_sinkhorn_step_cases,
        "engram.engram_sinkhorn_step_reduce": engram_sinkhorn_step_reduce_cases,
        "engram.engram_sinkhorn_finalize": engram_sinkhorn_finalize_cases,
        "quant.norm_backward": backward.norm_backward_cases,
        "quant.swiglu_backward": backward.swiglu_backward_cases,
        "quant.swiglu_backward_and_per_token_cast": backward.swiglu_backward_cast_cases,
        "moe.moe_topk_gate_backward": backward.moe_gate_backward_cases,
    }


def ops() -> list[str]:
    return list(_generators())


def cases(op: str) -> list[Case]:
    """The op's cases: the same on every machine for one TKAOT_PARITY_SEED / _CASES / _CONFIGS."""
    rng = random.Random(zlib.crc32(op.encode()) ^ SEED)
    return _generators()[op](rng)


def resolve(module, op: str):
    """The function `op` ("quant.per_token_cast") names in a library module (tkaot or tile_kernels)."""
    family, name = op.split(".")
    return getattr(getattr(module, family), name)
