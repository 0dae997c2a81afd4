"""Parity cases of tkaot.mhc's first ten ops (see tests/parity_cases.py for what a case is and how sizes are drawn).

The expansion rate is 4 (the default set's; TileKernels' mhc_post_bwd takes no other). Hidden sizes are multiples of
8 (tkaot reads rows as 16-byte vectors; TileKernels would also take others) and, for mhc_post_*, of 128 (TileKernels
asserts it). Every output buffer is poisoned. Sums over a hidden row or over all tokens (mhc_pre_apply_mix_bwd's
mix_grad, mhc_post_bwd's d_post_layer_mix and d_comb_res_mix, mhc_pre_split_mixes_bwd's mhc_scale_grad and
mhc_base_grad) are fp32 sums TileKernels splits across threads in its own order: they are compared by value (`close`),
their inputs of unit scale so that one absolute tolerance fits every row; everything else, the bf16 outputs and the
Sinkhorn matrices included, byte for byte. mhc_post_*'s residual and d_o are always contiguous: TileKernels copies
a non-contiguous one, tkaot refuses it (it copies no user tensor silently).
"""

from __future__ import annotations

import torch

from tests.parity_cases import Call, assemble, no_call_options, pick, pick_size
from tests.parity_inputs import BF16, F32

MHC = 4
HIDDEN = (1536, 2048, 4096, 5120, 7168, 8192)  # the default hidden list (tkaot's mHC kernels take any at run time)
# fp32 sums added in another order (rtol, atol): over a hidden row of unit-scale products (values ~ sqrt(hidden)),
# and over every token's raw mixes (values ~ sqrt(tokens * 24))
ROW_SUMS, TOKEN_SUMS = (1e-4, 1e-3), (1e-4, 1e-2)
CLOSE = "fp32 sums by value (rtol 1e-4, atol 1e-3 over rows, 1e-2 over tokens), the rest byte for byte"


def _hidden(multiple: int):
    return lambda rng: {"hidden": pick_size(rng, multiple, 8192, HIDDEN)}


def _mix(gen, *shape) -> torch.Tensor:
    """Mixing weights as the sigmoid gates make them: positive, around 1."""
    return gen.rand(*shape) * 2


def expand_fwd_cases(rng):
    def make(gen, p):
        return Call((gen.activations(p["tokens"], p["hidden"]), gen.poisoned(p["tokens"], MHC, p["hidden"], dtype=BF16)), {})

    return assemble("mhc.expand_to_mhc_fwd", rng, _hidden(8), no_call_options, make)


def expand_bwd_cases(rng):
    def make(gen, p):
        return Call((gen.activations(p["tokens"], MHC, p["hidden"]), gen.poisoned(p["tokens"], p["hidden"], dtype=BF16)), {})

    return assemble("mhc.expand_to_mhc_bwd", rng, _hidden(8), no_call_options, make)


def pre_apply_mix_fwd_cases(rng):
    def make(gen, p):
        n, h = p["tokens"], p["hidden"]
        return Call((gen.activations(n, MHC, h), _mix(gen, n, MHC), gen.poisoned(n, h, dtype=BF16)), {})

    return assemble("mhc.mhc_pre_apply_mix_fwd", rng, _hidden(8), no_call_options, make)


def pre_apply_mix_bwd_cases(rng):
    def make(gen, p):
        n, h = p["tokens"], p["hidden"]
        args = (gen.randn(n, h, dtype=BF16), gen.randn(n, MHC, h, dtype=BF16), _mix(gen, n, MHC), gen.activations(n, MHC, h))
        return Call(args, {}, close={"ret": ROW_SUMS})

    return assemble("mhc.mhc_pre_apply_mix_bwd", rng, _hidden(8), no_call_options, make, tolerance=lambda p: CLOSE)


def _split_config(rng) -> dict:
    return {"post_mult": pick(rng, (1.0, 2.0, 0.5), (2.0,)), "pre_eps": pick(rng, (1e-6, 1e-4, 0.0), (1e-6,))}


def _split_params(gen):
    width = MHC * (MHC + 2)
    return gen.randn(3) * 0.5 + 1, gen.randn(width) * 0.5


def split_fwd_cases(rng):
    def make(gen, p):
        n = p["tokens"]
        scale, base = _split_params(gen)
        outs = (gen.poisoned(n, MHC, dtype=F32), gen.poisoned(n, MHC, dtype=F32), gen.poisoned(n, MHC * MHC, dtype=F32))
        return Call((gen.randn(n, MHC * (MHC + 2)) * 2, scale, base, *outs, p["post_mult"], p["pre_eps"]), {})

    return assemble("mhc.mhc_pre_split_mixes_fwd", rng, _split_config, no_call_options, make)


def split_bwd_cases(rng):
    def make(gen, p):
        n, width = p["tokens"], MHC * (MHC + 2)
        scale, base = _split_params(gen)
        grads = (gen.randn(n, MHC), gen.randn(n, MHC), gen.randn(n, MHC * MHC))
        post = gen.rand(n, MHC) * p["post_mult"]
        outs = (gen.poisoned(n, width, dtype=F32), gen.poisoned(3, dtype=F32), gen.poisoned(width, dtype=F32))
        args = (*grads, gen.randn(n, width) * 2, post, scale, base, *outs, p["post_mult"])
        return Call(args, {}, close={"args[8]": TOKEN_SUMS, "args[9]": TOKEN_SUMS})

    return assemble("mhc.mhc_pre_split_mixes_bwd", rng, _split_config, no_call_options, make, tolerance=lambda p: CLOSE)


def _sinkhorn_config(rng) -> dict:
    return {"repeat": pick(rng, (1, 2, 3, 7, 10, 20), (20,)), "eps": pick(rng, (1e-6, 1e-3), (1e-6,))}


def sinkhorn_fwd_cases(rng):
    def make(gen, p):
        n = p["tokens"]
        return Call((gen.randn(n, MHC, MHC) * 2, gen.poisoned(n, MHC, MHC, dtype=F32), p["repeat"], p["eps"]), {})

    return assemble("mhc.mhc_sinkhorn_fwd", rng, _sinkhorn_config, no_call_options, make)


def sinkhorn_bwd_cases(rng):
    def make(gen, p):
        n = p["tokens"]
        args = (gen.randn(n, MHC, MHC), gen.randn(n, MHC, MHC) * 2, gen.poisoned(n, MHC, MHC, dtype=F32), p["repeat"], p["eps"])
        return Call(args, {})

    return assemble("mhc.mhc_sinkhorn_bwd", rng, _sinkhorn_config, no_call_options, make)


def _post_call(rng, config, tokens) -> dict:
    return {"seqs": rng.choice([1, 1, 2]), "out": rng.random() < 0.5}


def _post_inputs(gen, p, unit: bool = False):
    """x, residual, post_layer_mix, comb_res_mix; with `unit`, x and residual of unit scale (they enter sums)."""
    lead, h = (p["seqs"], p["tokens"]), p["hidden"]
    rows = (lambda *s: gen.randn(*s, dtype=BF16)) if unit else gen.activations
    x, residual = rows(*lead, h), rows(*lead, MHC, h)
    return x, residual, _mix(gen, *lead, MHC, 1), gen.randn(*lead, MHC, MHC) * 0.5


def post_fwd_cases(rng):
    def make(gen, p):
        x, residual, post_mix, comb = _post_inputs(gen, p)
        kwargs = {"out": gen.poisoned(*residual.shape, dtype=BF16)} if p["out"] else {}
        return Call((x, residual, post_mix, comb), kwargs)

    return assemble("mhc.mhc_post_fwd", rng, _hidden(128), _post_call, make)


def post_bwd_cases(rng):
    def make(gen, p):
        x, residual, post_mix, comb = _post_inputs(gen, p, unit=True)
        d_o = gen.randn(*residual.shape, dtype=BF16)
        return Call((x, residual, post_mix, comb, d_o), {}, close={"ret[2]": ROW_SUMS, "ret[3]": ROW_SUMS})

    def call(rng, config, tokens):
        return {k: v for k, v in _post_call(rng, config, tokens).items() if k != "out"}

    return assemble("mhc.mhc_post_bwd", rng, _hidden(128), call, make, tolerance=lambda p: CLOSE)
