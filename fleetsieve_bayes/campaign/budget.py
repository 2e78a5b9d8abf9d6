"""The profiling budget: ``[stopping] max_gpu_seconds`` and ``max_wall_s``.

A campaign never starts a cell whose expected cost (``duration_s × tp``
GPU-seconds; ``duration_s`` of wall clock) would take what it has spent — and,
in a pool, what the cells in flight will spend — past the budget. The round
whose chosen cell does not fit stops the campaign ``undecided`` with the stop
reason ``budget`` and the usual uncertified answer
(:func:`fleetsieve_bayes.round.stop_undecided`); its record keeps the budget,
what was spent, the cell it would have measured and, for the best few cells
the acquisition ranked, the expected gap reduction each would buy per
GPU-second (:func:`next_cells`).

A budget that never binds changes nothing: the rounds, their randomness and
the cells measured are those of the same campaign without it. The budget is
fingerprinted; a resume may raise it (the run goes on to the new budget; a
``budget`` record in the journal keeps the raise) and never lower it
(:func:`check_resume`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.campaign.journal import BUDGET_KEYS, Cell, RoundRecord, held_budget
from fleetsieve_bayes.campaign.makespan import profiling_wall_s, record_dict
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.errors import InputError

__all__ = [
    "Budget",
    "BudgetRecord",
    "NEXT_CELLS",
    "BUDGET_REASON",
    "spent",
    "check_design",
    "check_resume",
    "reopens",
    "next_cells",
    "stop_json",
    "budget_json",
]

# How many of the acquisition's best cells a budget stop reports.
NEXT_CELLS = 5
BUDGET_REASON = "budget"
# Relative slack on the comparison (a budget equal to the cost admits it).
_SLACK = 1e-9


class BudgetRecord(dict):
    """The journal's ``budget`` record (a raise on resume): a plain JSON object with ``to_json``."""

    def to_json(self) -> dict[str, Any]:
        return dict(self)


class Budget(NamedTuple):
    """A campaign's profiling budget (None: no limit on that axis)."""

    max_gpu_seconds: float | None = None
    max_wall_s: float | None = None

    @classmethod
    def of(cls, campaign: Campaign) -> Budget:
        return cls(campaign.max_gpu_seconds, campaign.max_wall_s)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Budget:
        return cls(*(None if raw.get(k) is None else float(raw[k]) for k in BUDGET_KEYS))

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in self)

    def allows(self, gpu_seconds: float, wall_s: float) -> bool:
        """Whether spending up to ``gpu_seconds`` and ``wall_s`` in all stays within the budget."""
        ok_gpu = self.max_gpu_seconds is None or gpu_seconds <= self.max_gpu_seconds * (1 + _SLACK)
        ok_wall = self.max_wall_s is None or wall_s <= self.max_wall_s * (1 + _SLACK)
        return ok_gpu and ok_wall

    def to_json(self) -> dict[str, float | None]:
        return dict(zip(BUDGET_KEYS, self, strict=True))


def spent(records: Iterable[Any]) -> tuple[float, float]:
    """GPU-seconds (measured windows and cancelled cells) and profiling wall seconds so far."""
    records = list(records)
    gpu = 0.0
    for r in records:
        d = record_dict(r)
        if d.get("type") in ("measurement", "cancelled"):
            gpu += float(d.get("gpu_seconds") or 0.0)
    return gpu, float(profiling_wall_s(records))


def check_design(campaign: Campaign, grid: CellGrid, measured: Collection[Cell]) -> None:
    """Refuse a budget the initial design cannot fit: GPU-seconds below the design's cost, a
    wall clock below its wall (one cell at a time: the sum of its durations; in a pool: its
    longest cell), counting only design cells not yet ``measured`` (seeded or reused).

    Raises:
        InputError: one line naming the file and the field.
    """
    budget = Budget.of(campaign)
    if not budget.is_set:
        return
    held = {tuple(c) for c in measured}
    todo = [c for c in initial_design(grid) if grid.key(c) not in held]
    cost = float(np.sum(grid.cost_gpu_s[todo])) if todo else 0.0
    dur = np.asarray(grid.duration_s, np.float64)[todo]
    wall = 0.0 if not todo else float(dur.max() if campaign.pool.parallel else dur.sum())
    if budget.max_gpu_seconds is not None and cost > budget.max_gpu_seconds * (1 + _SLACK):
        raise InputError(
            f"{campaign.path}: [stopping] max_gpu_seconds: {budget.max_gpu_seconds:g} is less than the initial "
            f"design's cost ({cost:,.0f} GPU-seconds, {len(todo)} cells); give at least {cost:g}"
        )
    if budget.max_wall_s is not None and wall > budget.max_wall_s * (1 + _SLACK):
        raise InputError(
            f"{campaign.path}: [stopping] max_wall_s: {budget.max_wall_s:g} is less than the initial design's "
            f"wall clock ({wall:,.0f} s); give at least {wall:g}"
        )


def check_resume(out: Path, campaign: Campaign, records: list[Any]) -> tuple[Campaign, BudgetRecord | None]:
    """A resumed directory's budget: the campaign as its header fingerprinted it (the budget
    the header holds, for the fingerprint's comparison) and the ``budget`` record to append
    when this run raises the budget (None when it is unchanged).

    Raises:
        InputError: one line, when the budget is lower than the one the directory last ran under.
    """
    held = held_budget(records)
    header = next((record_dict(r) for r in records if record_dict(r).get("type") == "header"), {})
    first = ((header.get("inputs") or {}).get("stopping") or {})
    new = Budget.of(campaign)
    raised = False
    for key, now in zip(BUDGET_KEYS, new, strict=True):
        before = held.get(key)
        if before is None and now is None:
            continue
        if now is not None and (before is None or now < float(before)):
            was = "no limit" if before is None else f"{float(before):g}"
            raise InputError(
                f"{campaign.path}: [stopping] {key}: {now:g} is lower than the budget this campaign ran under "
                f"({was}); a resume may only raise it"
            )
        raised |= now is None or now > float(before)  # type: ignore[arg-type]
    as_header = dataclasses.replace(campaign, **{k: first.get(k) for k in BUDGET_KEYS})
    return as_header, (BudgetRecord(type="budget", **new.to_json()) if raised else None)


def reopens(rec: RoundRecord, budget: Budget) -> bool:
    """Whether a round the budget stopped may go on under ``budget`` (it was raised since)."""
    if not rec.stop or rec.stop.get("reason") != BUDGET_REASON:
        return False
    return Budget.from_json(rec.stop.get("budget") or {}) != budget


def next_cells(
    state: Any, settings: Any, assessment: Any, posterior: Any, round_no: int, budget: Budget, spent_gpu: float,
    chosen: int, *, busy: Collection[int] = (), k: int = NEXT_CELLS,
) -> list[dict[str, Any]]:
    """What the next cells would buy: the ``k`` open cells the acquisition ranks first — the
    cell the round chose, then by expected gap reduction on the round's view and draws
    (:func:`fleetsieve_bayes.round.decision_values`; ties to the cheaper) — each with its
    GPU-seconds, that value per GPU-second and whether it fits what is left of the budget.
    A value of 0 everywhere: no single cell is expected to narrow the gap on its own (the
    optimistic allocation rests on several hopes); the strategy then measures the cells an
    allocation commits to first (docs/method.md, §7)."""
    from fleetsieve_bayes.round import decision_values, open_cells

    view = assessment.acting_view
    values = decision_values(state, settings, view, posterior, round_no, assessment.attempt, busy=busy)
    grid = state.grid
    cost = np.asarray(grid.cost_gpu_s, np.float64)
    score = np.nan_to_num(np.asarray(values.score, np.float64), nan=0.0, neginf=0.0)
    cells = [int(c) for c in np.flatnonzero(open_cells(state, settings, view, busy=busy))]
    cells.sort(key=lambda c: (c != chosen, -score[c], cost[c], c))
    out = []
    for c in cells[:k]:
        out.append({
            **Cell(*grid.key(c)).to_json(),
            "chosen": c == chosen,
            "repeat": bool(state.measured[c]),
            "gpu_seconds": round(float(cost[c]), 6),
            "expected_gap_reduction": round(float(score[c]), 9),
            "per_gpu_second": round(float(score[c] / cost[c]) if cost[c] > 0 else 0.0, 12),
            "fits_budget": bool(budget.max_gpu_seconds is None
                                or spent_gpu + cost[c] <= budget.max_gpu_seconds * (1 + _SLACK)),
        })
    return out


def stop_json(
    budget: Budget, grid: CellGrid, cell: int, spent_gpu: float, spent_wall: float, cells: list[dict[str, Any]],
    committed_gpu: float = 0.0,
) -> dict[str, Any]:
    """A budget stop's record (the round record's ``stop``): the budget, what was spent (and,
    in a pool, committed to cells in flight), the cell that did not fit and :func:`next_cells`."""
    return {
        "reason": BUDGET_REASON,
        "budget": budget.to_json(),
        "gpu_seconds": round(spent_gpu, 6),
        "profiling_wall_s": round(spent_wall, 6),
        "committed_gpu_seconds": round(committed_gpu, 6),
        "next_cell": {**Cell(*grid.key(cell)).to_json(), "gpu_seconds": float(grid.cost_gpu_s[cell]),
                      "duration_s": float(grid.duration_s[cell])},
        "next_cells": cells,
    }


def budget_json(campaign: Campaign, records: list[Any], final: RoundRecord) -> dict[str, Any] | None:
    """result.json's ``budget`` (null without one): the budget, what was spent against it and,
    when it stopped the campaign, the cell that did not fit and what the next cells would buy."""
    budget = Budget.of(campaign)
    if not budget.is_set:
        return None
    gpu, wall = spent(records)
    stop = final.stop if final.stop and final.stop.get("reason") == BUDGET_REASON else None
    return {
        **budget.to_json(),
        "gpu_seconds": gpu,
        "profiling_wall_s": wall,
        "stopped": stop is not None,
        "next_cell": None if stop is None else stop.get("next_cell"),
        "next_cells": None if stop is None else stop.get("next_cells"),
    }
