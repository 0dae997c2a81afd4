"""MoE routing cases: the gate at DeepSeek-V3's shape (256 experts, top-8, one shared slot, bias)."""

import torch
import torch.nn.functional as F

import tkaot
from bench.cases import Case

EXPERTS, TOPK, SHARED, SCALE = 256, 8, 1, 2.5


def _torch_gate(a):
    scores = F.softplus(a["logits"]).sqrt()
    idx = torch.topk(scores + a["bias"], TOPK, dim=1).indices
    chosen = scores.gather(1, idx)
    return idx, chosen / (chosen.sum(dim=1, keepdim=True) + 1e-20) * SCALE


def cases() -> list[Case]:
    out = []
    for tokens, host in ((8192, False), (1, True)):

        def make(tokens=tokens):
            return {
                "logits": torch.randn(tokens, EXPERTS, device="cuda"),
                "bias": torch.randn(EXPERTS, device="cuda") * 0.1,
            }

        out.append(
            Case(
                op="moe_topk_gate_forward",
                shape=f"{tokens}x{EXPERTS} fp32 top-{TOPK}+{SHARED}",
                bytes=tokens * EXPERTS * 4 + EXPERTS * 4 + tokens * (TOPK + SHARED) * (8 + 4),
                make=make,
                tkaot=lambda a: tkaot.moe.moe_topk_gate_forward(a["logits"], TOPK, True, SHARED, SCALE, 0, bias=a["bias"]),
                torch=_torch_gate,
                tile_kernels=lambda tk, a: tk.moe.moe_topk_gate_forward(a["logits"], TOPK, True, SHARED, SCALE, 0, bias=a["bias"]),
                host_timing=host,
            )
        )

    def make_scores():
        return {"scores": torch.randn(8192, EXPERTS, device="cuda")}

    out.append(
        Case(
            op="topk_gate",
            shape=f"8192x{EXPERTS} fp32 top-{TOPK}",
            bytes=8192 * EXPERTS * 4 + 8192 * TOPK * 8,
            make=make_scores,
            tkaot=lambda a: tkaot.moe.topk_gate(a["scores"], TOPK),
            torch=lambda a: torch.topk(a["scores"], TOPK, dim=1).indices,
            tile_kernels=lambda tk, a: tk.moe.topk_gate(a["scores"], TOPK),
        )
    )
    return out
