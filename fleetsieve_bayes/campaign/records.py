"""The journal records both drivers write: measurements and rounds.

A measurement record is checked (every column of
:data:`~fleetsieve_bayes.table.COLUMNS`) and appended durably before the
campaign takes its next step; a round record holds a round's certificate,
gap, both allocations and their objectives, the chosen cell or the final
allocation, and the round's timings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetsieve_bayes.allocation.objective import objective_json
from fleetsieve_bayes.allocation.problem import Allocation, CellGrid, allocation_to_json
from fleetsieve_bayes.campaign.journal import Cell, Journal, MeasurementRecord, RoundRecord, Side
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import COLUMNS

__all__ = ["Event", "cell_of", "side_of", "plain_row", "journal_measurement", "round_record", "no_events",
           "sampling_events"]

# Callback for progress displays: ``on_event(kind, info)``. Kinds: "resume",
# "round", "measure-start", "measure-done", "sampling", "done".
Event = Callable[[str, dict[str, Any]], None]


def no_events(kind: str, info: dict[str, Any]) -> None:
    """An :data:`Event` callback that shows nothing."""
    return None


def sampling_events(on_event: Event) -> Callable[[str, int, int], None]:
    """A :func:`fleetsieve_bayes.model.sampling_progress.sampling_progress` sink that sends
    ``on_event("sampling", {preset, done, total})``: how far the running fit has got."""

    def sink(preset: str, done: int, total: int) -> None:
        on_event("sampling", {"preset": preset, "done": done, "total": total})

    return sink


def cell_of(grid: CellGrid, c: int) -> Cell:
    """Cell ``c`` of ``grid`` as the journal names it."""
    return Cell(*grid.key(c))


def side_of(a: Allocation, grid: CellGrid) -> Side:
    """One side of the decision (an allocation and its objective) as the journal keeps it."""
    return Side(allocation_to_json(a, grid), objective_json(a, with_feasible=True))


def plain_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row with NumPy scalars as plain Python values (JSON-able)."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def journal_measurement(
    journal: Journal,
    grid: CellGrid,
    c: int,
    row: dict[str, Any],
    *,
    round_no: int,
    phase: str,
    started: float,
    finished: float,
    on_event: Event,
    replicate: int = 0,
) -> dict[str, Any]:
    """Check a backend's row and append its measurement record durably (window
    ``replicate`` of the cell); returns the row.

    Raises:
        InputError: the row lacks a column of :data:`~fleetsieve_bayes.table.COLUMNS`.
    """
    cell = cell_of(grid, c)
    missing = [k for k in COLUMNS if k not in row]
    if missing:
        raise InputError(f"backend returned a row for {cell.label} without {', '.join(missing)}")
    row = plain_row(row)
    gpu_s = float(row["duration_s"]) * int(row["tp"])
    journal.append(
        MeasurementRecord(
            seq=len(journal.measurements),
            round=round_no,
            phase=phase,
            cell=cell,
            row=row,
            gpu_seconds=gpu_s,
            started_at=started,
            finished_at=finished,
            wall_s=finished - started,
            replicate=int(replicate),
        )
    )
    on_event("measure-done", {"cell": cell.to_json(), "label": cell.label, "row": row, "gpu_seconds": gpu_s,
                              "replicate": int(replicate)})
    return row


def round_record(
    grid: CellGrid,
    round_no: int,
    view: Any,
    *,
    outcome: str,
    measured_cells: int,
    gpu_seconds: float,
    chosen: int | None,
    timings: dict[str, float],
    final: Allocation | None,
    joint: dict[str, Any] | None,
    repeat: bool = False,
    stop: dict[str, Any] | None = None,
    alternatives: dict[str, Any] | None = None,
) -> RoundRecord:
    """A round's record: ``view``'s certificate and both allocations
    (a :class:`~fleetsieve_bayes.decision.batch.Belief`), and what the round did
    (``repeat``: ``chosen`` is measured again; ``alternatives``: a stopping round's ranked
    fleets, :func:`fleetsieve_bayes.round.with_alternatives`)."""
    cert = view.certificate
    return RoundRecord(
        round=round_no,
        certificate=cert.status,
        outcome=outcome,
        reason=cert.reason,
        gap={k: float(v) for k, v in cert.gap._asdict().items()}
        | ({} if getattr(cert, "dollars", None) is None else {"dollars": float(cert.dollars)}),
        conservative=side_of(view.conservative, grid),
        optimistic=side_of(view.optimistic, grid),
        measured_cells=measured_cells,
        candidates=grid.n_cells,
        gpu_seconds=gpu_seconds,
        chosen=None if chosen is None else cell_of(grid, chosen),
        timings=timings,
        final=None if final is None else side_of(final, grid),
        joint=joint,
        repeat=bool(repeat),
        stop=stop,
        alternatives=alternatives,
    )
