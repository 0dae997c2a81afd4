"""A tensor-parallel toy step on several GPUs: run with `torchrun --nproc-per-node 2 tests/gpu/tp_step.py`.

Each rank launches on its own GPU (cuda:<local rank>, the current device set only for NCCL): RMSNorm of its partial
activations -> FP8 per-token cast -> cast back to fp32 -> all-reduce (sum) over the ranks. Every rank draws every
rank's input (one seed each), so it checks the reduced result against (a) the same tkaot pipeline run locally on all
inputs, summed in rank order (bit for bit: a sum of two fp32 values does not depend on the order), and (b) the pure-torch
references (norm and cast bit for bit, the sum as above). Prints one line per rank; exits non-zero on a mismatch.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import tkaot

TOKENS, HIDDEN, GROUP = 127, 7168, 128


def inputs(rank: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cpu").manual_seed(1000 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16)
    w = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)  # the same weight on every rank
    return x.to(device), w.to(device)


def pipeline(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y, _, _ = tkaot.quant.norm_forward(x, w, 1e-6)
    data, sf = tkaot.quant.per_token_cast(y, "e4m3", GROUP)
    return tkaot.quant.per_token_cast_back((data, sf), "fp32", GROUP)


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    from tkaot.reference import norm_forward, quant

    y, _, _ = norm_forward(x, w, 1e-6)
    data, sf = quant.per_token_cast(y, "e4m3", GROUP)
    return quant.per_token_cast_back((data, sf), "fp32", GROUP)


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    x, w = inputs(rank, device)
    tkaot.preload(device=device)
    reduced = pipeline(x, w)
    assert reduced.device == device
    dist.all_reduce(reduced)
    torch.cuda.synchronize(device)
    local = [pipeline(*inputs(r, device)) for r in range(world)]
    refs = [reference(*inputs(r, device)) for r in range(world)]
    expected, expected_ref = local[0].clone(), refs[0].clone()
    for r in range(1, world):
        expected += local[r]
        expected_ref += refs[r]
    same_local = torch.equal(reduced, expected)
    same_ref = all(torch.equal(a, b) for a, b in zip(local, refs)) and torch.equal(reduced, expected_ref)
    print(f"rank {rank}/{world} on {device}: all-reduced step equals local pipeline: {same_local}, references: {same_ref}", flush=True)
    dist.destroy_process_group()
    return 0 if same_local and same_ref else 1


if __name__ == "__main__":
    sys.exit(main())
