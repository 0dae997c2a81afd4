"""Static-axis descriptions shared by every kernel source module.

Kept free of TileLang so the CLI can list ops and check keys cheaply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Axis:
    """One static (compile-time) parameter of a kernel."""

    name: str
    kind: type  # int, str or bool
    choices: tuple | None = None  # allowed values, when the set is finite
    check: Callable[[object], bool] | None = None  # predicate, when it is not
    rule: str = ""  # the predicate in words, for error messages

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

    def describe(self) -> str:
        if self.choices is not None:
            return "|".join(str(c).lower() if isinstance(c, bool) else str(c) for c in self.choices)
        return self.rule or self.kind.__name__
