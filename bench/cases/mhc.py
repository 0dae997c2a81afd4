"""mHC cases at DeepSeek's shape: 8192 tokens, hidden 7168, expansion 4, bf16 streams and fp32 mixes (the issue's
anchors, H200 TileKernels: mhc_sinkhorn_fwd 20 repeats 25.9 µs, expand_to_mhc_fwd 161.9 µs, mhc_post_fwd 259.6 µs).
`bytes` counts each input read once and each output written once (in-place buffers both), scratch not counted;
bench/run.py reports each row against the copy ceiling it measures in the same run. mhc_post_fwd also at 1 token,
for host µs a call."""

import torch

import tkaot
from bench.cases import Case

TOKENS, HIDDEN, MHC, REPEAT, EPS = 8192, 7168, 4, 20, 1e-6
MIXES = MHC * (MHC + 2)
BF16, F32 = 2, 4  # bytes an element


def _streams(n: int = TOKENS) -> torch.Tensor:
    return torch.randn(n, MHC, HIDDEN, device="cuda").bfloat16()


def _row(n: int = TOKENS) -> torch.Tensor:
    return torch.randn(n, HIDDEN, device="cuda").bfloat16()


def _mix(*shape) -> torch.Tensor:
    return torch.rand(*shape, device="cuda") * 2


def _stream_cases() -> list[Case]:
    row, streams, mix = TOKENS * HIDDEN * BF16, TOKENS * MHC * HIDDEN * BF16, TOKENS * MHC * F32
    shape = f"{TOKENS}x{MHC}x{HIDDEN} bf16"
    return [
        Case(
            op="expand_to_mhc_fwd", shape=shape, bytes=row + streams,
            make=lambda: {"x": _row(), "o": torch.empty(TOKENS, MHC, HIDDEN, dtype=torch.bfloat16, device="cuda")},
            tkaot=lambda a: tkaot.mhc.expand_to_mhc_fwd(a["x"], a["o"]),
            torch=lambda a: a["o"].copy_(a["x"].unsqueeze(1).expand(-1, MHC, -1)),
            tile_kernels=lambda tk, a: tk.mhc.expand_to_mhc_fwd(a["x"], a["o"]),
        ),
        Case(
            op="expand_to_mhc_bwd", shape=shape, bytes=streams + row,
            make=lambda: {"o_grad": _streams(), "x_grad": _row()},
            tkaot=lambda a: tkaot.mhc.expand_to_mhc_bwd(a["o_grad"], a["x_grad"]),
            torch=lambda a: torch.sum(a["o_grad"], dim=1, out=a["x_grad"]),
            tile_kernels=lambda tk, a: tk.mhc.expand_to_mhc_bwd(a["o_grad"], a["x_grad"]),
        ),
        Case(
            op="mhc_pre_apply_mix_fwd", shape=shape, bytes=streams + mix + row,
            make=lambda: {"x": _streams(), "mix": _mix(TOKENS, MHC), "o": _row()},
            tkaot=lambda a: tkaot.mhc.mhc_pre_apply_mix_fwd(a["x"], a["mix"], a["o"]),
            torch=lambda a: a["o"].copy_((a["x"] * a["mix"].unsqueeze(-1)).sum(1)),
            tile_kernels=lambda tk, a: tk.mhc.mhc_pre_apply_mix_fwd(a["x"], a["mix"], a["o"]),
        ),
        Case(
            op="mhc_pre_apply_mix_bwd", shape=shape, bytes=row + 3 * streams + 2 * mix,
            make=lambda: {"o_grad": _row(), "x": _streams(), "mix": _mix(TOKENS, MHC), "x_grad": _streams()},
            tkaot=lambda a: tkaot.mhc.mhc_pre_apply_mix_bwd(a["o_grad"], a["x"], a["mix"], a["x_grad"]),
            tile_kernels=lambda tk, a: tk.mhc.mhc_pre_apply_mix_bwd(a["o_grad"], a["x"], a["mix"], a["x_grad"]),
        ),
    ]  # fmt: skip


def _split_cases() -> list[Case]:
    def fwd_inputs():
        return {
            "im": torch.randn(TOKENS, MIXES, device="cuda"), "scale": torch.rand(3, device="cuda"),
            "base": torch.randn(MIXES, device="cuda"), "pre": torch.empty(TOKENS, MHC, device="cuda"),
            "post": torch.empty(TOKENS, MHC, device="cuda"), "comb": torch.empty(TOKENS, MHC * MHC, device="cuda"),
        }  # fmt: skip

    def bwd_inputs():
        a = fwd_inputs()
        a.update(post=_mix(TOKENS, MHC), im_grad=torch.empty_like(a["im"]), scale_grad=torch.empty(3, device="cuda"),
                 base_grad=torch.empty(MIXES, device="cuda"), pre_g=torch.randn(TOKENS, MHC, device="cuda"),
                 post_g=torch.randn(TOKENS, MHC, device="cuda"), comb_g=torch.randn(TOKENS, MHC * MHC, device="cuda"))  # fmt: skip
        return a

    def fwd(lib, a):
        lib.mhc.mhc_pre_split_mixes_fwd(a["im"], a["scale"], a["base"], a["pre"], a["post"], a["comb"], 2.0, EPS)

    def bwd(lib, a):
        lib.mhc.mhc_pre_split_mixes_bwd(
            a["pre_g"], a["post_g"], a["comb_g"], a["im"], a["post"], a["scale"], a["base"], a["im_grad"], a["scale_grad"],
            a["base_grad"], 2.0,
        )  # fmt: skip

    rows = TOKENS * MIXES * F32
    return [
        Case("mhc_pre_split_mixes_fwd", f"{TOKENS}x{MIXES} fp32", 2 * rows, fwd_inputs, lambda a: fwd(tkaot, a),
             tile_kernels=fwd),
        Case("mhc_pre_split_mixes_bwd", f"{TOKENS}x{MIXES} fp32", 3 * rows + TOKENS * MHC * F32, bwd_inputs,
             lambda a: bwd(tkaot, a), tile_kernels=bwd),
    ]  # fmt: skip


def _sinkhorn_cases() -> list[Case]:
    matrices = TOKENS * MHC * MHC * F32

    def inputs():
        return {"x": torch.randn(TOKENS, MHC, MHC, device="cuda"), "g": torch.randn(TOKENS, MHC, MHC, device="cuda"),
                "out": torch.empty(TOKENS, MHC, MHC, device="cuda")}  # fmt: skip

    shape = f"{TOKENS}x{MHC}x{MHC} fp32, {REPEAT} repeats"
    return [
        Case("mhc_sinkhorn_fwd", shape, 2 * matrices, inputs,
             lambda a: tkaot.mhc.mhc_sinkhorn_fwd(a["x"], a["out"], REPEAT, EPS),
             tile_kernels=lambda tk, a: tk.mhc.mhc_sinkhorn_fwd(a["x"], a["out"], REPEAT, EPS)),
        Case("mhc_sinkhorn_bwd", shape, 3 * matrices, inputs,
             lambda a: tkaot.mhc.mhc_sinkhorn_bwd(a["g"], a["x"], a["out"], REPEAT, EPS),
             tile_kernels=lambda tk, a: tk.mhc.mhc_sinkhorn_bwd(a["g"], a["x"], a["out"], REPEAT, EPS)),
    ]  # fmt: skip


def _post_inputs(tokens: int) -> dict:
    return {
        "x": _row(tokens).unsqueeze(0), "residual": _streams(tokens).unsqueeze(0), "post": _mix(1, tokens, MHC, 1),
        "comb": torch.randn(1, tokens, MHC, MHC, device="cuda") * 0.5, "d_o": _streams(tokens).unsqueeze(0),
    }  # fmt: skip


def _torch_post(a):
    merged = torch.einsum("...io,...ih->...oh", a["comb"], a["residual"].float())
    return (a["post"] * a["x"].unsqueeze(-2) + merged).bfloat16()


def _post_cases() -> list[Case]:
    out = []
    for tokens, host in ((TOKENS, False), (1, True)):
        row, streams = tokens * HIDDEN * BF16, tokens * MHC * HIDDEN * BF16
        mixes = tokens * (MHC * MHC + MHC) * F32
        out.append(
            Case(
                op="mhc_post_fwd", shape=f"{tokens}x{MHC}x{HIDDEN} bf16", bytes=row + 2 * streams + mixes,
                make=lambda tokens=tokens: _post_inputs(tokens),
                tkaot=lambda a: tkaot.mhc.mhc_post_fwd(a["x"], a["residual"], a["post"], a["comb"]),
                torch=_torch_post,
                tile_kernels=lambda tk, a: tk.mhc.mhc_post_fwd(a["x"], a["residual"], a["post"], a["comb"]),
                host_timing=host,
            )
        )  # fmt: skip
    row, streams = TOKENS * HIDDEN * BF16, TOKENS * MHC * HIDDEN * BF16
    out.append(
        Case(
            op="mhc_post_bwd", shape=f"{TOKENS}x{MHC}x{HIDDEN} bf16",
            bytes=2 * row + 3 * streams + 2 * TOKENS * (MHC * MHC + MHC) * F32,
            make=lambda: _post_inputs(TOKENS),
            tkaot=lambda a: tkaot.mhc.mhc_post_bwd(a["x"], a["residual"], a["post"], a["comb"], a["d_o"]),
            tile_kernels=lambda tk, a: tk.mhc.mhc_post_bwd(a["x"], a["residual"], a["post"], a["comb"], a["d_o"]),
        )
    )  # fmt: skip
    return out


def cases() -> list[Case]:
    return [*_stream_cases(), *_split_cases(), *_sinkhorn_cases(), *_post_cases()]
