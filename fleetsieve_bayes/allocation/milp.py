"""Exact lexicographic fleet allocation as a sequence of MILPs (python-mip + CBC).

The problem (docs/contracts.md, "The allocation problem"): each class i picks
at most one admissible cell q of its own and n_i ≥ 0 replicas (TP_q GPUs
each), ``Σ n_i·TP_i ≤ G``; served ``x_i = min(λ_i, n_i·c_q)``,
``r_i = x_i/λ_i``; the stages and their tolerance are those of
:mod:`fleetsieve_bayes.allocation.objective`.

Formulation, scale-free (:class:`_Scaled`): per class the reachable rate
``s_i = max_q min(λ_i, floor(G/TP_q)·c_q)`` and ``u_i = x_i/s_i ∈ [0, 1]``;
binary ``y_iq`` (``Σ_q y_iq ≤ 1``), integer ``n_iq ≤ floor(G/TP_q)·y_iq``,
``u_i ≤ Σ_q n_iq·min(c_q, λ_i)/s_i`` and ``Σ n_iq·TP_q ≤ G``. Every
coefficient is O(1) whatever the demand's unit or scale (1e-6 req/s and 1e9
req/s alike), which CBC's absolute feasibility tolerances need. Successive
solves, each stage fixing the previous optimum up to the relative tolerance:

1. critical floors ``r_i ≥ δ_i·(1 − tol)`` — if the model is infeasible,
   status ``"infeasible"`` (stage 1 is the feasibility of stage 2's model,
   since t = 0 adds nothing);
2. maximise ``τ`` with ``r_i ≥ τ·T`` (``T = min_i s_i/λ_i``) → τ*;
3. add ``τ ≥ τ*·(1 − tol)``, maximise goodput ``Σ x_i`` (divided by Σ s_i) → g*;
4. add goodput ``≥ g*·(1 − tol)``, minimise GPUs (the objective's stage 5;
   its stage 4, dollars, is this one with one pool).

CBC runs with zero relative gap and integrality tolerance 1e-9, and the
objectives reported are recomputed in float64 from the integer replica
counts.

GPU pools: a grid with several pools is solved by the per-pool GPU-level
formulation of :mod:`fleetsieve_bayes.allocation.milp_pools` (stage 4 there
minimises dollars per hour). With one pool, dollars are proportional to GPUs
(stage 4 is stage 5, "min GPUs" below), and a dollar cap only lowers the
budget to ``floor(cap·(1 + tol)/price)`` GPUs
(:func:`~fleetsieve_bayes.allocation.problem.effective_single_budget`).

Exact reduction: a cell with TP ≥ and capacity ≤ another admissible cell of the
same class is dominated (the other serves at least as much with at most as
many GPUs in every stage), so per class only the Pareto front of
(TP, capacity) enters the MILP (``prune=True``; ≤ one cell per distinct TP).
The reported cell is then chosen canonically (as in the JAX allocator): for
the class's GPUs w_i, the lowest-index admissible cell whose served rate
``min(λ_i, floor(w_i/TP_q)·c_q)`` is within ``tol`` (relative) of the best.
"""

from __future__ import annotations

from typing import NamedTuple

import mip
import numpy as np

from fleetsieve_bayes.allocation.cells import canonical_cells, pareto_cells, pool_budgets
from fleetsieve_bayes.allocation.objective import (
    DEFAULT_TOL,
    allocation_from_choice,
    infeasible_allocation,
    within,
)
from fleetsieve_bayes.allocation.problem import (
    Allocation,
    AllocationProblem,
    CellGrid,
    admissible,
    check_demand,
    effective_single_budget,
)

__all__ = ["allocate_milp", "pareto_cells", "canonical_cells", "pool_budgets", "DEFAULT_TOL"]


class _Scaled(NamedTuple):
    """One instance in units where every coefficient is O(1), whatever the demand's scale.

    ``u_i = x_i / s_i`` with ``s_i`` the most class i can be served on its own
    (``max_q min(λ_i, floor(G/TP_q)·c_q)``, 0 without a usable cell), so
    ``u_i ∈ [0, 1]``; a replica of cell q adds ``min(c_q, λ_i)/s_i`` to
    ``u_i`` (capping c_q at λ_i changes no served rate, as ``x_i ≤ λ_i``).
    Fulfillment is ``r_i = ρ_i·u_i`` with ``ρ_i = s_i/λ_i``; stage 2's
    threshold is ``t = τ·T`` with ``T = min_i ρ_i``; stage 3's goodput is
    ``S·Σ_i (s_i/S)·u_i`` with ``S = Σ_i s_i``.
    """

    per_class: list[list[int]]  # usable cells per class
    coef: dict[tuple[int, int], float]  # (class, cell) → u added per replica
    s: np.ndarray  # (K,) reachable served rate, req/s
    rho: np.ndarray  # (K,) reachable fulfillment s_i / λ_i
    t_scale: float  # T = min_i ρ_i
    g_scale: float  # S = Σ_i s_i
    u_floor: np.ndarray  # (K,) critical floors in u units (δ_i·(1 − tol)/ρ_i; 0 where none)


def _scaled(
    grid: CellGrid, cap: np.ndarray, lam: np.ndarray, lo: np.ndarray, per_class: list[list[int]], gpus: int, tol: float
) -> _Scaled:
    k = len(per_class)
    s = np.zeros(k)
    for i, cells in enumerate(per_class):
        s[i] = max((min(lam[i], (gpus // int(grid.tp[q])) * cap[q]) for q in cells), default=0.0)
    coef = {(i, q): float(min(cap[q], lam[i]) / s[i]) for i, cells in enumerate(per_class) for q in cells}
    rho = s / lam
    with np.errstate(divide="ignore", invalid="ignore"):  # ρ_i = 0: unservable class
        u_floor = np.where(lo > 0, within(lo, tol) / rho, 0.0)
    return _Scaled(per_class, coef, s, rho, float(rho.min()), float(s.sum()), u_floor)


def _stage_model(
    grid: CellGrid, inst: _Scaled, gpus: int, tau_min: float, good_min: float | None
) -> tuple[mip.Model, dict[tuple[int, int], mip.Var], list[mip.Var], mip.Var, mip.LinExpr]:
    """A fresh model with the stage constraints fixed so far (all in scaled units).

    Each stage gets its own model: re-solving one CBC model after adding a
    constraint and flipping the objective sense was seen to report a feasible
    stage-4 model as infeasible.
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
    # CBC's orbital branching prints the symmetry orbits it finds with printf,
    # whatever the verbosity ("Orbit 0:  0 2" on a campaign's stdout); the
    # models are small and solved to a zero gap without it.
    mip.cbc.cbc_set_parameter(m.solver, "OrbitalBranching", "off")
    n_vars: dict[tuple[int, int], mip.Var] = {}
    u = [m.add_var(lb=0.0, ub=1.0) for _ in inst.per_class]
    tau = m.add_var(lb=max(tau_min, 0.0), ub=1.0)
    for i, cells in enumerate(inst.per_class):
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
            m += u[i] <= mip.xsum(inst.coef[(i, q)] * n_vars[(i, q)] for q in cells)
        else:
            m += u[i] <= 0.0
        if inst.u_floor[i] > 0:
            m += u[i] >= float(inst.u_floor[i])
        if inst.s[i] > 0:  # r_i ≥ t  ⇔  u_i ≥ τ·T/ρ_i
            m += u[i] >= float(inst.t_scale / inst.rho[i]) * tau
    gpu_expr = mip.xsum(int(grid.tp[q]) * nv for (_, q), nv in n_vars.items())
    if n_vars:
        m += gpu_expr <= gpus
    if good_min is not None:
        m += _goodput_expr(inst, u) >= good_min
    return m, n_vars, u, tau, gpu_expr


def _goodput_expr(inst: _Scaled, u: list[mip.Var]) -> mip.LinExpr:
    """Goodput / S, in [0, 1]."""
    return mip.xsum(float(inst.s[i] / inst.g_scale) * u[i] for i in range(len(u)) if inst.s[i] > 0)


def _optimize(m: mip.Model, stage: str, time_limit: float | None) -> bool:
    """True when optimal, False when infeasible; anything else is an error."""
    kwargs = {} if time_limit is None else {"max_seconds": float(time_limit)}
    status = m.optimize(**kwargs)
    if status == mip.OptimizationStatus.OPTIMAL:
        return True
    if status in (mip.OptimizationStatus.INFEASIBLE, mip.OptimizationStatus.INT_INFEASIBLE):
        return False
    raise RuntimeError(f"allocate_milp: CBC stopped at stage {stage} with status {status.name}")


def _served(n_vars: dict[tuple[int, int], mip.Var], cap: np.ndarray, lam: np.ndarray) -> tuple[float, float]:
    """``(min fulfillment, goodput)`` recomputed in float64 from the integer replica counts."""
    served = np.zeros(len(lam))
    for (i, q), nv in n_vars.items():
        served[i] += round(nv.x) * cap[q]
    served = np.minimum(served, lam)
    return float(np.min(served / lam)), float(np.sum(served))


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
        tol: relative stage tolerance (:func:`~fleetsieve_bayes.allocation.objective.within`).
        time_limit: seconds per stage for CBC (None: no limit). A stage that
            hits it without a proven optimum raises ``RuntimeError``.
        prune: restrict each class to its (TP, capacity) Pareto front (exact;
            the pool formulation always works on GPU levels).

    Returns:
        An :class:`Allocation` (status ``"feasible"`` or ``"infeasible"``).

    Raises:
        InputError: a demand outside :data:`~fleetsieve_bayes.allocation.problem.DEMAND_RANGE`.
    """
    check_demand(problem.demand)
    values = np.asarray(values, np.float64)
    if grid.n_pools > 1:
        from fleetsieve_bayes.allocation.milp_pools import allocate_pools_milp

        return allocate_pools_milp(grid, values, problem, tol=tol, time_limit=time_limit)
    k, gpus = grid.n_classes, effective_single_budget(problem, tol)
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
    inst = _scaled(grid, cap, lam, lo, per_class, gpus, tol)
    if np.any(inst.u_floor > 1.0):  # a critical floor above what the class can reach alone
        return infeasible_allocation(k, problem)
    t_scale = inst.t_scale if inst.t_scale > 0 else 1.0  # some class unservable: t* = 0

    m, n_vars, u, tau, _ = _stage_model(grid, inst, gpus, 0.0, None)
    m.objective = mip.maximize(tau)
    if not _optimize(m, "2 (max min-fulfillment)", time_limit):
        return infeasible_allocation(k, problem)
    tau_star = max(float(tau.x), _served(n_vars, cap, lam)[0] / t_scale) if inst.t_scale > 0 else 0.0
    m, n_vars, u, tau, _ = _stage_model(grid, inst, gpus, within(tau_star, tol), None)
    m.objective = mip.maximize(_goodput_expr(inst, u))
    if not _optimize(m, "3 (max goodput)", time_limit):
        raise RuntimeError("allocate_milp: stage 3 infeasible after stage 2 (numerical trouble)")
    if n_vars:
        g_star = max(float(m.objective_value), _served(n_vars, cap, lam)[1] / inst.g_scale)
        m, n_vars, u, tau, gpu_expr = _stage_model(grid, inst, gpus, within(tau_star, tol), within(g_star, tol))
        m.objective = mip.minimize(gpu_expr)
        if not _optimize(m, "4 (min GPUs)", time_limit):
            raise RuntimeError("allocate_milp: stage 4 infeasible after stage 3 (numerical trouble)")

    w = np.zeros(k, np.int64)
    for (i, q), nv in n_vars.items():
        w[i] += int(round(nv.x)) * int(grid.tp[q])
    cell, reps = canonical_cells(grid, values, adm, lam, w, tol)
    return allocation_from_choice(grid, values, problem, cell, reps, feasible=True)
