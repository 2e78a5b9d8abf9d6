"""Profiling wall clock (``profiling_wall_s`` of result.json) and cells in flight, from a campaign's journal.

The wall clock an operator waits for is the time during which at least one
cell is being measured: the length of the union of the cells' intervals on
the campaign clock. A cell's interval is ``[start_s, finish_s]`` from its
``started`` and ``finished`` journal records (the parallel driver writes
them); a cell cancelled once the certificate was issued counts up to its
``cancelled`` time. Cells measured one at a time (the sequential loop, no
``started`` record) follow each other: each adds its occupancy,
``max(wall_s, duration_s + startup_s)`` — the simulated duration for replay
(whose measurements are instant) and the real time for hardware backends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["profiling_wall_s", "cell_intervals", "in_flight_cells", "read_in_flight", "record_dict", "cell_key"]


def record_dict(rec: Any) -> dict[str, Any]:
    """A journal record as a plain dict (raw dicts and typed records with ``to_json``)."""
    if isinstance(rec, dict):
        return rec
    to_json = getattr(rec, "to_json", None)
    return to_json() if callable(to_json) else {}


def cell_key(cell: Any) -> tuple[str, int | str, str]:
    """``(workload, tp or config name, load)`` of a cell or its journal JSON."""
    d = cell if isinstance(cell, dict) else (cell.to_json() if hasattr(cell, "to_json") else dict(cell))
    conf = str(d["config"]) if "config" in d else int(d["tp"])
    return (str(d["workload"]), conf, str(d["load"]))


def _num(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0


def _occupancy(rec: dict[str, Any]) -> float:
    row = rec.get("row") or {}
    return max(_num(rec.get("wall_s")), _num(row.get("duration_s")) + _num(row.get("startup_s")))


def cell_intervals(records: Iterable[Any]) -> tuple[list[tuple[float, float]], float]:
    """``(intervals, sequential_s)``: clock intervals of cells run by the parallel driver and the
    summed occupancy of cells measured one at a time."""
    started: dict[tuple[str, int, str], dict[str, Any]] = {}
    finished: dict[tuple[str, int, str], float] = {}
    intervals: list[tuple[float, float]] = []
    sequential = 0.0
    measurements: list[dict[str, Any]] = []
    for raw in records:
        rec = record_dict(raw)
        kind = rec.get("type")
        if kind == "started":
            started[cell_key(rec["cell"])] = rec
        elif kind == "finished":
            finished[cell_key(rec["cell"])] = float(rec["finish_s"])
        elif kind == "cancelled":
            intervals.append((float(rec["start_s"]), float(rec["finish_s"])))
        elif kind == "measurement":
            measurements.append(rec)
    for rec in measurements:
        key = cell_key(rec["cell"])
        if key in started:
            s = float(started[key]["start_s"])
            intervals.append((s, finished.get(key, s + _occupancy(rec))))
        else:
            sequential += _occupancy(rec)
    return intervals, sequential


def in_flight_cells(records: list[Any]) -> list[dict[str, Any]]:
    """The ``started`` records of cells that have not finished, been cancelled or measured, in start order."""
    state: dict[tuple[str, int, str], dict[str, Any] | None] = {}
    for raw in records:
        rec = record_dict(raw)
        kind = rec.get("type")
        if kind == "started":
            state[cell_key(rec["cell"])] = rec
        elif kind in ("measurement", "cancelled"):
            state[cell_key(rec["cell"])] = None
    return [r for r in state.values() if r is not None]


def read_in_flight(directory: Any) -> list[dict[str, Any]]:
    """Cells in flight in a campaign directory, as ``{workload, tp, load, gpus, start_s}`` (status/report)."""
    from pathlib import Path

    from fleetsieve_bayes.campaign.journal import JOURNAL_NAME, read_journal

    records, _ = read_journal(Path(directory) / JOURNAL_NAME)
    return [{**record_dict(r)["cell"], "gpus": r.get("gpus"), "start_s": r.get("start_s")} for r in in_flight_cells(records)]


def profiling_wall_s(records: Iterable[Any]) -> float:
    """Seconds during which at least one cell was being measured (see the module docstring)."""
    intervals, total = cell_intervals(records)
    end = -math.inf
    for s, f in sorted(intervals):
        if f <= end:
            continue
        total += f - max(s, end)
        end = f
    return float(total)
