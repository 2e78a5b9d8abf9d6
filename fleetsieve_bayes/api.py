"""The Python interface: a campaign as ``init`` / ``step`` / ``measure``, or run whole.

::

    import fleetsieve_bayes as fsb

    campaign = fsb.load_campaign("examples/h100_31b_fp8/campaign.toml")
    state = fsb.init(campaign, seed=0)
    settings = fsb.DecisionSettings.from_campaign(campaign)
    while not state.done:
        state, out = fsb.step(state, settings)
        if out.chosen is not None:
            state = fsb.measure(state, out.chosen)
    fsb.allocation_of(state)

:func:`fleetsieve_bayes.campaign.runner.run_campaign` does the same in a
campaign directory, with a journal that survives a kill.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from fleetsieve_bayes.backends import Backend, make_backend
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.campaign.journal import MeasurementRecord
from fleetsieve_bayes.campaign.outputs import Placement, placements
from fleetsieve_bayes.campaign.setup import build_strategy, resolve
from fleetsieve_bayes.campaign.windows import check_window
from fleetsieve_bayes.round import CampaignState, new_state, record

__all__ = ["init", "measure", "allocation_of"]


def init(
    campaign: Campaign,
    *,
    strategy: Any = "fleetsieve",
    seed: int = 0,
    prior: Any = None,
    preset: Any = None,
    backend: Backend | None = None,
) -> CampaignState:
    """A fresh state for a loaded campaign: its prior card, inference preset, strategy and
    seed tables resolved, and its backend built (the campaign file's own by default).

    ``strategy``, ``prior`` and ``preset`` take names or objects, as
    :func:`~fleetsieve_bayes.campaign.runner.run_campaign` does.

    Raises:
        InputError: a bad campaign field, strategy, card or preset (one line naming it).
    """
    setup = resolve(campaign, strategy, seed, prior=prior, preset=preset)
    if backend is None:
        backend = make_backend(campaign, Path(tempfile.gettempdir()))
    grid = backend.grid
    problem = campaign.problem()
    now = time.time()
    seeded = [
        MeasurementRecord(
            seq=i, round=0, phase="seed", cell=cell, row=dict(row), gpu_seconds=0.0,
            started_at=now, finished_at=now, wall_s=0.0, source=source,
        )
        for i, (cell, row, source) in enumerate(setup.seed_rows)
    ]
    strat = build_strategy(setup, grid, problem)
    return new_state(grid, problem, setup.card, setup.preset, strat, seed, seeded, backend=backend)


def measure(state: CampaignState, cell: int, *, repeat: bool = False) -> CampaignState:
    """Measure ``cell``'s next window with the state's backend and enter its row
    (:func:`fleetsieve_bayes.round.record`). ``repeat``: another window of a measured
    cell (a step's ``repeat``), asked for explicitly so that no cell is measured twice
    by accident.

    Raises:
        RuntimeError: a measured cell without ``repeat``, or ``repeat`` of an unmeasured one.
    """
    if state.backend is None:
        raise ValueError("this state has no backend: enter rows with fleetsieve_bayes.record(state, cell, row)")
    replicate = check_window(state.grid, state.records, int(cell), repeat=repeat)
    row = state.backend.preflight(cell)
    if row is None:
        row = state.backend.measure(cell, replicate) if replicate else state.backend.measure(cell)
    return record(state, cell, row, repeat=repeat)


def allocation_of(state: CampaignState) -> dict[str, Placement] | None:
    """The final allocation of a done state, per class (None: infeasible, or not done)."""
    from fleetsieve_bayes.allocation.problem import allocation_to_json

    if state.final is None:
        return None
    return placements(allocation_to_json(state.final, state.grid))
