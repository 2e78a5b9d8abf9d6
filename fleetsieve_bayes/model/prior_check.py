"""Prior-predictive checks of a prior card, from draws of the model under the
prior (:func:`fleetsieve_bayes.model.inference.prior_predictive`).

Used by ``priors show`` (the knee and per-GPU capacity a card implies before
any measurement) and by the coverage check of derived cards (do a card's 90 %
prior-predictive intervals contain what was measured?).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fleetsieve_bayes.allocation.problem import CellGrid, grid_from_table
from fleetsieve_bayes.model.inference import prior_predictive
from fleetsieve_bayes.model.priors import PriorCard

__all__ = ["card_tps", "summarize_card", "throughput_coverage"]

DEFAULT_TPS = (1, 2, 4, 8)


def card_tps(card: PriorCard) -> tuple[int, ...]:
    """The TPs a card speaks about: its derivation's, else its feasibility check's, else 1/2/4/8."""
    return card.derivation_tp or card.feasibility_checked_tp or DEFAULT_TPS


def _interval(x: np.ndarray, level: float) -> dict[str, float]:
    lo, med, hi = np.quantile(x, [(1 - level) / 2, 0.5, (1 + level) / 2])
    return {"median": float(med), "lo": float(lo), "hi": float(hi)}


def summarize_card(
    card: PriorCard,
    tps: Sequence[int] | None = None,
    *,
    level: float = 0.9,
    n_draws: int = 4000,
    seed: int = 0,
) -> dict[str, Any]:
    """Prior median and ``level`` interval of the knee TP and of per-GPU capacity per TP.

    One workload class on a grid of ``tps`` (default :func:`card_tps`), one
    cell per TP offered ``TP`` req/s: a card with an absolute capacity
    (``per_gpu_at_knee``) is in req/s/GPU; a scale-free one
    (``relative_to_offered``) in multiples of the grid's median offered load
    per GPU. A TP the card marks infeasible reports ``feasible: false`` and
    capacity 0 (the memory guard records it so, at zero cost).

    Returns:
        ``{"knee_tp": {"median", "lo", "hi"}, "tp": {"1": {"feasible": bool,
        "capacity_per_gpu": {"median", "lo", "hi"}}, ...}}``.
    """
    tps = sorted({int(t) for t in (tps or card_tps(card))})
    grid = CellGrid(
        workloads=("class",),
        workload_idx=np.zeros(len(tps), dtype=np.int64),
        tp=np.array(tps, dtype=np.int64),
        load=tuple(f"TP{t}" for t in tps),
        offered_rps=np.array(tps, dtype=np.float64),
        duration_s=np.ones(len(tps)),
    )
    draws = prior_predictive(grid, card, n_draws, seed=seed)
    out: dict[str, Any] = {"knee_tp": _interval(2.0 ** draws["knee"][:, 0], level), "tp": {}}
    for i, t in enumerate(tps):
        feasible = card.tp_feasible(t) is not False
        cap = draws["capacity"][:, i] / t if feasible else np.zeros(1)
        out["tp"][str(t)] = {"feasible": feasible, "capacity_per_gpu": _interval(cap, level)}
    return out


def throughput_coverage(
    card: PriorCard,
    table: pd.DataFrame,
    workloads: Sequence[str],
    *,
    level: float = 0.9,
    n_draws: int = 4000,
    seed: int = 0,
) -> pd.DataFrame:
    """Per measured cell, whether the prior-predictive ``level`` interval of the
    observed throughput contains the measured throughput.

    Returns:
        The table's rows in grid order with ``lo``, ``median``, ``hi`` (req/s)
        and ``covered`` (bool) added, and ``saturated`` (measured throughput
        below 97 % of offered: the cell measured its capacity, not its load).
    """
    grid = grid_from_table(table, tuple(workloads))
    draws = prior_predictive(grid, card, n_draws, seed=seed)
    thr = draws["y"][..., 0]  # (n_draws, n_cells) simulated measured throughput
    lo, med, hi = np.quantile(thr, [(1 - level) / 2, 0.5, (1 + level) / 2], axis=0)
    keyed = table.set_index(["workload", "tp", "load"])
    rows = []
    for c in range(grid.n_cells):
        w, tp, load = grid.key(c)
        row = keyed.loc[(w, tp, load)]
        measured = float(row["throughput_rps"])
        rows.append(
            {
                "workload": w,
                "tp": tp,
                "load": load,
                "offered_rps": float(row["offered_rps"]),
                "throughput_rps": measured,
                "lo": float(lo[c]),
                "median": float(med[c]),
                "hi": float(hi[c]),
                "covered": bool(lo[c] <= measured <= hi[c]),
                "saturated": measured < 0.97 * float(row["offered_rps"]),
            }
        )
    return pd.DataFrame(rows)
