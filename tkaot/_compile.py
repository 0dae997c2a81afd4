"""torch.compile and torch.export: each public op is also a torch custom op, `torch.ops.tkaot.<name>`.

A plain call of a public op runs straight through its own code (validation, allocation, launch): no dispatcher. While
torch.compile or torch.export traces, the op hands its arguments to its `TracedOp` instead, which puts one custom-op
call into the graph. The custom op's real kernel is the public op itself, behind a few lines written for the op's
schema at registration (arguments by name, conversions back inline: the dispatcher is most of its cost); its fake
kernel, used for tracing, is the op's *fake*: a small function with the op's parameters (after a first `new`) that
allocates the outputs the op would return, through `new`, with the op's exact shapes, dtypes and strides, and returns
the op's result structure (given buffers and inputs in their places, None where the op returns None).

An op module declares it next to the op:

    def _fake(new, x, weight, eps, ..., out=None, ...):
        return (new.empty_like(x) if out is None else out), ...

    _traced = traced(norm_forward, _fake, mutates=("out", "residual_out"), outputs=3)

An op that returns None and only writes its arguments (in-place ops, given output buffers) takes `allocates_nothing`
as its fake, with outputs=0.

The schema follows the op's parameters and their annotations (`_KINDS`). Arguments the op writes are
declared in `mutates`. A custom op must not return its inputs, nor (to be functionalised, when it writes
an argument) a list of tensors, so it returns only the tensors the op allocated, as a fixed tuple: one
overload per count, `o0` .. `o<outputs>`, registered together. Which one a call takes is known while
tracing (it depends on which optional buffers are given and on flags), and the traced call puts the
outputs back into the op's result structure.

Registration happens when an op module is first imported (a few tens of µs an overload); `import tkaot`
registers nothing. `register_all()` imports every op module, for loading a program exported elsewhere.
"""

from __future__ import annotations

import importlib

import torch

# Every op's first line, `if is_dynamo_compiling() or compiler._is_compiling_flag:`, is torch.compiler.is_compiling()
# written out without its two Python calls (0.1-0.15 µs an op call, measured in an op): Dynamo folds
# is_dynamo_compiling() to True, so while it traces the flag is never read (reading it would guard on it: a recompile
# every call), and torch.export's non-strict tracing sets the flag.
compiler = torch.compiler
is_dynamo_compiling = torch.compiler.is_dynamo_compiling
NAMESPACE = "tkaot"
_LIBRARY = None  # torch.library.Library(NAMESPACE, "FRAGMENT"), made at the first registration

# How a parameter reaches the schema, by its annotation (as written: op modules use `from __future__ import annotations`).
# Each kind: its schema arguments, (name suffix, schema type, schema type when the op writes the argument). Optional
# tensors in a written list trip functionalisation, so a written pair is two arguments, and written pairs a list of
# the given ones with a mask.
_KINDS = {
    "tensor": (("", "Tensor", "Tensor(a!)"),),
    "tensor?": (("", "Tensor?", "Tensor(a!)?"),),
    "tensors": (("", "Tensor[]", None),),  # a tensor, or a (data, sf) pair: a list of one or two
    "pair": (("", "Tensor[]", None),),
    "pair?": (("0", "Tensor?", "Tensor(a!)?"), ("1", "Tensor?", "Tensor(a!)?")),  # None, or a pair either of whose members may be None
    "pairs?": (("", "Tensor[]", "Tensor(a!)[]"), ("_given", "bool[]", "bool[]")),  # a sequence of such pairs: the given ones
    "tensor list": (("", "Tensor[]", "Tensor(a!)[]"),),
    "float": (("", "float", None),),
    "float?": (("", "float?", None),),
    "int": (("", "SymInt?", None),),  # optional: some int arguments take None for unquantized formats
    "ints": (("", "int[]", None),),
    "ints?": (("", "int[]?", None),),
    "bool": (("", "bool", None),),
    "bools": (("", "bool[]", None),),
    "str": (("", "str", None),),
    "str?": (("", "str?", None),),
    "dtype": (("", "ScalarType", None),),
}
_ANNOTATIONS = {
    "torch.Tensor": "tensor",
    "torch.Tensor | None": "tensor?",
    "tuple[torch.Tensor, torch.Tensor]": "pair",
    "tuple[torch.Tensor, torch.Tensor] | None": "pair?",
    "Sequence[torch.Tensor]": "tensor list",
    "list[torch.Tensor]": "tensor list",
    "Sequence[tuple[torch.Tensor, torch.Tensor] | None]": "pairs?",
    "float": "float",
    "float | None": "float?",
    "int": "int",
    "int | None": "int",
    "tuple[int, int]": "ints",
    "tuple[int, int] | None": "ints?",
    "bool": "bool",
    "Sequence[bool]": "bools",
    "str": "str",
    "str | None": "str?",
    "torch.dtype": "dtype",
}


class _Fresh:
    """Where a fake's output goes, while a traced call works out which outputs are new."""

    __slots__ = ()


class _Probe:
    """The `new` of a traced call: hands out markers, so the fake allocates nothing in the graph."""

    @staticmethod
    def empty(*args, **kwargs):
        return _Fresh()

    empty_like = empty_strided = empty


class _Allocator:
    """The `new` of a fake kernel: allocates (fake tensors, while tracing) and remembers what it made."""

    def __init__(self):
        self.made = []

    def empty(self, shape, dtype, device):
        return self._keep(torch.empty(shape, dtype=dtype, device=device))

    def empty_like(self, t):
        return self._keep(torch.empty_like(t))

    def empty_strided(self, shape, strides, dtype, device):
        return self._keep(torch.empty_strided(shape, strides, dtype=dtype, device=device))

    def _keep(self, t):
        self.made.append(t)
        return t


def _leaves(result) -> list:
    """The values of an op's result structure (nested tuples and lists), depth first."""
    if isinstance(result, (tuple, list)):
        return [leaf for item in result for leaf in _leaves(item)]
    return [result]


def _fill(result, outs: list):
    """The result structure with each _Fresh marker replaced by the next of outs (popped from the front)."""
    if isinstance(result, _Fresh):
        return outs.pop(0)
    if isinstance(result, tuple):
        return tuple(_fill(item, outs) for item in result)
    if isinstance(result, list):
        return [_fill(item, outs) for item in result]
    return result


def _pairs(tensors: list, given: list) -> list:
    """A `pairs?` argument back from the schema: the given pairs' tensors, two a pair, and which were given."""
    tensors = iter(tensors)
    return [(next(tensors), next(tensors)) if g else None for g in given]


def _new_tensors(result, inputs: tuple):
    """The tensors of an op's result (a tensor, None, or nested tuples / lists) that are not among its inputs, as the
    custom op returns them (the real kernel's end)."""
    if result is None:
        return None
    if not isinstance(result, (tuple, list)):
        for t in inputs:
            if t is result:
                return None
        return result
    outs = []
    for item in result:
        if item is None:
            continue
        for leaf in _leaves(item) if isinstance(item, (tuple, list)) else (item,):
            if isinstance(leaf, torch.Tensor):
                for t in inputs:
                    if t is leaf:
                        break
                else:
                    outs.append(leaf)
    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)


def _returns(outs: list):
    """Tensors as a custom op with a fixed count of Tensor returns hands them back."""
    return None if not outs else outs[0] if len(outs) == 1 else tuple(outs)


class TracedOp:
    """One public op as the custom op tkaot::<name>: its schema, its kernels, and its traced call."""

    def __init__(self, fn, fake, mutates: tuple = (), outputs: int = 1, kinds: dict | None = None):
        self.fn, self.fake, self.name, self.outputs = fn, fake, fn.__name__, outputs
        self.qualname = f"{NAMESPACE}::{self.name}"
        kinds = kinds or {}
        self.params = []  # (name, kind)
        code, annotations = fn.__code__, fn.__annotations__  # (inspect.signature costs milliseconds the first time)
        for name in code.co_varnames[: code.co_argcount]:
            kind = kinds.get(name) or _ANNOTATIONS.get(annotations.get(name))
            if kind is None:
                raise TypeError(f"{self.qualname}: parameter {name} ({annotations.get(name)}) has no schema kind; declare it in kinds")
            self.params.append((name, kind))
        unknown = set(mutates) - {name for name, _ in self.params}
        if unknown:
            raise ValueError(f"{self.qualname}: mutates names {sorted(unknown)}, which are not parameters")
        self.mutates = tuple(mutates)
        self.overloads: list = []
        # what the real kernel must convert back (any parameter of a kind that is not passed as is), and the
        # schema arguments that are lists of tensors (whose members are inputs too)
        plain = ("tensor", "tensor?", "float", "float?", "int", "bool", "str", "str?", "dtype")
        self._converts = any(kind not in plain for _, kind in self.params)
        schema_kinds = [k for _, kind in self.params for k in _KINDS[kind]]
        self._lists = tuple(
            i for i, (_, plain_type, _) in enumerate(schema_kinds) if plain_type.startswith("Tensor") and "[]" in plain_type
        )
        self._real = self._make_real()

    def schema_args(self) -> str:
        args, alias = [], iter("abcdefghijklmnopqrstuvwxyz")
        for name, kind in self.params:
            for suffix, plain, written in _KINDS[kind]:
                if name in self.mutates:
                    if written is None:
                        raise ValueError(f"{self.qualname}: {name} ({kind}) cannot be written")
                    plain = written.replace("(a!)", f"({next(alias)}!)")
                args.append(f"{plain} {name}{suffix}")
        return ", ".join(args)

    def register(self, library) -> None:
        args = self.schema_args()
        for count in range(self.outputs + 1):
            overload = f"o{count}"
            returns = "()" if count == 0 else "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"
            library.define(f"{self.name}.{overload}({args}) -> {returns}")
            library.impl(f"{self.name}.{overload}", self._real, "CompositeExplicitAutograd")
            library.impl(f"{self.name}.{overload}", self._fake_kernel, "Meta")
        packet = getattr(torch.ops.tkaot, self.name)
        self.overloads = [getattr(packet, f"o{count}") for count in range(self.outputs + 1)]

    # ---- the argument conversions: public values <-> schema values

    def flatten(self, values: tuple) -> list:
        flat = []
        for (_, kind), value in zip(self.params, values):
            if kind == "tensors" or kind == "pair":
                flat.append([value] if isinstance(value, torch.Tensor) else list(value))
            elif kind == "pair?":
                flat += (None, None) if value is None else value
            elif kind == "pairs?":
                flat += [t for pair in value if pair is not None for t in pair], [pair is not None for pair in value]
            elif kind in ("tensor list", "bools", "ints") or (kind == "ints?" and value is not None):
                flat.append(list(value))
            else:
                flat.append(value)
        return flat

    def unflatten(self, flat: tuple) -> list:
        values, flat = [], iter(flat)
        for _, kind in self.params:
            value = next(flat)
            if kind == "tensors":
                value = value[0] if len(value) == 1 else tuple(value)
            elif kind == "pair":
                value = tuple(value)
            elif kind == "pair?":
                second = next(flat)
                value = None if value is None and second is None else (value, second)
            elif kind == "pairs?":
                value = _pairs(value, next(flat))
            elif kind == "ints" or (kind == "ints?" and value is not None):
                value = tuple(value)
            values.append(value)
        return values

    # ---- the kernels and the traced call

    def _make_real(self):
        """The real kernel, written for this op's schema: the schema arguments by name, the conversions back to the public
        values inline (no per-call walk over the parameter kinds), the public op called, its new tensors handed back."""
        args, lines, given, lists = [], [], [], []
        for name, kind in self.params:
            for suffix, plain_type, _ in _KINDS[kind]:
                args.append(name + suffix)
                if plain_type.startswith("Tensor") and "[]" in plain_type:
                    lists.append(name + suffix)
                elif plain_type.startswith("Tensor"):
                    given.append(name + suffix)
            if kind == "tensors":
                lines.append(f"{name} = {name}[0] if len({name}) == 1 else tuple({name})")
            elif kind in ("pair", "ints"):
                lines.append(f"{name} = tuple({name})")
            elif kind == "ints?":
                lines.append(f"{name} = None if {name} is None else tuple({name})")
            elif kind == "pair?":
                lines.append(f"{name} = None if {name}0 is None and {name}1 is None else ({name}0, {name}1)")
            elif kind == "pairs?":
                lines.append(f"{name} = _pairs({name}, {name}_given)")
        scope = {"_op": self.fn, "_compiler": torch.compiler, "_pairs": _pairs, "_new_tensors": _new_tensors}
        scope["_compiling_real"], scope["_inputs"] = self._compiling_real, None
        if set(scope) & set(args):
            raise ValueError(f"{self.qualname}: parameters {sorted(set(scope) & set(args))} clash with the real kernel's names")
        values = ", ".join(name for name, _ in self.params)
        inputs = "(" + "".join(f"{g}, " for g in given) + "".join(f"*{g}, " for g in lists) + ")"  # before the conversions
        source = "\n    ".join(
            [f"def _real({', '.join(args)}):", "if _compiler._is_compiling_flag:", f"    return _compiling_real({', '.join(args)})",
             f"_inputs = {inputs}", *lines, f"return _new_tensors(_op({values}), _inputs)"]
        )  # fmt: skip
        exec(compile(source, f"<real kernel of {self.qualname}>", "exec"), scope)
        return scope["_real"]

    def _compiling_real(self, *flat):
        """The real kernel while a compiler runs kernels as it compiles: launch, do not trace again."""
        values = self.unflatten(flat) if self._converts else flat
        given = tuple(v for v in flat if isinstance(v, torch.Tensor))
        for i in self._lists:
            given += tuple(flat[i])
        return _new_tensors(_run_uncompiled(self.fn, values), given)

    def _fake_kernel(self, *flat):
        """The fake kernel: what the fake allocates, in result order."""
        new = _Allocator()
        result = self.fake(new, *self.unflatten(flat))
        return _returns([t for t in _leaves(result) if any(t is m for m in new.made)])

    def __call__(self, *values):
        """The traced call (values: the public op's arguments, all of them, in order)."""
        layout = self.fake(_Probe, *values)
        count = sum(1 for leaf in _leaves(layout) if isinstance(leaf, _Fresh))
        if count > self.outputs:
            raise ValueError(f"{self.qualname}: a traced call returns at most {self.outputs} new tensors, this one {count}: split it")
        outs = self.overloads[count](*self.flatten(values))
        if count == 1:
            outs = [outs]
        return _fill(layout, list(outs) if count else [])


def _run_uncompiled(fn, values):
    """Run fn with torch.compiler.is_compiling() False, so the op launches instead of tracing itself."""
    import torch.compiler as compiler

    flag = compiler._is_compiling_flag
    compiler._is_compiling_flag = False
    try:
        return fn(*values)
    finally:
        compiler._is_compiling_flag = flag


def traced(fn, fake, mutates: tuple = (), outputs: int = 1, kinds: dict | None = None) -> TracedOp:
    """Declare and register public op `fn` as the custom op tkaot::<its name> (see the module's docstring).

    fake: `fake(new, *fn's parameters)`, allocating through new.empty(shape, dtype, device) / empty_like(t) /
    empty_strided(shape, strides, dtype, device) only. mutates: the parameters the op writes. outputs: the most
    tensors one call allocates. kinds: schema kinds (`_KINDS`) of parameters whose annotation does not say
    (a tensor-or-pair `x`)."""
    global _LIBRARY
    op = TracedOp(fn, fake, mutates, outputs, kinds)
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
    op.register(_LIBRARY)
    return op


def allocates_nothing(new, *values) -> None:
    """The fake of an op that returns None and writes only its arguments (those its traced() line declares in mutates)."""
    return None


def op_families() -> list[str]:
    """The public op families (tkaot.quant, ...): the kernel families, those with kernel declarations. Not tkaot.rand
    (torch.randn and torch.manual_seed, which Dynamo traces itself), the trainable layers (tkaot.modeling: autograd
    functions over the ops, traced through them), the reference or the registry."""
    from tkaot._decl import FAMILIES

    return list(FAMILIES)


def register_all() -> list[str]:
    """Import every op module, registering all of tkaot's custom ops (to load a program exported elsewhere, say);
    returns their names."""
    names = set()
    for family in op_families():
        module = importlib.import_module(f"tkaot.{family}")
        names.update(getattr(module, name).__name__ for name in module.__all__)
    return sorted(n for n in names if hasattr(torch.ops.tkaot, n))
