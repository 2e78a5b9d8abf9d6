"""Which cells an exact allocator needs to consider, and each pool's GPU budget.

Shared by the single-pool MILP (:mod:`fleetsieve_bayes.allocation.milp`) and the
several-pool one (:mod:`fleetsieve_bayes.allocation.milp_pools`).
"""

from __future__ import annotations

import numpy as np

from fleetsieve_bayes.allocation.objective import DEFAULT_TOL, within
from fleetsieve_bayes.allocation.problem import (
    AllocationProblem,
    CellGrid,
    effective_single_budget,
    pool_counts,
    pool_prices,
    within_cap,
)

__all__ = ["pool_budgets", "pareto_cells", "canonical_cells"]


def pool_budgets(grid: CellGrid, problem: AllocationProblem, tol: float = DEFAULT_TOL) -> np.ndarray:
    """GPUs each pool can give, int64 ``(n_pools,)``: its count, ``gpus``, and the dollar cap in its GPUs."""
    if grid.n_pools == 1:
        return np.array([effective_single_budget(problem, tol)], np.int64)
    g = pool_counts(problem, grid.n_pools)
    cap = float(problem.usd_per_hour_max)
    if np.isfinite(cap):
        g = np.minimum(g, np.floor(within_cap(cap, tol) / pool_prices(problem, grid.n_pools)).astype(np.int64))
    return np.maximum(g, 0)


def pareto_cells(
    grid: CellGrid, values: np.ndarray, adm: np.ndarray, gpus: int | np.ndarray
) -> list[list[int]]:
    """Per class, the admissible cells on the (TP ↑, capacity ↓) Pareto front of each pool.

    Args:
        values: ``(n_cells, 4)``; adm: bool ``(n_cells,)``; gpus: the budget,
            one number or one per pool ``(n_pools,)``.

    Returns:
        ``n_classes`` lists of cell indices, pool by pool, each pool's with
        strictly increasing TP and capacity (ties keep the lowest index);
        cells with TP > their pool's budget are dropped.
    """
    out: list[list[int]] = []
    cap = values[:, 0]
    budget = np.broadcast_to(np.asarray(gpus, np.int64), (grid.n_pools,))
    pool = grid.gpu_idx
    for i in range(grid.n_classes):
        front: list[int] = []
        for p in range(grid.n_pools):
            cells = [
                q
                for q in np.flatnonzero(adm & (grid.workload_idx == i) & (pool == p))
                if grid.tp[q] <= budget[p]
            ]
            cells.sort(key=lambda q: (int(grid.tp[q]), -float(cap[q]), int(q)))
            best = -np.inf
            for q in cells:
                if cap[q] > best:
                    front.append(int(q))
                    best = float(cap[q])
        out.append(front)
    return out


def canonical_cells(
    grid: CellGrid,
    values: np.ndarray,
    adm: np.ndarray,
    demand: np.ndarray,
    w: np.ndarray,
    tol: float,
    pool: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Lowest-index admissible cell per class within ``tol`` (relative) of the best served rate at ``w_i`` GPUs.

    Args:
        values: ``(n_cells, 4)``; adm: bool ``(n_cells,)``; demand, w: ``(n_classes,)``.
        pool: ``(n_classes,)`` the pool each class's GPUs are on (None: any cell).

    Returns:
        ``cell (n_classes,)`` (-1 for none) and ``replicas (n_classes,)``, int64.
    """
    k = grid.n_classes
    kq = grid.workload_idx
    n_q = w[kq] // grid.tp
    s_q = np.where(adm, np.minimum(demand[kq], n_q * values[:, 0]), -np.inf)
    on_pool = np.ones(grid.n_cells, bool) if pool is None else grid.gpu_idx == np.asarray(pool)[kq]
    cell = np.full(k, -1, np.int64)
    reps = np.zeros(k, np.int64)
    for i in range(k):
        mine = np.flatnonzero((kq == i) & adm & (n_q > 0) & on_pool)
        if mine.size == 0:
            continue
        best = s_q[mine].max()
        q = int(mine[s_q[mine] >= within(best, tol)][0])
        cell[i] = q
        reps[i] = int(w[i] // grid.tp[q])
    return cell, reps
