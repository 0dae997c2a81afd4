"""mHC cases (second half of the family): pre big fuse, multilayer recompute, head mix, norm-weight merge and
reduce partials + RMSNorm at DeepSeek's shape, 8192 tokens x hidden 7168, expansion rate 4, bf16 streams."""

import torch

import tkaot
from bench.cases import Case

TOKENS, HIDDEN, M, SPLITS = 8192, 7168, 4, 16
M3 = M * (M + 2)


def _f32(*shape):
    return torch.randn(*shape, device="cuda")


def _bf16(*shape):
    return torch.randn(*shape, device="cuda").bfloat16()


def _big_fuse_inputs(tokens: int):
    def make():
        return {
            "mul": _f32(SPLITS, tokens, M3), "sq": _f32(SPLITS, tokens).abs() * 100, "scale": _f32(3).abs(), "base": _f32(M3),
            "residual": _bf16(tokens, M, HIDDEN), "post": _f32(tokens, M), "comb": _f32(tokens, M * M), "input": _bf16(tokens, HIDDEN),
        }  # fmt: skip

    return make


def _big_fuse(lib, a):
    return lib.mhc.mhc_pre_big_fuse_fwd(
        a["mul"], a["sq"], a["scale"], a["base"], a["residual"], a["post"], a["comb"], a["input"], 1e-6, 1e-6, 1e-6, 2.0, 20, SPLITS
    )


def _big_fuse_case(tokens: int) -> Case:
    return Case(
        op="mhc_pre_big_fuse_fwd",
        shape=f"{tokens}x{M}x{HIDDEN} bf16, {SPLITS} splits, 20 repeats",
        bytes=tokens * (M * HIDDEN * 2 + HIDDEN * 2 + SPLITS * (M3 + 1) * 4 + (M + M * M) * 4),
        make=_big_fuse_inputs(tokens),
        tkaot=lambda a: _big_fuse(tkaot, a),
        tile_kernels=_big_fuse,
        host_timing=tokens == 1,
    )


def _big_fuse_cases() -> list[Case]:
    # 1 and 32 tokens: the op's split kernel (up to tkaot/_mhc/big_fuse.py's SPLIT_MAX_TOKENS), 8192 the one-block kernel
    return [_big_fuse_case(tokens) for tokens in (TOKENS, 1, 32)]


def _recompute_case(layers: int) -> Case:
    def make():
        return {
            "res": _bf16(TOKENS, M, HIDDEN), "pre": [_f32(TOKENS, M, 1).sigmoid() for _ in range(layers)],
            "out": [_bf16(TOKENS, HIDDEN) for _ in range(layers)], "post": [_f32(TOKENS, M, 1).sigmoid() for _ in range(layers)],
            "comb": [_f32(TOKENS, M, M).softmax(-1) for _ in range(layers)], "input": [_bf16(TOKENS, HIDDEN) for _ in range(layers)],
            "residual": [_bf16(TOKENS, M, HIDDEN) for _ in range(layers)],
        }  # fmt: skip

    def call(lib, a):
        return lib.mhc.mhc_multilayer_recompute(a["res"], a["pre"], a["out"], a["post"], a["comb"], a["input"], a["residual"])

    per_layer = TOKENS * (HIDDEN * 2 + HIDDEN * 2 + M * HIDDEN * 2 + (2 * M + M * M) * 4)
    return Case(
        op="mhc_multilayer_recompute", shape=f"{TOKENS}x{M}x{HIDDEN} bf16, {layers} layers",
        bytes=TOKENS * M * HIDDEN * 2 + layers * per_layer, make=make, tkaot=lambda a: call(tkaot, a), tile_kernels=call,
    )  # fmt: skip


def _small_cases() -> list[Case]:
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count

    def head():
        return {"x": _f32(TOKENS, M), "scale": _f32(1), "base": _f32(M), "out": _f32(TOKENS, M), "dy": _f32(TOKENS, M),
                "sp": _f32(num_sms, 1), "bp": _f32(num_sms, M)}  # fmt: skip

    def fn():
        return {"fn": _f32(M3, M * HIDDEN), "w": _f32(M * HIDDEN), "out": _f32(M3, M * HIDDEN), "dy": _f32(M3, M * HIDDEN),
                "gw": _f32(M * HIDDEN)}  # fmt: skip

    def reduce():
        return {"parts": _f32(SPLITS, TOKENS, 1, M3), "sq": _f32(SPLITS, TOKENS, 1).abs(), "mul": _f32(TOKENS, 1, M3),
                "sqrsum": _f32(TOKENS, 1).abs() + 1, "out": _f32(TOKENS, M3), "dy": _f32(TOKENS, M3)}  # fmt: skip

    def head_bwd(lib, a):
        return lib.mhc.mhc_head_compute_mix_bwd(a["dy"], a["x"], a["scale"], a["base"], a["out"], a["sp"], a["bp"], num_sms)

    def reduce_fwd(lib, a):
        return lib.mhc.mhc_reduce_partials_and_rmsnorm_fwd(a["parts"], a["sq"], a["mul"], a["sqrsum"], a["out"], M * HIDDEN, 1e-6, SPLITS)

    def reduce_bwd(lib, a):
        return lib.mhc.mhc_reduce_partials_and_rmsnorm_bwd(a["dy"], a["mul"], a["sqrsum"], a["parts"][0], a["sq"][0], M * HIDDEN, 1e-6)

    def merge_bwd(lib, a):
        return lib.mhc.mhc_fn_normw_merge_bwd(a["fn"], a["w"], a["dy"], a["out"], a["gw"])

    def head_fwd(lib, a):
        return lib.mhc.mhc_head_compute_mix_fwd(a["x"], a["scale"], a["base"], a["out"], 1e-6)

    def merge_fwd(lib, a):
        return lib.mhc.mhc_fn_normw_merge_fwd(a["fn"], a["w"], a["out"])

    rows = [
        ("mhc_head_compute_mix_fwd", f"{TOKENS}x{M}", 2 * TOKENS * M * 4, head, head_fwd),
        ("mhc_head_compute_mix_bwd", f"{TOKENS}x{M}, {num_sms} partials", 3 * TOKENS * M * 4, head, head_bwd),
        ("mhc_fn_normw_merge_fwd", f"{M3}x{M * HIDDEN}", 2 * M3 * M * HIDDEN * 4, fn, merge_fwd),
        ("mhc_fn_normw_merge_bwd", f"{M3}x{M * HIDDEN}", 4 * M3 * M * HIDDEN * 4, fn, merge_bwd),
        ("mhc_reduce_partials_and_rmsnorm_fwd", f"{SPLITS}x{TOKENS}x{M3}", (SPLITS + 2) * TOKENS * (M3 + 1) * 4, reduce, reduce_fwd),
        ("mhc_reduce_partials_and_rmsnorm_bwd", f"{TOKENS}x{M3}", 4 * TOKENS * (M3 + 1) * 4, reduce, reduce_bwd),
    ]
    return [
        Case(op=op, shape=shape, bytes=n, make=make, tkaot=lambda a, f=f: f(tkaot, a), tile_kernels=f) for op, shape, n, make, f in rows
    ]


def cases() -> list[Case]:
    return _big_fuse_cases() + [_recompute_case(4)] + _small_cases()
