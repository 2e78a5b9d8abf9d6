"""Constrained Bayesian optimisation without sharing: ``constrained-bo``.

Independent per-cell Gaussians (no sharing between cells,
:func:`fleetsieve_bayes.decision.surrogates.independent_arms`); expected
improvement of per-GPU throughput over the class's best measured admissible
cell (in units of the class's demand per GPU, λ_i/G) times the probability
that the cell meets its SLO.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid, admissible
from fleetsieve_bayes.decision.strategies.base import (
    RoundState,
    Select,
    StrategyContext,
    pick,
    unmeasured,
)
from fleetsieve_bayes.decision.surrogates import ArmBeliefs, independent_arms, transform

__all__ = ["build_constrained_bo", "expected_improvement", "p_slo"]


def expected_improvement(
    grid: CellGrid, problem: AllocationProblem, arms: ArmBeliefs, observed: np.ndarray, measured: np.ndarray
) -> np.ndarray:
    """EI of per-GPU throughput over each class's best measured admissible cell, in λ_i/G units; ``(n_cells,)``."""
    w = grid.workload_idx
    adm = admissible(grid, observed, problem) & measured
    per_gpu = observed[:, 0] / grid.tp
    best = np.zeros(grid.n_classes)
    for k in range(grid.n_classes):
        sel = adm & (w == k)
        best[k] = per_gpu[sel].max() if sel.any() else 0.0
    mu, sd = arms.mean[:, 0] - np.log(grid.tp.astype(np.float64)), arms.sd[:, 0]
    b = best[w]
    with np.errstate(divide="ignore"):
        log_b = np.log(np.maximum(b, 1e-300))
    ei_pos = np.exp(mu + sd**2 / 2) * ndtr((mu + sd**2 - log_b) / sd) - b * ndtr((mu - log_b) / sd)
    ei = np.where(b > 0, ei_pos, np.exp(mu + sd**2 / 2))
    return ei / (problem.demand[w] / max(problem.gpus, 1))


def p_slo(grid: CellGrid, problem: AllocationProblem, arms: ArmBeliefs) -> np.ndarray:
    """Probability that each cell meets its class's SLO under independent Gaussians; ``(n_cells,)``."""
    w = grid.workload_idx
    limits = transform(
        np.stack([np.ones(grid.n_cells), problem.ttft_max[w], problem.completion_max[w], problem.success_min[w]], axis=1)
    )
    named = np.isfinite(np.stack([problem.ttft_max[w], problem.completion_max[w]], 1))
    z_lim = np.where(named, limits[:, 1:3], np.inf)
    p_tails = ndtr((z_lim - arms.mean[:, 1:3]) / arms.sd[:, 1:3]).prod(axis=1)
    return p_tails * ndtr((arms.mean[:, 3] - limits[:, 3]) / arms.sd[:, 3])


def build_constrained_bo(ctx: StrategyContext) -> Select:
    def select(state: RoundState) -> int:
        unmeasured(state)
        measured = np.asarray(state.measured, bool)
        observed = np.where(measured[:, None], np.nan_to_num(state.observed, nan=1.0, posinf=1e9), 1.0)
        arms = independent_arms(ctx.grid, observed, measured)
        ei = expected_improvement(ctx.grid, ctx.problem, arms, observed, measured)
        return pick(np.maximum(ei, 0.0) * p_slo(ctx.grid, ctx.problem, arms), state)

    return select
