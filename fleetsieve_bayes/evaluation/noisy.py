"""The noisy synthetic suite (issue 29) and a campaign scored against its truth at a level.

A suite fleet is :func:`~fleetsieve_bayes.evaluation.synthetic.random_spec`'s hard
family with window noise (:func:`~fleetsieve_bayes.evaluation.synthetic.window_draws`:
tails scatter more near and past the knee than at light load, success mostly sits
near its truth but sometimes drops in a burst, throughput barely moves),
:data:`SUITE_WINDOWS` replicate rows per cell (so a campaign can repeat a cell and
the full grid can be read with several windows) and each cell's exact
``true_attainment``. Its campaign decides at ``[stopping] slo_attainment``.

A finished campaign is judged on the truth at its level
(:func:`~fleetsieve_bayes.evaluation.attainment.score_decision`: correct = every
committed cell's true attainment ≥ the level and the decision ε-correct against
the optimum of the truth at that level; a false certificate = certified and not
correct), beside the fully measured grid read the point way with one window per
cell and with three (median of three). It also reports the calibration of the
attainment ``result.json`` gives its committed cells and how close the final
posterior's medians are to the truth at cells it never measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fleetsieve_bayes.decision.bounds import repeat_at_limit
from fleetsieve_bayes.evaluation.attainment import (
    NoisyFleet,
    full_grid_decision,
    score_decision,
    tail_accuracy,
    true_level_table,
)
from fleetsieve_bayes.evaluation.regret import cells_from_json, make_oracle
from fleetsieve_bayes.evaluation.synthetic import SyntheticSpec, random_spec, synthetic_fleet
from fleetsieve_bayes.settings import MAX_WINDOWS_PER_CELL

__all__ = [
    "SUITE_WINDOWS",
    "SUITE_LEVEL",
    "FULL_GRID_WINDOWS",
    "noisy_suite_fleet",
    "full_grid_gpu_s",
    "full_grid_scores",
    "window_counts_of",
    "conservative_answer",
    "score_campaign",
]

SUITE_WINDOWS = 5  # replicate rows per cell in a suite table
SUITE_LEVEL = 0.9  # the level that means "meets its SLO" (docs/results.md)
FULL_GRID_WINDOWS = (1, 3)  # the full-grid baselines: windows per cell
CERTIFIED = ("certified-feasible", "certified-infeasible")


def noisy_suite_fleet(
    seed: int, k: int, *, windows: int = SUITE_WINDOWS, level: float = SUITE_LEVEL, max_windows: int = MAX_WINDOWS_PER_CELL
) -> tuple[SyntheticSpec, pd.DataFrame, dict[str, Any]]:
    """Fleet ``k`` of the noisy suite of ``seed``: its spec, its table (``windows``
    replicate rows per cell, ``true_*`` and ``true_attainment`` columns) and its
    campaign mapping (``[stopping] slo_attainment = level``, ``max_windows_per_cell``);
    the same arguments always give the same fleet."""
    if max_windows > windows:
        raise ValueError(f"max_windows {max_windows} > the table's {windows} windows per cell")
    rng = np.random.default_rng([int(seed), int(k)])
    spec = random_spec(rng, hard=True)._replace(window_noise=True, windows=int(windows))
    table, campaign = synthetic_fleet(rng, spec)
    campaign["name"] = f"noisy-{k}"
    campaign["stopping"] = {**campaign["stopping"], "slo_attainment": float(level),
                            "max_windows_per_cell": int(max_windows)}
    return spec, table, campaign


def full_grid_gpu_s(table: pd.DataFrame, windows: int) -> float:
    """GPU-seconds of measuring every cell ``windows`` times (its first ``windows``
    replicate rows; a start-up failure is attempted once)."""
    rep = table["replicate"].to_numpy()
    oom = table["failure"].fillna("").astype(str).to_numpy() == "startup-oom"
    keep = (rep < windows) & (~oom | (rep == 0))
    return float((table["duration_s"].to_numpy() * table["tp"].to_numpy())[keep].sum())


def full_grid_scores(
    fleet: NoisyFleet, table: pd.DataFrame, problem: Any, level: float, epsilon: float
) -> dict[str, dict[str, Any]]:
    """Per window count in :data:`FULL_GRID_WINDOWS`: the fully measured grid's decision
    (:func:`~fleetsieve_bayes.evaluation.attainment.full_grid_decision`) scored at
    ``level`` and its GPU-seconds (:func:`full_grid_gpu_s`); keyed ``"1"``, ``"3"``."""
    out: dict[str, dict[str, Any]] = {}
    for w in FULL_GRID_WINDOWS:
        cell, reps = full_grid_decision(fleet, problem, w)
        sc = score_decision(fleet, problem, cell, reps, level, epsilon, certified=False)
        out[str(w)] = {"gpu_seconds": full_grid_gpu_s(table, w), "correct": sc["correct"],
                       "slo_ok": sc["slo_ok"], "min_true_attainment": sc["min_true_attainment"]}
    return out


def window_counts_of(fleet: NoisyFleet, measured_json: list[dict[str, Any]]) -> np.ndarray:
    """``(n_cells,)`` int: windows per cell of result.json's ``measured`` list."""
    index = fleet.grid.index()
    counts = np.zeros(fleet.grid.n_cells, np.int64)
    for m in measured_json:
        counts[index[(m["workload"], int(m["tp"]), str(m["load"]))]] += 1
    return counts


def _committed_calibration(fleet: NoisyFleet, committed: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """result.json's committed cells' reported attainment beside their true attainment."""
    index = fleet.grid.index()
    out = []
    for e in committed or []:
        c = index[(e["workload"], int(e["tp"]), str(e["load"]))]
        a = e["attainment"]
        out.append({"cell": fleet.grid.describe(c), "windows": int(e["windows"]), "median": float(a["median"]),
                    "lo": float(a["lo"]), "hi": float(a["hi"]), "truth": float(fleet.attainment[c])})
    return out


def repeat_truth(fleet: NoisyFleet, repeat: dict[str, Any] | None, max_windows: int) -> dict[str, Any] | None:
    """result.json's cell to repeat beside its true attainment: ``{cell, windows, limit,
    at_limit, truth}`` (None when the campaign named none). ``limit``: the entry's own,
    else ``max_windows`` (an entry written before ``limit`` existed)."""
    if not repeat:
        return None
    c = fleet.grid.index()[(repeat["workload"], int(repeat["tp"]), str(repeat["load"]))]
    entry = {**repeat, "limit": int(repeat.get("limit") or max_windows)}
    return {"cell": fleet.grid.describe(c), "windows": int(repeat["windows"]), "limit": entry["limit"],
            "at_limit": repeat_at_limit(entry), "truth": float(fleet.attainment[c])}


def conservative_answer(
    fleet: NoisyFleet, problem: Any, run_dir: str | Path, level: float, epsilon: float
) -> dict[str, Any] | None:
    """The final round's conservative allocation (the journal's round record) judged on the
    truth at ``level``, as :func:`score_campaign` judges the answer: what the campaign would
    have answered with ``[stopping] uncertified_answer = "conservative"`` (the same for a
    certified campaign). None without a final round.

    Returns:
        ``{correct, slo_ok, eps_correct, same}`` (``same``: the answer is that allocation).
    """
    from fleetsieve_bayes.campaign.journal import read_journal

    records, _ = read_journal(Path(run_dir) / "journal.jsonl")
    final = [r for r in records if r.get("type") == "round" and r.get("final") is not None]
    if not final:
        return None
    last = final[-1]
    cons = (last.get("conservative") or {}).get("allocation")
    cr = cells_from_json(fleet.grid, cons)
    cell, reps = cr if cr is not None else (None, None)
    sc = score_decision(fleet, problem, cell, reps, level, epsilon, certified=False)
    return {"correct": sc["correct"], "slo_ok": sc["slo_ok"], "eps_correct": sc["eps_correct"],
            "same": cons == (last["final"] or {}).get("allocation")}


def score_campaign(
    fleet: NoisyFleet,
    problem: Any,
    result: dict[str, Any],
    level: float,
    epsilon: float,
    latent_median: np.ndarray | None = None,
) -> dict[str, Any]:
    """A finished campaign's ``result.json`` judged on the truth at ``level``.

    Args:
        latent_median: ``(n_cells, 4)`` the final posterior's median metrics
            (``posterior.nc``), for the cells the campaign never measured.

    Returns:
        ``status``, ``gpu_seconds``, ``windows`` / ``cells_measured`` / ``repeats``,
        :func:`~fleetsieve_bayes.evaluation.attainment.score_decision`'s fields,
        ``floor_gpu_s`` (the hindsight floor of the truth at the level),
        ``committed`` (reported vs true attainment per committed cell),
        ``oracle_cells`` (the oracle's committed cells: ``{cell, replicas,
        truth, windows}``, windows the campaign measured of each) and
        ``tails_unmeasured`` (:func:`~fleetsieve_bayes.evaluation.attainment.tail_accuracy`).
    """
    cr = cells_from_json(fleet.grid, result.get("allocation"))
    cell, reps = cr if cr is not None else (None, None)
    status = str(result["status"])
    sc = score_decision(fleet, problem, cell, reps, level, epsilon, certified=status in CERTIFIED)
    counts = window_counts_of(fleet, result.get("measured", []))
    oracle = make_oracle(fleet.grid, true_level_table(fleet, problem, level), problem)
    tails = (tail_accuracy(latent_median, fleet.truth, fleet.offered, np.flatnonzero(counts == 0))
             if latent_median is not None else None)
    return {
        "status": status,
        "gpu_seconds": float(result["gpu_seconds"]),
        "windows": int(counts.sum()),
        "cells_measured": int((counts > 0).sum()),
        "repeats": int(counts.sum() - (counts > 0).sum()),
        **sc,
        "floor_gpu_s": float(oracle.floor_gpu_s),
        "committed": _committed_calibration(fleet, result.get("committed")),
        "oracle_cells": [{"cell": fleet.grid.describe(c), "replicas": int(oracle.allocation.replicas[i]),
                          "truth": float(fleet.attainment[c]), "windows": int(counts[c])}
                         for i, c in enumerate(oracle.allocation.cell) if c >= 0 and oracle.allocation.replicas[i] > 0],
        "tails_unmeasured": tails,
    }
