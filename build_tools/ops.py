"""The kernel catalogue, read from the kernel declarations, and the frozen Variant they build.

Each kernel is declared once (tkaot/_decl.py, tkaot/_<family>/kernels.py): its static axes, runtime
arguments, dynamic dims, shipped tilings and ops. The catalogue is those declarations; a declaration's
`source` names the kernels_src module that builds it. A `Variant` (kernel name + static values in axis
order) is the one currency between kernels_src, the build and the manifest; the CLI only parses into it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from build_tools.imports import imported_names
from tkaot._decl import Axis, KernelDecl, all_kernels, build_command, format_value, runtime_value

__all__ = [
    "KERNEL_MODULES",
    "Variant",
    "declaration",
    "fingerprint",
    "format_value",
    "kernel_axes",
    "kernel_ops",
    "load_kernel_module",
    "source_files",
    "source_sha256",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELS_ROOT = REPO_ROOT / "kernels_src"

DECLARATIONS: dict[str, KernelDecl] = all_kernels()
# kernel name -> its TileLang module ("kernels_src.<family>.<file>")
KERNEL_MODULES: dict[str, str] = {name: decl.source for name, decl in DECLARATIONS.items()}


def declaration(kernel: str) -> KernelDecl:
    try:
        return DECLARATIONS[kernel]
    except KeyError:
        raise ValueError(f"unknown kernel {kernel!r}; known: {sorted(DECLARATIONS)}") from None


def kernel_ops(kernel: str) -> tuple[str, ...]:
    """The public tkaot ops a kernel serves."""
    return declaration(kernel).ops


def kernel_axes(kernel: str) -> tuple[Axis, ...]:
    return declaration(kernel).axes


def load_kernel_module(kernel: str) -> ModuleType:
    """The kernel's TileLang module (imports TileLang)."""
    return importlib.import_module(declaration(kernel).source)


def runtime_axes(module: ModuleType) -> tuple[str, ...]:
    """The static axes of a kernel's declaration that its module (CUDA or Ascend) takes at run time (its
    RUNTIME_AXES): the variants that differ only in those share one lowering, each launched with its own values."""
    return tuple(getattr(module, "RUNTIME_AXES", ()))


def build_static(variant: Variant, runtime: tuple[str, ...]) -> dict:
    """The static values a module builds the variant from: all but the axes it takes at run time."""
    return {k: v for k, v in variant.static if k not in runtime}


def fixed_values(variant: Variant, runtime: tuple[str, ...]) -> dict:
    """The variant's values of the axes its kernel takes at run time, as the kernel takes them (an int axis's value,
    a string axis's index among its choices): the manifest entry's `fixed`, passed after the op's arguments."""
    decl = declaration(variant.kernel)
    return {a: runtime_value(decl.axis(a), variant.params[a]) for a in runtime}


def _module_file(name: str) -> Path:
    return REPO_ROOT.joinpath(*name.split(".")).with_suffix(".py")


def _tkaot_imports(path: Path) -> set[tuple[str, str]]:
    """(module, name) of each `from tkaot... import name` in the file, read from its source."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "tkaot":
            found |= {(node.module, a.name) for a in node.names}
    return found


def _axis_text(axis: Axis) -> tuple:
    return (axis.name, axis.kind.__name__, axis.choices, axis.rule)


def fingerprint(value) -> str | None:
    """Stable text of what a kernel source takes from the runtime: a declaration (the facts a build reads: name,
    source, axes, arguments, tilings, generic tier; not the ops it serves) or plain data (numbers, strings, and
    tuples, lists, sets and mappings of them). None for anything else (a function): its whole module is hashed."""
    if isinstance(value, KernelDecl):
        return repr((
            value.name, value.source, [_axis_text(a) for a in value.axes], value.params, value.dims,
            sorted(value.tilings.items()), value.generic_of, [_axis_text(a) for a in value.runtime_axes],
        ))  # fmt: skip
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        items = [fingerprint(v) for v in value]
        return None if None in items else f"{type(value).__name__}({', '.join(items)})"
    if isinstance(value, (set, frozenset)):
        items = [fingerprint(v) for v in value]
        return None if None in items else f"set({', '.join(sorted(items))})"
    if isinstance(value, Mapping):
        items = [(fingerprint(k), fingerprint(v)) for k, v in value.items()]
        return None if any(None in kv for kv in items) else f"map({sorted(items)})"
    return None


def _kernels_src_imports(path: Path) -> set[Path]:
    """Files of kernels_src modules that `path` imports (directly), found by reading its imports."""
    found: set[Path] = set()
    for name in imported_names(path):
        parts = name.split(".")
        if parts[0] != "kernels_src":
            continue
        candidate = KERNELS_ROOT.joinpath(*parts[1:])
        for f in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if f.is_file():
                found.add(f)
    return found


def source_files(kernel: str) -> list[Path]:
    """The kernel's TileLang module and every kernels_src module it imports, transitively."""
    return kernels_src_closure(_module_file(declaration(kernel).source))


def kernels_src_closure(root: Path) -> list[Path]:
    """`root` and every kernels_src module it imports, transitively."""
    todo = [root]
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo.extend(_kernels_src_imports(f) - seen)
    return sorted(seen)


def sources_sha256(kernel: str, files: list[Path]) -> str:
    """Hash of a kernel's source files and of what they take from the runtime: its own declaration and each value
    they import from a tkaot module, by fingerprint, so that another kernel's declaration changing beside them in the
    same module rebuilds nothing; a value with no fingerprint (a function) brings its whole module file in."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(REPO_ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    digest.update(b"declaration\0" + fingerprint(declaration(kernel)).encode() + b"\0")
    for module_name, name in sorted({pair for f in files for pair in _tkaot_imports(f)}):
        module = importlib.import_module(module_name)
        text = fingerprint(getattr(module, name, None)) if hasattr(module, name) else None
        if text is None:  # a function, or a submodule: the file it lives in
            text = Path(module.__file__).read_text()
        digest.update(f"{module_name}.{name}".encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def source_sha256(kernel: str) -> str:
    """Hash of the kernel's sources and declaration (so a change to any of them rebuilds it): sources_sha256."""
    return sources_sha256(kernel, source_files(kernel))


@dataclass(frozen=True)
class Variant:
    """One kernel specialised on all its static axes."""

    kernel: str
    static: tuple[tuple[str, object], ...]  # in the declaration's axis order

    @classmethod
    def make(cls, kernel: str, values: dict) -> Variant:
        axes = kernel_axes(kernel)
        names = [a.name for a in axes]
        unknown = set(values) - set(names)
        if unknown:
            raise ValueError(f"{kernel}: unknown static axes {sorted(unknown)}; axes are {names}")
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"{kernel}: missing static axes {missing}")
        return cls(kernel, tuple((axis.name, axis.parse(values[axis.name])) for axis in axes))

    @property
    def key(self) -> str:
        """Canonical text key, formatted by the declaration (the same string the runtime builds)."""
        return declaration(self.kernel).key([v for _, v in self.static])

    @property
    def params(self) -> dict:
        return dict(self.static)

    def build_command(self, arch: str = "sm90") -> str:
        return build_command(self.kernel, self.key, arch)
