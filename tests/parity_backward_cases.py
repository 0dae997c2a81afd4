"""Parity cases of the backward ops (tests/parity_cases.py's conventions): norm_backward, swiglu_backward,
swiglu_backward_and_per_token_cast, moe_topk_gate_backward.

What is compared byte for byte: SwiGLU's element-wise results (x_grad, act_out, the E4M3 cast and its scale factors),
which both libraries compute with the same fp32 operations in the same order. Within a tolerance (`Call.close`):
every result either library sums in its own order, as TileKernels itself does in one order per SM count (RMSNorm's
x_grad through the row's dot product and weight_grad over tokens, SwiGLU's weight_grad over the row, the gate's
gradient, whose repeated experts TileKernels adds with shared-memory atomics).
"""

from __future__ import annotations

import torch

from tests.parity_cases import NORM_HIDDEN, SWIGLU_HIDDEN, Call, assemble, pick, pick_size, sf_trims, swiglu_call, swiglu_options
from tests.parity_inputs import Gen

BF16_SUM = (2**-7, 2**-7)  # a few fp32 ulps of the row's sum can flip one bf16 rounding
# seen on the H200 (first run): fp32 x_grad 3.6e-5 apart at hidden 32 (1 of 108576 values), where a row's mean of
# g * xhat multiplies back by xhat
F32_SUM = (1e-4, 1e-5)
WEIGHT_GRAD = (1e-4, 1e-3)
# a bf16 weight_grad: the fp32 sum over thousands of tokens, 1e-4 apart, can round to neighbouring bf16 values (seen:
# -7.6875 vs -7.65625 over 2768 tokens)
BF16_WEIGHT_GRAD = (2**-7, 1e-3)
SUMS = "x_grad / weight_grad within rtol/atol: both libraries sum rows in their own order"


def norm_backward_cases(rng):
    def config(rng):
        return {
            "hidden": pick_size(rng, 32, 8192, NORM_HIDDEN), "dtype": rng.choice(["bfloat16", "float32"]),
            "weight": rng.random() < 0.8, "residual": rng.random() < 0.5, "given": rng.random() < 0.3,
            "out_scale": rng.choice([1.0, 0.5, 2.5]),
        }  # fmt: skip

    def call(rng, config, tokens):
        return {"wg_dtype": rng.choice(["bfloat16", "float32"])} if config["given"] and config["weight"] else {}

    def make(gen: Gen, p):
        dtype = getattr(torch, p["dtype"])
        t, h = p["tokens"], p["hidden"]
        x = gen.activations(t, h, dtype=dtype)
        rstd = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
        kwargs = {"out_scale": p["out_scale"]}
        if p["residual"]:
            kwargs["residual_out_grad"] = gen.randn(t, h, dtype=dtype)
        if "wg_dtype" in p:
            kwargs["weight_grad"] = gen.randn(h, dtype=getattr(torch, p["wg_dtype"]))
        # weight_grad comes back in the given buffer's dtype, else in x's
        wg_dtype = getattr(torch, p["wg_dtype"]) if "wg_dtype" in p else dtype
        wg_close = BF16_WEIGHT_GRAD if wg_dtype is torch.bfloat16 else WEIGHT_GRAD
        close = {"ret[0]": BF16_SUM if dtype is torch.bfloat16 else F32_SUM, "ret[1]": wg_close}
        if "weight_grad" in kwargs:
            close["kw.weight_grad"] = wg_close
        weight = gen.randn(h, dtype=dtype) if p["weight"] else None
        return Call((gen.randn(t, h, dtype=dtype), x, weight, rstd), kwargs, close=close)

    return assemble("quant.norm_backward", rng, config, call, make, tolerance=lambda p: SUMS)


def _swiglu_config(rng) -> dict:
    c = {"hidden": pick_size(rng, 64, 8192, SWIGLU_HIDDEN), "experts": rng.choice([0, 0, 1, 3, 8])}
    c["weights"] = rng.random() < 0.6
    c["scaling"] = c["weights"] and rng.random() < 0.5
    c["clamp"] = rng.choice([None, None, 3.0, 7.5])
    c["recompute"] = rng.random() < 0.5
    return c


def _swiglu_kwargs(gen: Gen, p) -> dict:
    return {"do_recompute": p["recompute"], **swiglu_options(gen, p)}


def _weight_grad_path(p, cast: bool) -> dict:
    return {f"ret[{2 if cast else 1}]": WEIGHT_GRAD} if p["weights"] else {}


def swiglu_backward_cases(rng):
    def config(rng):
        return {**_swiglu_config(rng), "dtype": rng.choice(["bfloat16", "bfloat16", "float32"]), "fmt": rng.choice(["bf16", "fp32"])}

    def make(gen: Gen, p):
        dtype = getattr(torch, p["dtype"])
        x = gen.activations(p["tokens"], 2 * p["hidden"], dtype=dtype) * 4
        dy = gen.randn(p["tokens"], p["hidden"], dtype=dtype)
        return Call((x, dy, p["fmt"]), _swiglu_kwargs(gen, p), close=_weight_grad_path(p, False))

    return assemble("quant.swiglu_backward", rng, config, swiglu_call, make, tolerance=lambda p: SUMS if p["weights"] else None)


def swiglu_backward_cast_cases(rng):
    def config(rng):
        c = {**_swiglu_config(rng), "group": rng.choice([32, 128]), "grad": rng.choice(["bfloat16", "float32"])}
        c["sf"] = pick(rng, ["fp32", "pow2", "ue8m0"], ("ue8m0",))
        c["col_major"] = rng.random() < 0.5
        if c["hidden"] % c["group"]:
            c["hidden"] = max(c["group"], c["hidden"] // c["group"] * c["group"])
        return c

    def make(gen: Gen, p):
        t, h, group = p["tokens"], p["hidden"], p["group"]
        data = gen.fp8(t, 2 * h)
        sf = gen.sf_values(t, 2 * h // group, "fp32")
        dy = gen.randn(t, h, dtype=getattr(torch, p["grad"]))
        kwargs = _swiglu_kwargs(gen, p)
        kwargs.update(use_tma_aligned_col_major_sf=p["col_major"], round_sf=p["sf"] != "fp32", use_packed_ue8m0=p["sf"] == "ue8m0")
        trims = sf_trims(["ret[1][1]"], 2 * h // group, p["sf"] == "ue8m0")
        return Call(((data, sf), dy, "e4m3", group), kwargs, trims=trims, close=_weight_grad_path(p, True))

    return assemble("quant.swiglu_backward_and_per_token_cast", rng, config, swiglu_call, make,
                    tolerance=lambda p: SUMS if p["weights"] else None)  # fmt: skip


def moe_gate_backward_cases(rng):
    def config(rng):
        experts = pick(rng, [64, 72, 128, 256, 384, 512], (64, 128, 256))
        return {"experts": experts, "topk": pick(rng, range(1, min(experts, 32) + 1), (6, 8)), "aux": rng.random() < 0.5}

    def call(rng, config, tokens):
        divisors = [d for d in (1, 2, 3, 4, 8) if tokens % d == 0]
        return {"seqs": rng.choice(divisors), "rsf": rng.choice([1.0, 2.5])} if config["aux"] else {"rsf": rng.choice([1.0, 2.5])}

    def make(gen: Gen, p):
        t, e, k = p["tokens"], p["experts"], p["topk"]
        scores = torch.nn.functional.softplus(gen.randn(t, e) * 2).sqrt()
        idx = torch.argsort(gen.rand(t, e), dim=1)[:, :k].contiguous()
        mask = gen.bools(t, 0.8)
        idx[~mask] = -1
        args = (scores, idx, gen.rand(t, k), gen.randn(t, k), p["rsf"])
        kwargs = {"mask": mask, "grad_scores_sum": gen.randn(p["seqs"], e)} if p["aux"] else {}
        return Call(args, kwargs, close={"ret": (1e-5, 1e-6)})

    return assemble("moe.moe_topk_gate_backward", rng, config, call, make, tolerance=lambda p: "within rtol 1e-5: sums in another order")
