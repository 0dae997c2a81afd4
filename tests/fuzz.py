"""The machinery of the property-based op tests (tests/test_fuzz_*.py): drawn calls, a launch recorder, breaks.

Each op is one strategy, registered with `@CASES.case(op, built)` on its module's `Cases`: it draws a valid call
within the op's documented limits, as a `Call` (keyword arguments, the launches it must make as (kernel
declaration, static values by axis name), the op's Signature and where its tensors sit among the arguments, and
hand-written breaks of its options). Two tests serve every registered op (`Cases.valid_test`, `Cases.invalid_test`):

- a valid call must make exactly its launches, each with static values its declaration's axes allow and every
  runtime argument supplied, a number; its key must resolve to a variant of the default shape set (the set
  prebuilt/sm90 is built from: specialised, general tiling or generic), unless the case (or the call) says
  `built="listed"` (variants for listed sizes only): then a key that resolves to none must make the registry, over
  prebuilt/, raise VariantNotBuilt naming the tkaot-build command that builds it;
- every break of each drawn call (one thing broken) must raise ValueError or TypeError whose message starts with a
  tkaot op's name, and launch nothing. The breaks are derived from the op's Signature (tkaot/_validate.py) for every
  tensor the call gives: not a tensor, on the CPU, a dtype it does not list, another rank, a size another tensor or
  argument fixes, a layout it refuses, a misaligned address; and the case's own breaks of options and buffers.

Meta tensors stand in for CUDA ones (device 0); a recorder stands in for each op's kernel lookup and launcher, so no
GPU, driver or cubin is needed. Examples are derandomized, without a database, 40 a test (SETTINGS).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tkaot
from tests.helpers import dense
from tkaot import _op
from tkaot._decl import KernelDecl, all_kernels, build_command, generic_kernel
from tkaot._validate import Signature
from tkaot.errors import VariantNotBuilt

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
FAMILIES = ("quant", "moe", "transform", "engram", "mhc")
PREBUILT = Path(__file__).resolve().parent.parent / "prebuilt" / "sm90"
BF16, F32, F16, F8, E5M2 = torch.bfloat16, torch.float32, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2
I8, I32, I64, BOOL = torch.int8, torch.int32, torch.int64, torch.bool
# wrong dtypes to try, in order: the first one a tensor does not list is its dtype break
NAMES = {BF16: "bfloat16", F32: "float32"}  # the declarations' names of the float dtypes
FLOATS = st.sampled_from([BF16, F32])
WRONG_DTYPES = (F16, torch.float64, BF16, F32, I32, I8, BOOL, I64, F8)
_ERROR = re.compile(r"tkaot\.\w+\.\w+: ")


def meta(*shape, dtype=BF16, strides=None, offset=0) -> torch.Tensor:
    """A meta tensor (device 0 under the recorder); with strides (and a storage offset, in elements) a view."""
    if strides is None and not offset:
        return torch.empty(shape, dtype=dtype, device="meta")
    strides = dense(shape) if strides is None else strides
    size = offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else offset
    return torch.empty(size, dtype=dtype, device="meta").as_strided(shape, strides, offset)


def padded_rows(*shape, dtype=BF16, pad: int = 0) -> torch.Tensor:
    """A tensor whose rows are `pad` elements further apart than dense ones (a slice of a wider one)."""
    if not pad or len(shape) < 2:
        return meta(*shape, dtype=dtype)
    return meta(*shape, dtype=dtype, strides=dense((*shape[:-1], shape[-1] + pad)))


# ---- drawing within the declarations


def allowed(decl: KernelDecl, axis: str, upto: int) -> tuple:
    """The values in [1, upto] that a declaration's integer axis allows."""
    return _allowed(decl.name, axis, upto)


@functools.cache
def _allowed(kernel: str, axis: str, upto: int) -> tuple:
    check = all_kernels()[kernel].axis(axis)
    return tuple(v for v in range(1, upto + 1) if check.allows(v))


def choices(decl: KernelDecl, axis: str):
    return st.sampled_from(decl.axis(axis).choices)


def sizes(decl: KernelDecl, axis: str, upto: int, multiple: int = 1, limit: int | None = None):
    """A value the axis allows in [1, upto], a multiple of `multiple`, at most `limit`: the op's rules on top of the
    kernel's."""
    values = [v for v in allowed(decl, axis, upto) if v % multiple == 0 and (limit is None or v <= limit)]
    return st.sampled_from(values)


def tokens(zero: bool = True):
    return st.sampled_from([1, 3, 127, 4097] + ([0] if zero else []))


# ---- a drawn call


class Call:
    """One valid call of an op, and what it must do.

    op: the public name ("quant.per_token_cast"); kwargs: its arguments by name; launches: [(declaration, {axis:
    value})] in launch order (with `empty`, no launch is also right: the call has nothing to compute); signature:
    the Signature whose tensors the derived breaks break (None: only `breaks`); paths: where a Signature tensor sits
    when its name is not an argument or an unpacked one, as (argument, index, ...); breaks: label -> a dict of
    arguments to change, or a function of the arguments returning new ones; check: a function of the result; built:
    this call's "all" or "listed", where it differs from its case's.
    """

    def __init__(self, op: str, kwargs: dict, launches=(), signature: Signature | None = None, paths: dict | None = None,
                 breaks: dict | None = None, check: Callable | None = None, empty: bool = False, built: str | None = None):  # fmt: skip
        self.op, self.kwargs, self.launches, self.signature = op, kwargs, list(launches), signature
        self.paths, self.breaks, self.check, self.empty, self.built = paths or {}, breaks or {}, check, empty, built

    def __repr__(self) -> str:
        shown = {k: _show(v) for k, v in self.kwargs.items()}
        return f"{self.op}({', '.join(f'{k}={v}' for k, v in shown.items())})"

    @property
    def function(self):
        family, name = self.op.split(".")
        return getattr(getattr(tkaot, family), name)

    def run(self, kwargs: dict | None = None):
        return self.function(**(self.kwargs if kwargs is None else kwargs))

    def expected(self) -> list[tuple[str, str]]:
        keys = []
        for decl, values in self.launches:
            assert set(values) == set(decl.axis_names), f"{decl.name}: give {decl.axis_names}, not {sorted(values)}"
            keys.append((decl.name, decl.key(tuple(values[a] for a in decl.axis_names))))
        return keys

    def path(self, tensor: str) -> tuple | None:
        if tensor in self.paths:
            return self.paths[tensor]
        if tensor in self.kwargs:
            return (tensor,)
        for arg, names in (self.signature.unpack or {}).items():
            if tensor in names and isinstance(self.kwargs.get(arg), (tuple, list)):
                return (arg, names.index(tensor))
        return None

    def get(self, path: tuple):
        value = self.kwargs
        for step in path:
            if value is None:  # inside an optional argument not given
                return None
            value = value[step]
        return value

    def replaced(self, path: tuple, new) -> dict:
        def put(container, steps):
            if not steps:
                return new
            head, rest = steps[0], steps[1:]
            if isinstance(container, dict):
                return {**container, head: put(container[head], rest)}
            items = list(container)
            items[head] = put(items[head], rest)
            return type(container)(items)

        return put(self.kwargs, path)

    def all_breaks(self) -> list[tuple[str, dict]]:
        found = signature_breaks(self) if self.signature is not None else []
        for label, change in self.breaks.items():
            found.append((label, change(self.kwargs) if callable(change) else {**self.kwargs, **change}))
        return found


def _show(value) -> str:
    if isinstance(value, torch.Tensor):
        dense_ = value.stride() == dense(value.shape)
        return f"{str(value.dtype)[6:]}{list(value.shape)}" + ("" if dense_ else f"@{list(value.stride())}")
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_show(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)


# ---- breaks derived from a Signature


def signature_breaks(call: Call) -> list[tuple[str, dict]]:
    """One call per thing broken in one tensor the call gives, for every tensor of its Signature."""
    sig = call.signature
    given = {}
    for t in sig.tensors:
        path = call.path(t.name)
        value = call.get(path) if path is not None else None
        if isinstance(value, torch.Tensor):
            given[t.name] = (t, path, value)
    found = []
    for name, (t, path, value) in given.items():

        def put(new, label, path=path, name=name):
            found.append((f"{name}: {label}", call.replaced(path, new)))

        put([0.0], "not a tensor")
        put(torch.zeros((), dtype=value.dtype).expand(value.shape), "on the CPU")
        wrong = _wrong_dtype(t, given)
        if wrong is not None:
            put(meta(*value.shape, dtype=wrong, strides=value.stride()), f"of dtype {wrong}")
        if t.shapes is not None:
            ranks = {len(a) for a in t.shapes} if isinstance(t.shapes, tuple) else {value.dim()}
            other = value
            while other.dim() in ranks:
                other = other.unsqueeze(0)
            put(other, f"of rank {other.dim()}")
        for k in _fixed_dims(sig, t, value, given):
            shape = list(value.shape)
            shape[k] += 1
            put(meta(*shape, dtype=value.dtype), f"of shape {tuple(shape)}")
        if t.layout in ("contiguous", "rows") and (t.layout == "rows" or value.numel() > 1):
            put(meta(*value.shape, dtype=value.dtype, strides=tuple(2 * s for s in dense(value.shape))), "strided by 2")
        vec = 16 // value.element_size()
        if t.layout == "rows" and value.dim() >= 2 and value.shape[-2] > 1 and vec > 1:
            put(padded_rows(*value.shape, dtype=value.dtype, pad=1), "rows one element apart from 16-byte vectors")
        align = 16 if t.layout == "rows" else t.align
        if align > value.element_size() and value.numel():  # an empty tensor's address is 0
            put(meta(*value.shape, dtype=value.dtype, strides=value.stride(), offset=1), f"not {align}-byte aligned")
    return found


def _wrong_dtype(t, given) -> torch.dtype | None:
    if t.dtypes is None:
        return None
    if isinstance(t.dtypes, str):
        if t.dtypes not in given:
            return None
        allowed_ = (given[t.dtypes][2].dtype,)
    else:
        allowed_ = t.dtypes
    return next(d for d in WRONG_DTYPES if d not in allowed_)


def _fixed_dims(sig: Signature, t, value, given) -> list[int]:
    """The dims of `value` that another tensor the call gives, or an argument, fixes: changing one breaks a rule."""
    if isinstance(t.shapes, str) or any(u.shapes == t.name for u, _, _ in given.values()):
        return list(range(value.dim()))
    if not isinstance(t.shapes, tuple):
        return []
    alt = next((a for a in t.shapes if len(a) == value.dim()), ())
    elsewhere = set(sig.scalars)
    for u, _, other in given.values():
        if u is not t and isinstance(u.shapes, tuple):
            elsewhere.update(d for a in u.shapes if len(a) == other.dim() for d in a)
    return [k for k, d in enumerate(alt) if isinstance(d, int) or d in elsewhere]


# ---- the cases of a test module, and the two tests each case gets


class Cases:
    """A test module's ops, each a composite strategy `draw -> Call` of its valid calls, registered with `case`; the
    module binds `valid_test()` and `invalid_test()` to test names."""

    def __init__(self):
        self.strategies: dict[str, tuple] = {}  # op -> (strategy of Calls, built)

    def case(self, op: str, built: str = "all"):
        """Register the valid calls of `op`. built: "all" (every valid call's variant is in the default set) or
        "listed" (variants for listed sizes only; the others raise VariantNotBuilt naming a build command)."""
        assert built in ("all", "listed") and op not in self.strategies

        def register(draw_call):
            self.strategies[op] = (st.composite(draw_call)(), built)
            return draw_call

        return register

    def cases(self, draw_call, ops: dict, built: str = "all"):
        """Register ops whose valid calls one function draws: draw_call(draw, arg) for each arg -> op of `ops`."""
        for arg, op in ops.items():
            self.case(op, built)(lambda draw, arg=arg: draw_call(draw, arg))

    def valid_test(self):
        return per_op_test(self.strategies, check_valid_call, "test_valid_calls_launch_their_declared_variants")

    def invalid_test(self):
        return per_op_test(self.strategies, check_invalid_calls, "test_invalid_calls_raise_before_any_launch")


@functools.cache
def default_set() -> frozenset:
    """(kernel, key) of every variant of the default shape set, the one prebuilt/sm90 is built from."""
    from build_tools.sweep import load_shapeset

    return frozenset((v.kernel, v.key) for v in load_shapeset("default"))


@functools.cache
def prebuilt_keys() -> frozenset:
    return frozenset((e["kernel"], e["key"]) for e in json.loads((PREBUILT / "manifest.json").read_text())["variants"])


def resolution(decl: KernelDecl, values: tuple, general_tiling: str | None) -> str:
    """How the runtime would serve a key with the default set built: specialised, general (tiling), generic or missing."""
    built = default_set()
    if (decl.name, decl.key(values)) in built:
        return "specialised"
    if general_tiling is not None and (decl.name, decl.key((*values[:-1], general_tiling))) in built:
        return "general"
    generic = generic_kernel(decl.name)
    if generic is not None and (generic.name, generic.key(generic.split(decl, values)[0])) in built:
        return "generic"
    return "missing"


# Kernels an op launches only where their variant is built, else another (VariantNotBuilt tells it)
TRIED_FIRST = ("rmsnorm_backward_residual", "rmsnorm_backward_plain")


class Launches(list):
    """The (kernel, key) of each launch, in order; `served` maps each to how the default set serves it (`resolution`)."""

    def __init__(self):
        super().__init__()
        self.served: dict[tuple[str, str], str] = {}


@pytest.fixture
def launches(monkeypatch):
    """Meta tensors read as device 0; every op's kernel lookup is recorded, each launch appending (kernel, key)."""
    from tkaot import registry as reg
    from tkaot._engram import device as engram_device
    from tkaot._quant import casts, weight_casts

    get_device = torch.Tensor.get_device
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0 if self.device.type == "meta" else get_device(self))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(engram_device, "sm_count", lambda device: 132)
    # the value checks of the weight casts (powers of two) read the data: skipped, as during CUDA-graph capture
    monkeypatch.setattr(weight_casts, "_values_unchecked", lambda: True)
    monkeypatch.setattr(casts, "_PLANS", {})
    monkeypatch.delenv("TKAOT_PATH", raising=False)
    prebuilt = reg.Registry()
    monkeypatch.setattr(prebuilt, "device_arch", lambda index: "sm90")
    recorded = Launches()

    def get(self, device, *values, general_tiling=None):
        assert device == 0, device
        refused = [f"{a.name}={v!r} ({a.describe()})" for a, v in zip(self.decl.axes, values, strict=True) if not a.allows(v)]
        generic = generic_kernel(self.decl.name)
        if refused:  # values only a generic kernel takes (swiglu's hidden a multiple of 64, not of 256): it must serve them
            assert generic is not None, f"{self.kernel}: {', '.join(refused)} outside its declaration, and no generic kernel"
            static, _ = generic.split(self.decl, values)
            assert all(a.allows(v) for a, v in zip(generic.axes, static, strict=True)), f"{generic.name}: {static}"
            assert (generic.name, generic.key(static)) in default_set(), f"{generic.name} [{generic.key(static)}] not in the default set"
        key = self.decl.key(values)
        served = "generic" if refused else resolution(self.decl, values, general_tiling)
        if served == "missing":  # the registry over prebuilt/ names the command that builds it
            with pytest.raises(VariantNotBuilt) as refused:
                prebuilt.kernel(self.op, self.kernel, key, 0)
            assert refused.value.command == build_command(self.kernel, key, "sm90")
            if self.kernel in TRIED_FIRST:  # the op launches another kernel instead
                raise refused.value

        def launch(dev, stream, *args):
            assert len(args) == len(self.args), f"{self.kernel}: {len(args)} values for {len(self.args)} arguments"
            bad = [(n, a) for n, a in zip(self.args, args) if not isinstance(a, (int, float))]
            assert not bad, f"{self.kernel}: arguments that are not numbers: {bad}"
            recorded.append((self.kernel, key))
            recorded.served[self.kernel, key] = served

        return launch

    monkeypatch.setattr(_op.OpKernels, "get", get)
    for family in FAMILIES:
        module_family = getattr(tkaot, family)
        for name in module_family.__all__:
            module = __import__(getattr(module_family, name).__module__, fromlist=["_"])
            if hasattr(module, "current_stream"):
                monkeypatch.setattr(module, "current_stream", lambda device: 0)
            for value in vars(module).values():
                kernels = value.values() if isinstance(value, dict) else (value,)
                for k in kernels:
                    if isinstance(k, _op.OpKernels):
                        monkeypatch.setattr(k, "cache", {})
    return recorded


def per_op_test(cases: dict, check, name: str):
    """A test, parametrized by op, that runs check(launches, call, built) on each call drawn from the op's strategy."""

    @pytest.mark.parametrize("op", sorted(cases))
    def test(launches, op):
        calls, built = cases[op]

        @SETTINGS
        @given(call=calls)
        def run(call):
            check(launches, call, built)

        run()

    test.__name__ = test.__qualname__ = name
    return test


def check_valid_call(launches, call, built) -> None:
    """A valid call makes exactly its launches, on variants that resolve."""
    launches.clear()
    result = call.run()
    made = list(launches)
    expected = call.expected()
    assert made == expected or (call.empty and not made), f"{call}: launched {made}, expected {expected}"
    if (call.built or built) == "all":
        missing = [launch for launch in launches if launches.served[launch] == "missing"]
        assert not missing, f"{call}: no variant of the default set serves {missing}"
    if call.check is not None:
        call.check(result)


def check_invalid_calls(launches, call, _built) -> None:
    """Each of the call's breaks raises a clear error before any launch."""
    breaks = call.all_breaks()
    assert breaks, f"{call}: nothing to break"
    for label, kwargs in breaks:
        launches.clear()
        try:
            call.run(kwargs)
        except (ValueError, TypeError) as error:
            assert _ERROR.match(str(error)), f"{call} with {label}: unclear error {error!r}"
        else:
            raise AssertionError(f"{call} with {label}: accepted")
        assert not launches, f"{call} with {label}: launched {launches}"
