"""Targeted active learning on the current decision: ``targeted``.

From the posterior draws, ``p_best(c)`` = share of draws whose own optimal
allocation (JAX allocator per draw) uses cell c, and ``p_adm(c)`` = share of
draws in which c is admissible; score = ``p_best(1−p_best)`` +
``p_adm(1−p_adm)`` for cells A⁻ or A⁺ commit to — the Bernoulli variance of
the decision variables. Falls back to ``max-uncertainty`` when every score
is 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetsieve_bayes.allocation.problem import admissible
from fleetsieve_bayes.decision.strategies.base import (
    RoundState,
    Select,
    StrategyContext,
    pick,
    unmeasured,
)
from fleetsieve_bayes.decision.strategies.uncertainty import max_uncertainty

__all__ = ["build_targeted", "decision_usage"]

# Draws used for per-draw allocations (evenly thinned).
_MAX_DRAWS = 256


def decision_usage(solve: Any, state: RoundState) -> tuple[np.ndarray, np.ndarray]:
    """``(p_best, p_adm)`` each ``(n_cells,)`` over (thinned) posterior draws.

    Measured cells are known: every draw sees their measured values.
    """
    import jax.numpy as jnp

    grid = state.grid
    lat = np.asarray(state.posterior.latent)
    lat = lat[:: max(1, -(-lat.shape[0] // _MAX_DRAWS))]
    obs = np.where(state.measured[:, None], np.nan_to_num(state.observed, nan=1.0), 0.0)
    lat = np.where(state.measured[None, :, None], obs[None].astype(lat.dtype), lat)
    out = solve(jnp.asarray(lat))
    cells = np.asarray(out.cell)  # (D, n_classes)
    reps = np.asarray(out.replicas)
    used = np.zeros((lat.shape[0], grid.n_cells))
    rows = np.repeat(np.arange(lat.shape[0])[:, None], cells.shape[1], axis=1)
    ok = (cells >= 0) & (reps > 0)
    used[rows[ok], cells[ok]] = 1.0
    return used.mean(axis=0), admissible(grid, lat.astype(np.float64), state.problem).mean(axis=0)


def build_targeted(ctx: StrategyContext) -> Select:
    solver: dict[str, Any] = {}

    def select(state: RoundState) -> int:
        unmeasured(state)
        if "solve" not in solver:
            from fleetsieve_bayes.allocation.batched import make_jax_allocator

            solver["solve"] = make_jax_allocator(ctx.grid, ctx.problem).solve
        p_best, p_adm = decision_usage(solver["solve"], state)
        decision = np.zeros(ctx.grid.n_cells, bool)
        decision[state.conservative.committed() + state.optimistic.committed()] = True
        score = p_best * (1.0 - p_best) + decision * p_adm * (1.0 - p_adm)
        if np.max(np.where(state.measured, 0.0, score)) <= 0.0:
            return max_uncertainty(state)
        return pick(score, state)

    return select
