"""RMSNorm cases."""

import torch

import tkaot
from bench.cases import Case


def cases() -> list[Case]:
    out = []
    for tokens, hidden, host in ((8192, 7168, False), (1, 7168, True), (4096, 4096, False)):

        def make(tokens=tokens, hidden=hidden):
            return {
                "x": torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda"),
                "w": torch.randn(hidden, dtype=torch.bfloat16, device="cuda"),
            }

        out.append(
            Case(
                op="norm_forward",
                shape=f"{tokens}x{hidden} bf16",
                bytes=2 * tokens * hidden * 2 + hidden * 2,
                make=make,
                tkaot=lambda a: tkaot.quant.norm_forward(a["x"], a["w"], 1e-6),
                torch=lambda a: torch.nn.functional.rms_norm(a["x"], (a["x"].shape[-1],), a["w"], 1e-6),
                tile_kernels=lambda tk, a: tk.quant.norm_forward(a["x"], a["w"], 1e-6),
                host_timing=host,
            )
        )
    return out
