"""Input checks, one module for every op: one clear exception per problem, before any launch.

An op declares its inputs once, as data: a `Signature` of `Tensor` rules (dtypes, shapes over named dims,
memory layout, alignment, optional or not, same device as the first) plus `Rule`s over the bound dims and
the op's other arguments (option combinations, limits). From that declaration `Signature.checker()`
writes one Python function — reading each tensor property once, with one `if` a rule — which is both
the fast path and the detailed error: a call that breaks no rule runs straight through, a call that
breaks one raises the error naming the argument, what it must be and what it was. Nothing is checked
twice and no exception is caught on the way.

The checker takes the signature's arguments (tensors and the names its rules read) in `Signature.params`
order and returns `(device, *dims, *pointers, *strides)`: the device index of the first tensor; each dim
in `dims` order; each tensor's data_ptr() (0 when an optional tensor is None); the stride() tuple of each
tensor whose layout is not "contiguous" (None when absent), in `tensors` order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

MAX_I32 = 2**31 - 1
_DTYPE_NAMES = {
    torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16", torch.float8_e4m3fn: "float8_e4m3fn",
    torch.int8: "int8", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}  # fmt: skip
LAYOUTS = ("rows", "contiguous", "any")
_VEC = {d: 16 // d.itemsize for d in _DTYPE_NAMES}  # elements of a 16-byte vector


def fail(op: str, name: str, expected: str, actual) -> None:
    raise ValueError(f"{op}: {name} must be {expected}, got {actual}")


def not_a_tensor(op: str, name: str, value) -> None:
    raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")


def _dtype_text(dtypes: tuple) -> str:
    names = [f"torch.{_DTYPE_NAMES.get(d, d)}" if len(dtypes) == 1 else _DTYPE_NAMES.get(d, str(d)) for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


@dataclass(frozen=True)
class Tensor:
    """One tensor argument.

    dtypes: the allowed torch dtypes, or the name of an earlier tensor whose dtype this one must have.
    shapes: alternatives by rank, each a tuple of dim names (bound at first sight, compared after) and ints;
        or the name of an earlier tensor whose shape this one must have.
    layout: "rows" — last dimension contiguous, 16-byte aligned, every other stride of a dim longer than 1 a
        multiple of 16 bytes and below 2**31 elements; "contiguous" — torch's is_contiguous(); "any".
    align: bytes the data pointer must be a multiple of (rows implies 16).
    """

    name: str
    dtypes: tuple | str
    shapes: tuple | str
    layout: str = "rows"
    align: int = 1
    optional: bool = False
    what: str = ""  # how the shape reads in an error ("(num_tokens, hidden)"); derived when empty

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"{self.name}: layout must be one of {LAYOUTS}")


@dataclass(frozen=True)
class Rule:
    """A condition over bound dims and the op's arguments, as a Python expression; `expected` says it in words.

    `name` is what the error names (an argument, or an expression such as "num_topk + num_shared_experts");
    `actual` is an expression for the value shown (default: `name` itself when it is a plain argument).
    """

    name: str
    check: str
    expected: str
    actual: str = ""
    error: str = "ValueError"  # or "TypeError"


@dataclass
class Signature:
    """An op's inputs: tensors, dims, then rules, checked in that order."""

    op: str
    tensors: tuple[Tensor, ...]
    dims: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()
    scalars: tuple[str, ...] = ()  # other arguments the rules read
    defaults: dict | None = None  # dims an alternative shape leaves out ("batch": 1)

    def __post_init__(self):
        self._checker = None
        self._lock = threading.Lock()

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors) + self.scalars

    def checker(self):
        """The check function (written and compiled on first use)."""
        if self._checker is None:
            with self._lock:
                if self._checker is None:
                    self._checker = _compile(self)
        return self._checker

    def source(self) -> str:
        return _source(self)[0]


def _shape_text(dims: tuple) -> str:
    return "(" + ", ".join(str(d) for d in dims) + (",)" if len(dims) == 1 else ")")


def _source(sig: Signature) -> tuple[str, dict]:
    """The checker's source and the names it needs."""
    env: dict = {"_fail": fail, "_not_a_tensor": not_a_tensor, "_MAX_I32": MAX_I32, "_VEC": _VEC, "_op": sig.op}
    lines = [f"def check({', '.join(sig.params)}):"]
    bound: set[str] = set()
    out = lines.append
    by_name = {t.name: t for t in sig.tensors}

    def fail_line(indent: str, name: str, expected: str, actual: str, literal: bool = True) -> None:
        """A raise of `expected` (text, or with literal=False an expression) and `actual` (an expression)."""
        text = repr(expected) if literal else expected
        out(f"{indent}    _fail(_op, {name!r}, {text}, {actual})")

    for i, t in enumerate(sig.tensors):
        n = t.name
        ind = "    "
        if t.optional:
            out(f"    if {n} is None:")
            out(f"        p_{n} = 0")
            if t.layout != "contiguous":
                out(f"        s_{n} = None")
            out("    else:")
            ind = "        "
        out(f"{ind}try:")
        out(f"{ind}    d_{n}, t_{n}, h_{n}, s_{n}, p_{n} = {n}.get_device(), {n}.dtype, {n}.shape, {n}.stride(), {n}.data_ptr()")
        out(f"{ind}except AttributeError:")
        out(f"{ind}    _not_a_tensor(_op, {n!r}, {n})")
        # device
        if i == 0:
            if t.optional:
                raise ValueError(f"{sig.op}: the first tensor sets the device and cannot be optional")
            out(f"{ind}device = d_{n}")
            out(f"{ind}if device < 0:")
            fail_line(ind, n, "a CUDA tensor", f"f'a tensor on {{{n}.device}}'")
        else:
            first = sig.tensors[0].name
            out(f"{ind}if d_{n} != device:")
            fail_line(ind, n, f"on the device of {first}", f"f'a tensor on {{{n}.device}}'")
        # dtype
        if isinstance(t.dtypes, str):
            out(f"{ind}if t_{n} is not t_{t.dtypes}:")
            fail_line(ind, n, f"f'{{t_{t.dtypes}}} like {t.dtypes}'", f"t_{n}", literal=False)
        else:
            names = []
            for d in t.dtypes:
                key = f"_dt_{_DTYPE_NAMES[d]}"
                env[key] = d
                names.append(key)
            out(f"{ind}if {' and '.join(f't_{n} is not {k}' for k in names)}:")
            fail_line(ind, n, _dtype_text(t.dtypes), f"t_{n}")
        # shape
        if isinstance(t.shapes, str):
            other = by_name[t.shapes]
            out(f"{ind}if h_{n} != h_{other.name}:")
            fail_line(ind, n, f"f'of shape {{tuple(h_{other.name})}} like {other.name}'", f"tuple(h_{n})", literal=False)
            alternatives = None
        else:
            alternatives = t.shapes
            ranks = [len(a) for a in alternatives]
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"{sig.op}: {n}'s shape alternatives must differ in rank")
            expected = t.what or " or ".join(f"{len(a)}-D {_shape_text(a)}" for a in alternatives)
            for j, alt in enumerate(alternatives):
                kw = "if" if j == 0 else "elif"
                out(f"{ind}{kw} len(h_{n}) == {len(alt)}:")
                checks, binds = [], []
                for k, dim in enumerate(alt):
                    if isinstance(dim, int):
                        checks.append(f"h_{n}[{k}] == {dim}")
                    elif dim in bound:
                        checks.append(f"h_{n}[{k}] == {dim}")
                    else:
                        binds.append(f"{dim} = h_{n}[{k}]")
                for b in binds:
                    out(f"{ind}    {b}")
                for dim in sig.dims:
                    if dim not in alt and (sig.defaults or {}).get(dim) is not None and dim not in bound:
                        out(f"{ind}    {dim} = {sig.defaults[dim]!r}")
                if checks:
                    shape = "(" + ", ".join(f"{{{d}}}" if isinstance(d, str) else str(d) for d in alt) + (",)" if len(alt) == 1 else ")")
                    out(f"{ind}    if not ({' and '.join(checks)}):")
                    fail_line(ind + "    ", n, f"f'of shape {shape}'", f"tuple(h_{n})", literal=False)
            out(f"{ind}else:")
            fail_line(ind, n, expected, f"f'shape {{tuple(h_{n})}}'")
            for alt in alternatives:
                bound.update(d for d in alt if isinstance(d, str))
            bound.update(d for d in sig.dims if (sig.defaults or {}).get(d) is not None)
        # layout
        if t.layout == "rows":
            ranks = sorted({len(a) for a in (by_name[t.shapes].shapes if isinstance(t.shapes, str) else t.shapes)})
            out(f"{ind}_vec = _VEC[t_{n}]")
            out(f"{ind}if s_{n}[-1] != 1:")
            fail_line(ind, n, "contiguous in its last dimension", f"f'strides {{s_{n}}}'")
            out(f"{ind}if p_{n} % 16:")
            fail_line(ind, n, "16-byte aligned", f"f'address {{p_{n}:#x}}'")
            for j, rank in enumerate(ranks):
                kw = "if" if j == 0 else "elif"
                terms = [f"(h_{n}[{k}] <= 1 or (s_{n}[{k}] % _vec == 0 and 0 <= s_{n}[{k}] <= _MAX_I32))" for k in range(rank - 1)]
                if not terms:
                    continue
                out(f"{ind}{kw} len(h_{n}) == {rank} and not ({' and '.join(terms)}):")
                expected = "f'strided in multiples of {_vec} elements (16 bytes) below 2**31'"
                fail_line(ind, n, expected, f"f'strides {{s_{n}}}'", literal=False)
        elif t.layout == "contiguous":
            out(f"{ind}if not {n}.is_contiguous():")
            fail_line(ind, n, "contiguous", f"f'strides {{s_{n}}}'")
        if t.align > 1 and t.layout != "rows":
            out(f"{ind}if p_{n} % {t.align}:")
            fail_line(ind, n, f"{t.align}-byte aligned", f"f'address {{p_{n}:#x}}'")
    for r in sig.rules:
        actual = r.actual or (r.name if r.name.isidentifier() else repr("see above"))
        out(f"    if not ({r.check}):")
        if r.error == "TypeError":
            out(f"        raise TypeError(f'{{_op}}: {r.name} must be {r.expected}, got {{type({actual}).__name__}}')")
        else:
            fail_line("    ", r.name, r.expected, actual)
    strides = [f"s_{t.name}" for t in sig.tensors if t.layout != "contiguous"]
    values = ["device", *sig.dims, *(f"p_{t.name}" for t in sig.tensors), *strides]
    out(f"    return ({', '.join(values)},)")
    return "\n".join(lines) + "\n", env


def _compile(sig: Signature):
    source, env = _source(sig)
    code = compile(source, f"<checker of {sig.op}>", "exec")
    exec(code, env)  # the source above is made from the signature's own data, never from user input
    return env["check"]


# Checks for the ops that do not declare a Signature yet: same messages


def check_cuda(op: str, name: str, t, device_index: int | None = None) -> int:
    """t is a CUDA tensor (on device_index when given); returns its device index."""
    if not isinstance(t, torch.Tensor):
        not_a_tensor(op, name, t)
    if not t.is_cuda:
        fail(op, name, "a CUDA tensor", f"a tensor on {t.device}")
    index = t.get_device()
    if device_index is not None and index != device_index:
        fail(op, name, f"on cuda:{device_index} like the input", f"cuda:{index}")
    return index


def check_like(op: str, name: str, t, shape, dtype, device_index: int) -> None:
    check_cuda(op, name, t, device_index)
    if t.dtype != dtype:
        fail(op, name, f"{dtype}", t.dtype)
    if t.shape != shape:
        fail(op, name, f"of shape {tuple(shape)}", tuple(t.shape))


def check_rows(op: str, name: str, t, vec: int) -> None:
    """Rows of t are 16-byte aligned vectors: last dim contiguous, strides and address aligned."""
    strides = t.stride()
    if strides[-1] != 1:
        fail(op, name, "contiguous in its last dimension", f"strides {strides}")
    if t.data_ptr() % 16:
        fail(op, name, "16-byte aligned", f"address {t.data_ptr():#x}")
    shape = t.shape
    for dim in range(len(shape) - 1):
        if shape[dim] > 1 and (strides[dim] % vec or strides[dim] > MAX_I32):
            fail(op, name, f"strided in multiples of {vec} elements (16 bytes) below 2**31", f"strides {strides}")
