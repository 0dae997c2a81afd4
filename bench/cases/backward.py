"""Backward (training) cases beside TileKernels: RMSNorm backward, SwiGLU backward (+ per-token FP8 cast), the MoE
gate's backward, and randn. `python -m bench.run --families backward` measures them."""

import torch

import tkaot
from bench.cases import Case

TOKENS, HIDDEN = 8192, 7168
# The widths of the default set's rmsnorm_backward_plain (the calls with neither a weight nor a residual gradient)
NO_WEIGHT_WIDTHS = (7168, 512, 1536, 2048, 4096, 5120, 8192)


def _norm_cases() -> list[Case]:
    def make(residual: bool, dtype=torch.bfloat16, hidden=HIDDEN):
        def inputs():
            x = torch.randn(TOKENS, hidden, dtype=dtype, device="cuda")
            a = {"dy": torch.randn_like(x), "x": x, "w": torch.rand(hidden, dtype=dtype, device="cuda") + 0.5}
            a["rstd"] = torch.rsqrt(x.float().square().mean(-1) + 1e-6)
            a["dr"] = torch.randn_like(x) if residual else None
            return a

        return inputs

    def torch_norm_backward(a):  # the same math, unfused
        xhat = a["x"].float() * a["rstd"][:, None]
        gw = a["dy"].float() * a["w"].float()
        return ((gw - xhat * (xhat * gw).mean(-1, keepdim=True)) * a["rstd"][:, None]).to(a["x"].dtype), (xhat * a["dy"].float()).sum(0)

    row = TOKENS * HIDDEN * 2
    # Calls the default set serves on the generic rmsnorm_backward (fp32 activations; a width with no specialised
    # variant): (shape, dtype, hidden)
    generic = [(f"{TOKENS}x{HIDDEN} fp32, weight (generic tier)", torch.float32, HIDDEN),
               (f"{TOKENS}x3168 bf16, weight (generic tier)", torch.bfloat16, 3168)]  # fmt: skip
    return [
        *(
            Case(
                op="norm_backward",
                shape=shape,
                bytes=3 * TOKENS * hidden * dtype.itemsize + TOKENS * 4 + hidden * (dtype.itemsize + 4),
                make=make(False, dtype, hidden),
                tkaot=lambda a: tkaot.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"]),
                torch=torch_norm_backward,
                tile_kernels=lambda tk, a: tk.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"]),
            )
            for shape, dtype, hidden in generic
        ),
        Case(
            op="norm_backward",
            shape=f"{TOKENS}x{HIDDEN} bf16, weight",
            bytes=3 * row + TOKENS * 4 + HIDDEN * 4,
            make=make(False),
            tkaot=lambda a: tkaot.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"]),
            torch=torch_norm_backward,
            tile_kernels=lambda tk, a: tk.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"]),
        ),
        *(
            Case(
                op="norm_backward",
                shape=f"{TOKENS}x{hidden} bf16, no weight",
                bytes=3 * TOKENS * hidden * 2 + TOKENS * 4,
                make=make(False, torch.bfloat16, hidden),
                tkaot=lambda a: tkaot.quant.norm_backward(a["dy"], a["x"], None, a["rstd"]),
                tile_kernels=lambda tk, a: tk.quant.norm_backward(a["dy"], a["x"], None, a["rstd"]),
            )
            for hidden in NO_WEIGHT_WIDTHS
        ),
        Case(
            op="norm_backward",
            shape=f"{TOKENS}x{HIDDEN} bf16, weight + residual grad",
            bytes=4 * row + TOKENS * 4 + HIDDEN * 4,
            make=make(True),
            tkaot=lambda a: tkaot.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"], a["dr"]),
            tile_kernels=lambda tk, a: tk.quant.norm_backward(a["dy"], a["x"], a["w"], a["rstd"], a["dr"]),
        ),
    ]


def _swiglu_cases() -> list[Case]:
    hidden = 4096  # x is (tokens, 2 * intermediate): 8192 x 8192

    def make_bf16():
        w = torch.rand(TOKENS, device="cuda")
        x = torch.randn(TOKENS, 2 * hidden, dtype=torch.bfloat16, device="cuda")
        return {"x": x, "dy": torch.randn(TOKENS, hidden, dtype=torch.bfloat16, device="cuda"), "w": w}

    def make_fp8():
        a = make_bf16()
        sf = torch.rand(TOKENS, 2 * hidden // 128, device="cuda") + 0.01
        a["xq"] = ((a["x"].float() / sf.repeat_interleave(128, -1)).clamp(-448, 448).to(torch.float8_e4m3fn), sf)
        a["dy32"] = a["dy"].float()
        return a

    def make_fp32():
        a = make_bf16()
        a["x32"], a["dy32"] = a["x"].float(), a["dy"].float()
        return a

    def torch_swiglu_backward(a):
        g, u = a["x"][:, :hidden].float(), a["x"][:, hidden:].float()
        s = torch.sigmoid(g)
        dy = a["dy"].float()
        return torch.cat([dy * s * u * (1 + g * (1 - s)), dy * s * g], 1).bfloat16()

    bf16 = TOKENS * 2 * hidden * 2 + TOKENS * hidden * 2
    return [
        Case(
            op="swiglu_backward",
            shape=f"{TOKENS}x{2 * hidden} bf16 -> bf16",
            bytes=bf16 + TOKENS * 2 * hidden * 2,  # x and dy read, x_grad written
            make=make_bf16,
            tkaot=lambda a: tkaot.quant.swiglu_backward(a["x"], a["dy"], "bf16"),
            torch=torch_swiglu_backward,
            tile_kernels=lambda tk, a: tk.quant.swiglu_backward(a["x"], a["dy"], "bf16"),
        ),
        Case(
            op="swiglu_backward",
            shape=f"{TOKENS}x{2 * hidden} bf16 -> bf16, weights + recompute",
            bytes=bf16 + TOKENS * 2 * hidden * 2 + TOKENS * hidden * 2 + TOKENS * 8,
            make=make_bf16,
            tkaot=lambda a: tkaot.quant.swiglu_backward(a["x"], a["dy"], "bf16", topk_weights=a["w"], do_recompute=True),
            tile_kernels=lambda tk, a: tk.quant.swiglu_backward(a["x"], a["dy"], "bf16", topk_weights=a["w"], do_recompute=True),
        ),
        *(
            Case(
                op="swiglu_backward_and_per_token_cast",
                shape=f"{TOKENS}x{2 * hidden} e4m3/128{label} -> bf16 + e4m3/128",
                bytes=TOKENS * 2 * hidden * (1 + 2 + 1) + TOKENS * hidden * grad_bytes + TOKENS * (2 * hidden // 128) * 8,
                make=make_fp8,
                tkaot=lambda a, dy=dy: tkaot.quant.swiglu_backward_and_per_token_cast(a["xq"], a[dy], "e4m3", 128),
                tile_kernels=lambda tk, a, dy=dy: tk.quant.swiglu_backward_and_per_token_cast(a["xq"], a[dy], "e4m3", 128),
            )
            for dy, label, grad_bytes in (("dy", "", 2), ("dy32", ", fp32 grad", 4))
        ),
        Case(
            op="swiglu_backward_and_per_token_cast",
            shape=f"{TOKENS}x{2 * hidden} fp32 x, bf16 grad -> bf16",
            bytes=TOKENS * 2 * hidden * (4 + 2) + TOKENS * hidden * 2,
            make=make_fp32,
            tkaot=lambda a: tkaot.quant.swiglu_backward_and_per_token_cast(a["x32"], a["dy"], "bf16", 128),
            tile_kernels=lambda tk, a: tk.quant.swiglu_backward_and_per_token_cast(a["x32"], a["dy"], "bf16", 128),
        ),
        Case(
            op="swiglu_backward",
            shape=f"{TOKENS}x{2 * hidden} fp32 -> fp32",
            bytes=TOKENS * 2 * hidden * (4 + 4) + TOKENS * hidden * 4,
            make=make_fp32,
            tkaot=lambda a: tkaot.quant.swiglu_backward(a["x32"], a["dy32"], "fp32"),
            tile_kernels=lambda tk, a: tk.quant.swiglu_backward(a["x32"], a["dy32"], "fp32"),
        ),
    ]


def _gate_cases() -> list[Case]:
    experts, topk = 256, 8

    def make(aux: bool):
        def inputs():
            scores = torch.nn.functional.softplus(torch.randn(TOKENS, experts, device="cuda")).sqrt()
            idx = torch.argsort(torch.rand(TOKENS, experts, device="cuda"), dim=1)[:, :topk].contiguous()
            a = {"args": (scores, idx, torch.rand(TOKENS, topk, device="cuda"), torch.randn(TOKENS, topk, device="cuda"), 2.5)}
            a["kw"] = (
                {"mask": torch.ones(TOKENS, dtype=torch.bool, device="cuda"), "grad_scores_sum": torch.randn(4, experts, device="cuda")}
                if aux
                else {}
            )
            return a

        return inputs

    return [
        Case(
            op="moe_topk_gate_backward",
            shape=f"{TOKENS}x{experts}, top-{topk}" + (", aux" if aux else ""),
            bytes=TOKENS * experts * 8 + TOKENS * topk * 16,
            make=make(aux),
            tkaot=lambda a: tkaot.moe.moe_topk_gate_backward(*a["args"], **a["kw"]),
            tile_kernels=lambda tk, a: tk.moe.moe_topk_gate_backward(*a["args"], **a["kw"]),
        )
        for aux in (False, True)
    ]


def _rand_cases() -> list[Case]:
    return [
        Case(
            op="randn",
            shape=f"{TOKENS}x{HIDDEN} bf16",
            bytes=TOKENS * HIDDEN * 2,
            make=lambda: {},
            tkaot=lambda a: tkaot.rand.randn(TOKENS, HIDDEN, dtype=torch.bfloat16),
            torch=lambda a: torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16, device="cuda"),
            tile_kernels=lambda tk, a: tk.rand.randn(TOKENS, HIDDEN, dtype=torch.bfloat16),
        )
    ]


def cases() -> list[Case]:
    return _norm_cases() + _swiglu_cases() + _gate_cases() + _rand_cases()
