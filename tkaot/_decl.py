"""Kernel declarations: what the build and the runtime must agree on about each kernel, written once.

A `KernelDecl` is plain data (no TileLang, no torch): the kernel's static axes and the values each
may take, the runtime arguments the ops pass (tensor pointers, scalars, dynamic dims, in the ops'
order), the shipped tilings, and the ops it serves. The TileLang source (kernels_src/) builds
from it and the build checks the lowered signature against it; the runtime keys and binds
variants with it. A variant's key is formatted by `KernelDecl.key` and nowhere else.

A generic kernel (`KernelDecl.generic`) serves a specialised kernel's calls with some of its size axes
taken at run time: its axes are the specialised kernel's minus those, its arguments the specialised
kernel's plus one dynamic dim per runtime axis. The runtime launches it when the specialised variant of
a call is not built (tkaot/_op.py), with the runtime axes fixed at bind, so the op passes the same
arguments to either; and, with no warning, for the calls the specialised kernel cannot take at all
(`specialisable`: a per-token cast whose row ends in a partial group). A runtime axis is an integer axis,
passed as its value, or a string axis with a finite set of choices, passed as its value's index among them
(`runtime_value`: an sf layout "row"/"col" reaches the kernel as 0/1).

Each family keeps its declarations in `tkaot/_<family>/kernels.py` as a tuple `KERNELS`;
`all_kernels()` collects them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType

from tkaot._record import Record

# The runtime families that declare kernels (tkaot/_<family>/kernels.py)
FAMILIES = ("quant", "moe", "transform", "mhc", "engram")


class Axis(Record):
    """One static (compile-time) parameter of a kernel."""

    # name: str
    # kind: type  # int, str or bool
    # choices: tuple | None = None  # allowed values, when the set is finite
    # check: Callable[[object], bool] | None = None  # predicate, when it is not
    # rule: str = ""  # the predicate in words, for error messages
    __slots__ = _fields = ("name", "kind", "choices", "check", "rule")
    _defaults = {"choices": None, "check": None, "rule": ""}

    def parse(self, text: str | object):
        """Turn a CLI or TOML value into this axis's type, or raise ValueError."""
        if self.kind is bool:
            if isinstance(text, bool):
                value = text
            elif str(text).lower() in ("1", "true", "yes", "on"):
                value = True
            elif str(text).lower() in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError(f"{self.name}: expected a boolean, got {text!r}")
        elif self.kind is int:
            try:
                value = int(text)
            except (TypeError, ValueError):
                raise ValueError(f"{self.name}: expected an integer, got {text!r}") from None
        else:
            value = str(text)
        self.validate(value)
        return value

    def validate(self, value) -> None:
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{self.name}={value!r} is not supported; choose one of {list(self.choices)}")
        if self.check is not None and not self.check(value):
            raise ValueError(f"{self.name}={value!r} is not supported: {self.rule}")

    def allows(self, value) -> bool:
        try:
            self.validate(value)
        except ValueError:
            return False
        return True

    def describe(self) -> str:
        if self.choices is not None:
            return "|".join(format_value(c) for c in self.choices)
        return self.rule or self.kind.__name__


def format_value(value) -> str:
    """A static value as it stands in a key: booleans lower-case, everything else str()."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def parse_key(key: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in key.split(",") if part)


def build_command(kernel: str, key: str, arch: str) -> str:
    """The tkaot-build command that builds one variant."""
    sets = " ".join(f"--set {k}={v}" for k, v in parse_key(key).items())
    return f"tkaot-build build --op {kernel} {sets} --arch {arch} --out ./tkaot-artifacts"


class KernelDecl(Record):
    """One kernel, as both wings see it."""

    # name: str
    # source: str  # its TileLang module ("kernels_src.<family>.<file>"); imported by the build only
    # axes: tuple[Axis, ...]
    # params: tuple[str, ...]  # runtime arguments before the dims (tensors and scalars), in the order the ops pass them
    # dims: tuple[str, ...]  # then the dynamic dims (sizes and strides); `args` is both, the lowered kernel's by name
    # ops: tuple[str, ...]  # the public ops that launch it
    # role -> shipped tiling, for kernels with a "tiling" axis (whose choices are exactly these tilings)
    # tilings: Mapping[str, str] = {}
    # generic_of: str = ""  # a generic kernel: the specialised kernel whose calls it serves
    # runtime_axes: tuple[Axis, ...] = ()  # a generic kernel: the specialised kernel's axes it takes at run time
    # specialisable: Callable[[dict], bool] | None = None  # a kernel with a generic one: whether the static values
    #   (by axis name) can be built specialised; the calls of the others are the generic kernel's alone
    __slots__ = _fields = ("name", "source", "axes", "params", "dims", "ops", "tilings", "generic_of", "runtime_axes", "specialisable")
    _defaults = {"tilings": MappingProxyType({}), "generic_of": "", "runtime_axes": (), "specialisable": None}

    def __post_init__(self):
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names) or len(set(self.args)) != len(self.args):
            raise ValueError(f"{self.name}: axis or argument names repeat")
        if self.tilings:
            tiling = self.axis("tiling")
            if tiling.choices != tuple(dict.fromkeys(self.tilings.values())):
                raise ValueError(f"{self.name}: the tiling axis must offer exactly the shipped tilings {dict(self.tilings)}")
        if bool(self.generic_of) != bool(self.runtime_axes):
            raise ValueError(f"{self.name}: a generic kernel names both the kernel it serves and its runtime axes")
        if is_generic(self.name) != bool(self.generic_of) or (self.generic_of and self.name != self.generic_of + GENERIC_SUFFIX):
            raise ValueError(f"{self.name}: a generic kernel, and only one, is named after the kernel it serves + {GENERIC_SUFFIX!r}")
        if not {a.name for a in self.runtime_axes} <= set(self.dims):
            raise ValueError(f"{self.name}: every runtime axis must be a dynamic dim")

    def generic(self, name: str, source: str, runtime_axes: tuple[str, ...]) -> KernelDecl:
        """The declaration of a generic kernel that serves this kernel's calls, taking `runtime_axes` (integer
        axes) at run time as dynamic dims appended to this kernel's arguments; built from `source`."""
        runtime = tuple(self.axis(n) for n in runtime_axes)
        if any(a.kind is not int and (a.kind is not str or a.choices is None) for a in runtime):
            wrong = [a.name for a in runtime if a.kind is not int and (a.kind is not str or a.choices is None)]
            raise ValueError(f"{name}: runtime axes must be integers or strings with a finite set of choices, not {wrong}")
        return KernelDecl(
            name=name,
            source=source,
            axes=tuple(a for a in self.axes if a.name not in runtime_axes),
            params=self.params,
            dims=(*self.dims, *runtime_axes),
            ops=self.ops,
            tilings=self.tilings,
            generic_of=self.name,
            runtime_axes=runtime,
        )

    def can_specialise(self, values) -> bool:
        """Whether static values (in axis order) have a specialised variant, or only a generic kernel serves them."""
        return self.specialisable is None or self.specialisable(dict(zip(self.axis_names, values)))

    def split(self, specialised: KernelDecl, values) -> tuple[tuple, dict[str, int]]:
        """A generic kernel's view of a call of `specialised` with static `values` (in its axis order):
        (this kernel's static values, {runtime axis: value})."""
        runtime = {a.name: a for a in self.runtime_axes}
        pairs = list(zip(specialised.axis_names, values))
        return tuple(v for n, v in pairs if n not in runtime), {n: runtime_value(runtime[n], v) for n, v in pairs if n in runtime}

    @property
    def args(self) -> tuple[str, ...]:
        """Every runtime argument in the ops' order: the params, then the dims."""
        return (*self.params, *self.dims)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(f"{self.name} has no axis {name!r}")

    def key(self, values) -> str:
        """The variant key of static values given in axis order: "axis=value,..."; the one key format."""
        return ",".join(f"{a.name}={format_value(v)}" for a, v in zip(self.axes, values))


def runtime_value(axis: Axis, value) -> int:
    """A runtime axis's value as its generic kernel takes it (a dim): an integer as is, a string as its index among
    the axis's choices."""
    return axis.choices.index(value) if axis.kind is str else value


def tiling_axis(tilings: Mapping[str, str]) -> Axis:
    """The static `tiling` axis of a kernel that ships these tilings (role -> name)."""
    return Axis("tiling", str, choices=tuple(dict.fromkeys(tilings.values())))


def declarer(prefix: str, ops_module: str) -> Callable[..., KernelDecl]:
    """A family's declaration constructor: `declare("mhc.post_fwd", axes, params, dims, ("mhc_post_fwd",), ...)`
    declares kernel `prefix + "post_fwd"` built from kernels_src.mhc.post_fwd, serving ops `ops_module + op`."""

    def declare(source: str, axes: tuple, params: tuple, dims: tuple, ops: tuple, **more) -> KernelDecl:
        name = prefix + source.rpartition(".")[2]
        ops = tuple(ops_module + op for op in ops)
        return KernelDecl(name=name, source="kernels_src." + source, axes=axes, params=params, dims=dims, ops=ops, **more)

    return declare


# A generic kernel's name: the specialised kernel's + this (KernelDecl checks it), so a manifest entry tells its tier
# by name alone: preload skips the generic tier without importing the declarations
GENERIC_SUFFIX = "_generic"


def is_generic(kernel_name: str) -> bool:
    return kernel_name.endswith(GENERIC_SUFFIX)


def all_kernels() -> dict[str, KernelDecl]:
    """Every declared kernel, by name (imports each family's declaration module: plain data, cheap)."""
    found: dict[str, KernelDecl] = {}
    for family in FAMILIES:
        for decl in importlib.import_module(f"tkaot._{family}.kernels").KERNELS:
            if decl.name in found:
                raise RuntimeError(f"kernel {decl.name!r} is declared twice")
            found[decl.name] = decl
    return found


def generic_kernel(specialised: str) -> KernelDecl | None:
    """The generic kernel declared for a specialised one, if any."""
    for decl in all_kernels().values():
        if decl.generic_of == specialised:
            return decl
    return None


def kernel(name: str) -> KernelDecl:
    try:
        return all_kernels()[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; known: {sorted(all_kernels())}") from None
