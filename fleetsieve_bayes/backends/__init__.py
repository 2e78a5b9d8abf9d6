"""Measurement backends: where a chosen cell's table row comes from.

A backend is a :class:`Backend` — a NamedTuple of functions, not a class
hierarchy. ``make_backend`` picks one by the campaign's
``[measurement] backend`` name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.errors import InputError


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


def make_backend(campaign: Campaign, out_dir: Path) -> Backend:
    """The backend named by ``campaign.measurement.backend``."""
    name = campaign.measurement.backend
    if name == "replay":
        from fleetsieve_bayes.backends.replay import make_replay_backend

        return make_replay_backend(campaign)
    if name == "vllm":
        from fleetsieve_bayes.backends.vllm import make_vllm_backend

        return make_vllm_backend(campaign, out_dir)
    raise InputError(f"{campaign.path}: [measurement] backend: unknown backend {name!r} (expected 'replay' or 'vllm')")
