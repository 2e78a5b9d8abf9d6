"""Locating data shipped with the package (prior cards, inference presets, examples).

In a wheel they live under ``fleetsieve_bayes/_data/``; in a source checkout or
an editable install they are the top-level ``models/``, ``inference/`` and
``examples/`` folders of the repository.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """Folder of shipped data of one kind: ``"models"``, ``"inference"`` or ``"examples"``."""
    if kind not in ("models", "inference", "examples"):
        raise ValueError(f"unknown data kind {kind!r}")
    for candidate in (_PACKAGE_DIR / "_data" / kind, _PACKAGE_DIR.parent / kind):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"shipped data folder {kind!r} not found next to {_PACKAGE_DIR}")
