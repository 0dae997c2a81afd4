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
tensor whose layout is not "contiguous" (None when absent), in `tensors` order. A signature that names its
`returns` gets those expressions instead (only what its op reads).

Rule checks, `Let` values and `actual` texts are Python expressions over the arguments, the dims and Lets
bound so far, `torch`, `_MAX_I32`, the signature's `env` names, `_dt_<dtype name>` for each dtype a tensor
lists, and for each tensor read so far `h_<name>` (shape), `s_<name>`
(stride()), `t_<name>` (dtype) and `p_<name>` (data_ptr()); an optional tensor's are unset when it is None.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch

from tkaot._record import Record

MAX_I32 = 2**31 - 1
_DTYPE_NAMES = {
    torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float16: "float16", torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2", torch.int8: "int8", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}  # fmt: skip
LAYOUTS = ("rows", "contiguous", "any")
_VEC = {d: 16 // d.itemsize for d in _DTYPE_NAMES}  # elements of a 16-byte vector


def fail(op: str, name: str, expected: str, actual) -> None:
    raise ValueError(f"{op}: {name} must be {expected}, got {actual}")


def not_a_tensor(op: str, name: str, value) -> None:
    raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")


def _sequence_kind(value) -> str:
    """What a value that is not the tuple of tensors expected is: its type, and its length when a tuple or list."""
    kind = type(value).__name__
    return f"{kind} of {len(value)}" if isinstance(value, (tuple, list)) else kind


def _dtype_text(dtypes: tuple) -> str:
    names = [f"torch.{_DTYPE_NAMES.get(d, d)}" if len(dtypes) == 1 else _DTYPE_NAMES.get(d, str(d)) for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


class Tensor(Record):
    """One tensor argument.

    dtypes: the allowed torch dtypes, or the name of an earlier tensor whose dtype this one must have, or None for
        any dtype (a Rule may then check t_<name>).
    shapes: alternatives by rank, each a tuple of dim names (bound at first sight, compared after; the
        signature's scalars and Lets are bound from the start) and ints; or the name of an earlier tensor
        whose shape this one must have; or None for any shape (a Rule may then check h_<name>).
    layout: "rows" — last dimension contiguous, 16-byte aligned, every other stride of a dim longer than 1 a
        multiple of 16 bytes and below 2**31 elements; "contiguous" — torch's is_contiguous(); "any".
    align: bytes the data pointer must be a multiple of (rows implies 16).
    """

    # name: str
    # dtypes: tuple | str
    # shapes: tuple | str | None
    # layout: str = "rows"
    # align: int = 1
    # optional: bool = False
    # what: str = ""  # how the shape reads in an error ("(num_tokens, hidden)"); derived when empty
    # label: str = ""  # what errors call it ("out[0] (topk_idx)"); the name when empty; it may name scalars in braces ("sf[{i}]")
    # only_with: str = ""  # an optional tensor checked only when this earlier tensor is given (else taken as None)
    __slots__ = _fields = ("name", "dtypes", "shapes", "layout", "align", "optional", "what", "label", "only_with")
    _defaults = {"layout": "rows", "align": 1, "optional": False, "what": "", "label": "", "only_with": ""}

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"{self.name}: layout must be one of {LAYOUTS}")
        if self.dtypes is None and self.layout == "rows":
            raise ValueError(f'{self.name}: a "rows" layout needs declared dtypes')
        if self.shapes is None and self.layout == "rows":
            raise ValueError(f'{self.name}: a "rows" layout needs declared shapes')
        if self.only_with and not self.optional:
            raise ValueError(f"{self.name}: only a tensor that is optional can be checked only with another")


class Rule(Record):
    """A condition over bound dims and the op's arguments, as a Python expression; `expected` says it in words.

    `name` is what the error names (an argument, or an expression such as "num_topk + num_shared_experts");
    `expected` is f-string text (braces show values: "in [1, {num_experts}]"); `actual` is an expression
    for the value shown (default: `name` itself when it is a plain argument); a TypeError shows its type.
    `message`, when given, is the whole error text after "op: " (f-string text), instead of
    "name must be expected, got actual". `after` names the tensor right after which the rule is checked,
    only when that tensor is given if it is optional (default: after every tensor); "<tensor>.shape" places
    it right after that tensor's declared shape is read, before its layout checks; rules at one place
    are checked in declaration order. `after="launch"` takes a rule off the per-call check: it reads only what the
    op's launcher cache is keyed on (a row width, a dtype), so the op checks it once a key, where it binds that
    key's launcher, with `Signature.check_at_launch` (every rule, then these).
    """

    # name: str
    # check: str
    # expected: str = ""
    # actual: str = ""
    # error: str = "ValueError"  # or "TypeError"
    # after: str = ""
    # message: str = ""
    __slots__ = _fields = ("name", "check", "expected", "actual", "error", "after", "message")
    _defaults = {"expected": "", "actual": "", "error": "ValueError", "after": "", "message": ""}


class Let(Record):
    """A value the checker computes from what is bound so far, bound as `name` for the later shapes, rules
    and Lets; list it in the signature's dims to have it returned. Placed among the rules, with `after`
    as a Rule's. One placed after an optional tensor is computed only when that tensor is given: give it
    a value in the signature's defaults (set at the start, as for any default no shape mentions), which
    also lets it build on itself (`Let("flags", "flags | 4", after="bias")` with defaults {"flags": 0})."""

    # name: str
    # value: str
    # after: str = ""
    __slots__ = _fields = ("name", "value", "after")
    _defaults = {"after": ""}


class Signature:
    """An op's inputs: tensors, dims, then rules, checked in that order.

    op: the op's public name, for errors; tensors: its Tensor rules; dims: the dims (and Lets) returned;
    rules: Rules and Lets; scalars: other arguments the rules read; defaults: dims an alternative shape leaves out
    ("batch": 1), or an absent optional tensor binds; unpack: an argument that is None or a tuple/list of tensors,
    unpacked into the optional tensors named ({"out": ("topk_idx", "topk_weights")}), or a tuple/list that must be
    given, unpacked into required ones ({"x": ("x_data", "x_sf")}), taking their place among the parameters; env:
    further names the rules and Lets read (tables, helpers); returns: what the checker returns, as expressions over
    what it bound (None: (device, *dims, *pointers, *strides)).
    """

    def __init__(self, op: str, tensors: tuple, dims: tuple = (), rules: tuple = (), scalars: tuple = (), defaults: dict | None = None,
                 unpack: dict | None = None, env: dict | None = None, returns: tuple | None = None):  # fmt: skip
        self.op, self.tensors, self.dims, self.rules, self.scalars = op, tensors, dims, rules, scalars
        self.defaults, self.unpack, self.env, self.returns = defaults, unpack, env, returns
        self._checkers: dict[bool, Callable] = {}  # at_launch -> the compiled check
        self.written: tuple[str, dict] | None = None  # the checker's source and names, once written
        self._lock = threading.Lock()

    @property
    def params(self) -> tuple[str, ...]:
        """Tensors (those an unpack argument fills excepted), then the unpack arguments, then scalars."""
        unpack = self.unpack or {}
        filled = {name for names in unpack.values() for name in names}
        return tuple(t.name for t in self.tensors if t.name not in filled) + tuple(unpack) + self.scalars

    def checker(self, at_launch: bool = False):
        """The check function (written and compiled on first use); with `at_launch`, the one that also checks the rules
        placed at "launch", last."""
        check = self._checkers.get(at_launch)
        if check is None:
            with self._lock:
                check = self._checkers.get(at_launch)
                if check is None:
                    check = self._checkers[at_launch] = _compile(self, at_launch)
        return check

    def check_at_launch(self, *args):
        """Every check, those placed at "launch" last: what an op runs before it binds the launcher of a key it has not
        launched (a call that passes costs about one checker call)."""
        return self.checker(at_launch=True)(*args)

    def source(self, at_launch: bool = False) -> str:
        return _source(self, at_launch)[0]


def _text(s: str) -> str:
    """A text as source: an f-string where it names the checker's arguments in braces (a label such as "sf[{i}]")."""
    return f"f{s!r}" if "{" in s else repr(s)


def _shape_text(dims: tuple) -> str:
    return "(" + ", ".join(str(d) for d in dims) + (",)" if len(dims) == 1 else ")")


def _source(sig: Signature, at_launch: bool = False) -> tuple[str, dict]:
    """The checker's source and the names it needs; with `at_launch`, the rules placed at "launch" checked last."""
    env: dict = {"_fail": fail, "_not_a_tensor": not_a_tensor, "_sequence_kind": _sequence_kind, "_MAX_I32": MAX_I32, "_VEC": _VEC,
                 "_op": sig.op, "torch": torch}  # fmt: skip
    env.update(sig.env or {})
    lines = [f"def check({', '.join(sig.params)}):"]
    defaults = sig.defaults or {}
    bound: set[str] = set(sig.scalars)
    out = lines.append
    by_name = {t.name: t for t in sig.tensors}
    placed: dict[str, list] = {}  # tensor name ("" for the end) -> the rules and Lets checked after it
    for r in sig.rules:
        if r.after == "launch":
            if isinstance(r, Let):
                raise ValueError(f"{sig.op}: Let {r.name} cannot be placed at launch")
        elif r.after and r.after.removesuffix(".shape") not in by_name:
            raise ValueError(f"{sig.op}: {r.name} is placed after {r.after!r}, which is not a tensor")
        placed.setdefault(r.after, []).append(r)
    shaped = {d for t in sig.tensors if isinstance(t.shapes, tuple) for alt in t.shapes for d in alt}

    def fail_line(indent: str, name: str, expected: str, actual: str, literal: bool = True) -> None:
        """A raise of `expected` (text, or with literal=False an expression) and `actual` (an expression)."""
        text = _text(expected) if literal else expected
        out(f"{indent}    _fail(_op, {_text(name)}, {text}, {actual})")

    def emit_rules(items: list, ind: str = "    ") -> None:
        for r in items:
            if isinstance(r, Let):
                out(f"{ind}{r.name} = {r.value}")
                bound.add(r.name)
                continue
            actual = r.actual or (r.name if r.name.isidentifier() else repr("see above"))
            out(f"{ind}if not ({r.check}):")
            if r.message:
                out(f"{ind}    raise {r.error}(f'{{_op}}: ' + f{r.message!r})")
            elif r.error == "TypeError":
                out(f"{ind}    raise TypeError(f'{{_op}}: {r.name} must be {r.expected}, got {{type({actual}).__name__}}')")
            else:
                fail_line(ind, r.name, f"f{r.expected!r}", actual, literal=False)

    def emit_rows(t: Tensor, ind: str, ranks_to_test: list | None, ranks: list, alt: tuple = ()) -> None:
        """The "rows" layout checks of t, for a rank among `ranks` (tested with len() when ranks_to_test);
        with `alt`, the shape alternative matched, whose dims are read by name or known."""
        n, label = t.name, t.label or t.name
        dtypes = t.dtypes
        while isinstance(dtypes, str):
            dtypes = by_name[dtypes].dtypes
        if len({_VEC[d] for d in dtypes}) == 1:  # one vector width: a constant
            vec = str(_VEC[dtypes[0]])
        else:  # looked up where a stride is tested (a 1-token call tests none)
            vec = f"_VEC[t_{n}]"
        out(f"{ind}if s_{n}[-1] != 1:")
        fail_line(ind, label, "contiguous in its last dimension", f"f'strides {{s_{n}}}'")
        out(f"{ind}if p_{n} % 16:")
        fail_line(ind, label, "16-byte aligned", f"f'address {{p_{n}:#x}}'")
        kw = "if"
        for rank in ranks:
            terms = []
            for k in range(rank - 1):
                size = alt[k] if alt else f"h_{n}[{k}]"
                stride = f"(s_{n}[{k}] % {vec} == 0 and 0 <= s_{n}[{k}] <= _MAX_I32)"
                if not isinstance(size, int):
                    terms.append(f"({size} <= 1 or {stride})")
                elif size > 1:  # a fixed size: the stride matters exactly when it is above 1
                    terms.append(stride)
            if not terms:
                continue
            test = f"not ({' and '.join(terms)})"
            out(f"{ind}{kw} {f'len(h_{n}) == {rank} and {test}' if ranks_to_test else test}:")
            kw = "elif"
            expected = f"f'strided in multiples of {{{vec}}} elements (16 bytes) below 2**31'"
            fail_line(ind, label, expected, f"f'strides {{s_{n}}}'", literal=False)

    for dim, value in defaults.items():  # a default no shape mentions holds throughout
        if dim not in shaped:
            out(f"    {dim} = {value!r}")
            bound.add(dim)
    for arg, names in (sig.unpack or {}).items():
        given = {by_name[name].optional for name in names}
        if len(given) > 1:
            raise ValueError(f"{sig.op}: the tensors unpacked from {arg} must be all optional or all required")
        # the error names the argument as its tensors' labels do ("outs[0]" for "outs[0][0]", "outs[0][1]")
        labels = [by_name[name].label for name in names]
        prefix = labels[0].removesuffix("[0]")
        shown = prefix if prefix and labels == [f"{prefix}[{j}]" for j in range(len(names))] else arg
        kind = f"a ({', '.join(names)}) {'pair' if len(names) == 2 else 'tuple'}"
        if given == {True}:
            kind = "None or " + kind
            out(f"    if {arg} is None:")
            out(f"        {' = '.join(names)} = None")
            out(f"    elif isinstance({arg}, (tuple, list)) and len({arg}) == {len(names)}:")
        else:
            out(f"    if isinstance({arg}, (tuple, list)) and len({arg}) == {len(names)}:")
        out(f"        {', '.join(names)}, = {arg}")
        out("    else:")
        out(f"        raise TypeError(f'{{_op}}: {shown} must be {kind}, got {{_sequence_kind({arg})}}')")

    for i, t in enumerate(sig.tensors):
        n = t.name
        label = t.label or n
        ind = "    "
        if t.only_with and t.only_with not in by_name:
            raise ValueError(f"{sig.op}: {n} is checked only with {t.only_with!r}, which is not a tensor")
        if t.optional:
            out(f"    if {n} is None{f' or {t.only_with} is None' if t.only_with else ''}:")
            out(f"        p_{n} = 0")
            if t.layout != "contiguous":
                out(f"        s_{n} = None")
            if isinstance(t.shapes, tuple):  # dims only this tensor binds take their default
                for dim in dict.fromkeys(d for alt in t.shapes for d in alt if isinstance(d, str) and d not in bound):
                    if dim in defaults:
                        out(f"        {dim} = {defaults[dim]!r}")
                    elif dim in sig.dims:
                        raise ValueError(f"{sig.op}: dim {dim} is bound only by the optional {n}: give it a default")
            out("    else:")
            ind = "        "
        out(f"{ind}try:")
        # one statement a property: no tuple built and unpacked (about 0.08 µs a call on norm_forward's two tensors, dev machine)
        for var, read in (("d", "get_device()"), ("t", "dtype"), ("h", "shape"), ("s", "stride()"), ("p", "data_ptr()")):
            out(f"{ind}    {'device' if i == 0 and var == 'd' else f'{var}_{n}'} = {n}.{read}")  # the first sets the device
        out(f"{ind}except AttributeError:")
        out(f"{ind}    _not_a_tensor(_op, {_text(label)}, {n})")
        # device
        if i == 0:
            if t.optional:
                raise ValueError(f"{sig.op}: the first tensor sets the device and cannot be optional")
            out(f"{ind}if device < 0:")
            fail_line(ind, label, "a CUDA tensor", f"f'a tensor on {{{n}.device}}'")
        else:
            first = sig.tensors[0]
            out(f"{ind}if d_{n} != device:")
            fail_line(ind, label, f"on the device of {first.label or first.name}", f"f'a tensor on {{{n}.device}}'")
        # dtype
        if t.dtypes is None:  # any dtype: the signature's rules check it
            pass
        elif isinstance(t.dtypes, str):
            out(f"{ind}if t_{n} is not t_{t.dtypes}:")
            fail_line(ind, label, f"f'{{t_{t.dtypes}}} like {t.dtypes}'", f"t_{n}", literal=False)
        else:
            names = []
            for d in t.dtypes:
                key = f"_dt_{_DTYPE_NAMES[d]}"
                env[key] = d
                names.append(key)
            out(f"{ind}if {' and '.join(f't_{n} is not {k}' for k in names)}:")
            fail_line(ind, label, _dtype_text(t.dtypes), f"t_{n}")
        # shape
        shape_rules = placed.get(f"{n}.shape", [])
        if shape_rules and not isinstance(t.shapes, tuple):
            raise ValueError(f"{sig.op}: rules placed after {n}.shape need {n}'s declared shapes")
        if isinstance(t.shapes, str):
            other = by_name[t.shapes]
            out(f"{ind}if h_{n} != h_{other.name}:")
            fail_line(ind, label, f"f'of shape {{tuple(h_{other.name})}} like {other.name}'", f"tuple(h_{n})", literal=False)
        elif t.shapes is not None:
            alternatives = t.shapes
            ranks = [len(a) for a in alternatives]
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"{sig.op}: {n}'s shape alternatives must differ in rank")
            expected = t.what or " or ".join(f"{len(a)}-D {_shape_text(a)}" for a in alternatives)
            mentioned = {d for alt in alternatives for d in alt if isinstance(d, str)}
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
                if len(binds) == len(alt) > 1:  # every dim new: one unpacking binds them all
                    out(f"{ind}    {', '.join(b.split(' = ')[0] for b in binds)} = h_{n}")
                else:
                    for b in binds:
                        out(f"{ind}    {b}")
                for dim in sorted(mentioned - set(alt) - bound):
                    if dim in defaults:
                        out(f"{ind}    {dim} = {defaults[dim]!r}")
                if checks:
                    shape = "(" + ", ".join(f"{{{d}}}" if isinstance(d, str) else str(d) for d in alt) + (",)" if len(alt) == 1 else ")")
                    out(f"{ind}    if not ({' and '.join(checks)}):")
                    fail_line(ind + "    ", label, f"f'of shape {shape}'", f"tuple(h_{n})", literal=False)
                if t.layout == "rows" and not shape_rules:  # in the branch, where the rank is known
                    emit_rows(t, ind + "    ", None, [len(alt)], alt)
            out(f"{ind}else:")
            fail_line(ind, label, expected, f"f'shape {{tuple(h_{n})}}'")
            bound.update(mentioned)
            if shape_rules:  # rules on the shape first, then the layout, for each rank
                emit_rules(shape_rules, ind)
                if t.layout == "rows":
                    emit_rows(t, ind, ranks if len(ranks) > 1 else None, ranks, alternatives[0] if len(ranks) == 1 else ())
        # layout
        if t.layout == "rows" and not isinstance(t.shapes, tuple):  # shaped like another tensor: any of its ranks
            ranks = sorted({len(a) for a in by_name[t.shapes].shapes})
            emit_rows(t, ind, ranks if len(ranks) > 1 else None, ranks)
        if t.layout == "contiguous":
            fast = ""
            if isinstance(t.shapes, tuple) and len(t.shapes) == 1 and t.shapes[0]:
                # the dense strides of the one declared rank, asked of torch only when they differ
                rank, terms = len(t.shapes[0]), []
                for k in range(rank - 1, -1, -1):
                    size = " * ".join(f"h_{n}[{j}]" for j in range(k + 1, rank)) or "1"
                    terms.append(f"s_{n}[{k}] == {size}")
                fast = f"({' and '.join(terms)}) or "
            out(f"{ind}if not ({fast}{n}.is_contiguous()):")
            fail_line(ind, label, "contiguous", f"f'strides {{s_{n}}}'")
        if t.align > 1 and t.layout != "rows":
            out(f"{ind}if p_{n} % {t.align}:")
            fail_line(ind, label, f"{t.align}-byte aligned", f"f'address {{p_{n}:#x}}'")
        emit_rules(placed.get(n, []), ind)
    emit_rules(placed.get("", []))
    if at_launch:
        emit_rules(placed.get("launch", []))
    if sig.returns is None:
        strides = [f"s_{t.name}" for t in sig.tensors if t.layout != "contiguous"]
        values = ["device", *sig.dims, *(f"p_{t.name}" for t in sig.tensors), *strides]
    else:
        values = list(sig.returns)
    out(f"    return ({', '.join(values)},)" if values else "    return None")
    return "\n".join(_merge_checks(lines)) + "\n", env


def _merge_checks(lines: list[str]) -> list[str]:
    """Runs of two or more checks (`if COND:` and one raising line) at one indent, tested under one `if` of their
    conditions joined by `or`, the checks themselves inside it: a passing call evaluates each condition once and
    takes one branch (measured 0.03-0.05 µs a call on norm_forward's checker); a failing one raises the first
    check's error, as before."""

    def check_at(i: int) -> str | None:
        """The indent of a check starting at line i that is neither continued by an elif/else nor part of one."""
        line = lines[i]
        ind = line[: len(line) - len(line.lstrip())]
        if not (line.lstrip().startswith("if ") and line.endswith(":") and i + 1 < len(lines)):
            return None
        body = lines[i + 1]
        if not (body.startswith(ind + "    ") and body[len(ind) + 4 :].startswith(("_fail(", "_not_a_tensor(", "raise "))):
            return None
        after = lines[i + 2] if i + 2 < len(lines) else ""
        if after.startswith(ind + "elif ") or after.startswith(ind + "else:") or after.startswith(ind + "     "):
            return None
        return ind

    merged, i = [], 0
    while i < len(lines):
        ind = check_at(i)
        j = i
        while ind is not None and j < len(lines) and check_at(j) == ind:
            j += 2
        if ind is None or j - i < 4:
            merged.append(lines[i])
            i += 1
            continue
        conditions = " or ".join(f"({lines[k].strip()[3:-1]})" for k in range(i, j, 2))
        merged.append(f"{ind}if {conditions}:")
        merged.extend("    " + line for line in lines[i:j])
        i = j
    return merged


def lazy_checker(sig: Signature, namespace: dict, name=None):
    """A stand-in for `sig`'s checker in `namespace` (an op module's globals(), or a dict of an op's checkers), bound
    there as `name` or, without one, under the names that hold it at its first call: that call writes the checker and
    puts it in the stand-in's place, so every later call reaches it in one lookup and importing an op module compiles
    nothing. In a module's globals that call also writes the checker into the functions that call it
    (tkaot/_inline.py; TKAOT_INLINE_CHECKS=0 leaves them calling it)."""

    def first_call(*args):
        check = sig.checker()
        names = [name] if name is not None else [k for k, v in namespace.items() if v is first_call]
        for key in names:
            namespace[key] = check
        if "__file__" in namespace and os.environ.get("TKAOT_INLINE_CHECKS", "1") != "0":
            from tkaot._inline import inline_checker  # ast, loaded at the first check rather than at import

            source, env = sig.written  # what sig.checker() compiled: written once
            for key in names:
                inline_checker(namespace, key, source, env)
        return check(*args)

    first_call.signature = sig  # what marks a checker (tkaot/_inline.py, tests/test_inline.py)
    return first_call


def _compile(sig: Signature, at_launch: bool = False):
    source, env = _source(sig, at_launch)
    if not at_launch:
        sig.written = (source, dict(env))
    code = compile(source, f"<checker of {sig.op}{' at launch' if at_launch else ''}>", "exec")
    exec(code, env)  # the source above is made from the signature's own data, never from user input
    check = env["check"]
    check.signature = sig  # as its stand-in's
    return check


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
