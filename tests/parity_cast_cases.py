"""Parity cases of tkaot.quant's casts (see tests/parity_cases.py for what a case is and how sizes are drawn).

Per-token casts draw bf16/fp32 inputs (rows strided or not) and quantized ones: E4M3 or E2M1 data with fp32, E4M3 or
packed UE8M0 scale factors, row- or column-major, of 1 x 16 ... 128 x 128 blocks. Outputs draw E4M3 and E2M1, 16 to
128 channels a group, every sf kind (fp32, powers of two, packed UE8M0, E4M3) and layout, out= buffers. Per-block and
per-channel casts, and the lossless FP4 -> FP8 recast, take multiples of 128 tokens only (TileKernels asserts it).
"""

from __future__ import annotations

import torch

from tests.parity_cases import (
    BLOCK_TOKENS,
    STOCHASTIC,
    Call,
    assemble,
    first_packed_rows,
    no_call_options,
    out_sf_buffer,
    pick,
    pick_size,
    quantized_input,
    sf_flags,
    sf_trims,
)
from tests.parity_inputs import E4M3, F32, PACK, ceil_div

CAST_HIDDEN = (512, 768, 1536, 2048, 4096, 5120, 7168, 8192, 14336, 18432)
GROUPS = (16, 32, 64, 128)
IN_BLOCKS = ((1, 16), (1, 32), (1, 64), (1, 128), (32, 32), (32, 128), (128, 128))
IN_SF = ("fp32", "e4m3", "ue8m0")


def _cast_hidden(rng, *blocks: int) -> int:
    """A hidden size TileKernels' per-token casts take (a multiple of 64) holding whole groups of every block size."""
    return pick_size(rng, max(64, *blocks), 16384, CAST_HIDDEN)


def _out_kind(rng, e4m3_ok: bool = True) -> str:
    return rng.choice(["fp32", "pow2", "ue8m0", "e4m3"] if e4m3_ok else ["fp32", "pow2", "ue8m0"])


def _fmt_dtype(fmt: str):
    return E4M3 if fmt == "e4m3" else torch.int8


def _out_cols(fmt: str, hidden: int) -> int:
    return hidden // 2 if fmt == "e2m1" else hidden


def _input_config(rng, quantized_ok: bool = True) -> dict:
    if quantized_ok and rng.random() < 0.35:
        block = pick(rng, IN_BLOCKS, ((1, 32), (1, 128), (128, 128)))
        return {"in": rng.choice(["e4m3", "e2m1"]), "in_block": block, "in_sf": rng.choice(IN_SF), "in_col": rng.random() < 0.3}
    return {"in": rng.choice(["bfloat16", "float32"]), "row_pad": rng.choice([0, 0, 64])}


def _input(gen, p: dict):
    """x (bf16/fp32, rows maybe strided; or a quantized (data, sf) pair) and x_block_size."""
    if p["in"] in ("e4m3", "e2m1"):
        return quantized_input(gen, p["tokens"], p["hidden"], p["in"], p["in_block"], p["in_sf"], p["in_col"]), p["in_block"]
    dtype = getattr(torch, p["in"])
    return gen.activations(p["tokens"], p["hidden"], dtype=dtype, row_pitch=p["hidden"] + p.get("row_pad", 0)), None


# ---- per-token casts


def per_token_cast_cases(rng):
    def config(rng):
        c = {"fmt": rng.choice(["e4m3", "e2m1"]), "group": rng.choice(GROUPS), **_input_config(rng)}
        c["hidden"] = _cast_hidden(rng, c["group"], c.get("in_block", (1, 1))[1])
        c["partial_group"] = c["in"] in ("bfloat16", "float32") and c["group"] == 128 and rng.random() < 0.2
        if c["partial_group"]:
            c["hidden"] = 64 * (2 * rng.randint(1, 8) + 1)  # a last group of 64 channels: TileKernels takes it
        c["sf"] = _out_kind(rng)
        c["col_major"] = rng.random() < 0.3
        c["stochastic_cast"] = rng.random() < 0.2
        return c

    def call(rng, config, tokens):
        return {"out": rng.choice(["none", "none", "data", "data+sf"] if not config["col_major"] else ["none", "data"])}

    def make(gen, p):
        x, block = _input(gen, p)
        groups = ceil_div(p["hidden"], p["group"])
        kwargs = {**sf_flags(p["sf"], p["col_major"]), "stochastic_cast": p["stochastic_cast"]}
        if p["out"] != "none":
            data = gen.poisoned(p["tokens"], _out_cols(p["fmt"], p["hidden"]), dtype=_fmt_dtype(p["fmt"]))
            kwargs["out"] = (data, out_sf_buffer(gen, p["tokens"], groups, p["sf"]) if p["out"] == "data+sf" else None)
        call = Call((x, p["fmt"], p["group"], block), kwargs, trims=sf_trims(["ret[1]"], groups, p["sf"] == "ue8m0"))
        if p["stochastic_cast"]:
            call.adjacent = {"ret[0]": p["fmt"]}
        return call

    return assemble("quant.per_token_cast", rng, config, call, make, tolerance=lambda p: STOCHASTIC if p["stochastic_cast"] else None)


def per_token_sf_only_cases(rng):
    def config(rng):
        c = {"fmt": rng.choice(["e4m3", "e2m1"]), "group": rng.choice(GROUPS)}
        c["hidden"] = _cast_hidden(rng, c["group"])
        c.update(_input_config(rng, quantized_ok=False), sf=_out_kind(rng), col_major=rng.random() < 0.3)
        return c

    def call(rng, config, tokens):
        return {"out_sf": not config["col_major"] and rng.random() < 0.5}

    def make(gen, p):
        x, _ = _input(gen, p)
        groups = ceil_div(p["hidden"], p["group"])
        kwargs = sf_flags(p["sf"], p["col_major"])
        if p["out_sf"]:
            kwargs["out_sf"] = out_sf_buffer(gen, p["tokens"], groups, p["sf"])
        return Call((x, p["fmt"], p["group"]), kwargs, trims=sf_trims(["ret"], groups, p["sf"] == "ue8m0"))

    return assemble("quant.per_token_cast_with_sf_only", rng, config, call, make)


def _unpacked_sf_config(rng):
    """A bf16/fp32 per-token cast keeping an unpacked, row-major sf (precomputed sf, the round trip)."""
    c = {"fmt": rng.choice(["e4m3", "e2m1"]), "group": rng.choice(GROUPS)}
    c["hidden"] = _cast_hidden(rng, c["group"])
    c.update(_input_config(rng, quantized_ok=False), sf=rng.choice(["fp32", "pow2", "e4m3"]))
    return c


def per_token_precomputed_cases(rng):
    def call(rng, config, tokens):
        return {"out": rng.random() < 0.5}

    def make(gen, p):
        x, _ = _input(gen, p)
        values = gen.sf_values(p["tokens"], ceil_div(p["hidden"], p["group"]), p["sf"])
        sf = values.to(E4M3) if p["sf"] == "e4m3" else values
        kwargs = dict(sf_flags(p["sf"], False))
        if p["out"]:
            kwargs["out"] = gen.poisoned(p["tokens"], _out_cols(p["fmt"], p["hidden"]), dtype=_fmt_dtype(p["fmt"]))
        return Call((x, p["fmt"], p["group"], sf), kwargs)

    return assemble("quant.per_token_cast_with_precomputed_sf", rng, _unpacked_sf_config, call, make)


def _cast_back_config(rng, blocks) -> dict:
    block = rng.choice(blocks)
    c = {"hidden": _cast_hidden(rng, block[1]), "in": rng.choice(["e4m3", "e2m1"]), "in_block": block}
    if block[1] == 1:  # per-channel blocks (per_channel_cast's output): E4M3, row-major sf only
        c.update({"in": "e4m3", "in_sf": rng.choice(["fp32", "ue8m0"]), "in_col": False})
    else:
        c.update({"in_sf": rng.choice(IN_SF), "in_col": rng.random() < 0.3})
    c["out_fmt"] = rng.choice(["bf16", "fp32"])
    return c


def per_token_cast_back_cases(rng):
    def make(gen, p):
        x = quantized_input(gen, p["tokens"], p["hidden"], p["in"], p["in_block"], p["in_sf"], p["in_col"])
        return Call((x, p["out_fmt"], p["in_block"][1]), {})

    blocks = tuple((1, g) for g in GROUPS)
    return assemble("quant.per_token_cast_back", rng, lambda rng: _cast_back_config(rng, blocks), no_call_options, make)


def cast_back_cases(rng):
    def make(gen, p):
        x = quantized_input(gen, p["tokens"], p["hidden"], p["in"], p["in_block"], p["in_sf"], p["in_col"])
        return Call((x, p["out_fmt"], p["in_block"]), {})

    blocks = (*IN_BLOCKS, (32, 1), (128, 1))
    return assemble("quant.cast_back", rng, lambda rng: _cast_back_config(rng, blocks), no_call_options, make)


def per_token_round_trip_cases(rng):
    def make(gen, p):
        x, _ = _input(gen, p)
        return Call((x, p["fmt"], p["group"]), {"round_sf": p["sf"] == "pow2", "use_e4m3_sf": p["sf"] == "e4m3"})

    return assemble("quant.per_token_cast_and_cast_back", rng, _unpacked_sf_config, no_call_options, make)


# ---- per-block and per-channel casts, lossless recast, weight sf transpose


def _block_config(rng, kinds=("fp32", "pow2", "ue8m0"), col_ok=True) -> dict:
    return {
        "hidden": pick_size(rng, 128, 16384, CAST_HIDDEN),
        "in": rng.choice(["bfloat16", "float32"]),
        "fmt": rng.choice(["e4m3", "e2m1"]),
        "block": (rng.choice([32, 128]), rng.choice([32, 128])),
        "sf": rng.choice(kinds),
        "col_major": col_ok and rng.random() < 0.3,
    }


def _block_input(gen, p):
    return gen.activations(p["tokens"], p["hidden"], dtype=getattr(torch, p["in"]))


def per_block_cast_cases(rng):
    def call(rng, config, tokens):
        return {"out": rng.choice(["none", "data", "data+sf"] if not config["col_major"] else ["none", "data"])}

    def make(gen, p):
        rows, groups = ceil_div(p["tokens"], p["block"][0]), ceil_div(p["hidden"], p["block"][1])
        kwargs = sf_flags(p["sf"], p["col_major"])
        if p["out"] != "none":
            data = gen.poisoned(p["tokens"], _out_cols(p["fmt"], p["hidden"]), dtype=_fmt_dtype(p["fmt"]))
            kwargs["out"] = (data, out_sf_buffer(gen, rows, groups, p["sf"]) if p["out"] == "data+sf" else None)
        x = _block_input(gen, p)
        return Call((x, p["fmt"], p["block"]), kwargs, trims=sf_trims(["ret[1]"], groups, p["sf"] == "ue8m0"))

    return assemble("quant.per_block_cast", rng, _block_config, call, make, fixed=BLOCK_TOKENS, multiple=128)


def per_block_sf_only_cases(rng):
    def call(rng, config, tokens):
        return {"out_sf": not config["col_major"] and rng.random() < 0.5}

    def make(gen, p):
        rows, groups = ceil_div(p["tokens"], p["block"][0]), ceil_div(p["hidden"], p["block"][1])
        kwargs = sf_flags(p["sf"], p["col_major"])
        if p["out_sf"]:
            kwargs["out_sf"] = out_sf_buffer(gen, rows, groups, p["sf"])
        x = _block_input(gen, p)
        return Call((x, p["fmt"], p["block"]), kwargs, trims=sf_trims(["ret"], groups, p["sf"] == "ue8m0"))

    return assemble("quant.per_block_cast_with_sf_only", rng, _block_config, call, make, fixed=BLOCK_TOKENS, multiple=128)


def per_block_precomputed_cases(rng):
    def call(rng, config, tokens):
        return {"out": rng.random() < 0.5}

    def make(gen, p):
        x = _block_input(gen, p)
        sf = gen.sf_values(ceil_div(p["tokens"], p["block"][0]), ceil_div(p["hidden"], p["block"][1]), p["sf"])
        kwargs = sf_flags(p["sf"], False)
        if p["out"]:
            kwargs["out"] = gen.poisoned(p["tokens"], _out_cols(p["fmt"], p["hidden"]), dtype=_fmt_dtype(p["fmt"]))
        return Call((x, p["fmt"], p["block"], sf), kwargs)

    def config(rng):
        return _block_config(rng, kinds=("fp32", "pow2"), col_ok=False)

    return assemble("quant.per_block_cast_with_precomputed_sf", rng, config, call, make, fixed=BLOCK_TOKENS, multiple=128)


LOSSLESS_IN = ((1, 16), (1, 32), (1, 128), (32, 32), (128, 128))
LOSSLESS_OUT = ((1, 32), (1, 128), (32, 32), (32, 128), (128, 32), (128, 128))


def lossless_cases(rng):
    def config(rng):
        in_block = pick(rng, LOSSLESS_IN, ((1, 16), (1, 32), (32, 32)))
        outs = [b for b in LOSSLESS_OUT if b[0] % in_block[0] == 0 and b[1] % in_block[1] == 0]
        return {
            "hidden": pick_size(rng, 128, 16384, (512, 1536, 2048, 7168, 16384)),
            "in_block": in_block,
            "in_sf": rng.choice(["fp32", "ue8m0"]),
            "in_col": rng.random() < 0.3,
            "out_block": pick(rng, outs, ((1, 128), (32, 32), (128, 128))),
            "sf": rng.choice(["fp32", "pow2", "ue8m0"]),
            "col_major": rng.random() < 0.3,
        }

    def make(gen, p):
        tokens, hidden, (bm, bk), (om, ok) = p["tokens"], p["hidden"], p["in_block"], p["out_block"]
        data = gen.fp4(tokens, hidden)
        # exponents at most 11 below their output block's largest (TileKernels asserts it); one block's so small
        # that its output exponent clamps at 0
        m, k = ceil_div(tokens, bm), ceil_div(hidden, bk)
        base = gen.randint(12, 240, ceil_div(tokens, om), ceil_div(hidden, ok), dtype=torch.int32)
        base[0, 0] = 5
        per_out = (om // bm, ok // bk)
        exps = base.repeat_interleave(per_out[0], 0).repeat_interleave(per_out[1], 1)[:m, :k]
        exps = (exps - gen.randint(0, 12, m, k, dtype=torch.int32)).clamp(min=0)
        sf = gen.sf_tensor((exps << 23).view(F32), p["in_sf"], p["in_col"])
        groups = ceil_div(hidden, ok)
        call = Call(((data, sf), "e4m3", p["in_block"], p["out_block"]), sf_flags(p["sf"], p["col_major"]))
        call.trims = sf_trims(["ret[1]"], groups, p["sf"] == "ue8m0")
        return call

    return assemble("quant.per_block_cast_lossless", rng, config, no_call_options, make, fixed=BLOCK_TOKENS, multiple=128)


def per_channel_cases(rng):
    def config(rng):
        c = {"hidden": pick_size(rng, 128, 16384, CAST_HIDDEN), "block_m": rng.choice([32, 128])}
        c["sf"] = rng.choice(["fp32", "pow2", "ue8m0"])
        if rng.random() < 0.4:
            c.update({"in": "e4m3", "in_block": (1, rng.choice([32, 128])), "in_sf": rng.choice(IN_SF), "in_col": rng.random() < 0.3})
        else:
            c["in"] = rng.choice(["bfloat16", "float32"])
        return c

    def make(gen, p):
        x, block = _input(gen, p)
        kwargs = {**sf_flags(p["sf"], False), "num_per_channels": block[1] if block else None}
        call = Call((x, "e4m3", p["block_m"]), kwargs)
        token_blocks = p["tokens"] // p["block_m"]
        if p["sf"] == "ue8m0" and token_blocks % PACK:
            call.trims = {"ret[1]": first_packed_rows(token_blocks)}
        return call

    return assemble("quant.per_channel_cast", rng, config, no_call_options, make, fixed=BLOCK_TOKENS, multiple=128)


def transpose_weight_sf_cases(rng):
    """Weights of n x k (multiples of 128 up to 8192; 1 to 3 groups or none) a call, 1 to 3 weights; the outputs
    allocated or given (poisoned, TileKernels' exact strides). The 'tokens' of a case are its first weight's n."""

    def call(rng, config, tokens):
        weights = []
        for i in range(rng.randint(1, 3)):
            n = tokens if i == 0 else 128 * rng.randint(1, 64)
            weights.append((rng.choice([0, 0, 1, 3]), n, 128 * rng.randint(1, 64), rng.random() < 0.5, rng.random() < 0.5))
        return {"weights": tuple(weights)}  # (groups or 0 for a 2-D sf, n, k, transpose_sf1, out given)

    def make(gen, p):
        bs, sfs, flags, outs = p["block_size"], [], [], []
        for groups, n, k, transpose, given in p["weights"]:
            lead = (groups,) if groups else ()
            exps = gen.randint(-30, 31, *lead, n // bs, k // bs).float()
            sf = torch.exp2(exps)
            sf[..., 0, 0] = 0  # exponent byte 0
            sfs.append(sf)
            flags.append(transpose)
            outs.append(_transpose_outs(gen, lead, n, k, bs, transpose) if given else None)
        return Call((sfs, bs, flags, outs), {})

    def config(rng):
        return {"block_size": rng.choice([32, 128])}

    return assemble("quant.batched_transpose_weight_sf", rng, config, call, make, fixed=BLOCK_TOKENS, multiple=128)


def _transpose_outs(gen, lead, n, k, bs, transpose):
    """Poisoned (sf0_out, sf1_out) in the layout TileKernels asks of given outputs."""
    g = lead[0] if lead else 1
    p0, p1 = ceil_div(k // bs, PACK), ceil_div(n // bs, PACK)
    gs0, gs1 = ((p0 * n,), (p1 * k,)) if lead else ((), ())
    sf0 = gen.poisoned(g * p0 * n, dtype=torch.int32).as_strided((*lead, n, p0), (*gs0, 1, n))
    shape1, strides1 = ((p1, k), (k, 1)) if transpose else ((k, p1), (1, k))
    sf1 = gen.poisoned(g * p1 * k, dtype=torch.int32).as_strided((*lead, *shape1), (*gs1, *strides1))
    return sf0, sf1


# ---- elementwise casts

CAST_DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
STOCHASTIC_PAIRS = (("float32", "bfloat16"), ("float32", "float8_e4m3fn"), ("bfloat16", "float8_e4m3fn"))
LEVELS = {"bfloat16": "bf16", "float8_e4m3fn": "e4m3"}


def cast_cases(rng):
    def config(rng):
        if rng.random() < 0.4:
            src, dst = rng.choice(STOCHASTIC_PAIRS)
            return {"src": src, "dst": dst, "stochastic_rounding": True}
        src = rng.choice(CAST_DTYPES)
        wide = [d for d in CAST_DTYPES if d != src and not (d.startswith("float8") and src.startswith("float8"))]
        return {"src": src, "dst": rng.choice(wide), "stochastic_rounding": False}  # FP8 to FP8: no CUDA conversion

    def call(rng, config, tokens):
        shape = rng.choice(["1-D", "2-D", "3-D"])
        hidden = rng.randint(1, 3000) * (4 if config["stochastic_rounding"] else 1)  # stochastic: numel % 4 == 0
        return {"shape": shape, "hidden": hidden}

    def make(gen, p):
        lead = {"1-D": (), "2-D": (p["tokens"],), "3-D": (2, ceil_div(p["tokens"], 2))}[p["shape"]]
        src = getattr(torch, p["src"])
        if p["src"] == "float8_e4m3fn":
            x = gen.fp8(max(1, _numel(lead)), p["hidden"]).reshape(*lead, p["hidden"])
        else:
            x = gen.activations(max(1, _numel(lead)), p["hidden"], dtype=F32).reshape(*lead, p["hidden"]).to(src)
        call = Call((x, getattr(torch, p["dst"])), {"stochastic_rounding": p["stochastic_rounding"]})
        if p["stochastic_rounding"]:
            call.adjacent = {"ret": LEVELS[p["dst"]]}
        return call

    return assemble("quant.cast", rng, config, call, make, tolerance=lambda p: STOCHASTIC if p["stochastic_rounding"] else None)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def unpack_e2m1_cases(rng):
    def config(rng):
        return {"dtype": rng.choice(["int8", "uint8"]), "out_dtype": rng.choice([None, "float32", "bfloat16", "float16"])}

    def call(rng, config, tokens):
        return {"shape": rng.choice(["1-D", "2-D", "3-D"]), "hidden": rng.randint(1, 4096)}

    def make(gen, p):
        lead = {"1-D": (), "2-D": (p["tokens"],), "3-D": (2, ceil_div(p["tokens"], 2))}[p["shape"]]
        x = gen.fp4(max(1, _numel(lead)), 2 * p["hidden"]).reshape(*lead, p["hidden"]).view(getattr(torch, p["dtype"]))
        kwargs = {"out_dtype": getattr(torch, p["out_dtype"])} if p["out_dtype"] else {}
        return Call((x,), kwargs)

    return assemble("quant.unpack_from_e2m1fn_x2", rng, config, call, make)
