"""Strategies that ignore the model: ``random`` and ``grid``.

- ``random``: uniform over unmeasured cells.
- ``grid``: a fixed order — workload (campaign order), then TP ascending,
  then load ascending (offered rate, then label); the first unmeasured cell.
"""

from __future__ import annotations

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid
from fleetsieve_bayes.decision.strategies.base import (
    RoundState,
    Select,
    StrategyContext,
    rng_of,
    unmeasured,
)

__all__ = ["grid_order", "build_random", "build_grid"]


def grid_order(grid: CellGrid) -> np.ndarray:
    """The ``grid`` strategy's fixed order: workload, TP ascending, offered load ascending, label; ``(n_cells,)``."""
    labels = np.asarray(grid.load, dtype=object)
    label_rank = np.unique(labels, return_inverse=True)[1]
    return np.lexsort((np.arange(grid.n_cells), label_rank, grid.offered_rps, grid.config_idx, grid.workload_idx))


def build_random(ctx: StrategyContext) -> Select:
    def select(state: RoundState) -> int:
        return int(rng_of(state, ctx.seed).choice(unmeasured(state)))

    return select


def build_grid(ctx: StrategyContext) -> Select:
    order = grid_order(ctx.grid)

    def select(state: RoundState) -> int:
        unmeasured(state)
        return int(next(c for c in order if not state.measured[c]))

    return select
