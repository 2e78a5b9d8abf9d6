"""Locating data shipped with the package (prior cards, inference presets, examples).

The prior cards and inference presets are package data, in the source tree and
in a wheel alike:

- ``fleetsieve_bayes/data/priors/``: prior cards (``*.toml``), with the
  architecture configs ``priors derive`` knows by name (``architectures/``)
  and the GPU datasheet table (``hardware/gpus.toml``);
- ``fleetsieve_bayes/data/presets/``: inference presets (``*.toml``).

The examples are the top-level ``examples/`` folder of the repository, for
users of a clone; the wheel ships a copy as ``fleetsieve_bayes/data/examples/``.
Nothing falls back to a folder outside the package except ``examples`` in a
source checkout (the folder next to the package, in a tree that has a
``pyproject.toml``).

Relative paths ``models/…`` (the priors) and ``inference/…`` (the presets)
are accepted aliases of these folders (:func:`legacy_path`), e.g.
``models/generic.toml``, ``models/architectures/dense-31b.json``,
``inference/fast.toml``; so are the kind names ``"models"`` and ``"inference"``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_KINDS", "data_dir", "legacy_path"]

_PACKAGE_DIR = Path(__file__).resolve().parent
_DATA = _PACKAGE_DIR / "data"

DATA_KINDS: tuple[str, ...] = ("priors", "presets", "examples")
# Earlier names of the kinds, accepted by data_dir.
_ALIASES = {"models": "priors", "inference": "presets"}
# Earlier repository folders, as the first component of a relative path.
_LEGACY_FOLDERS = {"models": "priors", "inference": "presets"}


def data_dir(kind: str) -> Path:
    """Folder of shipped data of one kind: ``"priors"``, ``"presets"`` or ``"examples"``.

    Raises:
        ValueError: an unknown kind.
        FileNotFoundError: the folder is missing (a broken install).
    """
    kind = _ALIASES.get(kind, kind)
    if kind not in DATA_KINDS:
        raise ValueError(f"unknown data kind {kind!r} (known: {', '.join(DATA_KINDS)})")
    candidates = [_DATA / kind]
    if kind == "examples" and (_PACKAGE_DIR.parent / "pyproject.toml").is_file():
        candidates.append(_PACKAGE_DIR.parent / "examples")  # a source checkout
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"shipped data folder {kind!r} not found in {_DATA} (a broken install?)")


def legacy_path(path: str | Path) -> Path | None:
    """The shipped file a relative ``models/…`` or ``inference/…`` path named, or None.

    Only for a relative path that does not exist as given, whose first
    component is ``models`` or ``inference`` and whose rest names a shipped file.
    """
    p = Path(path)
    if p.is_absolute() or p.exists() or len(p.parts) < 2 or p.parts[0] not in _LEGACY_FOLDERS:
        return None
    shipped = _DATA / _LEGACY_FOLDERS[p.parts[0]] / Path(*p.parts[1:])
    return shipped if shipped.is_file() else None
