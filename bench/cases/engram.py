"""Engram cases (tkaot.engram) beside TileKernels: the gate forward (the anchor: 8192 tokens, 4 heads, hidden 7168,
inference path; TileKernels 403.8 µs, 3.78 TB/s on the H200) and with saved values, the backward, the weight-gradient
reduction, the fused weight, the hash and the Sinkhorn ops (step, its column reduction, finalize, momentum) at
TileKernels' test shapes: a row for each of the nine functions."""

import torch

import tkaot
from bench.cases import Case
from tkaot._engram.sinkhorn import PARTIALS_PER_SM

TOKENS, HC, HIDDEN = 8192, 4, 7168
BF16, F32 = torch.bfloat16, torch.float32


def _gate_inputs(tokens=TOKENS, hidden=HIDDEN):
    wh, we = (torch.randn(HC, hidden, dtype=BF16, device="cuda") for _ in range(2))
    return {
        "x": torch.randn(tokens, HC, hidden, dtype=BF16, device="cuda"),
        "kv": torch.randn(tokens, HC + 1, hidden, dtype=BF16, device="cuda"),
        "wh": wh, "we": we, "w": wh.float() * we.float(),
    }  # fmt: skip


def _bwd_inputs(hidden=HIDDEN):
    a = _gate_inputs(hidden=hidden)
    _, dot, gate, rx, rk = tkaot.reference.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], 1e-20, 1e-6, True)
    return {**a, "go": torch.randn(TOKENS, HC, hidden, dtype=BF16, device="cuda"), "saved": (dot, gate, rx, rk)}


def _gate_cases() -> list[Case]:
    row, saved = TOKENS * HC * HIDDEN * 2, TOKENS * HC * 4
    gate_bytes = row * 2 + TOKENS * (HC + 1) * HIDDEN * 2 + HC * HIDDEN * 4  # x, kv, w read; out written

    def fwd(lib, save):
        return lambda a: lib.engram.engram_gate_fwd(a["x"], a["kv"], a["w"], 1e-20, 1e-6, save)

    def tk(save):
        return lambda t, a: fwd(t, save)(a)

    return [
        Case("engram_gate_fwd", f"{TOKENS}x{HC}x{HIDDEN} bf16, inference", gate_bytes, _gate_inputs, fwd(tkaot, False),
             tile_kernels=tk(False)),
        Case("engram_gate_fwd", f"{TOKENS}x{HC}x{HIDDEN} bf16, save_for_backward", gate_bytes + 4 * saved, _gate_inputs,
             fwd(tkaot, True), tile_kernels=tk(True)),
        Case("engram_gate_fwd", f"1x{HC}x{HIDDEN} bf16, inference", (2 * HC + HC + 1) * HIDDEN * 2 + HC * HIDDEN * 4,
             lambda: _gate_inputs(tokens=1), fwd(tkaot, False), tile_kernels=tk(False), host_timing=True),
        Case(
            "engram_gate_bwd", f"{TOKENS}x{HC}x{HIDDEN} bf16",
            # go, x, kv, w, saved read; grad_x, grad_kv written (the partials stay in L2)
            row * 3 + TOKENS * (HC + 1) * HIDDEN * 2 * 2 + HC * HIDDEN * 4 + 4 * saved,
            _bwd_inputs,
            lambda a: tkaot.engram.engram_gate_bwd(a["go"], a["x"], a["kv"], a["w"], *a["saved"], 1e-6),
            tile_kernels=lambda t, a: t.engram.engram_gate_bwd(a["go"], a["x"], a["kv"], a["w"], *a["saved"], 1e-6),
        ),
    ]  # fmt: skip


def _reduce_case() -> Case:
    partials = torch.cuda.get_device_properties(0).multi_processor_count

    def make():
        return {
            "p": torch.randn(partials, HC, HIDDEN, device="cuda"),
            "wh": torch.randn(HC, HIDDEN, dtype=BF16, device="cuda"), "we": torch.randn(HC, HIDDEN, dtype=BF16, device="cuda"),
            "gh": torch.zeros(HC, HIDDEN, device="cuda"), "ge": torch.zeros(HC, HIDDEN, device="cuda"),
        }  # fmt: skip

    def run(lib):
        return lambda a: lib.engram.grad_w_reduce(a["p"], a["wh"], a["we"], a["gh"], a["ge"])

    return Case("grad_w_reduce", f"{partials}x{HC}x{HIDDEN} fp32", (partials + 4) * HC * HIDDEN * 4 + 2 * HC * HIDDEN * 2, make,
                run(tkaot), tile_kernels=lambda t, a: run(t)(a))  # fmt: skip


def _hash_case() -> Case:
    ngram, layers, tables = 3, 2, 8

    def make():
        vocab = torch.randint(100000, 500000, (layers, ngram - 1, tables), dtype=torch.int32, device="cuda")
        flat = vocab.reshape(layers, -1)
        return {
            "ids": torch.randint(0, 2**31 - 1, (TOKENS, ngram), dtype=torch.int32, device="cuda"),
            "mult": torch.randint(1, 2**31, (layers, ngram), dtype=torch.int64, device="cuda"),
            "vocab": vocab, "offsets": (torch.cumsum(flat, 1, dtype=torch.int32) - flat).contiguous(),
        }  # fmt: skip

    def run(lib):
        return lambda a: lib.engram.engram_hash(a["ids"], a["mult"], a["vocab"], a["offsets"])

    cols = (ngram - 1) * tables
    return Case("engram_hash", f"{TOKENS} tokens, 3-grams, {layers}x{tables} tables", TOKENS * ngram * 4 + layers * TOKENS * cols * 4,
                make, run(tkaot), tile_kernels=lambda t, a: run(t)(a))  # fmt: skip


def _fused_weight_case() -> Case:
    def make():
        return {"wh": torch.randn(HC, HIDDEN, dtype=BF16, device="cuda"), "we": torch.randn(HC, HIDDEN, dtype=BF16, device="cuda")}

    def run(lib):
        return lambda a: lib.engram.fused_weight(a["wh"], a["we"])

    return Case("fused_weight", f"{HC}x{HIDDEN} bf16 -> fp32", HC * HIDDEN * (2 + 2 + 4), make, run(tkaot),
                tile_kernels=lambda t, a: run(t)(a))  # fmt: skip


def _sinkhorn_cases() -> list[Case]:
    rows, head_dim, numel = 100001, 5120, 1000001 * 512

    def matrix():
        return {
            "m": torch.randn(rows, head_dim, device="cuda"), "r": torch.rand(rows, device="cuda"), "c": torch.rand(head_dim, device="cuda"),
            "out": torch.empty(rows, head_dim, device="cuda"),
        }  # fmt: skip

    def momentum():
        return {"g": torch.randn(numel, device="cuda"), "m": torch.randn(numel, dtype=BF16, device="cuda")}

    def step(lib):
        return lambda a: lib.engram.engram_sinkhorn_step(a["m"], a["r"], a["c"], 1e-20)

    def finalize(lib):
        return lambda a: lib.engram.engram_sinkhorn_finalize(a["m"], a["r"], a["c"], 1e-20, head_dim**0.5, a["out"])

    def update(lib):
        return lambda a: lib.engram.engram_sinkhorn_momentum_update(a["g"], a["m"], 0.95, True)

    partials = PARTIALS_PER_SM * torch.cuda.get_device_properties(0).multi_processor_count  # engram_sinkhorn_step's partials

    def partial_sums():
        return {"p": torch.rand(partials, head_dim, device="cuda"), "s": torch.empty(head_dim, device="cuda")}

    def reduce(lib):
        return lambda a: lib.engram.engram_sinkhorn_step_reduce(a["p"], a["s"])

    m_bytes = rows * head_dim * 4
    return [
        Case("engram_sinkhorn_step", f"{rows}x{head_dim} fp32", m_bytes + rows * 12, matrix, step(tkaot),
             tile_kernels=lambda t, a: step(t)(a)),
        Case("engram_sinkhorn_step_reduce", f"{partials}x{head_dim} fp32", (partials + 1) * head_dim * 4, partial_sums, reduce(tkaot),
             tile_kernels=lambda t, a: reduce(t)(a)),
        Case("engram_sinkhorn_finalize", f"{rows}x{head_dim} fp32", 2 * m_bytes + rows * 4, matrix, finalize(tkaot),
             tile_kernels=lambda t, a: finalize(t)(a)),
        Case("engram_sinkhorn_momentum_update", f"{numel} fp32 grad, bf16 momentum, nesterov", numel * (4 + 2 * 2 + 4), momentum,
             update(tkaot), tile_kernels=lambda t, a: update(t)(a)),
    ]  # fmt: skip


def cases() -> list[Case]:
    return [*_gate_cases(), _reduce_case(), _fused_weight_case(), _hash_case(), *_sinkhorn_cases()]
