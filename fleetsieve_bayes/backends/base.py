"""What a measurement backend is: :class:`Backend`, a NamedTuple of functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from fleetsieve_bayes.allocation.problem import CellGrid

__all__ = ["Backend"]


class Backend(NamedTuple):
    """How a campaign obtains measurements.

    Attributes:
        grid: the candidate cells (fixed for the whole campaign).
        measure: ``measure(cell_index) -> row`` measures one cell and returns a
            table row: a dict with every column of
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
    """

    grid: CellGrid
    measure: Callable[[int], dict[str, Any]]
    close: Callable[[], None]
    expected_duration_s: Any
    preflight: Callable[[int], dict[str, Any] | None]
