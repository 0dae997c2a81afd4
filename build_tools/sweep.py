"""Shape sets (TOML) -> the list of Variants to build.

A shape set has one table per declared kernel (tkaot/_<family>/kernels.py); each
key is a static axis of its declaration and its value a list of values (or one
value); an axis left out with a finite set of choices sweeps them all. The
sweep is the cross product of each table; `[[kernel]]` arrays of tables give
several products for one kernel.

    [[rmsnorm]]
    hidden = [512, 7168]
    dtype = ["bfloat16", "float32"]
    with_weight = [true, false]

A top-level `include = ["other.toml", ...]` pulls in further sets (paths
relative to the including file), so the default set is a union of files.
A top-level `hf_config = "model.json"` (or a list) adds every variant that
model's forward pass needs, through build_tools/model_shapes.py; the model
presets are such files.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from build_tools.ops import DECLARATIONS, Variant, declaration

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SHAPESETS_DIR = Path(__file__).resolve().parent / "shapesets"


def resolve_shapeset(name_or_file: str) -> Path:
    path = Path(name_or_file)
    if path.suffix == ".toml" and path.exists():
        return path
    named = SHAPESETS_DIR / f"{name_or_file}.toml"
    if named.exists():
        return named
    known = sorted(p.stem for p in SHAPESETS_DIR.glob("*.toml"))
    raise ValueError(f"no shape set {name_or_file!r}: not a .toml file, and the named sets are {known}")


def expand_table(kernel: str, table: dict, refused: list[str] | None = None) -> list[Variant]:
    """The cross product of one table. With `refused`, values a kernel cannot build are
    noted there and skipped instead of raising (a model config may ask for more than a kernel does)."""
    axes = declaration(kernel).axes
    names = [a.name for a in axes]
    unknown = set(table) - set(names)
    if unknown:
        raise ValueError(f"[{kernel}]: unknown axes {sorted(unknown)}; axes are {names}")
    choices = []
    for axis in axes:
        if axis.name in table:
            values = table[axis.name]
            values = values if isinstance(values, list) else [values]
        elif axis.choices is not None:
            values = list(axis.choices)  # an unnamed finite axis sweeps every value
        else:
            raise ValueError(f"[{kernel}]: axis {axis.name!r} needs values ({axis.describe()})")
        choices.append(values)
    variants = []
    for combo in itertools.product(*choices):
        try:
            variants.append(Variant.make(kernel, dict(zip(names, combo))))
        except ValueError as exc:
            if refused is None:
                raise
            refused.append(f"{kernel} {','.join(f'{n}={v}' for n, v in zip(names, combo))}: {exc}")
    return variants


def sweep(shapeset: dict, refused: list[str] | None = None) -> list[Variant]:
    """All variants of a parsed shape set, deduplicated, in a stable order (`refused`: see expand_table)."""
    variants: dict[tuple[str, str], Variant] = {}
    for kernel, tables in shapeset.items():
        if kernel not in DECLARATIONS:
            raise ValueError(f"shape set names unknown kernel {kernel!r}; known: {sorted(DECLARATIONS)}")
        for table in tables if isinstance(tables, list) else [tables]:
            for v in expand_table(kernel, table, refused):
                variants.setdefault((v.kernel, v.key), v)
    return [variants[k] for k in sorted(variants)]


def read_shapeset(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, list]:
    """Parse a shape set file and its includes into {kernel: [table, ...]}."""
    path = path.resolve()
    if path in _seen:
        raise ValueError(f"shape set {path} includes itself")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    merged: dict[str, list] = {}
    for inc in _paths(data.pop("include", []), path, "include"):
        for kernel, tables in read_shapeset(path.parent / inc, (*_seen, path)).items():
            merged.setdefault(kernel, []).extend(tables)
    for config in _paths(data.pop("hf_config", []), path, "hf_config"):
        try:
            tables_of_model = model_shapeset(path.parent / config)
        except ValueError as exc:
            raise ValueError(f"{path}: hf_config: {exc}") from None
        for kernel, tables in tables_of_model.items():
            merged.setdefault(kernel, []).extend(tables)
    for kernel, tables in data.items():
        merged.setdefault(kernel, []).extend(tables if isinstance(tables, list) else [tables])
    return merged


def _paths(value, path: Path, key: str) -> list[str]:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, str) for v in values):
        raise ValueError(f"{path}: {key} wants a path or a list of paths, got {value!r}")
    return values


def model_shapeset(config_path: str | Path) -> dict[str, list]:
    """The shape set a model config implies: {kernel: [table, ...]}, for the kernels tkaot has."""
    from build_tools.model_shapes import load_config, shape_tables

    return shape_tables(load_config(config_path))


def load_shapeset(name_or_file: str) -> list[Variant]:
    return sweep(read_shapeset(resolve_shapeset(name_or_file)))


def shard(variants: list[Variant], spec: str | None) -> list[Variant]:
    """Keep shard i of n ("i/n", 0-based) of the sweep."""
    if not spec:
        return variants
    try:
        i, n = (int(p) for p in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard wants i/n, got {spec!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec}: need 0 <= i < n")
    return variants[i::n]
