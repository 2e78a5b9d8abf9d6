"""The common initial design, identical for every strategy.

For every workload class and every TP candidate of that class, measure the
cell at the median offered load of that (class, TP) — the lower median when
the count is even. One probe per (class, TP) gives the model a first look at
the per-GPU capacity curve (where the knee is) and at the tails at a
mid-range load, without spending on the most expensive high-load cells.
The design is ordered like the grid (class, TP), so every strategy spends the
same GPU-seconds before its own choices start.
"""

from __future__ import annotations

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid

# The names live in the strategy registry (the only list); re-exported for
# callers that import them with the design.
from fleetsieve_bayes.decision.strategies.registry import STRATEGY_NAMES

__all__ = ["initial_design", "STRATEGY_NAMES"]


def initial_design(grid: CellGrid) -> list[int]:
    """Cell indices of the initial design, in measurement order."""
    cells: list[int] = []
    for w in range(grid.n_classes):
        for tp in np.unique(grid.tp[grid.workload_idx == w]):
            idx = np.flatnonzero((grid.workload_idx == w) & (grid.tp == tp))
            idx = idx[np.argsort(grid.offered_rps[idx], kind="stable")]
            cells.append(int(idx[(len(idx) - 1) // 2]))
    return cells
