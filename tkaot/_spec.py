"""LaunchSpec: how to launch one compiled variant, as stored in a manifest.

Shared by the build (which writes it) and the runtime (which reads it). A
manifest is data: grid expressions are text checked against an
arithmetic-only grammar before they are turned into a function.
"""

from __future__ import annotations

import ast
import copy
import functools
import struct
from collections.abc import Mapping
from types import MappingProxyType

from tkaot._record import Record
from tkaot.errors import ManifestError

MANIFEST_SCHEMA = 1
PARAM_TYPES = ("ptr", "i32", "i64", "f32")
ARG_ROLES = ("tensor", "scalar", "dim")

_ALLOWED_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
_ALLOWED_CALLS = ("min", "max")
_NONE: Mapping[str, int] = MappingProxyType({})


class Param(Record):
    """One parameter of the generated kernel, in the kernel's own order."""

    # name: str
    # type: str  # one of PARAM_TYPES
    __slots__ = _fields = ("name", "type")


class Arg(Record):
    """One argument the op supplies (PrimFunc order, then dynamic dims)."""

    # name: str
    # role: str  # one of ARG_ROLES
    # type: str  # one of PARAM_TYPES
    __slots__ = _fields = ("name", "role", "type")


class LaunchSpec(Record):
    # symbol: str
    # params: tuple[Param, ...]
    # args: tuple[Arg, ...]
    # grid: tuple[str, str, str]
    # block: tuple[int, int, int]
    # smem: int
    # The kernel waits for the grids ahead of it before it touches memory (kernels_src/pdl.py), so it may be
    # launched with programmatic dependent launch. Written only when set: a manifest without it, or a
    # runtime that does not read it, launches the kernel plainly, which is always correct.
    # pdl: bool = False
    __slots__ = _fields = ("symbol", "params", "args", "grid", "block", "smem", "pdl")
    _defaults = {"pdl": False}

    def to_json(self) -> dict:
        data = {
            "symbol": self.symbol,
            "params": [[p.name, p.type] for p in self.params],
            "args": [[a.name, a.role, a.type] for a in self.args],
            "grid": list(self.grid),
            "block": list(self.block),
            "smem": self.smem,
        }
        if self.pdl:
            data["pdl"] = True
        return data

    @classmethod
    def from_json(cls, data: dict) -> LaunchSpec:
        try:
            spec = cls(
                symbol=str(data["symbol"]),
                params=_shared(_PARAMS, data["params"], Param),
                args=_shared(_ARGS, data["args"], Arg),
                grid=tuple(str(g) for g in data["grid"]),
                block=tuple(int(b) for b in data["block"]),
                smem=int(data["smem"]),
                pdl=data.get("pdl", False),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"malformed launch spec: {exc!r}") from None
        spec.check()
        return spec

    def check(self) -> None:
        """Raise ManifestError unless every field is well formed."""
        if not self.symbol.isidentifier():
            raise ManifestError(f"kernel symbol {self.symbol!r} is not an identifier")
        if len(self.grid) != 3 or len(self.block) != 3:
            raise ManifestError("grid and block must have three dimensions")
        dims = _checked_arguments(self.params, self.args)
        for expr in self.grid:
            check_grid_expr(expr, dims)
        if not all(0 < b <= 1024 for b in self.block) or self.smem < 0:
            raise ManifestError(f"bad block {self.block} or shared memory {self.smem}")
        if type(self.pdl) is not bool:
            raise ManifestError(f"pdl must be true or false, got {self.pdl!r}")


def _checked_arguments(params: tuple[Param, ...], args: tuple[Arg, ...]) -> frozenset[str]:
    """Check a parameter and argument list; returns the dim names. The lists a manifest's variants share (_shared)
    are checked once, remembered by identity (the entry holds them, so an id is never reused while remembered)."""
    seen = _CHECKED.get((id(params), id(args)))
    if seen is not None and seen[0] is params and seen[1] is args:
        return seen[2]
    arg_types = {}
    for a in args:
        if not a.name.isidentifier() or a.role not in ARG_ROLES or a.type not in PARAM_TYPES:
            raise ManifestError(f"bad argument {a}")
        arg_types[a.name] = a.type
    for p in params:
        if p.type not in PARAM_TYPES:
            raise ManifestError(f"parameter {p.name!r} has unknown type {p.type!r}")
        if arg_types.get(p.name) != p.type:
            raise ManifestError(f"kernel parameter {p.name!r} ({p.type}) is not supplied by any op argument")
    dims = frozenset(a.name for a in args if a.role == "dim")
    if len(_CHECKED) < 4096:
        _CHECKED[(id(params), id(args))] = (params, args, dims)
    return dims


_CHECKED: dict[tuple[int, int], tuple] = {}


# The variants of one kernel share their parameter and argument lists: parsed once per process
_PARAMS: dict[tuple, tuple[Param, ...]] = {}
_ARGS: dict[tuple, tuple[Arg, ...]] = {}


def _shared(table: dict, items: list, make) -> tuple:
    """The tuple of `make(*item)` for a manifest list of string lists, built once per distinct list."""
    key = tuple(map(tuple, items))
    found = table.get(key)
    if found is None:
        found = table[key] = tuple(make(*(str(field) for field in item)) for item in key)
    return found


def check_grid_expr(text: str, names: set[str] | frozenset[str]) -> ast.expr:
    """Parse `text` and refuse anything but integer arithmetic over `names`."""
    return _checked_grid_expr(text, names if type(names) is frozenset else frozenset(names))


@functools.lru_cache(maxsize=4096)
def _checked_grid_expr(text: str, names: frozenset[str]) -> ast.expr:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ManifestError(f"grid expression {text!r} does not parse") from None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.BinOp) and isinstance(node.op, _ALLOWED_BINOPS):
            visit(node.left)
            visit(node.right)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            pass
        elif isinstance(node, ast.Name) and node.id in names:
            pass
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ALLOWED_CALLS
            and len(node.args) == 2
            and not node.keywords
        ):
            visit(node.args[0])
            visit(node.args[1])
        else:
            raise ManifestError(f"grid expression {text!r} is outside the arithmetic grammar at {ast.dump(node)[:80]}")

    visit(tree.body)
    return tree.body


def compile_grid(grid: tuple[str, str, str], arg_names: tuple[str, ...], dims: set[str], constants: Mapping[str, int] = _NONE):
    """Return f(values) -> (gx, gy, gz), values being a tuple in `arg_names` order.

    Each expression is checked first; names are then replaced by tuple items (or, for the dims in
    `constants`, by their fixed values), so the compiled function does only integer arithmetic on one argument.
    """
    position = {name: i for i, name in enumerate(arg_names)}

    class ToItems(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id in _ALLOWED_CALLS:
                return node
            if node.id in constants:
                return ast.copy_location(ast.Constant(int(constants[node.id])), node)
            item = ast.Subscript(ast.Name("v", ast.Load()), ast.Constant(position[node.id]), ast.Load())
            return ast.copy_location(item, node)

    # the checked trees are shared (cached): the transformer works on a copy
    known = dims & (set(arg_names) | set(constants))
    exprs = [ToItems().visit(copy.deepcopy(check_grid_expr(expr, known))) for expr in grid]
    body = ast.Tuple(exprs, ast.Load())
    tree = ast.Expression(ast.Lambda(ast.arguments([], [ast.arg("v")], None, [], [], None, []), body))
    ast.fix_missing_locations(tree)
    # Only items of v, integers, + - * // % and min/max survive the check above.
    return eval(compile(tree, "<grid>", "eval"), {"__builtins__": {}, "min": min, "max": max})


# The compiled launcher's encoding of the same grammar: postfix steps of two int64 each,
# (opcode, operand), every expression closed by END. tkaot/_launch.c holds the same numbers.
_G_CONST, _G_ARG, _G_END = 0, 1, 9
_G_BINOPS = {ast.Add: 2, ast.Sub: 3, ast.Mult: 4, ast.FloorDiv: 5, ast.Mod: 6}
_G_CALLS = {"min": 7, "max": 8}
_GRID_STEP = struct.Struct("=qq")


def grid_program(grid: tuple[str, str, str], arg_names: tuple[str, ...], dims: set[str], constants: Mapping[str, int] = _NONE) -> bytes:
    """The grid as a postfix program over values in `arg_names` order, for the compiled launcher.

    Checked against the same grammar as compile_grid; evaluates to the same numbers
    (Python's floor division and modulo), in 64-bit integers. Dims in `constants` become their fixed values.
    """
    position = {name: i for i, name in enumerate(arg_names)}
    steps: list[tuple[int, int]] = []

    def emit(node: ast.expr) -> None:
        if isinstance(node, ast.Constant):
            steps.append((_G_CONST, node.value))
        elif isinstance(node, ast.Name) and node.id in constants:
            steps.append((_G_CONST, int(constants[node.id])))
        elif isinstance(node, ast.Name):
            steps.append((_G_ARG, position[node.id]))
        elif isinstance(node, ast.BinOp):
            emit(node.left)
            emit(node.right)
            steps.append((_G_BINOPS[type(node.op)], 0))
        else:  # min/max of two, the only calls check_grid_expr lets through
            emit(node.args[0])
            emit(node.args[1])
            steps.append((_G_CALLS[node.func.id], 0))

    for expr in grid:
        emit(check_grid_expr(expr, dims & (set(arg_names) | set(constants))))
        steps.append((_G_END, 0))
    try:
        return b"".join(_GRID_STEP.pack(op, operand) for op, operand in steps)
    except struct.error:
        raise ManifestError(f"grid {grid} has a constant outside 64 bits") from None
