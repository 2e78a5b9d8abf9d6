"""What a measurement backend is: :class:`Backend`, a NamedTuple of functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from fleetsieve_bayes.allocation.problem import CellGrid

__all__ = ["Backend", "no_window_limit"]


def no_window_limit(cell: int) -> int | None:
    """:attr:`Backend.windows_available` of a backend that can measure a cell any number of times."""
    return None


class Backend(NamedTuple):
    """How a campaign obtains measurements.

    Attributes:
        grid: the candidate cells (fixed for the whole campaign).
        measure: ``measure(cell_index, replicate=0) -> row`` measures one
            window of a cell — its ``replicate``-th (0 for the first, 1, … for
            deliberate repeats) — and returns a table row: a dict with every column of
            :data:`fleetsieve_bayes.table.COLUMNS` (and optionally
            ``calibration``, ``seed``, ``failure``). A cell that failed (OOM at
            start-up, server death, …) returns a row with ``failure`` set,
            ``success_rate`` 0 and ``throughput_rps`` 0: a failure is an
            observation. Raises ``MeasurementError`` only when the harness
            itself broke.
        close: releases whatever the backend holds (servers, GPUs).
        expected_duration_s: ``(n_cells,)`` expected wall seconds of each cell,
            for progress display.
        preflight: ``preflight(cell_index) -> row | None``: a row to record at
            zero GPU-seconds without measuring (e.g. a TP whose weights and KV
            cache cannot fit on its GPUs), or None to measure for real.
        windows_available: ``windows_available(cell_index) -> int | None``: how
            many distinct windows the backend can give of the cell in all
            (replicates ``0 .. n-1``), or None for no limit. A strategy reads
            it before choosing a repeat; ``measure`` past it raises
            :class:`~fleetsieve_bayes.errors.InputError` naming the cell.
    """

    grid: CellGrid
    measure: Callable[..., dict[str, Any]]
    close: Callable[[], None]
    expected_duration_s: Any
    preflight: Callable[[int], dict[str, Any] | None]
    windows_available: Callable[[int], int | None] = no_window_limit
