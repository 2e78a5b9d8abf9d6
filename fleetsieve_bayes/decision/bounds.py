"""Credible bounds for every cell, and the conservative / optimistic tables.

For an unmeasured cell the interval is the central ``level`` interval of the
posterior *predictive* distribution (latent metrics plus observation noise): it
should contain what measuring the cell would return, which is the value the
decision will use once the cell is measured. A measured cell collapses to its
measured values, widened by ``±repeatability`` (relative) for throughput and
tails and on the *failure* probability ``1 - success`` for success (a relative
band on 0.99 itself would be meaninglessly wide), clipped to ``[0, 1]``.
Measured failed cells keep their values (0 throughput, 0 success, tails
possibly ``+inf``). Success intervals reaching within ``SUCCESS_EPS`` of 0 or 1
are extended to 0 or 1 (the model's resolution ends there).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.model.joint import SUCCESS_EPS, sample_obs
from fleetsieve_bayes.table import BOUNDS_COLUMNS

__all__ = [
    "Bounds",
    "credible_bounds",
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
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"credible level must be in (0, 1), got {level}")
    latent = np.asarray(posterior.latent, dtype=np.float64)
    if predictive:
        noise = jnp.asarray(posterior.noise)[:, None, :]
        draws = np.asarray(
            sample_obs(jax.random.PRNGKey(seed), jnp.asarray(latent), noise), dtype=np.float64
        )
    else:
        draws = latent
    a = (1.0 - level) / 2.0
    lo = np.quantile(draws, a, axis=0)
    hi = np.quantile(draws, 1.0 - a, axis=0)
    # The model resolves success only within [SUCCESS_EPS, 1 - SUCCESS_EPS]
    # (logit of clipped values): an interval reaching past either end reaches
    # the end itself, so a measured 1.0 (or 0.0) is inside it.
    lo[:, 3] = np.where(lo[:, 3] <= SUCCESS_EPS, 0.0, lo[:, 3])
    hi[:, 3] = np.where(hi[:, 3] >= 1.0 - SUCCESS_EPS, 1.0, hi[:, 3])
    m = np.asarray(measured_mask, dtype=bool)
    obs = np.asarray(observed, dtype=np.float64)
    r = float(repeatability)
    with np.errstate(invalid="ignore"):
        mlo = obs * (1.0 - r)
        mhi = obs * (1.0 + r)
        fail = 1.0 - obs[:, 3]
        mlo[:, 3] = np.clip(1.0 - fail * (1.0 + r), 0.0, 1.0)
        mhi[:, 3] = np.clip(1.0 - fail * (1.0 - r), 0.0, 1.0)
    # A measured cell whose source had no completion timing (NaN) is
    # unobserved there: +inf on both sides, so a class whose SLO names
    # completion p99 cannot commit to it until it is measured.
    mlo[:, 1:3] = np.where(np.isnan(obs[:, 1:3]), np.inf, mlo[:, 1:3])
    mhi[:, 1:3] = np.where(np.isnan(obs[:, 1:3]), np.inf, mhi[:, 1:3])
    lo = np.where(m[:, None], mlo, lo)
    hi = np.where(m[:, None], mhi, hi)
    return Bounds(lo=lo, hi=hi)


def conservative_table(bounds: Bounds) -> np.ndarray:
    """``(n_cells, 4)``: low throughput, high TTFT and completion, low success."""
    return np.stack([bounds.lo[:, 0], bounds.hi[:, 1], bounds.hi[:, 2], bounds.lo[:, 3]], axis=1)


def optimistic_table(bounds: Bounds) -> np.ndarray:
    """``(n_cells, 4)``: high throughput, low TTFT and completion, high success."""
    return np.stack([bounds.hi[:, 0], bounds.lo[:, 1], bounds.lo[:, 2], bounds.hi[:, 3]], axis=1)


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
