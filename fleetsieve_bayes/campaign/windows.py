"""Every measurement window of a campaign, read from its journal: the one owner of replicate numbering.

A cell's windows are its measurement records, numbered by ``replicate``
(0 for the first, 1, … for deliberate repeats). The rules, enforced here for
every driver:

- the next window of a cell is always ``replicate = windows so far``
  (:func:`next_replicate`); a record of a ``(cell, replicate)`` already held
  (a kill between measuring and journaling, re-run on resume) counts once;
- a repeat (replicate ≥ 1) is asked for explicitly (:func:`check_window`):
  measuring a cell that already has windows without saying it is a repeat is
  refused, so no cell is measured twice by accident;
- a cell can be repeated only where the backend can give another window
  (:attr:`~fleetsieve_bayes.backends.Backend.windows_available`: a replayed
  table has as many as its rows), below the campaign's cap of windows per
  cell, and when its windows say something about the load (a server that
  never started, :data:`~fleetsieve_bayes.backends.failures.SERVER_FAILURES`,
  is not repeated: :func:`repeatable`).

:func:`window_observations` gives every window as model input (rows and
their cells, in journal order); :func:`window_rows` the table rows of
``measurements.csv`` (each with its ``replicate``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.backends.failures import SERVER_FAILURES
from fleetsieve_bayes.campaign.journal import MeasurementRecord
from fleetsieve_bayes.decision.bounds import repeatable_mask
from fleetsieve_bayes.deploy.production import PRODUCTION_PHASE
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import METRICS

__all__ = [
    "WindowObservations",
    "windows_of",
    "window_counts",
    "next_replicate",
    "check_window",
    "repeatable",
    "repeatable_mask",
    "window_limits",
    "server_failed_cells",
    "window_observations",
    "window_rows",
]


class WindowObservations(NamedTuple):
    """Every window of the measured cells, in journal order.

    Attributes:
        rows: ``(n_windows, 4)`` float64 METRICS of each window (NaN: unobserved completion).
        cell: ``(n_windows,)`` int64 grid index of each window's cell.
        replicate: ``(n_windows,)`` int64 replicate index of each window.
        failed: ``(n_windows,)`` bool: the window carries a failure label.
    """

    rows: np.ndarray
    cell: np.ndarray
    replicate: np.ndarray
    failed: np.ndarray


def _label(key: tuple[str, int, str]) -> str:
    return f"{key[0]} TP{key[1]}@{key[2]}"


def windows_of(records: Iterable[Any]) -> dict[tuple[str, int, str], list[MeasurementRecord]]:
    """Each cell's measurement records in replicate order, a repeated ``(cell, replicate)`` once (the first).

    Raises:
        InputError: a cell's replicates have a gap (a journal edited by hand or
            written by a broken driver), naming the cell and the missing index.
    """
    by: dict[tuple[str, int, str], dict[int, MeasurementRecord]] = {}
    for rec in records:
        # Production windows are observations of their own (fleetsieve_bayes/deploy/production.py).
        if isinstance(rec, MeasurementRecord) and rec.phase != PRODUCTION_PHASE:
            by.setdefault(tuple(rec.cell), {}).setdefault(rec.replicate, rec)  # type: ignore[arg-type]
    out: dict[tuple[str, int, str], list[MeasurementRecord]] = {}
    for key, reps in by.items():
        have = sorted(reps)
        gap = next((k for k, r in enumerate(have) if r != k), None)
        if gap is not None:
            raise InputError(
                f"journal: cell {_label(key)} has window replicate {have[gap]} but no replicate {gap} "
                f"(a cell's windows are 0, 1, … without gaps)"
            )
        out[key] = [reps[r] for r in have]
    return out


def window_counts(grid: CellGrid, records: Iterable[Any]) -> np.ndarray:
    """``(n_cells,)`` int64: the windows the journal holds of each candidate cell.

    Raises:
        InputError: a gap (:func:`windows_of`) or a cell that is not a candidate.
    """
    index = grid.index()
    counts = np.zeros(grid.n_cells, dtype=np.int64)
    for key, recs in windows_of(records).items():
        if key not in index:
            raise InputError(f"journal: measured cell {_label(key)} is not a candidate of this campaign")
        counts[index[key]] = len(recs)
    return counts


def next_replicate(grid: CellGrid, records: Iterable[Any], cell: int) -> int:
    """The replicate index the next window of ``cell`` gets: the number of windows held."""
    return int(window_counts(grid, records)[cell])


def check_window(grid: CellGrid, records: Iterable[Any], cell: int, *, repeat: bool) -> int:
    """The replicate of the window about to be measured, after checking that it is meant.

    Args:
        repeat: the caller asks for another window of a measured cell.

    Returns:
        The replicate index to measure and journal.

    Raises:
        RuntimeError: a first window asked of a cell already measured, or a
            repeat of a cell never measured (a driver bug, never user input).
    """
    k = next_replicate(grid, records, cell)
    if k and not repeat:
        raise RuntimeError(f"cell {grid.describe(cell)} already has {k} window(s): a repeat must be asked for")
    if repeat and not k:
        raise RuntimeError(f"cell {grid.describe(cell)} has no window yet: its first is not a repeat")
    return k


def window_limits(windows_available: Callable[[int], int | None], n_cells: int) -> np.ndarray:
    """``(n_cells,)`` float64: the windows a backend can give of each cell (``inf``: no limit)."""
    out = np.full(n_cells, np.inf)
    for c in range(n_cells):
        n = windows_available(c)
        if n is not None:
            out[c] = float(n)
    return out


def server_failed_cells(grid: CellGrid, records: Iterable[Any]) -> np.ndarray:
    """``(n_cells,)`` bool: cells with a window in which the server never served
    (:data:`~fleetsieve_bayes.backends.failures.SERVER_FAILURES`)."""
    index = grid.index()
    out = np.zeros(grid.n_cells, dtype=bool)
    for key, recs in windows_of(records).items():
        if key in index and any(r.row.get("failure") in SERVER_FAILURES for r in recs):
            out[index[key]] = True
    return out


def repeatable(
    grid: CellGrid,
    records: Iterable[Any],
    *,
    max_windows_per_cell: int,
    windows_available: Callable[[int], int | None],
) -> np.ndarray:
    """``(n_cells,)`` bool: the cells a strategy may measure again now.

    A cell is repeatable when it has a window, fewer than
    ``max_windows_per_cell`` of them, the backend can give another
    (``windows_available(cell)`` is None or above the count), and none of its
    windows is a failure of the server itself (it never served: another
    window would fail the same way).
    """
    records = list(records)
    return repeatable_mask(window_counts(grid, records), window_limits(windows_available, grid.n_cells),
                           server_failed_cells(grid, records), max_windows_per_cell)


def _metric(v: Any) -> float:
    return float("nan") if v is None else float(v)


def window_observations(grid: CellGrid, records: Iterable[Any]) -> WindowObservations:
    """Every window of the journal as model input, in journal order (a duplicate record once)."""
    index = grid.index()
    records = list(records)
    kept = _kept(records)
    rows, cells, reps, failed = [], [], [], []
    for rec in records:
        if not isinstance(rec, MeasurementRecord) or id(rec) not in kept:
            continue
        key = tuple(rec.cell)
        if key not in index:
            raise InputError(f"journal: measured cell {rec.cell.label} is not a candidate of this campaign")
        rows.append([_metric(rec.row.get(m)) for m in METRICS])
        cells.append(index[key])
        reps.append(rec.replicate)
        failed.append(bool(rec.row.get("failure")))
    return WindowObservations(
        rows=np.asarray(rows, dtype=np.float64).reshape(-1, len(METRICS)),
        cell=np.asarray(cells, dtype=np.int64),
        replicate=np.asarray(reps, dtype=np.int64),
        failed=np.asarray(failed, dtype=bool),
    )


def _kept(records: list[Any]) -> set[int]:
    """``id`` of each window's record (:func:`windows_of`: a repeated ``(cell, replicate)`` once)."""
    return {id(r) for recs in windows_of(records).values() for r in recs}


def window_rows(records: Iterable[Any]) -> list[dict[str, Any]]:
    """The table row of every window in journal order, each with its ``replicate``
    (``measurements.csv``; a repeated ``(cell, replicate)`` record once)."""
    records = list(records)
    kept = _kept(records)
    return [{**rec.row, "replicate": rec.replicate} for rec in records
            if isinstance(rec, MeasurementRecord) and id(rec) in kept]
