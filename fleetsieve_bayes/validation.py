"""The one validator of the package's TOML files (campaigns, inference presets).

Every problem is one :class:`~fleetsieve_bayes.errors.InputError` line naming
the file and the field; an unknown key is an error with the closest known one
suggested, so a typo never becomes a silent default.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

from fleetsieve_bayes.errors import InputError

__all__ = ["Validator"]


class Validator:
    """Formats one-line errors naming the file and the field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, message: str) -> InputError:
        return InputError(f"{self.path}: {where}: {message}")

    def check_keys(self, where: str, table: dict[str, Any], allowed: set[str]) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(
                    where, f"unknown key {key!r}{hint}; allowed: {', '.join(sorted(allowed))}"
                )

    def table(self, where: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a table, got {type(value).__name__}")
        return value

    def string(self, where: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"expected a non-empty string, got {value!r}")
        return value

    def number(
        self,
        where: str,
        value: Any,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, f"expected a number, got {value!r}")
        x = float(value)
        if not math.isfinite(x):
            raise self.fail(where, f"expected a finite number, got {value!r}")
        if lo is not None and (x < lo or (lo_open and x == lo)):
            raise self.fail(where, f"must be {'>' if lo_open else '>='} {lo:g}, got {value!r}")
        if hi is not None and (x > hi or (hi_open and x == hi)):
            raise self.fail(where, f"must be {'<' if hi_open else '<='} {hi:g}, got {value!r}")
        return x

    def integer(self, where: str, value: Any, *, lo: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected an integer, got {value!r}")
        if value < lo:
            raise self.fail(where, f"must be >= {lo}, got {value!r}")
        return value

    def boolean(self, where: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {value!r}")
        return value
