"""Measurement backends: where a chosen cell's table row comes from.

A backend is a :class:`Backend` — a NamedTuple of functions, not a class
hierarchy. :data:`BACKENDS` is the registry: each name maps to a
:class:`BackendSpec` whose ``validate`` checks that backend's own
``[measurement]`` keys, and whose ``make`` builds it. ``make_backend`` picks
one by the campaign's ``[measurement] backend`` name and validates its keys
before building it (a campaign file is also read where no backend is built).
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


class BackendSpec(NamedTuple):
    """One registered backend.

    Attributes:
        validate: ``validate(campaign)`` raises
            :class:`~fleetsieve_bayes.errors.InputError` (one line naming the
            file and key) for a bad ``[measurement]`` key of this backend.
        make: ``make(campaign, out_dir) -> Backend``.
    """

    validate: Callable[[Campaign], None]
    make: Callable[[Campaign, Path], Backend]


def _replay_spec() -> BackendSpec:
    from fleetsieve_bayes.backends.replay import make_replay_backend, validate_replay_options

    return BackendSpec(validate=validate_replay_options, make=lambda c, _out: make_replay_backend(c))


def _vllm_spec() -> BackendSpec:
    from fleetsieve_bayes.backends.vllm import make_vllm_backend, parse_vllm_options

    def validate(campaign: Campaign) -> None:
        parse_vllm_options(campaign)

    return BackendSpec(validate=validate, make=make_vllm_backend)


# name → loader of its spec (imported lazily: the vLLM backend pulls in aiohttp).
BACKENDS: dict[str, Callable[[], BackendSpec]] = {"replay": _replay_spec, "vllm": _vllm_spec}


def backend_spec(campaign: Campaign) -> BackendSpec:
    """The registered backend named by ``campaign.measurement.backend``.

    Raises:
        InputError: an unknown name, listing the known ones.
    """
    name = campaign.measurement.backend
    if name not in BACKENDS:
        known = ", ".join(repr(n) for n in sorted(BACKENDS))
        raise InputError(f"{campaign.path}: [measurement] backend: unknown backend {name!r} (expected one of {known})")
    return BACKENDS[name]()


def validate_backend(campaign: Campaign) -> None:
    """Check the campaign's ``[measurement]`` keys with its backend's own validator.

    A name that is not registered is left to :func:`make_backend` (campaign
    files are also parsed where no backend is ever built, e.g. by tools that
    only read their workloads).
    """
    if campaign.measurement.backend in BACKENDS:
        backend_spec(campaign).validate(campaign)


def make_backend(campaign: Campaign, out_dir: Path) -> Backend:
    """The backend named by ``campaign.measurement.backend``, its ``[measurement]`` keys
    validated first.

    Raises:
        InputError: an unknown backend, or a bad key of its own (one line naming the file and key).
    """
    spec = backend_spec(campaign)
    spec.validate(campaign)
    return spec.make(campaign, out_dir)
