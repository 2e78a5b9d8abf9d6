"""Small surrogates for the baseline strategies (NumPy only, no sampling).

- :func:`gp_predictive_std`: an RBF Gaussian process over the features
  ``(log2 TP, log offered load)`` with a class kernel, shared across TP and
  load — the *shared-feature uncertainty* baseline.
- :func:`independent_arms`: one independent Gaussian per cell and metric (no
  sharing between cells) — the *constrained Bayesian optimisation* baseline.

Both work on the modelling scale: log throughput, log TTFT, log completion,
logit success (clipped like the main model, so 0.999 and 1.0 coincide).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.model.scales import TINY as _TINY
from fleetsieve_bayes.model.scales import metric_transform

__all__ = [
    "transform",
    "cell_features",
    "rbf_class_kernel",
    "GpFit",
    "fit_gp",
    "gp_predictive_std",
    "ArmBeliefs",
    "independent_arms",
]



def transform(values: np.ndarray) -> np.ndarray:
    """Natural units → modelling scale in float64; ``(..., 4)`` → ``(..., 4)`` (finite).

    The model's own transform (:func:`fleetsieve_bayes.model.scales.metric_transform`).
    """
    return metric_transform(np.asarray(values, np.float64), np)


def cell_features(grid: CellGrid) -> np.ndarray:
    """``(n_cells, 2)``: log2 TP and log offered rate, each standardised over the grid."""
    x = np.stack([np.log2(grid.tp.astype(np.float64)), np.log(np.maximum(grid.offered_rps, _TINY))], axis=1)
    sd = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def rbf_class_kernel(
    xa: np.ndarray, ca: np.ndarray, xb: np.ndarray, cb: np.ndarray, length: float, class_corr: float
) -> np.ndarray:
    """``k(a, b) = exp(−|x_a − x_b|² / 2ℓ²) · (1 if same class else class_corr)``.

    Args:
        xa: ``(na, d)``; ca: ``(na,)`` class index; xb: ``(nb, d)``; cb: ``(nb,)``.

    Returns:
        ``(na, nb)``.
    """
    d2 = ((xa[:, None, :] - xb[None, :, :]) ** 2).sum(-1)
    same = ca[:, None] == cb[None, :]
    return np.exp(-0.5 * d2 / length**2) * np.where(same, 1.0, class_corr)


class GpFit(NamedTuple):
    length: float
    class_corr: float
    log_marginal: float


def fit_gp(
    x: np.ndarray,
    cls: np.ndarray,
    y: np.ndarray,
    *,
    nugget: float = 1e-2,
    lengths: tuple[float, ...] = (0.35, 0.7, 1.4, 2.8),
    class_corrs: tuple[float, ...] = (0.0, 0.5, 0.9),
) -> GpFit:
    """Pick (length scale, class correlation) by the summed log marginal likelihood (grid search).

    Args:
        x: ``(n, d)`` features; cls: ``(n,)``; y: ``(n, m)`` targets, each
            column standardised by the caller (unit prior variance).
    """
    best = GpFit(lengths[len(lengths) // 2], class_corrs[1], -np.inf)
    n, m = y.shape
    if n < 2:
        return best
    for length, rho in itertools.product(lengths, class_corrs):
        k = rbf_class_kernel(x, cls, x, cls, length, rho) + nugget * np.eye(n)
        chol = np.linalg.cholesky(k)
        alpha = np.linalg.solve(chol, y)
        lml = -0.5 * float((alpha**2).sum()) - m * float(np.log(np.diag(chol)).sum())
        if lml > best.log_marginal:
            best = GpFit(length, rho, lml)
    return best


def gp_predictive_std(
    grid: CellGrid, observed: np.ndarray, measured: np.ndarray, *, nugget: float = 1e-2
) -> np.ndarray:
    """Predictive standard deviation (unit prior variance) of every cell under the shared RBF GP.

    Hyperparameters are fitted to the measured cells' standardised
    modelling-scale metrics; the std itself depends on where the measured
    cells are, not on their values.

    Args:
        observed: ``(n_cells, 4)`` (rows of unmeasured cells ignored).
        measured: ``(n_cells,)`` bool.

    Returns:
        ``(n_cells,)`` in [0, 1].
    """
    x = cell_features(grid)
    cls = grid.workload_idx
    idx = np.flatnonzero(measured)
    if idx.size == 0:
        return np.ones(grid.n_cells)
    y = transform(observed[idx])
    sd = y.std(axis=0)
    y = (y - y.mean(axis=0)) / np.where(sd > 1e-9, sd, 1.0)
    fit = fit_gp(x[idx], cls[idx], y, nugget=nugget)
    k_mm = rbf_class_kernel(x[idx], cls[idx], x[idx], cls[idx], fit.length, fit.class_corr)
    k_xm = rbf_class_kernel(x, cls, x[idx], cls[idx], fit.length, fit.class_corr)
    chol = np.linalg.cholesky(k_mm + nugget * np.eye(idx.size))
    v = np.linalg.solve(chol, k_xm.T)  # (n_meas, n_cells)
    var = 1.0 - (v**2).sum(axis=0)
    return np.sqrt(np.clip(var, 0.0, 1.0))


class ArmBeliefs(NamedTuple):
    """Independent Gaussian beliefs on the modelling scale; both ``(n_cells, 4)``."""

    mean: np.ndarray
    sd: np.ndarray


def independent_arms(
    grid: CellGrid,
    observed: np.ndarray,
    measured: np.ndarray,
    *,
    measured_sd: float = 0.05,
    min_sd: tuple[float, float, float, float] = (0.3, 0.5, 0.5, 1.0),
    default_mean: tuple[float, float, float, float] = (0.0, 0.0, 2.5, 4.0),
) -> ArmBeliefs:
    """Per-cell, per-metric Gaussians with no sharing between cells.

    A measured cell: its transformed value, sd ``measured_sd``. An unmeasured
    cell: an empirical-Bayes prior of its class — throughput as
    ``log(offered) + mean log(throughput/offered)``, tails and success as the
    class mean; the sd is the class spread, at least ``min_sd`` — pooled
    over all measured cells when the class has fewer than two, and
    ``default_mean``/``min_sd`` when nothing is measured.

    Args:
        observed: ``(n_cells, 4)`` natural units; measured: ``(n_cells,)`` bool.
    """
    z = transform(np.where(measured[:, None], observed, 1.0))
    log_off = np.log(np.maximum(grid.offered_rps, _TINY))
    resid = z.copy()
    resid[:, 0] = z[:, 0] - log_off  # throughput relative to the offered rate
    mean = np.zeros((grid.n_cells, 4))
    sd = np.zeros((grid.n_cells, 4))
    floor = np.asarray(min_sd)
    pooled = measured.copy()
    if pooled.sum() >= 2:
        p_mean, p_sd = resid[pooled].mean(0), np.maximum(resid[pooled].std(0), floor)
    elif pooled.sum() == 1:
        p_mean, p_sd = resid[pooled][0], floor * 2
    else:
        p_mean, p_sd = np.asarray(default_mean), floor * 2
    for w in range(grid.n_classes):
        in_class = grid.workload_idx == w
        mine = in_class & measured
        if mine.sum() >= 2:
            m, s = resid[mine].mean(0), np.maximum(resid[mine].std(0), floor)
        else:
            m, s = p_mean, p_sd
        mean[in_class] = m
        sd[in_class] = s
    mean[:, 0] += log_off
    mean[:, 0] = np.minimum(mean[:, 0], log_off)  # a cell cannot serve more than it is offered
    mean = np.where(measured[:, None], z, mean)
    sd = np.where(measured[:, None], measured_sd, sd)
    return ArmBeliefs(mean=mean, sd=sd)
