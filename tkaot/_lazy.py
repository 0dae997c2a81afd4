"""Public op families that load their op modules on first use, so importing a family costs almost nothing."""

from __future__ import annotations

import importlib


def lazy_family(family: str, modules: dict[str, tuple[str, ...]], namespace: dict):
    """`__getattr__` and `__dir__` for the public family module whose globals() are `namespace`: each op name
    of `modules` ({module path: op names}) is imported from its module at first access and then cached there."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module 'tkaot.{family}' has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(module), name)  # later lookups skip this
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__, sorted(where)
