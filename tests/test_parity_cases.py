"""The parity cases (tests/parity_cases.py), checked without a GPU: every case is a call tkaot accepts.

Each case is built on the meta device (shapes, dtypes and strides, no values) and made to tkaot with a fake device:
meta tensors read as CUDA device 0, the registry believes it is an sm90 GPU and reads this checkout's artifact sets,
and every kernel launches into a recorder. A case either reaches built variants (recorded) or raises VariantNotBuilt
(a miss: the parity run on a GPU fails on it until the variant is built); a ValueError or TypeError means tkaot
refuses a call TileKernels accepts, which fails here unless it is listed in KNOWN_REFUSALS with the TileKernels
source that accepts it. The comparison helpers (tests/parity_compare.py) are checked on CPU tensors.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import tkaot
from tests import parity_cases, parity_compare
from tkaot import _decl, _kernel, _op
from tkaot.registry import Registry

ROOT = Path(__file__).resolve().parent.parent

# tkaot refusing calls TileKernels 2.1.0 accepts: (op, a fragment of tkaot's message) -> where TileKernels takes it.
# Each is a gap in tkaot, listed so that the suite stays green until it is closed (an entry no case meets fails).
KNOWN_REFUSALS: dict[tuple[str, str], str] = {
    ("quant.norm_forward_and_per_token_cast", "mega_moe_sf must be None"): "norm_forward_kernel.py:128-137 take mega_moe_sf on CUDA",
}


@pytest.fixture
def fake_sm90(monkeypatch):
    """Meta tensors as CUDA tensors of device 0, a fresh registry on sm90, kernels bound to a recorder."""
    get_device = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "meta" else get_device(self))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: self.device.type in ("cuda", "meta")))
    monkeypatch.delenv("TKAOT_PATH", raising=False)
    registry = Registry()
    monkeypatch.setattr(registry, "device_arch", lambda index: "sm90")
    monkeypatch.setattr(_op, "REGISTRY", registry)
    launches: list[str] = []

    def bind(self, arg_names, kind=None, pdl=None, fixed=None):
        # fixed: a generic variant's runtime axes, bound once; the op passes the values of arg_names alone
        def launch(device, stream, *values):
            assert len(values) == len(arg_names), f"{self}: {len(values)} values for {len(arg_names)} arguments"
            launches.append(f"{self.kernel}[{self.key}]")

        return launch

    monkeypatch.setattr(_kernel.Kernel, "bind", bind)
    from tkaot._quant import weight_casts

    monkeypatch.setattr(weight_casts, "_values_unchecked", lambda: True)  # meta tensors hold no values to check
    for family in (getattr(tkaot, name) for name in _decl.FAMILIES):
        for name in family.__all__:
            getattr(family, name)  # load every op module before patching them
    from tkaot._engram import device as engram_device

    monkeypatch.setattr(engram_device, "sm_count", lambda device: 132)  # an H200's
    for name, module in list(sys.modules.items()):
        if not name.startswith("tkaot"):
            continue
        if hasattr(module, "current_stream"):
            monkeypatch.setattr(module, "current_stream", lambda device: 0)
        for value in list(vars(module).values()):
            for kernels in value.values() if isinstance(value, dict) else (value,):
                if isinstance(kernels, _op.OpKernels):
                    monkeypatch.setattr(kernels, "cache", {})  # launchers bound here must not outlive the test
    return launches


def run_on_meta(case, launches: list[str]) -> tuple[str, str]:
    """(outcome, detail): ("variant", the kernels launched), ("miss", the key), or ("refused", the message)."""
    call = case.build("meta")
    launches.clear()
    try:
        parity_cases.resolve(tkaot, case.op)(*call.args, **call.kwargs)
    except tkaot.VariantNotBuilt as miss:
        return "miss", f"{miss.kernel}[{miss.key}]"
    except (ValueError, TypeError) as refusal:
        return "refused", str(refusal).splitlines()[0]
    return "variant", ", ".join(launches) or "(no kernel)"


def known(op: str, message: str) -> bool:
    return any(o == op and fragment in message for o, fragment in KNOWN_REFUSALS)


@pytest.mark.parametrize("op", parity_cases.ops())
def test_every_case_is_a_call_tkaot_accepts(fake_sm90, op, capsys):
    cases = parity_cases.cases(op)
    outcomes = [(case, *run_on_meta(case, fake_sm90)) for case in cases]
    counts = Counter(outcome for _, outcome, _ in outcomes)
    with capsys.disabled():
        print(f"\n{op}: {len(cases)} cases, {counts['variant']} reach built variants, {counts['miss']} would miss, "
              f"{counts['refused']} refused")  # fmt: skip
        for case, outcome, detail in outcomes:
            if outcome != "variant":
                print(f"    {outcome}: {case.label}\n        {detail}")
    refused = [f"{case.label}: {detail}" for case, outcome, detail in outcomes if outcome == "refused" and not known(op, detail)]
    assert not refused, f"tkaot refuses {len(refused)} calls TileKernels accepts:\n" + "\n".join(refused)


def test_every_known_refusal_is_still_met(fake_sm90, monkeypatch):
    """Each KNOWN_REFUSALS entry is met by some case of the first ten seeds (else it is fixed: drop it)."""
    met = set()
    for seed in range(10):
        monkeypatch.setattr(parity_cases, "SEED", seed)
        for op in {op for op, _ in KNOWN_REFUSALS}:
            for case in parity_cases.cases(op):
                outcome, detail = run_on_meta(case, fake_sm90)
                met |= {(o, fragment) for o, fragment in KNOWN_REFUSALS if o == op and outcome == "refused" and fragment in detail}
    assert set(KNOWN_REFUSALS) - met == set()


@pytest.mark.parametrize("op", parity_cases.ops())
def test_cases_are_reproducible_and_bounded(op):
    first, again = parity_cases.cases(op), parity_cases.cases(op)
    assert [(c.label, c.seed) for c in first] == [(c.label, c.seed) for c in again]
    assert len(first) == parity_cases.CASES_PER_OP
    assert len({c.config for c in first}) <= parity_cases.CONFIGS_PER_OP
    tokens = {c.params["tokens"] for c in first}
    fixed = parity_cases.ODD_TOKENS if 1 in tokens else parity_cases.BLOCK_TOKENS
    assert set(fixed[: parity_cases.CASES_PER_OP]) <= tokens and max(tokens) <= parity_cases.MAX_TOKENS
    # two builds of a case hold equal tensors of the same layout (the GPU run compares bytes; CPU shows the layout)
    call_a, call_b = first[0].build("meta"), first[0].build("meta")
    a, b = parity_compare.inputs(call_a.args, call_a.kwargs), parity_compare.inputs(call_b.args, call_b.kwargs)
    assert [(p, t.shape, t.dtype, t.stride()) for p, t in a.items()] == [(p, t.shape, t.dtype, t.stride()) for p, t in b.items()]


def test_cases_are_the_same_in_every_process():
    """The GPU run's warm-up processes and the CPU check must meet the very cases of the test process."""
    script = "from tests import parity_cases as p; print([(c.label, c.seed) for op in p.ops() for c in p.cases(op)])"
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONHASHSEED": seed}).stdout
        for seed in ("1", "2")
    ]  # fmt: skip
    assert runs[0] == runs[1] == repr([(c.label, c.seed) for op in parity_cases.ops() for c in parity_cases.cases(op)]) + "\n"


def test_the_cases_cover_every_public_op():
    tested = set(parity_cases.ops())
    public = {f"{family}.{name}" for family in ("quant", "moe", "transform", "mhc", "engram") for name in getattr(tkaot, family).__all__}
    assert tested == public


def test_builds_on_cpu_are_identical():
    for op in ("quant.per_token_cast", "moe.moe_topk_gate_forward", "transform.apply_rotary"):
        case = min(parity_cases.cases(op), key=lambda c: c.params["tokens"])
        a, b = case.build("cpu"), case.build("cpu")
        ta, tb = parity_compare.inputs(a.args, a.kwargs), parity_compare.inputs(b.args, b.kwargs)
        for path in ta:
            assert torch.equal(parity_compare.storage_bytes(ta[path]), parity_compare.storage_bytes(tb[path])), path


# ---- the comparison itself, on CPU tensors


def test_identical_calls_compare_equal():
    x = torch.randn(5, 8)
    out = torch.full((5, 8), float("nan"))
    call = ((x,), {"out": out})
    other = ((x.clone(),), {"out": out.clone()})
    problems, tolerant = parity_compare.compare_calls(call, (out, x[:, :4]), other, (other[1]["out"], other[0][0][:, :4]))
    assert problems == [] and not tolerant


def test_a_differing_byte_is_located_and_shown():
    ours, theirs = torch.zeros(3, 4, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16)
    theirs[2, 1] = 1.0
    problems, _ = parity_compare.compare_calls(((), {}), ours, ((), {}), theirs)
    assert len(problems) == 1
    assert "2 of 24 bytes differ" in problems[0] and "(2, 1)" in problems[0] and "TileKernels 1.0 (0x3f80)" in problems[0]


def test_layout_and_aliasing_are_compared():
    x = torch.randn(4, 6)
    ours_call, theirs_call = ((x,), {}), ((x.clone(),), {})
    problems, _ = parity_compare.compare_calls(ours_call, x.T.contiguous().T, theirs_call, theirs_call[0][0].clone())
    assert any("strides" in p for p in problems)
    problems, _ = parity_compare.compare_calls(ours_call, x.clone(), theirs_call, theirs_call[0][0])
    assert any("aliases None vs args[0]" in p for p in problems)


def test_in_place_inputs_are_compared_whole():
    base = torch.zeros(4, 8)
    ours, theirs = base.clone(), base.clone()
    ours[:, 6] = 1  # outside the view the op was given
    problems, _ = parity_compare.compare_calls(((ours[:, :4],), {}), None, ((theirs[:, :4],), {}), None)
    assert len(problems) == 1 and "args[0] (its storage" in problems[0]


def test_trims_drop_unspecified_bytes():
    ours, theirs = torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32)
    theirs[:, 1] = 0x7F000000  # the 8th byte of each row: beyond 5 groups
    assert parity_compare.compare_calls(((), {}), ours, ((), {}), theirs, trims={"ret": parity_cases.first_bytes(5)})[0] == []
    theirs[0, 1] = 0x7F00  # the 6th byte: a group's exponent
    assert parity_compare.compare_calls(((), {}), ours, ((), {}), theirs, trims={"ret": parity_cases.first_bytes(6)})[0]


@pytest.mark.parametrize("fmt, dtype", [("bf16", torch.bfloat16), ("e4m3", torch.float8_e4m3fn)])
def test_level_ranks_order_values(fmt, dtype):
    values = torch.tensor([-448.0, -1.0, -(2.0**-9), -0.0, 0.0, 2.0**-9, 1.0, 1.125, 448.0])
    if dtype == torch.bfloat16:
        values = torch.tensor([-3.0, -1.0, -(2.0**-133), -0.0, 0.0, 2.0**-133, 1.0, 1.0078125, 3.0])
    ranks = parity_compare.level_rank(values.to(dtype), fmt)
    assert torch.all(ranks[1:] >= ranks[:-1]) and ranks[3] == ranks[4] == 0 and ranks[5] == 1 and ranks[7] - ranks[6] == 1


def test_e2m1_level_ranks_read_both_nibbles():
    codes = torch.tensor([0x10, 0x98, 0x71], dtype=torch.uint8).view(torch.int8)  # (0, +0.5), (-0, -0.5), (+0.5, +6)
    assert parity_compare.level_rank(codes, "e2m1").tolist() == [[0, 1], [0, -1], [1, 7]]


def test_adjacent_levels_pass_and_farther_ones_fail():
    ours = torch.tensor([1.0, 1.125, 2.0]).to(torch.float8_e4m3fn)
    near = torch.tensor([1.125, 1.125, 1.875]).to(torch.float8_e4m3fn)
    assert parity_compare.describe_non_adjacent("x", ours, near, "e4m3") is None
    far = torch.tensor([1.25, 1.125, 2.0]).to(torch.float8_e4m3fn)
    assert "more than one e4m3 level apart" in parity_compare.describe_non_adjacent("x", ours, far, "e4m3")
    ones, up = torch.ones(70000, dtype=torch.bfloat16), torch.full((70000,), 1.0078125, dtype=torch.bfloat16)
    assert "on average" in parity_compare.describe_non_adjacent("x", ones, up, "bf16")


def test_close_outputs_pass_within_their_tolerance_and_fail_beyond():
    x = torch.randn(4, 6)
    call = ((torch.zeros(1),), {})
    near, far = x + 1e-7, x.clone()
    far[2, 3] += 1.0
    assert parity_compare.compare_calls(call, near, call, x, close={"ret": (1e-5, 1e-6)}) == ([], True)
    assert parity_compare.compare_calls(call, near, call, x)[0]  # byte for byte without it
    problems, _ = parity_compare.compare_calls(call, far, call, x, close={"ret": (1e-5, 1e-6)})
    assert len(problems) == 1 and "1 of 24 values" in problems[0] and "(2, 3)" in problems[0]


def test_close_inputs_written_in_place_are_compared_by_value():
    ours_in, theirs_in = torch.tensor([2.0, 1.000001]), torch.tensor([2.0, 1.0])
    assert parity_compare.compare_calls(((ours_in,), {}), None, ((theirs_in,), {}), None, close={"args[0]": (1e-5, 0.0)}) == ([], True)
    problems, _ = parity_compare.compare_calls(((ours_in + 1,), {}), None, ((theirs_in,), {}), None, close={"args[0]": (1e-5, 0.0)})
    assert len(problems) == 1 and "args[0]" in problems[0]


def test_differences_are_counted_across_chunks(monkeypatch):
    monkeypatch.setattr(parity_compare, "CHUNK", 5)
    ours = torch.zeros(3, 7, dtype=torch.int16)
    theirs = ours.clone()
    theirs[0, 6], theirs[2, 0], theirs[2, 6] = 1, 0x100, 0x101
    problem = parity_compare.describe_difference("x", ours, theirs.T.contiguous().T, limit=2)
    assert "4 of 42 bytes differ" in problem and "(0, 6)" in problem and "(2, 0)" in problem and "(2, 6)" not in problem
    assert parity_compare.describe_difference("x", ours, ours.T.contiguous().T) is None


def test_contiguous_tensors_with_odd_strides_on_size_one_dimensions_compare():
    ours = torch.arange(6, dtype=torch.int32).as_strided((2, 3, 1), (3, 1, 3712))  # is_contiguous(), stride(-1) != 1
    theirs = ours.clone()
    assert parity_compare.describe_difference("x", ours, theirs) is None
    theirs[1, 2, 0] = 7
    assert "(1, 2, 0)" in parity_compare.describe_difference("x", ours, theirs)


def test_strided_views_that_flatten_to_strided_views_compare():
    base = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    ours = base[:, :1].unsqueeze(0)  # (1, 6, 1), strides (24, 4, 1): reshape(-1) is a view of stride 4
    assert ours.reshape(-1).stride() == (4,)
    theirs = ours.clone()
    assert parity_compare.describe_difference("x", ours, theirs) is None
    theirs[0, 5, 0] = -1.0
    assert "(0, 5, 0)" in parity_compare.describe_difference("x", ours, theirs)
