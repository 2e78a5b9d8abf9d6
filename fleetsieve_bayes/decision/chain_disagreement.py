"""Acquisition when the certifying posterior has not converged: measure the cell
that tells the chains apart.

A certification attempt can close the interval gap and pass the joint check
on draws whose chains disagree (r_hat above the bound): the model has two
readings of the data — e.g. a sharp saturation with a heavy overload against
a gradual one with a larger capacity — and NUTS does not cross between them
in any affordable number of draws. The campaign may not certify then, and
neither the gap score nor the regret score helps: both read the pooled draws,
on which the decision already looks safe. What resolves it is a measurement
whose outcome the chains predict differently.

:func:`chain_disagreement` scores every unmeasured cell by how far apart the
chains' predictions of its measurement are, relative to the spread a
measurement has within one chain (its posterior spread plus the observation
noise), summed over the four metrics on the model's scale (log throughput,
log tails, logit success):

    D(c) = Σ_m Var_k(μ_kcm) / (mean_k Var_d(z_kdcm) + mean σ_m²)

with ``z`` the transformed latent value of draw ``d`` of chain ``k`` and
``σ`` the noise scale. It is the between/within variance ratio behind r_hat,
taken on the predictive of a measurement rather than on the latent value, so
it ranks the cells whose measurement is most likely to rule one reading out.
"""

from __future__ import annotations

import numpy as np

from fleetsieve_bayes.decision.strategies.base import select_cell
from fleetsieve_bayes.model.scales import metric_transform

__all__ = ["chain_disagreement", "select_by_disagreement"]


def chain_disagreement(latent: np.ndarray, noise: np.ndarray, chains: int, measured: np.ndarray) -> np.ndarray:
    """Between-chain disagreement of each unmeasured cell's predicted measurement.

    Args:
        latent: ``(chains · draws, n_cells, 4)`` natural units, chain-major
            (the certifying posterior's ``latent``).
        noise: ``(chains · draws, 4)`` per-metric noise scales (transformed scale).
        chains: number of chains the draws come from (≥ 2).
        measured: bool ``(n_cells,)``.

    Returns:
        ``(n_cells,)`` scores ≥ 0; −inf for measured cells.
    """
    lat = np.asarray(latent, np.float64)
    n_draws, n_cells, _ = lat.shape
    if chains < 2 or n_draws % chains:
        raise ValueError(f"{n_draws} draws cannot be split into {chains} chains (need ≥ 2)")
    z = metric_transform(lat, np).reshape(chains, n_draws // chains, n_cells, 4)
    between = z.mean(axis=1).var(axis=0, ddof=1)  # (n_cells, 4)
    within = z.var(axis=1, ddof=1).mean(axis=0)  # (n_cells, 4)
    noise2 = np.mean(np.asarray(noise, np.float64) ** 2, axis=0)  # (4,)
    score = np.sum(between / (within + noise2[None, :]), axis=-1)
    return np.where(np.asarray(measured, bool), -np.inf, score)


def select_by_disagreement(score: np.ndarray, cost_gpu_s: np.ndarray, *, min_score: float = 1e-3) -> int | None:
    """The cell whose measurement best tells the chains apart (ties → fewer
    GPU-seconds), or None when no unmeasured cell separates them by ``min_score``."""
    s = np.asarray(score, np.float64)
    finite = np.isfinite(s)
    if not finite.any() or s[finite].max() < min_score:
        return None
    return select_cell(s, cost_gpu_s, tie_tolerance=1e-2)
