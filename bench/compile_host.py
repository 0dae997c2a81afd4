"""Host cost of the custom-op path (what a compiled graph without CUDA graphs calls) beside the direct call, on CPU.

The direct call is the public op (tkaot.quant.norm_forward(...)); the custom-op path is torch.ops.tkaot.<op>.o<n>(...):
the dispatcher, then the op's real kernel (tkaot/_compile.py: written per op from its schema, it converts the arguments
back, calls the public op and picks the new tensors out). All run on the no-driver CPU
setup of bench.host_overhead; the decode step of bench.decode too, eager and as the graph of custom ops Dynamo captures
(run as is, no Inductor): the per-step cost of the custom-op path. For scale, the dispatch alone of a do-nothing op
registered both ways: torch.library.custom_op, and the lower-level torch.library.Library.impl tkaot uses.

    TKAOT_HOST_CLOCK=cpu python -m bench.compile_host
"""

from __future__ import annotations

import json

import torch

from bench.host_overhead import patch_for_cpu, per_call_us


def cases() -> dict:
    import tkaot

    x = torch.randn(1, 7168, dtype=torch.bfloat16)
    w = torch.randn(7168, dtype=torch.bfloat16)
    logits = torch.randn(1, 256)
    ops = torch.ops.tkaot
    out = {
        "norm_forward direct": lambda: tkaot.quant.norm_forward(x, w, 1e-6),
        "norm_forward torch.ops": lambda: ops.norm_forward.o1(x, w, 1e-6, None, 1.0, None, None, False),
        "per_token_cast direct": lambda: tkaot.quant.per_token_cast(x, "e4m3", 128),
        "per_token_cast torch.ops": lambda: ops.per_token_cast.o2([x], "e4m3", 128, None, False, False, False, False, False, None, None),
        "moe_topk_gate_forward direct": lambda: tkaot.moe.moe_topk_gate_forward(logits, 8, False, 0, 2.5, 0),
        "moe_topk_gate_forward torch.ops": lambda: ops.moe_topk_gate_forward.o2(logits, 8, False, 0, 2.5, 0, "sqrtsoftplus", *[None] * 12),
    }

    @torch.library.custom_op("tkaot_bench::noop_custom_op", mutates_args=())
    def noop_custom_op(t: torch.Tensor) -> torch.Tensor:
        return t.new_empty(0)

    library = torch.library.Library("tkaot_bench", "FRAGMENT")
    library.define("noop_library(Tensor t) -> Tensor")
    library.impl("noop_library", lambda t: t.new_empty(0), "CompositeExplicitAutograd")
    out["dispatch floor: custom_op"] = lambda: torch.ops.tkaot_bench.noop_custom_op(x)
    out["dispatch floor: Library.impl"] = lambda: torch.ops.tkaot_bench.noop_library.default(x)
    out["no dispatch: the same python call"] = lambda: x.new_empty(0)
    out["_keep"] = library  # the registration lives as long as the cases
    out.update(step_cases())
    return out


def step_cases() -> dict:
    """bench.decode's step over CPU stand-ins: eager, and the graph of custom ops Dynamo captures, called directly."""
    from bench import decode

    state = {k: v.normal_() if v.is_floating_point() else v.zero_() for k, v in decode.empty_state(1, device="cpu").items()}
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(decode.step, fullgraph=True, backend=backend)(state)
    (gm,) = graphs
    args = [state[node.target[len("L_s_") : -1]] for node in gm.graph.nodes if node.op == "placeholder"]
    return {"decode step (6 ops) direct": lambda: decode.step(state), "decode step (6 ops) torch.ops": lambda: gm.forward(*args)}


def main() -> None:
    patch_for_cpu()
    import tkaot

    result = {"launcher": tkaot.launcher_kind()}
    for name, fn in cases().items():
        if not name.startswith("_"):
            result[name] = round(per_call_us(fn, n=1000 if name.startswith("decode") else 20000), 3)
    print(json.dumps(result, indent=1))
    print("case | µs | over direct")
    for name, us in result.items():
        if name == "launcher":
            continue
        direct = result.get(name.replace("torch.ops", "direct")) if name.endswith("torch.ops") else None
        over = f"{us - direct:+.1f}" if direct is not None else ""
        print(f"{name} | {us:.1f} | {over}")


if __name__ == "__main__":
    main()
