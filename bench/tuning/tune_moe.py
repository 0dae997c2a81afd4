"""Time every built tiling of the MoE selecting kernels at 8192x256 top-8 (one shared slot).

Each candidate is launched straight from its artifact entry (the op itself launches
only its fixed tiling), checked once against the pure-torch reference, then timed
by CUDA-graph replay over rotating input sets larger than L2.

    TKAOT_PATH=<dir with the candidates> python -m bench.tuning.tune_moe
"""

from __future__ import annotations

import time

import torch

from bench.timing import device_us
from tkaot import moe
from tkaot._moe import ops as moe_ops
from tkaot._op import current_stream
from tkaot.errors import VariantNotBuilt
from tkaot.reference import moe as ref

TOKENS, EXPERTS, TOPK, SHARED, SCALE = 8192, 256, 8, 1, 2.5
TILINGS = ("pair4", "ballot2", "ballot4", "ballot8")  # kernels_src/moe/common.TILINGS, without importing TileLang
SETS = 4  # 4 x 8 MiB of logits, past the 50 MiB L2 together with outputs


def launcher(ops: moe.OpKernels, tiling: str, device: int):
    try:
        return ops.get(device, EXPERTS, TOPK, tiling)
    except VariantNotBuilt:
        return None


def gate_call(launch, device: int):
    def call(io: dict) -> None:
        launch(
            device, current_stream(device),
            io["logits"].data_ptr(), 0, 0, 0, 0, 0, 0, 0, 0, io["idx"].data_ptr(), io["weights"].data_ptr(), 0, 0,
            SHARED, SCALE, 0, 0,
            TOKENS, 0, 0, TOPK + SHARED, 0,
        )  # fmt: skip

    return call


def topk_call(launch, device: int):
    def call(io: dict) -> None:
        launch(device, current_stream(device), io["logits"].data_ptr(), io["idx"].data_ptr(), TOKENS)

    return call


def main() -> None:
    start = time.perf_counter()
    device = torch.cuda.current_device()
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = []
    for _ in range(SETS):
        logits = torch.randn(TOKENS, EXPERTS, device="cuda", generator=gen)
        logits[:64, 7::16] = logits[:64, 3:4]  # some exact ties
        inputs.append(
            dict(
                logits=logits,
                idx=torch.empty(TOKENS, TOPK + SHARED, dtype=torch.int64, device="cuda"),
                weights=torch.empty(TOKENS, TOPK + SHARED, device="cuda"),
            )
        )
    want = ref.moe_topk_gate_forward(inputs[0]["logits"], TOPK, True, SHARED, SCALE, 0)
    want_topk = ref.topk_gate(inputs[0]["logits"], TOPK)
    topk_inputs = [dict(logits=d["logits"], idx=torch.empty(TOKENS, TOPK, dtype=torch.int64, device="cuda")) for d in inputs]

    print(f"{'kernel':15s} {'tiling':8s} {'check':6s} {'µs':>7s}  mode")
    for name, ops, make, sets in (
        ("moe_topk_gate", moe_ops._GATE, gate_call, inputs),
        ("topk_gate", moe_ops._TOPK, topk_call, topk_inputs),
    ):
        for tiling in TILINGS:
            launch = launcher(ops, tiling, device)
            if launch is None:
                print(f"{name:15s} {tiling:8s} not built")
                continue
            call = make(launch, device)
            io = sets[0]
            io["idx"].fill_(-7)
            if "weights" in io:
                io["weights"].fill_(float("nan"))
            call(io)
            torch.cuda.synchronize()
            if "weights" in io:
                # indices exactly; weights as the GPU tests take them (the reference's softplus is torch's)
                exact = torch.equal(io["idx"], want.topk_idx) and torch.allclose(io["weights"], want.topk_weights, rtol=1e-6, atol=1e-7)
            else:
                exact = torch.equal(io["idx"], want_topk)
            us, mode = device_us(call, sets, reps=30)
            print(f"{name:15s} {tiling:8s} {'yes' if exact else 'NO':6s} {us:7.2f}  {mode}")
    print(f"op defaults: moe_topk_gate {moe_ops._GATE_TILING}, topk_gate {moe_ops._TOPK_TILING}; {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
