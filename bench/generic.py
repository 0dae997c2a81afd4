"""Generic against specialised variants, side by side in one run (the generic tier's target: within 1.25x of the
specialised variant's device time at large shapes): per_token_cast at 8192x7168 bf16, topk_gate at 8192x256, the
SwiGLU ops at 8192 tokens of hidden 4096 and 14336 (x 8192x8192 and 8192x28672), moe_topk_gate_forward at 8192x256
top-8 (+1 shared slot), normalize_weight at 8192x9, norm_forward, norm_forward_and_per_token_cast and norm_backward at
8192x7168 bf16, cast_back of per-token E4M3 at 8192x7168, per_block_cast (128x128 blocks), per_channel_cast and
per_block_cast_lossless (1x32 UE8M0 to 128x128) at 8192x7168.

    python -m bench.generic [--out bench/results]

Each case is timed twice on the same rotating inputs: on the specialised variant the default set builds, then on
the generic variant of the same options (the specialised ones hidden from the registry). Prints a table and writes
bench/results/<date>-<gpu>-generic.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import warnings
from pathlib import Path

import torch

import tkaot
from bench import timing
from tkaot import _op
from tkaot._moe import ops as _moe_ops
from tkaot._quant import casts as _casts
from tkaot._quant import norm as _norm
from tkaot._quant import norm_backward as _norm_backward
from tkaot._quant import norm_cast as _norm_cast
from tkaot._quant import swiglu as _swiglu
from tkaot._quant import weight_casts as _weight_casts
from tkaot.errors import GenericVariantWarning, VariantNotBuilt

ROOT = Path(__file__).resolve().parent.parent
TOKENS, HIDDEN = 8192, 7168
TARGET = 1.25  # generic / specialised device time, at most
DEEPGEMM_SF = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
# (name, per_token_cast's arguments after x, its keywords, bytes moved per element of x): specialised at 7168 in the
# default set
CASES = [
    ("e4m3/128", ("e4m3", 128), {}, 2 + 1 + 4 / 128),
    ("e4m3/128 ue8m0 col", ("e4m3", 128), DEEPGEMM_SF, 2 + 1 + 1 / 128),
    ("e4m3/128 pow2", ("e4m3", 128), {"round_sf": True}, 2 + 1 + 4 / 128),
    ("e2m1/32", ("e2m1", 32), {}, 2 + 0.5 + 4 / 32),
    ("e2m1/32 ue8m0", ("e2m1", 32), {"round_sf": True, "use_packed_ue8m0": True}, 2 + 0.5 + 1 / 32),
    ("e2m1/16 e4m3 sf", ("e2m1", 16), {"use_e4m3_sf": True}, 2 + 0.5 + 1 / 16),
]


# The kernels an op launches instead of a specialised kernel for some of its calls where they are built (the generic tier
# serves those calls too): rmsnorm_backward_residual, norm_backward's calls with a residual gradient; rmsnorm_backward_plain,
# those with neither a weight nor a residual gradient
ALSO_SPECIALISED = {"rmsnorm_backward": ("rmsnorm_backward_residual", "rmsnorm_backward_plain")}


@contextlib.contextmanager
def on_generic(specialised: str = "per_token_cast"):
    """The `specialised` kernel's calls run on its generic variants: the registry finds no specialised one (nor a kernel
    the op launches instead of it for some calls, ALSO_SPECIALISED)."""
    registry, real = _op.REGISTRY, _op.REGISTRY.kernel
    hidden = {specialised, *ALSO_SPECIALISED.get(specialised, ())}

    def kernel(op, name, key, device):
        if name in hidden:
            raise VariantNotBuilt(op, name, key, [], "(hidden on purpose)", [])
        return real(op, name, key, device)

    def forget():
        _casts._PLANS.clear()
        for kernels in (
            *_casts._PER_TOKEN.values(),
            *_casts._CAST_BACK.values(),
            *_casts._PER_BLOCK.values(),
            _casts._PER_CHANNEL,
            _weight_casts._LOSSLESS,
            _moe_ops._TOPK,
            _moe_ops._GATE,
            _moe_ops._NORMALIZE,
            _swiglu._SWIGLU,
            _norm._NORM,
            _norm_cast._NORM_CAST,
            _norm_backward._PASS1,
            _norm_backward._PASS1_RESIDUAL,
            _norm_backward._PASS1_PLAIN,
        ):
            kernels.cache.clear()

    forget()
    registry.kernel, warned, _op._WARNED = kernel, _op._WARNED, set()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GenericVariantWarning)
            yield
    finally:
        del registry.kernel
        _op._WARNED = warned
        forget()


def launched_kernel(args: tuple, kwargs: dict, x: torch.Tensor) -> str:
    """Which kernel the op's launcher for this call runs (to be sure each column measured what it says)."""
    tkaot.quant.per_token_cast(x, *args, **kwargs)
    launcher = next(iter(v[0] for v in _casts._PLANS.values()))
    return getattr(launcher, "__self__", launcher).kernel.kernel


def topk_gate_row(l2: int, tokens: int = 8192, experts: int = 256, topk: int = 8) -> dict:
    """topk_gate on its specialised variant and on the generic one."""
    count = min(64, max(2, -(-3 * l2 // (tokens * experts * 4))))
    inputs = [{"scores": torch.randn(tokens, experts, device="cuda")} for _ in range(count)]

    def call(a):
        return tkaot.moe.topk_gate(a["scores"], topk)

    return routing_row(f"topk_gate {tokens}x{experts} top-{topk}", _moe_ops._TOPK, "topk_gate", inputs, call)


# SwiGLU: (name, hidden, x dtype, fmt, num_per_channels, keywords, clamp): specialised in the default set. A clamp
# takes the clamp tiling, with routing weights as MoE layers pass them.
SWIGLU_CASES = [
    ("e4m3/128", 4096, torch.bfloat16, "e4m3", 128, {}, False),
    ("e4m3/128 ue8m0 col", 4096, torch.bfloat16, "e4m3", 128, DEEPGEMM_SF, False),
    ("e4m3/32 pow2", 4096, torch.bfloat16, "e4m3", 32, {"round_sf": True}, False),
    ("e4m3/128 weights clamp", 4096, torch.bfloat16, "e4m3", 128, {}, True),
    ("bf16", 4096, torch.bfloat16, "bf16", None, {}, False),
    ("bf16 weights clamp", 4096, torch.bfloat16, "bf16", None, {}, True),
    ("e4m3/128", 14336, torch.bfloat16, "e4m3", 128, {}, False),
    ("fp32 x -> bf16", 2048, torch.float32, "bf16", None, {}, False),
]


def swiglu_rows(l2: int, tokens: int = 8192) -> list[dict]:
    """swiglu_forward(_and_per_token_cast) on the specialised variant and on the generic one."""
    rows = []
    for name, hidden, dtype, fmt, group, kwargs, clamp in SWIGLU_CASES:
        nbytes = tokens * 2 * hidden * dtype.itemsize
        count = min(64, max(2, -(-3 * l2 // nbytes)))
        inputs = [{"x": torch.randn(tokens, 2 * hidden, device="cuda").to(dtype)} for _ in range(count)]
        extra = dict(kwargs)
        if clamp:
            extra |= {"topk_weights": torch.rand(tokens, device="cuda"), "clamp_value": 6.0}

        def call(a, fmt=fmt, group=group, extra=extra):
            return tkaot.quant.swiglu_forward_and_per_token_cast(a["x"], fmt, group, **extra)

        out_bytes = 1 if fmt == "e4m3" else 2 if fmt == "bf16" else 4
        moved = tokens * hidden * (2 * dtype.itemsize + out_bytes)
        rows.append(routing_row(f"swiglu {tokens}x{hidden} {name}", _swiglu._SWIGLU, "swiglu", inputs, call, moved))
    return rows


def both_us(name: str, kernels, specialised: str, inputs: list[dict], call) -> tuple[float, float]:
    """Device µs of `call` over `inputs` on the specialised kernel, then on its generic one (the op's OpKernels
    `kernels`), each checked to be the kernel that ran."""

    def launched() -> str:
        (kernel,) = {getattr(launcher, "__self__", launcher).kernel.kernel for launcher in kernels.cache.values()}
        return kernel

    kernels.cache.clear()
    call(inputs[0])
    assert launched() == specialised, f"{name}: no specialised {specialised} variant"
    special_us, _ = timing.device_us(call, inputs)
    with on_generic(specialised):
        call(inputs[0])
        assert launched() == f"{specialised}_generic"
        generic_us, _ = timing.device_us(call, inputs)
    return special_us, generic_us


def result_row(name: str, special_us: float, generic_us: float, moved: float | None = None) -> dict:
    """Print a table row (the generic variant's TB/s when the bytes `moved` are given) and return its record."""
    ratio = generic_us / special_us
    tbps = "—" if moved is None else f"{moved / (generic_us * 1e-6) / 1e12:.2f}"
    print(f"| {name} | {special_us:.2f} | {generic_us:.2f} | {ratio:.2f}{'' if ratio <= TARGET else ' (over)'} | {tbps} |", flush=True)
    return {"options": name, "specialised_us": round(special_us, 3), "generic_us": round(generic_us, 3), "ratio": round(ratio, 3)}


def routing_row(name: str, kernels, specialised: str, inputs: list[dict], call, moved: float | None = None) -> dict:
    """One op (its OpKernels `kernels`) on the specialised variant and on the generic one, same inputs."""
    return result_row(name, *both_us(name, kernels, specialised, inputs, call), moved)


def gate_rows(l2: int, tokens: int = 8192, experts: int = 256, topk: int = 8) -> list[dict]:
    """moe_topk_gate_forward (DeepSeek-V3's routing: a bias, one shared slot) and normalize_weight of its weights."""
    count = min(64, max(2, -(-3 * l2 // (tokens * experts * 4))))
    bias = torch.randn(experts, device="cuda") * 0.1
    inputs = [{"logits": torch.randn(tokens, experts, device="cuda")} for _ in range(count)]

    def gate(a):
        return tkaot.moe.moe_topk_gate_forward(a["logits"], topk, True, 1, 2.5, 0, bias=bias)

    def normalize(a):
        return tkaot.moe.normalize_weight(a["w"])

    weights = [{"w": torch.rand(tokens, topk + 1, device="cuda")} for _ in range(count)]
    return [
        routing_row(f"moe_topk_gate_forward {tokens}x{experts} top-{topk}+1", _moe_ops._GATE, "moe_topk_gate", inputs, gate),
        routing_row(f"normalize_weight {tokens}x{topk + 1}", _moe_ops._NORMALIZE, "normalize_weight", weights, normalize),
    ]


# (name, the op, its arguments after x and the weight, its keywords, with a residual, bytes moved per element of x)
NORM_CASES = [
    ("norm_forward", "norm_forward", (1e-6,), {}, False, 2 + 2),
    ("norm_forward residual rstd", "norm_forward", (1e-6,), {"with_rstd": True}, True, 2 + 2 + 2 + 2),
    ("norm_cast e4m3/32", "norm_forward_and_per_token_cast", (1e-6, "e4m3", 32), {}, False, 2 + 1 + 4 / 32),
    ("norm_cast e4m3/32 ue8m0 residual", "norm_forward_and_per_token_cast", (1e-6, "e4m3", 32),
     {"round_sf": True, "use_packed_ue8m0": True}, True, 2 + 2 + 2 + 1 + 1 / 32),
]  # fmt: skip


def norm_rows(tokens: int = TOKENS, hidden: int = HIDDEN) -> list[dict]:
    """The norm ops on their specialised variants and on the generic ones, weight given."""
    count = 8  # rotating inputs: 8 x (x, residual) of 8192x7168 bf16 is 1.9 GB, well past L2
    weight = torch.randn(hidden, device="cuda").to(torch.bfloat16)
    inputs = [
        {
            "x": torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16),
            "r": torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16),
        }
        for _ in range(count)
    ]
    rows = []
    for name, op, call_args, kwargs, residual, per_element in NORM_CASES:
        fn = getattr(tkaot.quant, op)
        specialised_kernel = "rmsnorm" if op == "norm_forward" else "norm_cast"
        kernels = _norm._NORM if op == "norm_forward" else _norm_cast._NORM_CAST

        def call(a, fn=fn, call_args=call_args, kwargs=kwargs, residual=residual):
            return fn(a["x"], weight, *call_args, residual=a["r"] if residual else None, **kwargs)

        rows.append(routing_row(name, kernels, specialised_kernel, inputs, call, tokens * hidden * per_element))
    return rows


# norm_backward: (name, with a weight, with a residual gradient, bytes moved per element of x: x, out_grad and x_grad,
# + the residual gradient); both passes timed (the weight-gradient reduction is the same kernel either way)
NORM_BACKWARD_CASES = [
    ("norm_backward", True, False, 2 + 2 + 2),
    ("norm_backward residual", True, True, 2 + 2 + 2 + 2),
    ("norm_backward no weight", False, False, 2 + 2 + 2),
]


def norm_backward_rows(tokens: int = TOKENS, hidden: int = HIDDEN) -> list[dict]:
    """norm_backward on its specialised rmsnorm_backward variant and on the generic one."""
    count = 6  # rotating inputs: 6 x (x, out_grad, residual gradient) of 8192x7168 bf16 is 2.1 GB, well past L2
    weight = (torch.rand(hidden, device="cuda") + 0.5).to(torch.bfloat16)
    inputs = [
        {
            "x": torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16),
            "dy": torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16),
            "dr": torch.randn(tokens, hidden, device="cuda").to(torch.bfloat16),
            "rstd": torch.rand(tokens, device="cuda") + 0.5,
        }
        for _ in range(count)
    ]
    rows = []
    for name, with_weight, residual, per_element in NORM_BACKWARD_CASES:

        def call(a, with_weight=with_weight, residual=residual):
            return tkaot.quant.norm_backward(a["dy"], a["x"], weight if with_weight else None, a["rstd"], a["dr"] if residual else None)

        rows.append(routing_row(name, _norm_backward._PASS1, "rmsnorm_backward", inputs, call, tokens * hidden * per_element))
    return rows


# cast_back's (name, in_sf as per_token_cast writes it, out fmt): specialised at 7168 in the default set
CAST_BACK_CASES = [("e4m3 1x128 fp32 -> bf16", {}, "bf16"), ("e4m3 1x128 ue8m0 col -> bf16", DEEPGEMM_SF, "bf16")]


def cast_back_rows(l2: int) -> list[dict]:
    """cast_back of per_token_cast's E4M3 output on its specialised variant and on the generic one."""
    rows = []
    for name, flags, fmt in CAST_BACK_CASES:
        count = min(64, max(2, -(-3 * l2 // (TOKENS * HIDDEN * 3))))
        inputs = [{"x": tkaot.quant.per_token_cast(torch.randn(TOKENS, HIDDEN, device="cuda").to(torch.bfloat16), "e4m3", 128, **flags)}
                  for _ in range(count)]  # fmt: skip

        def call(a, fmt=fmt):
            return tkaot.quant.per_token_cast_back(a["x"], fmt, 128)

        kernels, moved = _casts._CAST_BACK["tkaot.quant.per_token_cast_back"], TOKENS * HIDDEN * (1 + 2 + 4 / 128)
        rows.append(routing_row(f"cast_back {name}", kernels, "cast_back", inputs, call, moved))
    return rows


def block_cast_rows(l2: int) -> list[dict]:
    """per_block_cast, per_channel_cast and per_block_cast_lossless at 8192x7168 on their specialised variants and on the
    generic ones (the lossless cast's value checks, a host sync, are skipped: the kernels alone are timed)."""
    count = min(64, max(2, -(-3 * l2 // (TOKENS * HIDDEN * 2))))
    xs = [{"x": torch.randn(TOKENS, HIDDEN, device="cuda").to(torch.bfloat16)} for _ in range(count)]
    rows = []
    for flags in ({}, {"round_sf": True}):  # the default set's per-block variants at 7168: 128x128, fp32 or pow2 sf

        def cast(a, flags=flags):
            return tkaot.quant.per_block_cast(a["x"], "e4m3", (128, 128), **flags)

        name = f"per_block_cast e4m3 128x128{' pow2' if flags else ''}"
        rows.append(routing_row(name, _casts._PER_BLOCK["tkaot.quant.per_block_cast"], "per_block_cast", xs, cast))
    rows.append(routing_row("per_channel_cast e4m3 128", _casts._PER_CHANNEL, "per_channel_cast", xs,
                            lambda a: tkaot.quant.per_channel_cast(a["x"], "e4m3", 128)))  # fmt: skip
    codes = [
        {"x": (torch.randint(-128, 128, (TOKENS, HIDDEN // 2), dtype=torch.int8, device="cuda"),
               torch.randint(100, 120, (TOKENS, HIDDEN // 32 // 4), dtype=torch.int32, device="cuda") * 0x01010101)}
        for _ in range(count)
    ]  # fmt: skip
    unchecked, _weight_casts._values_unchecked = _weight_casts._values_unchecked, lambda: True
    try:
        rows.append(routing_row("per_block_cast_lossless 1x32 ue8m0 -> 128x128", _weight_casts._LOSSLESS, "per_block_cast_lossless", codes,
                                lambda a: tkaot.quant.per_block_cast_lossless(a["x"], "e4m3", (1, 32), (128, 128))))  # fmt: skip
    finally:
        _weight_casts._values_unchecked = unchecked
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args(argv)
    gpu = torch.cuda.get_device_properties(0).name
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    count = min(64, max(2, -(-3 * l2 // (TOKENS * HIDDEN * 2))))
    inputs = [{"x": torch.randn(TOKENS, HIDDEN, device="cuda").to(torch.bfloat16)} for _ in range(count)]
    rows = []
    print(f"{gpu}: per_token_cast at {TOKENS}x{HIDDEN} bf16, generic against specialised (target: at most {TARGET}x)")
    print("| options | specialised µs | generic µs | generic / specialised | generic TB/s |\n| --- | ---: | ---: | ---: | ---: |")
    for name, call_args, kwargs, per_element in CASES:

        def call(a, call_args=call_args, kwargs=kwargs):
            return tkaot.quant.per_token_cast(a["x"], *call_args, **kwargs)

        _casts._PLANS.clear()
        assert launched_kernel(call_args, kwargs, inputs[0]["x"]) == "per_token_cast", f"{name}: no specialised variant"
        specialised, _ = timing.device_us(call, inputs)
        with on_generic():
            assert launched_kernel(call_args, kwargs, inputs[0]["x"]) == "per_token_cast_generic"
            generic, _ = timing.device_us(call, inputs)
        rows.append(result_row(name, specialised, generic, TOKENS * HIDDEN * per_element))
    rows.append(topk_gate_row(l2))
    rows += swiglu_rows(l2)
    rows += gate_rows(l2)
    rows += norm_rows()
    rows += norm_backward_rows()
    rows += cast_back_rows(l2)
    rows += block_cast_rows(l2)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{datetime.date.today().isoformat()}-{gpu.replace(' ', '-')}-generic.json"
    path.write_text(json.dumps({"gpu": gpu, "shape": f"{TOKENS}x{HIDDEN} bf16", "target": TARGET, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
