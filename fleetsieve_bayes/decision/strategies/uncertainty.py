"""Uncertainty sampling, blind to the decision: ``max-uncertainty`` and ``shared-uncertainty``.

- ``max-uncertainty``: the widest joint credible interval of the shared model
  (sum over metrics of the interval width on the modelling scale: log for
  throughput and tails, log failure rate for success).
- ``shared-uncertainty``: max predictive std of an RBF Gaussian process over
  (class, log2 TP, log load) fitted to the measured cells
  (:func:`fleetsieve_bayes.decision.surrogates.gp_predictive_std`).
"""

from __future__ import annotations

import numpy as np

from fleetsieve_bayes.decision.intervals import credible_quantiles
from fleetsieve_bayes.decision.strategies.base import (
    RoundState,
    Select,
    StrategyContext,
    pick,
    unmeasured,
)
from fleetsieve_bayes.decision.surrogates import gp_predictive_std

__all__ = ["interval_widths", "max_uncertainty", "build_max_uncertainty", "build_shared_uncertainty"]


def interval_widths(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Joint interval width per cell, ``(n_cells,)``, from ``lo``/``hi`` ``(n_cells, 4)``.

    Sum over metrics of the width on the modelling scale: log for throughput
    and the tails, log failure rate ``log(1 − s)`` for success.
    """
    clip = lambda v: np.clip(np.nan_to_num(np.asarray(v, np.float64), nan=1.0, posinf=1e9), 1e-9, 1e9)  # noqa: E731
    lo, hi = clip(lo), clip(hi)
    w = np.abs(np.log(hi[:, :3]) - np.log(lo[:, :3])).sum(axis=1)
    f_lo, f_hi = np.clip(1.0 - lo[:, 3], 1e-4, 1.0), np.clip(1.0 - hi[:, 3], 1e-4, 1.0)
    return w + np.abs(np.log(f_lo) - np.log(f_hi))


def _bounds_lo_hi(state: RoundState) -> tuple[np.ndarray, np.ndarray]:
    if state.bounds is not None:
        return np.asarray(state.bounds.lo), np.asarray(state.bounds.hi)
    lat = np.asarray(state.posterior.latent, np.float64)
    q_lo, q_hi = credible_quantiles(state.credible_level)
    return np.quantile(lat, q_lo, axis=0), np.quantile(lat, q_hi, axis=0)


def max_uncertainty(state: RoundState) -> int:
    """The unmeasured cell with the widest joint interval."""
    unmeasured(state)
    return pick(interval_widths(*_bounds_lo_hi(state)), state)


def build_max_uncertainty(ctx: StrategyContext) -> Select:
    return max_uncertainty


def build_shared_uncertainty(ctx: StrategyContext) -> Select:
    def select(state: RoundState) -> int:
        unmeasured(state)
        observed = np.where(state.measured[:, None], np.nan_to_num(state.observed, nan=1.0, posinf=1e9), 1.0)
        return pick(gp_predictive_std(ctx.grid, observed, np.asarray(state.measured, bool)), state)

    return select
