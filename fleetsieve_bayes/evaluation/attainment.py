"""Scoring SLO attainment against a noisy synthetic fleet's truth.

A window-noise synthetic fleet (:func:`fleetsieve_bayes.evaluation.synthetic.synthetic_fleet`
with ``window_noise``) has several rows per cell (``replicate`` 0, 1, …), the
noise-free ``true_*`` metrics and each cell's ``true_attainment``. This module
turns such a table into what a campaign fits (the grid, one value per cell,
every window with its cell) and scores a posterior's attainment and tail
predictions against the truth.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.allocation.problem import CellGrid, grid_from_table, values_from_table
from fleetsieve_bayes.table import METRICS

__all__ = [
    "NoisyFleet",
    "noisy_fleet",
    "windows_of",
    "attainment_scores",
    "admission_scores",
    "tail_accuracy",
    "true_level_table",
    "score_decision",
    "full_grid_decision",
]


class NoisyFleet(NamedTuple):
    """A window-noise fleet as a campaign sees it.

    ``grid``; ``windows (n_cells, k, 4)`` every replicate of every cell (NaN
    where a cell has fewer); ``truth (n_cells, 4)``; ``attainment
    (n_cells,)`` true attainment; ``offered (n_cells,)``.
    """

    grid: CellGrid
    windows: np.ndarray
    truth: np.ndarray
    attainment: np.ndarray
    offered: np.ndarray


def noisy_fleet(table: pd.DataFrame, workloads: tuple[str, ...]) -> NoisyFleet:
    """Split a window-noise table (``replicate`` column) into a :class:`NoisyFleet`."""
    first = table[table["replicate"] == 0].reset_index(drop=True)
    grid = grid_from_table(first, workloads)
    index = grid.index()
    k = int(table["replicate"].max()) + 1
    win = np.full((grid.n_cells, k, 4), np.nan)
    for r in table.itertuples(index=False):
        c = index[(r.workload, int(r.tp), str(r.load))]
        win[c, int(r.replicate)] = [getattr(r, m) for m in METRICS]
    truth_df = first.copy()
    for m in METRICS:
        truth_df[m] = truth_df[f"true_{m}"]
    truth = values_from_table(grid, truth_df)
    att = np.zeros(grid.n_cells)
    for r in first.itertuples(index=False):
        att[index[(r.workload, int(r.tp), str(r.load))]] = float(r.true_attainment)
    return NoisyFleet(grid, win, truth, att, np.asarray(grid.offered_rps, np.float64))


def windows_of(fleet: NoisyFleet, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What a campaign that measured cell ``c`` ``counts[c]`` times has seen.

    Args:
        counts: int ``(n_cells,)`` windows per cell (0: unmeasured).

    Returns:
        ``(observed (n_cells, 4), measured (n_cells,), rows (n_rows, 4),
        row_cell (n_rows,))``: ``observed`` holds each measured cell's first
        window (the point rule's value), ``rows`` every window in cell order.
    """
    counts = np.asarray(counts, np.int64)
    measured = counts > 0
    observed = np.where(measured[:, None], fleet.windows[:, 0], np.nan)
    cells = np.repeat(np.arange(fleet.grid.n_cells), counts)
    reps = np.concatenate([np.arange(n) for n in counts]) if counts.sum() else np.zeros(0, np.int64)
    rows = fleet.windows[cells, reps]
    return observed, measured, rows, cells


def attainment_scores(median: np.ndarray, lo: np.ndarray, hi: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """Mean absolute error of ``median (n,)`` against ``truth (n,)`` and the share of
    ``[lo, hi]`` intervals containing it."""
    if median.size == 0:
        return {"cells": 0, "mae": None, "coverage": None}
    return {
        "cells": int(median.size),
        "mae": float(np.mean(np.abs(median - truth))),
        "coverage": float(np.mean((lo - 1e-9 <= truth) & (truth <= hi + 1e-9))),
    }


def admission_scores(lo: np.ndarray, truth: np.ndarray, level: float) -> dict[str, int]:
    """What the conservative table at ``level`` makes of cells with attainment lower
    bounds ``lo (n,)`` and true attainment ``truth (n,)``: how many are truly admissible
    (truth ≥ level), how many of those it admits (lo ≥ level), and how many truly
    inadmissible cells it admits (each a false admission)."""
    good = truth >= level
    admitted = lo >= level
    return {
        "admissible": int(good.sum()),
        "admitted": int((good & admitted).sum()),
        "inadmissible_admitted": int((~good & admitted).sum()),
    }


def tail_accuracy(
    latent_median: np.ndarray, truth: np.ndarray, offered: np.ndarray, cells: np.ndarray, *, within: float = 0.2
) -> dict[str, Any]:
    """Share of ``cells`` below saturation (true throughput ≥ 95 % of the offered
    rate, not failed) whose posterior median TTFT p99 and completion p99
    (``latent_median (n_cells, 4)``) are within ``within`` (relative) of
    ``truth (n_cells, 4)``."""
    sel = np.zeros(truth.shape[0], bool)
    sel[cells] = True
    sel &= (truth[:, 0] > 0) & (truth[:, 0] >= 0.95 * offered)
    if not sel.any():
        return {"cells": 0, "ttft": None, "completion": None, "throughput": None}
    rel = np.abs(latent_median[sel] / truth[sel] - 1.0)
    return {
        "cells": int(sel.sum()),
        "throughput": float(np.mean(rel[:, 0] <= within)),
        "ttft": float(np.mean(rel[:, 1] <= within)),
        "completion": float(np.mean(rel[:, 2] <= within)),
    }


def true_level_table(fleet: NoisyFleet, problem: Any, level: float | np.ndarray) -> np.ndarray:
    """The truth as the allocators read it at an attainment level: ``(n_cells, 4)``,
    a cell admissible exactly when its true attainment ≥ ``level``
    (:func:`fleetsieve_bayes.decision.intervals.level_tables`)."""
    from fleetsieve_bayes.decision.intervals import level_tables

    w = fleet.grid.workload_idx
    lim = (problem.success_min[w], problem.ttft_max[w], problem.completion_max[w])
    t, _ = level_tables(fleet.truth, fleet.truth, fleet.attainment, fleet.attainment, level, *lim)
    return t


def score_decision(
    fleet: NoisyFleet, problem: Any, cell: np.ndarray | None, replicas: np.ndarray | None, level: float | np.ndarray,
    epsilon: float, *, certified: bool,
) -> dict[str, Any]:
    """A decision judged against the truth at an attainment level.

    Args:
        cell, replicas: ``(n_classes,)`` the decision's cells and replicas (None:
            "no allocation").
        certified: the campaign said certified-feasible (or -infeasible).

    Returns:
        ``correct``: every committed cell's true attainment ≥ its level and the
        decision ε-correct against the oracle of the truth at the level
        (:func:`true_level_table`, where a cell below its level serves nothing);
        ``false_certificate``: certified and not correct; ``slo_ok``: every
        committed cell's true attainment ≥ its level;
        ``min_true_attainment`` of the committed cells; ``regret``: the
        lexicographic regret against that oracle (``critical``,
        ``min_fulfillment``, ``goodput``).
    """
    from fleetsieve_bayes.evaluation.regret import eps_correct, evaluate_cells, make_oracle, regret

    truth = true_level_table(fleet, problem, level)
    oracle = make_oracle(fleet.grid, truth, problem)
    outcome = evaluate_cells(fleet.grid, truth, problem, cell, replicas)
    r = regret(outcome, oracle, problem)
    ok = bool(eps_correct(r, epsilon))
    q = np.broadcast_to(np.asarray(level, np.float64), (fleet.grid.n_cells,))
    committed = [] if cell is None else [int(c) for c, n in zip(cell, replicas, strict=True) if c >= 0 and n > 0]
    att = [float(fleet.attainment[c]) for c in committed]
    slo_ok = bool(all(fleet.attainment[c] >= q[c] for c in committed))
    return {
        "correct": bool(ok and slo_ok),
        "eps_correct": ok,
        "false_certificate": bool(certified and not (ok and slo_ok)),
        "slo_ok": slo_ok,
        "min_true_attainment": min(att) if att else None,
        "oracle_feasible": bool(oracle.allocation.feasible),
        "regret": {k: float(v) for k, v in r._asdict().items()},
    }


def full_grid_decision(fleet: NoisyFleet, problem: Any, windows: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The decision of a fully measured grid read the point way: every cell
    measured ``windows`` times, its median window against the SLOs, the optimum
    on those values (``(cell, replicas)`` or ``(None, None)`` when infeasible)."""
    from fleetsieve_bayes.allocation.milp import allocate_milp

    k = min(int(windows), fleet.windows.shape[1])
    values = np.nanmedian(fleet.windows[:, :k], axis=1)
    alloc = allocate_milp(fleet.grid, values, problem)
    if not alloc.feasible:
        return None, None
    return np.asarray(alloc.cell), np.asarray(alloc.replicas)
