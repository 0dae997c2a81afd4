"""Every cast op launches and returns what the GPU-verified code did, and refuses what it refused, on CPU.

The calls are tests/casts_corpus.py's. Each runs twice (first with its op's hot-path caches empty, then through them)
against a recording launcher. What a valid call launches (each kernel, variant key, device, stream and argument, a
pointer named by the tensor it points at) and returns (shape, dtype, strides, storage size, which given buffer), and the
exception type of an invalid call (raised before any launch), must equal tests/data/casts_contract.jsonl, which was
written from code that passed the GPU tests. The record keeps each exception's message for reading; wording may change.

CPU tensors stand in for CUDA ones on device 0 (a `_device_index` attribute puts one on another device, or -1 on
none); meta tensors for those too large to allocate. Rewrite the record only from code verified on a GPU:

    python -m tests.test_casts_contract
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import re
import sys
from pathlib import Path

import pytest
import torch

import tkaot._quant.casts  # noqa: F401  (the modules recording() patches)
import tkaot._quant.weight_casts  # noqa: F401
import tkaot.quant
from tests.casts_corpus import ALL, Call
from tkaot import _op
from tkaot._decl import format_value
from tkaot._quant import kernels

RECORD = Path(__file__).resolve().parent / "data" / "casts_contract.jsonl"
MODULES = ("tkaot._quant.casts", "tkaot._quant.weight_casts")
# the hot-path caches the cast modules keep (module -> dict attributes), emptied before each call's first run
HOT_PATHS = {"tkaot._quant.casts": ("_PLANS",)}
# ops that compute on the host: their returned values are recorded too (by hash)
HOST_VALUES = {"unpack_from_e2m1fn_x2"}
# Deliberate differences from the verified record: call id -> what it raises now, and why
CHANGED = {
    "per_channel_cast/bad-x-list": ("TypeError", "x is neither a tensor nor a (data, sf) pair, and num_per_channels is None: "
                                                 "the error names x (the pair is read first) where it named num_per_channels"),
    "per_channel_cast/bad-x-none": ("TypeError", "as per_channel_cast/bad-x-list"),
}  # fmt: skip


class Recorder:
    def __init__(self):
        self.launches: list[tuple] = []
        self.allocated: list[torch.Tensor] = []

    def reset(self) -> None:
        self.launches.clear()
        self.allocated.clear()


@contextlib.contextmanager
def recording():
    """CPU tensors read as CUDA tensors of device 0 (or their _device_index); launches and allocations recorded."""
    rec = Recorder()
    with pytest.MonkeyPatch.context() as mp:
        device_of = lambda t: getattr(t, "_device_index", 0)
        mp.setattr(torch.Tensor, "get_device", device_of)
        mp.setattr(torch.Tensor, "is_cuda", property(lambda t: device_of(t) >= 0))

        def get(self, device, *values, general_tiling=None):
            for axis, value in zip(self.decl.axes, values):
                axis.validate(value)  # as the build would: every static value one its declaration allows
            key = self.decl.key(values)

            def launch(dev, stream, *args):
                assert len(args) == len(self.args), f"{self.kernel}: {len(args)} values for {len(self.args)} arguments"
                rec.launches.append((self.decl, key, dev, stream, args))

            return launch

        mp.setattr(_op.OpKernels, "get", get)
        for name in MODULES:
            module = sys.modules[name]
            mp.setattr(module, "current_stream", lambda device: 7)
            for cache in HOT_PATHS.get(name, ()):
                mp.setattr(module, cache, {})
        empty = torch.empty

        def tracked_empty(*args, **kwargs):
            t = empty(*args, **kwargs)
            rec.allocated.append(t)
            return t

        mp.setattr(torch, "empty", tracked_empty)
        yield rec


def make(value):
    """A call's argument with its tensor descriptions made into tensors."""
    if hasattr(value, "make"):
        return value.make()
    if isinstance(value, (tuple, list)):
        return type(value)(make(v) for v in value)
    return value


def named(bound: dict) -> list[tuple[str, object]]:
    """(name, value) of each tensor and tuple/list among the bound arguments: "x", "x[0]", "outs[1][0]"."""
    found = []

    def walk(name, value):
        if isinstance(value, torch.Tensor):
            found.append((name, value))
        elif isinstance(value, (tuple, list)):
            found.append((name, value))
            for i, v in enumerate(value):
                walk(f"{name}[{i}]", v)

    for name, value in bound.items():
        walk(name, value)
    return found


def returned(value, name="ret") -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in returned(v, f"{name}[{i}]")]
    return []


def describe(value, inputs: dict, host_values: bool):
    """What a call returned: a tensor as [shape, dtype, strides, offset, storage bytes (, values' hash)(, "is <the given
    argument it is>")], a tuple or list as {"tuple": [...]} (with "is")."""
    given = inputs.get(id(value))
    if isinstance(value, torch.Tensor):
        d = [list(value.shape), str(value.dtype).removeprefix("torch."), list(value.stride()), value.storage_offset(),
             value.untyped_storage().nbytes()]  # fmt: skip
        if host_values:
            d.append(hashlib.sha256(value.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16])
        return d if given is None else [*d, f"is {given}"]
    if isinstance(value, (tuple, list)):
        d = {type(value).__name__: [describe(v, inputs, host_values) for v in value]}
        return d if given is None else {**d, "is": given}
    return repr(value)


def run(call: Call, rec: Recorder) -> dict:
    """One call's record: {"launches", "returns"} or {"raises", "message"} (and "launches" if any came first)."""
    fn = getattr(tkaot.quant, call.op)
    args, kwargs = make(call.args), {k: make(v) for k, v in call.kwargs.items()}
    inputs = named(inspect.signature(fn).bind(*args, **kwargs).arguments)
    rec.reset()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # the record names whatever a call raises
        record = {"raises": type(exc).__name__, "message": re.sub("0x[0-9a-f]+", "0x?", str(exc))}  # addresses vary
        if rec.launches:
            record["launches"] = launches(rec, inputs, [])
        return record
    by_id = {id(v): name for name, v in inputs}
    return {"launches": launches(rec, inputs, returned(result)), "returns": describe(result, by_id, call.op in HOST_VALUES)}


def launches(rec: Recorder, inputs, outputs) -> list:
    """Each launch as [kernel, static values (the key's, comma-separated), device, stream, args], pointers named: an
    input's name, "ret[i]" for what the call returned, "new <shape> <dtype>" for another tensor it allocated, None for 0."""
    pointers: dict[int, str] = {}
    for name, t in [*inputs, *outputs]:
        if isinstance(t, torch.Tensor):
            pointers.setdefault(t.data_ptr(), name)
    for t in rec.allocated:
        pointers.setdefault(t.data_ptr(), f"new {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
    pointers[0] = None
    out = []
    for decl, key, device, stream, values in rec.launches:
        args = [pointers.get(v, f"unknown {v:#x}") if a not in decl.dims else v for a, v in zip(decl.args, values)]
        out.append([decl.name, ",".join(item.split("=", 1)[1] for item in key.split(",")), device, stream, args])
    return out


def records(group: str) -> dict[str, dict]:
    """{call id: record} of a group of calls, each run cold and warm ({"cold", "warm"} where the two differ)."""
    out = {}
    with recording() as rec:
        for call in ALL[group]():
            for module, caches in HOT_PATHS.items():
                for cache in caches:
                    getattr(sys.modules[module], cache).clear()
            cold, warm = run(call, rec), run(call, rec)
            assert call.id not in out, f"two calls are named {call.id}"
            out[call.id] = cold if cold == warm else {"cold": cold, "warm": warm}
    return out


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "message"}


def expected_now(call_id: str, record: dict) -> dict:
    return {"raises": CHANGED[call_id][0]} if call_id in CHANGED else comparable(record)


@pytest.fixture(scope="module")
def verified() -> dict[str, dict]:
    return {r.pop("id"): r for r in map(json.loads, RECORD.read_text().splitlines())}


@pytest.mark.parametrize("group", list(ALL))
def test_calls_match_the_verified_record(group, verified):
    got = records(group)
    ops = {i.split("/")[0] for i in got}
    expected = {k: v for k, v in verified.items() if k.split("/")[0] in ops}
    assert sorted(got) == sorted(expected), "the corpus and the record list different calls: rewrite the record from verified code"
    wrong = [(i, expected[i], got[i]) for i in got if comparable(got[i]) != expected_now(i, expected[i])]
    shown = "\n".join(f"{i}\n  verified: {json.dumps(e)}\n  now:      {json.dumps(g)}" for i, e, g in wrong[:8])
    assert not wrong, f"{len(wrong)} of {len(got)} calls differ from the verified record:\n{shown}"


def test_invalid_calls_raise_before_any_launch(verified):
    raised = {i: r for i, r in verified.items() if "raises" in r}
    assert len(raised) > 200 and not [i for i, r in raised.items() if "launches" in r]


def test_the_corpus_reaches_every_value_of_every_cast_kernel_axis(verified):
    """Every static value the cast kernels declare is launched by some call (so every launch path is compared)."""
    seen: dict[str, set] = {}
    decls = (kernels.PER_TOKEN_CAST, kernels.PER_BLOCK_CAST, kernels.PER_CHANNEL_CAST, kernels.CAST, kernels.CAST_BACK,
             kernels.PER_BLOCK_CAST_LOSSLESS, kernels.BATCHED_TRANSPOSE_WEIGHT_SF)  # fmt: skip
    axes = {decl.name: [axis.name for axis in decl.axes] for decl in decls}
    for r in verified.values():
        for kernel, values, *_ in r.get("launches", ()):
            seen.setdefault(kernel, set()).update(f"{a}={v}" for a, v in zip(axes[kernel], values.split(",")))
    missing = []
    for decl in decls:
        for axis in decl.axes:
            for value in axis.choices or ():
                if f"{axis.name}={format_value(value)}" not in seen.get(decl.name, ()):
                    missing.append(f"{decl.name}: {axis.name}={value}")
    assert not missing, missing


def main() -> None:
    lines = []
    for group in ALL:
        for call_id, record in records(group).items():
            assert "cold" not in record, f"{call_id}: its first and second run differ"
            lines.append(json.dumps({"id": call_id, **record}, separators=(",", ":")))
    RECORD.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} calls recorded in {RECORD}")


if __name__ == "__main__":
    main()
