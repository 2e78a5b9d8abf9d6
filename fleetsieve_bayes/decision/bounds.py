"""Credible bounds for every cell, and the conservative / optimistic tables.

For an unmeasured cell the interval is the central ``level`` interval of the
posterior *predictive* distribution (latent metrics plus observation noise): it
should contain what measuring the cell would return, which is the value the
decision will use once the cell is measured. Success widening near 0/1, the
collapse of measured cells and the two tables follow the rules of
:mod:`fleetsieve_bayes.decision.intervals` — the same functions the
acquisition kernel uses. Quantiles here are NumPy's linear interpolation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.decision.intervals import (
    MODEL_MARGIN,
    SUCCESS_MARGIN,
    IntervalRules,
    LoadLadder,
    bound_tables,
    credible_quantiles,
    guard_state,
    knee_guard,
    load_ladder,
    model_intervals,
    with_measured,
)
from fleetsieve_bayes.model.joint import sample_obs
from fleetsieve_bayes.table import BOUNDS_COLUMNS

__all__ = [
    "Bounds",
    "credible_bounds",
    "rule_bounds",
    "conservative_table",
    "optimistic_table",
    "bounds_frame",
    "BOUNDS_COLUMNS",
]


class Bounds(NamedTuple):
    """Per-cell credible bounds, each ``(n_cells, 4)`` in METRICS order, ``lo <= hi``."""

    lo: np.ndarray
    hi: np.ndarray


def credible_bounds(
    posterior: object,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    level: float,
    repeatability: float = 0.0,
    *,
    predictive: bool = True,
    seed: int = 0,
    model_margin: float = MODEL_MARGIN,
    success_margin: float = SUCCESS_MARGIN,
    ladder: LoadLadder | None = None,
) -> Bounds:
    """Central ``level`` credible intervals, measured cells collapsed.

    Args:
        posterior: a :class:`fleetsieve_bayes.model.inference.Posterior` (uses
            ``latent (n_draws, n_cells, 4)`` and ``noise (n_draws, 4)``).
        observed: ``(n_cells, 4)`` measured values (read where measured).
        measured_mask: bool ``(n_cells,)``.
        level: e.g. 0.9 → 5 % and 95 % quantiles.
        repeatability: relative half-width of the band around measured values.
        predictive: intervals of latent + noise (default) rather than latent only.
        seed: PRNG seed of the predictive noise draws (deterministic bounds).
        model_margin: model discrepancy of the tails of unmeasured cells
            (:data:`fleetsieve_bayes.decision.intervals.MODEL_MARGIN`).
        success_margin: ... and of their failure probability
            (:data:`fleetsieve_bayes.decision.intervals.SUCCESS_MARGIN`).
        ladder: the grid's :func:`~fleetsieve_bayes.decision.intervals.load_ladder`:
            apply the knee guard (None: do not; campaigns always pass it).
    """
    q_lo, q_hi = credible_quantiles(level)
    latent = np.asarray(posterior.latent, dtype=np.float64)
    if predictive:
        noise = jnp.asarray(posterior.noise)[:, None, :]
        draws = np.asarray(
            sample_obs(jax.random.PRNGKey(seed), jnp.asarray(latent), noise), dtype=np.float64
        )
    else:
        draws = latent
    lo, hi = model_intervals(np.quantile(draws, q_lo, axis=0), np.quantile(draws, q_hi, axis=0), model_margin, success_margin)
    obs = np.asarray(observed, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # unmeasured rows may be NaN; they are not read
        m = np.asarray(measured_mask, dtype=bool)
        lo, hi = with_measured(lo, hi, obs, m, float(repeatability))
        if ladder is not None:
            lo = knee_guard(lo, *guard_state(obs, m, ladder, float(repeatability)))
    return Bounds(lo=lo, hi=hi)


def rule_bounds(
    posterior: object,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    level: float,
    repeatability: float,
    grid: CellGrid,
    rules: IntervalRules,
) -> Bounds:
    """:func:`credible_bounds` under a campaign's :class:`IntervalRules` (margins, knee guard)."""
    return credible_bounds(
        posterior,
        observed,
        measured_mask,
        level,
        repeatability,
        model_margin=rules.tail_margin,
        success_margin=rules.success_margin,
        ladder=load_ladder(grid.workload_idx, grid.tp, grid.offered_rps, rules.knee_guard),
    )


def conservative_table(bounds: Bounds) -> np.ndarray:
    """``(n_cells, 4)``: low throughput, high TTFT and completion, low success."""
    return bound_tables(bounds.lo, bounds.hi)[0]


def optimistic_table(bounds: Bounds) -> np.ndarray:
    """``(n_cells, 4)``: high throughput, low TTFT and completion, high success."""
    return bound_tables(bounds.lo, bounds.hi)[1]


def bounds_frame(grid: CellGrid, bounds: Bounds, measured_mask: np.ndarray) -> pd.DataFrame:
    """``bounds.csv``: one row per cell with :data:`BOUNDS_COLUMNS`."""
    lo, hi = bounds.lo, bounds.hi
    return pd.DataFrame(
        {
            "workload": [grid.workloads[int(w)] for w in grid.workload_idx],
            "tp": grid.tp.astype(np.int64),
            "load": list(grid.load),
            "measured": np.asarray(measured_mask, dtype=bool),
            "throughput_lo": lo[:, 0],
            "throughput_hi": hi[:, 0],
            "ttft_p99_lo": lo[:, 1],
            "ttft_p99_hi": hi[:, 1],
            "completion_p99_lo": lo[:, 2],
            "completion_p99_hi": hi[:, 2],
            "success_lo": lo[:, 3],
            "success_hi": hi[:, 3],
        },
        columns=list(BOUNDS_COLUMNS),
    )
