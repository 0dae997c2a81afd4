"""Parity cases (tests/parity_cases.py) of tkaot.mhc's head mix, norm-weight merge, reduce partials + RMSNorm, pre big
fuse and multilayer recompute: calls TileKernels 2.1.0 accepts, every output buffer NaN-poisoned, compared byte for
byte. Each kernel sums in TileKernels' order (splits and streams in order from zero, its butterflies over lanes and
threads, its fused multiply-adds), so no tolerance is declared; the head-mix backward's partial rows match only
where TileKernels' tile layout is one element a thread (token_block_size * mhc_mult == 128, its default), which is
all that is drawn. Expansion rate 4 (DeepSeek's) in most configurations; hidden sizes are the models' (multiples
of 512, which TileKernels' gcd(512, hidden) tiling takes whole).
"""

from __future__ import annotations

from tests.parity_cases import BF16, F32, Call, assemble, no_call_options, pick

HIDDEN = (2048, 4096, 5120, 7168)


def head_mix_fwd_cases(rng):
    def config(rng):
        return {"mhc_mult": pick(rng, (1, 2, 4, 8), (4,)), "eps": rng.choice([1e-6, 1e-2])}

    def make(gen, p):
        t, m = p["tokens"], p["mhc_mult"]
        return Call((gen.randn(t, m) * 3, gen.randn(1), gen.randn(m), gen.poisoned(t, m, dtype=F32), p["eps"]), {})

    return assemble("mhc.mhc_head_compute_mix_fwd", rng, config, no_call_options, make)


def head_mix_bwd_cases(rng):
    def config(rng):
        return {"mhc_mult": 4, "num_sms": rng.choice([132, 78, 1])}

    def make(gen, p):
        t, m, sms = p["tokens"], p["mhc_mult"], p["num_sms"]
        args = (gen.randn(t, m), gen.randn(t, m) * 3, gen.randn(1), gen.randn(m), gen.poisoned(t, m, dtype=F32),
                gen.poisoned(sms, 1, dtype=F32), gen.poisoned(sms, m, dtype=F32), sms)  # fmt: skip
        return Call(args, {})

    return assemble("mhc.mhc_head_compute_mix_bwd", rng, config, no_call_options, make)


def normw_merge_fwd_cases(rng):
    def config(rng):
        return {"rows": 24, "hidden": pick(rng, HIDDEN, (7168,))}

    def make(gen, p):
        n = 4 * p["hidden"]
        return Call((gen.randn(p["rows"], n), gen.randn(n), gen.poisoned(p["rows"], n, dtype=F32)), {})

    return assemble("mhc.mhc_fn_normw_merge_fwd", rng, config, no_call_options, make)


def normw_merge_bwd_cases(rng):
    def config(rng):
        return {"rows": 24, "hidden": pick(rng, HIDDEN, (7168,))}

    def make(gen, p):
        m, n = p["rows"], 4 * p["hidden"]
        return Call((gen.randn(m, n), gen.randn(n), gen.randn(m, n), gen.randn(m, n), gen.randn(n)), {})

    return assemble("mhc.mhc_fn_normw_merge_bwd", rng, config, no_call_options, make)


def reduce_fwd_cases(rng):
    def config(rng):
        return {"n_splits": pick(rng, (1, 4, 16), (16,)), "groups": pick(rng, (1, 2), (1,)), "hidden": pick(rng, HIDDEN, (7168,))}

    def make(gen, p):
        t, s, g, m3 = p["tokens"], p["n_splits"], p["groups"], 24
        args = (gen.randn(s, t, g, m3) * 20, gen.rand(s, t, g) * 300, gen.poisoned(t, g, m3, dtype=F32),
                gen.poisoned(t, g, dtype=F32), gen.poisoned(t, m3, dtype=F32), 4 * p["hidden"] // g, 1e-6, s)  # fmt: skip
        return Call(args, {})

    return assemble("mhc.mhc_reduce_partials_and_rmsnorm_fwd", rng, config, no_call_options, make)


def reduce_bwd_cases(rng):
    def config(rng):
        return {"groups": pick(rng, (1, 2), (1,)), "hidden": pick(rng, HIDDEN, (7168,))}

    def make(gen, p):
        t, g, m3 = p["tokens"], p["groups"], 24
        args = (gen.randn(t, m3), gen.randn(t, g, m3) * 50, gen.rand(t, g) * 4000, gen.poisoned(t, g, m3, dtype=F32),
                gen.poisoned(t, g, dtype=F32), 4 * p["hidden"] // g, 1e-6)  # fmt: skip
        return Call(args, {})

    return assemble("mhc.mhc_reduce_partials_and_rmsnorm_bwd", rng, config, no_call_options, make)


def pre_big_fuse_cases(rng):
    def config(rng):
        return {
            "hidden": pick(rng, HIDDEN, (7168, 4096)), "n_splits": pick(rng, (1, 8, 16), (16,)), "repeat": pick(rng, (1, 10, 20), (20,)),
        }  # fmt: skip

    def make(gen, p):
        t, m, h, s = p["tokens"], 4, p["hidden"], p["n_splits"]
        m3 = m * (m + 2)
        args = (gen.randn(s, t, m3) * 10, gen.rand(s, t) * 4000 / s, gen.rand(3) + 0.5, gen.randn(m3), gen.randn(t, m, h, dtype=BF16),
                gen.poisoned(t, m, dtype=F32), gen.poisoned(t, m * m, dtype=F32), gen.poisoned(t, h, dtype=BF16),
                1e-6, 1e-6, 1e-6, 2.0, p["repeat"])  # fmt: skip
        return Call(args, {"n_splits": s})

    return assemble("mhc.mhc_pre_big_fuse_fwd", rng, config, no_call_options, make)


def multilayer_recompute_cases(rng):
    def config(rng):
        layers = rng.randint(1, 4)
        return {"hidden": pick(rng, HIDDEN, (7168,)), "layers": layers, "post": rng.choice([layers - 1, layers])}

    def make(gen, p):
        t, m, h, n, post = p["tokens"], 4, p["hidden"], p["layers"], p["post"]
        args = (
            gen.randn(t, m, h, dtype=BF16),
            [gen.rand(t, m, 1) for _ in range(n)],
            [gen.randn(t, h, dtype=BF16) for _ in range(post)],
            [gen.rand(t, m, 1) * 2 for _ in range(post)],
            [gen.rand(t, m, m) / m for _ in range(post)],
            [gen.poisoned(t, h, dtype=BF16) for _ in range(n)],
            [gen.poisoned(t, m, h, dtype=BF16) for _ in range(post)],
        )
        return Call(args, {})

    return assemble("mhc.mhc_multilayer_recompute", rng, config, no_call_options, make)
