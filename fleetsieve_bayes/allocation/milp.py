"""Exact lexicographic fleet allocation as a sequence of MILPs (python-mip + CBC).

DESIGN.md, "The allocation problem (exact)": each class i picks at most one
admissible cell q of its own and n_i ≥ 0 replicas (TP_q GPUs each),
``Σ n_i·TP_i ≤ G``; served ``x_i = min(λ_i, n_i·c_q)``, ``r_i = x_i/λ_i``.

Formulation: binary ``y_iq`` (``Σ_q y_iq ≤ 1``), integer
``n_iq ≤ floor(G/TP_q)·y_iq``, continuous ``0 ≤ x_i ≤ λ_i`` with
``x_i ≤ Σ_q n_iq·c_q``, and ``Σ n_iq·TP_q ≤ G``. Successive solves on one
model, each stage fixing the previous optimum up to the tolerance:

1. critical floors ``x_i ≥ (δ_i − tol)·λ_i`` — if the model is infeasible,
   status ``"infeasible"`` (stage 1 is the feasibility of stage 2's model,
   since t = 0 adds nothing);
2. maximise t with ``x_i ≥ t·λ_i`` for every class → t*;
3. add ``t ≥ t* − tol``, maximise ``Σ x_i`` → g*;
4. add ``Σ x_i ≥ g* − tol·Σλ``, minimise GPUs.

Tolerance: ``tol`` (default 1e-6) is absolute on fulfillment (in [0, 1]) and
``tol·Σ_i λ_i`` on goodput (req/s) — the same as the JAX allocator's. CBC runs
with zero relative gap and integrality tolerance 1e-9, and the objectives
reported are recomputed in float64 from the integer replica counts.

Exact reduction: a cell with TP ≥ and capacity ≤ another admissible cell of the
same class is dominated (the other serves at least as much with at most as
many GPUs in every stage), so per class only the Pareto front of
(TP, capacity) enters the MILP (``prune=True``; ≤ one cell per distinct TP).
The reported cell is then chosen canonically (as in the JAX allocator): for
the class's GPUs w_i, the lowest-index admissible cell whose served rate
``min(λ_i, floor(w_i/TP_q)·c_q)`` is within ``tol·λ_i`` of the best.
"""

from __future__ import annotations

import mip
import numpy as np

from fleetsieve_bayes.allocation.objective import (
    DEFAULT_TOL,
    allocation_from_choice,
    infeasible_allocation,
)
from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid, admissible

__all__ = ["allocate_milp", "pareto_cells", "canonical_cells", "DEFAULT_TOL"]


def pareto_cells(grid: CellGrid, values: np.ndarray, adm: np.ndarray, gpus: int) -> list[list[int]]:
    """Per class, the admissible cells on the (TP ↑, capacity ↓) Pareto front.

    Args:
        values: ``(n_cells, 4)``; adm: bool ``(n_cells,)``.

    Returns:
        ``n_classes`` lists of cell indices, each with strictly increasing TP
        and capacity (ties keep the lowest index); cells with TP > ``gpus``
        are dropped.
    """
    out: list[list[int]] = []
    cap = values[:, 0]
    for i in range(grid.n_classes):
        cells = [q for q in np.flatnonzero(adm & (grid.workload_idx == i)) if grid.tp[q] <= gpus]
        cells.sort(key=lambda q: (int(grid.tp[q]), -float(cap[q]), int(q)))
        front: list[int] = []
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
) -> tuple[np.ndarray, np.ndarray]:
    """Lowest-index admissible cell per class within ``tol·λ_i`` of the best served rate at ``w_i`` GPUs.

    Args:
        values: ``(n_cells, 4)``; adm: bool ``(n_cells,)``; demand, w: ``(n_classes,)``.

    Returns:
        ``cell (n_classes,)`` (-1 for none) and ``replicas (n_classes,)``, int64.
    """
    k = grid.n_classes
    kq = grid.workload_idx
    n_q = w[kq] // grid.tp
    s_q = np.where(adm, np.minimum(demand[kq], n_q * values[:, 0]), -np.inf)
    cell = np.full(k, -1, np.int64)
    reps = np.zeros(k, np.int64)
    for i in range(k):
        mine = np.flatnonzero((kq == i) & adm & (n_q > 0))
        if mine.size == 0:
            continue
        best = s_q[mine].max()
        q = int(mine[s_q[mine] >= best - tol * demand[i]][0])
        cell[i] = q
        reps[i] = int(w[i] // grid.tp[q])
    return cell, reps


def allocate_milp(
    grid: CellGrid,
    values: np.ndarray,
    problem: AllocationProblem,
    *,
    tol: float = DEFAULT_TOL,
    time_limit: float | None = None,
    prune: bool = True,
) -> Allocation:
    """Solve the lexicographic allocation exactly on one table.

    Args:
        grid: the candidate cells.
        values: ``(n_cells, 4)`` cell metrics in METRICS order.
        problem: classes (``(n_classes,)`` arrays) and the GPU budget.
        tol: stage tolerance (see the module docstring).
        time_limit: seconds per stage for CBC (None: no limit). A stage that
            hits it without a proven optimum raises ``RuntimeError``.
        prune: restrict each class to its (TP, capacity) Pareto front (exact).

    Returns:
        An :class:`Allocation` (status ``"feasible"`` or ``"infeasible"``).
    """
    values = np.asarray(values, np.float64)
    k = grid.n_classes
    gpus = int(problem.gpus)
    lam = np.asarray(problem.demand, np.float64)
    adm = admissible(grid, values, problem)
    cap = values[:, 0]
    if prune:
        per_class = pareto_cells(grid, values, adm, gpus)
    else:
        per_class = [
            [int(q) for q in np.flatnonzero(adm & (grid.workload_idx == i)) if grid.tp[q] <= gpus]
            for i in range(k)
        ]
    lo = np.where(problem.critical, problem.floor, 0.0)

    def build(t_min: float, goodput_min: float | None) -> tuple[mip.Model, dict, list, mip.Var, mip.LinExpr]:
        """A fresh model with the stage constraints fixed so far.

        Each stage gets its own model: re-solving one CBC model after adding a
        constraint and flipping the objective sense was seen to report a
        feasible stage-4 model as infeasible.
        """
        m = mip.Model(sense=mip.MAXIMIZE, solver_name="CBC")
        m.verbose = 0
        m.threads = 1  # deterministic
        m.max_mip_gap = 0.0
        m.max_mip_gap_abs = 1e-10
        m.integer_tol = 1e-9
        # CBC's preprocessing returns wrong "optimal" solutions on small-valued
        # instances (e.g. 0.125 req/s replicas, 0.25 req/s demand: goodput 0.25
        # instead of 0.5); the pruned models are tiny, so it is not needed.
        m.preprocess = 0
        n_vars: dict[tuple[int, int], mip.Var] = {}
        x = [m.add_var(lb=0.0, ub=float(lam[i])) for i in range(k)]
        t = m.add_var(lb=max(t_min, 0.0), ub=1.0)
        for i, cells in enumerate(per_class):
            ys = []
            for q in cells:
                ub = gpus // int(grid.tp[q])
                y = m.add_var(var_type=mip.BINARY)
                nv = m.add_var(var_type=mip.INTEGER, lb=0, ub=ub)
                m += nv <= ub * y
                ys.append(y)
                n_vars[(i, q)] = nv
            if ys:
                m += mip.xsum(ys) <= 1
                m += x[i] <= mip.xsum(float(cap[q]) * n_vars[(i, q)] for q in cells)
            else:
                m += x[i] <= 0.0
            if lo[i] > 0:
                m += x[i] >= float(max(lo[i] - tol, 0.0) * lam[i])
            m += x[i] >= float(lam[i]) * t
        gpu_expr = mip.xsum(int(grid.tp[q]) * nv for (_, q), nv in n_vars.items())
        if n_vars:
            m += gpu_expr <= gpus
        if goodput_min is not None:
            m += mip.xsum(x) >= goodput_min
        return m, n_vars, x, t, gpu_expr

    def solve(m: mip.Model, stage: str) -> bool:
        kwargs = {} if time_limit is None else {"max_seconds": float(time_limit)}
        status = m.optimize(**kwargs)
        if status == mip.OptimizationStatus.OPTIMAL:
            return True
        if status in (mip.OptimizationStatus.INFEASIBLE, mip.OptimizationStatus.INT_INFEASIBLE):
            return False
        raise RuntimeError(f"allocate_milp: CBC stopped at stage {stage} with status {status.name}")

    def recompute(n_vars: dict) -> tuple[np.ndarray, float, float]:
        served = np.zeros(k)
        for (i, q), nv in n_vars.items():
            served[i] += round(nv.x) * cap[q]
        served = np.minimum(served, lam)
        return served, float(np.min(served / lam)), float(np.sum(served))

    m, n_vars, x, t, gpu_expr = build(0.0, None)
    m.objective = mip.maximize(t)
    if not solve(m, "2 (max min-fulfillment)"):
        return infeasible_allocation(k)
    t_star = max(float(t.x), recompute(n_vars)[1])
    m, n_vars, x, t, gpu_expr = build(t_star - tol, None)
    m.objective = mip.maximize(mip.xsum(x))
    if not solve(m, "3 (max goodput)"):
        raise RuntimeError("allocate_milp: stage 3 infeasible after stage 2 (numerical trouble)")
    g_star = max(float(m.objective_value), recompute(n_vars)[2])
    if n_vars:
        m, n_vars, x, t, gpu_expr = build(t_star - tol, g_star - tol * float(np.sum(lam)))
        m.objective = mip.minimize(gpu_expr)
        if not solve(m, "4 (min GPUs)"):
            raise RuntimeError(
                "allocate_milp: stage 4 infeasible after stage 3 (numerical trouble)"
            )

    w = np.zeros(k, np.int64)
    for (i, q), nv in n_vars.items():
        w[i] += int(round(nv.x)) * int(grid.tp[q])
    cell, reps = canonical_cells(grid, values, adm, lam, w, tol)
    return allocation_from_choice(grid, values, problem, cell, reps, feasible=True)
