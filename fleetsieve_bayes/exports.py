"""Lazy public names of a package: ``import fleetsieve_bayes`` stays cheap (no JAX) until a
name is used. A package's ``__init__`` lists its names once, each with the module that owns it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, owners: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public ``name`` lives in module
    ``owners[name]`` (a full module path); a name that is its owner's last component
    (``"strategies": "fleetsieve_bayes.decision.strategies"``) is that module itself."""

    def getattr_(name: str) -> Any:
        if name not in owners:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(owners[name])
        return module if owners[name].rsplit(".", 1)[-1] == name else getattr(module, name)

    def dir_() -> list[str]:
        return sorted(owners)

    return getattr_, dir_
