"""The catalogue of kernel source modules, and the frozen Variant they build.

A `Variant` (kernel name + static key) is the one currency between
kernels_src, the build and the manifest; the CLI only parses into it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kernels_src.axes import Axis

KERNELS_ROOT = Path(__file__).resolve().parent.parent / "kernels_src"
_KERNEL_LINE = re.compile(r'^KERNEL = "([a-z0-9_]+)"$', re.MULTILINE)


def _scan_kernel_modules() -> dict[str, str]:
    """kernel name -> module path, for every kernels_src/<family>/<op>.py that declares KERNEL = "...".

    Read as text, so listing kernels needs no TileLang import.
    """
    found: dict[str, str] = {}
    for path in sorted(KERNELS_ROOT.glob("*/*.py")):
        match = _KERNEL_LINE.search(path.read_text())
        if match:
            name = match.group(1)
            if name in found:
                raise RuntimeError(f"kernel name {name!r} is declared by both {found[name]} and {path}")
            found[name] = f"kernels_src.{path.parent.name}.{path.stem}"
    return found


KERNEL_MODULES = _scan_kernel_modules()


def kernel_ops(kernel: str) -> tuple[str, ...]:
    """The public tkaot ops a kernel serves (its module's OPS)."""
    return tuple(getattr(load_kernel_module(kernel), "OPS", ()))


def load_kernel_module(kernel: str) -> ModuleType:
    try:
        return importlib.import_module(KERNEL_MODULES[kernel])
    except KeyError:
        raise ValueError(f"unknown kernel {kernel!r}; known: {sorted(KERNEL_MODULES)}") from None


def kernel_axes(kernel: str) -> tuple[Axis, ...]:
    # The axes live in the module; importing it pulls in TileLang, which the
    # build has anyway.
    return load_kernel_module(kernel).AXES


def _kernels_src_imports(path: Path) -> set[Path]:
    """Files of kernels_src modules that `path` imports (directly), found by reading its imports."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "kernels_src":
                continue
            candidate = KERNELS_ROOT.joinpath(*parts[1:])
            for f in (candidate.with_suffix(".py"), candidate / "__init__.py"):
                if f.is_file():
                    found.add(f)
    return found


def source_files(kernel: str) -> list[Path]:
    """The kernel's module and every kernels_src module it imports, transitively."""
    todo = [Path(load_kernel_module(kernel).__file__)]
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo.extend(_kernels_src_imports(f) - seen)
    return sorted(seen)


def source_sha256(kernel: str) -> str:
    """Hash of the kernel's source and of every kernels_src helper it imports (so a change there rebuilds it)."""
    digest = hashlib.sha256()
    for f in source_files(kernel):
        digest.update(str(f.relative_to(KERNELS_ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def format_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class Variant:
    """One kernel specialised on all its static axes."""

    kernel: str
    static: tuple[tuple[str, object], ...]  # in the kernel's AXES order

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
        static = []
        for axis in axes:
            static.append((axis.name, axis.parse(values[axis.name])))
        return cls(kernel, tuple(static))

    @property
    def key(self) -> str:
        """Canonical text key, the same string the runtime builds."""
        return ",".join(f"{k}={format_value(v)}" for k, v in self.static)

    @property
    def params(self) -> dict:
        return dict(self.static)

    def build_command(self) -> str:
        sets = " ".join(f"--set {k}={format_value(v)}" for k, v in self.static)
        return f"tkaot-build build --op {self.kernel} {sets}"
