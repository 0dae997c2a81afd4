"""The kernel catalogue, read from the kernel declarations, and the frozen Variant they build.

Each kernel is declared once (tkaot/_decl.py, tkaot/_<family>/kernels.py): its static axes, runtime
arguments, dynamic dims, shipped tilings and ops. The catalogue is those declarations; a declaration's
`source` names the kernels_src module that builds it. A `Variant` (kernel name + static values in axis
order) is the one currency between kernels_src, the build and the manifest; the CLI only parses into it.
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from build_tools.imports import imported_names
from tkaot._decl import FAMILIES, Axis, KernelDecl, all_kernels, build_command, format_value

__all__ = [
    "KERNEL_MODULES",
    "Variant",
    "declaration",
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


def _module_file(name: str) -> Path:
    return REPO_ROOT.joinpath(*name.split(".")).with_suffix(".py")


def _declaration_file(kernel: str) -> Path:
    """The file of the module that declares the kernel (tkaot/_<family>/kernels.py)."""
    decl = declaration(kernel)
    for family in FAMILIES:
        module = importlib.import_module(f"tkaot._{family}.kernels")
        if any(d is decl for d in module.KERNELS):
            return Path(module.__file__).resolve()
    raise RuntimeError(f"no declaration module holds kernel {kernel!r}")


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
    """The kernel's declaration module, its TileLang module and every kernels_src module that imports, transitively."""
    todo = [_module_file(declaration(kernel).source)]
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo.extend(_kernels_src_imports(f) - seen)
    return sorted(seen | {_declaration_file(kernel)})


def source_sha256(kernel: str) -> str:
    """Hash of the kernel's declaration and sources (so a change to any of them rebuilds it)."""
    digest = hashlib.sha256()
    for f in source_files(kernel):
        digest.update(str(f.relative_to(REPO_ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


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
