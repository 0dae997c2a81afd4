"""Record: the runtime's small frozen value classes, without dataclasses' per-class code generation.

`@dataclass` writes and compiles several methods for every class it decorates (about half a millisecond
each at import); the runtime defines a dozen such classes on the path to its first kernel launch. A Record
subclass names its fields once (`__slots__ = _fields = (...)`) and its defaults in `_defaults`; construction
takes them positionally or by name, then runs `__post_init__` if the class has one.
"""

from __future__ import annotations


class Record:
    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict = {}

    def __init__(self, *args, **kwargs):
        fields = self._fields
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes {len(fields)} fields, got {len(args)}")
        values = dict(self._defaults)
        values.update(zip(fields, args))
        for name, value in kwargs.items():
            if name not in fields:
                raise TypeError(f"{type(self).__name__} has no field {name!r}")
            values[name] = value
        set_field = object.__setattr__
        for name in fields:
            try:
                set_field(self, name, values[name])
            except KeyError:
                raise TypeError(f"{type(self).__name__} needs {name!r}") from None
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is frozen")

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other):
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self):
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self._fields)})"

    def __reduce__(self):  # pickling (the build's worker processes) rebuilds through __init__
        return type(self), self._values()

    def replace(self, **changes):
        """A copy with some fields changed."""
        return type(self)(**{**dict(zip(self._fields, self._values())), **changes})
