"""Exact lexicographic allocation over several GPU pools (python-mip + CBC).

The problem of :mod:`fleetsieve_bayes.allocation.milp` with the budget split
into pools (docs/contracts.md, "The allocation problem"): each class picks at
most one admissible cell, on that cell's pool; ``Σ GPUs on pool p ≤ G_p``,
``Σ GPUs ≤ G``, and ``Σ_p price_p·GPUs_p ≤ cap·(1 + tol)`` under a dollar cap.

Formulation (GPU levels, a multiple-choice knapsack): for class i on pool p
with w GPUs the best served rate is ``v_ipw = min(λ_i, max_q floor(w/TP_q)·c_q)``
over the class's admissible cells q on p (the same table the JAX allocator
builds). Only the levels where ``v`` strictly increases in w are kept (more
GPUs for the same service is worse in every stage). One binary ``z_o`` per
kept option ``o = (p, w)``, ``Σ_o z_o ≤ 1`` per class, and
``u_i = Σ_o (v_o/s_i)·z_o`` with ``s_i`` the class's best option (so every
coefficient is O(1) whatever the demand's scale, as in the single-pool
model). Its LP relaxation is the convex hull of each class's choices, far
tighter than the cell-and-replica-count model with big-M links. Stages, each
a fresh model fixing the previous optimum up to the relative tolerance:

1. critical floors ``r_i ≥ δ_i·(1 − tol)`` (model infeasible → ``"infeasible"``);
2. the largest threshold t* among the options' fulfillments (and 0) such
   that every class can reach ``r_i ≥ max(t, δ_i)·(1 − tol)`` at once — by
   bisection (feasibility falls with t, as in the JAX allocator), each test
   a small assignment MILP: class i takes pool p with the fewest GPUs
   reaching the threshold there, under the pool, total and dollar limits;
3. ``r_i ≥ t*·(1 − tol)``, maximise goodput → g*;
4. goodput ``≥ g*·(1 − tol)``, minimise dollars per hour → c* (float64 from the levels);
5. dollars ``≤ c*·(1 + tol)``, minimise GPUs.

The chosen (pool, w) of each class then goes through the canonical cell
choice shared with the JAX allocator
(:func:`~fleetsieve_bayes.allocation.milp.canonical_cells`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

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
    pool_prices,
    within_cap,
)

__all__ = ["allocate_pools_milp", "cheapest_at_service", "pool_options", "PoolOptions"]


class PoolOptions(NamedTuple):
    """Every class's undominated (pool, GPUs) choices; each list has one entry per option."""

    klass: np.ndarray  # int64 (n_options,)
    pool: np.ndarray  # int64 (n_options,)
    gpus: np.ndarray  # int64 (n_options,), w
    served: np.ndarray  # float64 (n_options,), v = min(λ_i, best capacity at w GPUs), > 0


def pool_options(
    grid: CellGrid, values: np.ndarray, adm: np.ndarray, demand: np.ndarray, budgets: np.ndarray
) -> PoolOptions:
    """The GPU-level options of every class on every pool (module docstring).

    Args:
        values: ``(n_cells, 4)``; adm: bool ``(n_cells,)``; demand: ``(n_classes,)``;
        budgets: ``(n_pools,)`` GPUs each pool can give.
    """

    cap = values[:, 0]
    pool = grid.gpu_idx
    out: list[tuple[int, int, int, float]] = []
    for i, front in enumerate(pareto_cells(grid, values, adm, budgets)):
        for p in range(grid.n_pools):
            cells = [q for q in front if pool[q] == p]
            if not cells:
                continue
            best = 0.0
            for w in range(1, int(budgets[p]) + 1):
                v = min(float(demand[i]), max((w // int(grid.tp[q])) * float(cap[q]) for q in cells))
                if v > best:
                    out.append((i, p, w, v))
                    best = v
                if best >= demand[i]:
                    break
    if not out:
        return PoolOptions(*(np.zeros(0, np.int64) for _ in range(3)), np.zeros(0))
    a = np.array(out, dtype=object)
    return PoolOptions(
        a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2].astype(np.int64), a[:, 3].astype(np.float64)
    )


def _no_clique_strengthening(m: mip.Model) -> None:
    """Switch off CBC's clique strengthening (``clqstr``).

    On these multiple-choice rows (one ``Σ z ≤ 1`` per class) it was seen to
    declare feasible models infeasible and to return a costlier fleet as the
    stage-4 optimum (cases in tests/test_allocation_pools.py, ``CBC_CASES``).
    """
    from mip.cbc import cbc_set_parameter

    cbc_set_parameter(m.solver, "clqstr", "off")


def _optimize(m: mip.Model, stage: str, time_limit: float | None) -> bool:
    kwargs = {} if time_limit is None else {"max_seconds": float(time_limit)}
    status = m.optimize(**kwargs)
    if status == mip.OptimizationStatus.OPTIMAL:
        return True
    if status in (mip.OptimizationStatus.INFEASIBLE, mip.OptimizationStatus.INT_INFEASIBLE):
        return False
    raise RuntimeError(f"allocate_milp: CBC stopped at stage {stage} with status {status.name}")


def _max_min_threshold(
    opt: PoolOptions,
    lam: np.ndarray,
    lo: np.ndarray,
    budgets: np.ndarray,
    total: int | None,
    price: np.ndarray,
    cap: float,
    tol: float,
    time_limit: float | None,
) -> float | None:
    """Stages 1–2: the largest feasible threshold t* (module docstring), ``None`` if the floors cannot be met.

    Args:
        lam, lo: ``(n_classes,)`` demands and critical floors (0 where none);
        budgets, price: ``(n_pools,)`` GPUs and dollars per GPU-hour of each pool.
    """
    k, n_p = lam.shape[0], budgets.shape[0]
    r_o = opt.served / lam[opt.klass]
    cache: dict[float, bool] = {}

    def feasible(t: float) -> bool:
        if t in cache:
            return cache[t]
        need = np.zeros((k, n_p), np.int64)  # fewest GPUs on each pool; -1: none reaches it
        must = np.zeros(k, bool)
        for i in range(k):
            s = within(max(t, lo[i]), tol)
            must[i] = s > 0
            for p in range(n_p):
                ok = (opt.klass == i) & (opt.pool == p) & (r_o >= s)
                need[i, p] = int(opt.gpus[ok].min()) if ok.any() else -1
        rows = np.flatnonzero(must)
        if np.any(np.all(need[rows] < 0, axis=1)):
            cache[t] = False
            return False
        m = mip.Model(sense=mip.MINIMIZE, solver_name="CBC")
        m.verbose = 0
        m.threads = 1
        m.preprocess = 0
        _no_clique_strengthening(m)
        x = {(i, p): m.add_var(var_type=mip.BINARY) for i in rows for p in range(n_p) if need[i, p] >= 0}
        for i in rows:
            m += mip.xsum(v for (j, _), v in x.items() if j == i) == 1
        for p in range(n_p):
            on_p = [(int(need[i, q]), v) for (i, q), v in x.items() if q == p]
            if on_p:
                m += mip.xsum(n * v for n, v in on_p) <= int(budgets[p])
        if total is not None and x:
            m += mip.xsum(int(need[i, p]) * v for (i, p), v in x.items()) <= total
        if np.isfinite(cap) and x:
            m += mip.xsum(float(price[p] * need[i, p] / within_cap(cap, tol)) * v for (i, p), v in x.items()) <= 1.0
        m.objective = mip.minimize(mip.xsum(int(need[i, p]) * v for (i, p), v in x.items()))
        ok = (not x) or _optimize(m, "2 (max min-fulfillment)", time_limit)
        cache[t] = bool(ok)
        return cache[t]

    if not feasible(0.0):
        return None
    cand = np.unique(np.concatenate([[0.0], r_o]))
    a, b = 0, cand.shape[0]  # feasible(cand[a]); cand[b:] infeasible
    while b - a > 1:
        mid = (a + b) // 2
        if feasible(float(cand[mid])):
            a = mid
        else:
            b = mid
    return float(cand[a])


def _stages_3_to_5(
    model: Any, chosen: Any, fulfillment: Any, cost_o: np.ndarray, n_o: int, tau_star: float,
    scales: tuple[float, float], tol: float, time_limit: float | None,
) -> np.ndarray:
    """Stages 3–5 at the max-min level ``tau_star``: max goodput, then min dollars per hour,
    then min GPUs; the options picked, bool ``(n_options,)``."""
    g_scale, cost_scale = scales
    if not n_o:
        return np.zeros(0, bool)
    m, z, tau, _, _, good = model(within(tau_star, tol), None, None)
    m.objective = mip.maximize(good)
    if not _optimize(m, "3 (max goodput)", time_limit):
        raise RuntimeError("allocate_milp: stage 3 infeasible after stage 2 (numerical trouble)")
    g_star = max(float(m.objective_value), fulfillment(chosen(z))[1] / g_scale)
    m, z, tau, _, cost, _ = model(within(tau_star, tol), within(g_star, tol), None)
    m.objective = mip.minimize(cost)
    if not _optimize(m, "4 (min dollars per hour)", time_limit):
        raise RuntimeError("allocate_milp: stage 4 infeasible after stage 3 (numerical trouble)")
    c_star = float(cost_o[chosen(z)].sum())
    m, z, tau, gpus, _, _ = model(within(tau_star, tol), within(g_star, tol), within_cap(c_star, tol) / cost_scale)
    m.objective = mip.minimize(gpus)
    if not _optimize(m, "5 (min GPUs)", time_limit):
        raise RuntimeError("allocate_milp: stage 5 infeasible after stage 4 (numerical trouble)")
    return chosen(z)


def allocate_pools_milp(
    grid: CellGrid,
    values: np.ndarray,
    problem: AllocationProblem,
    *,
    tol: float = DEFAULT_TOL,
    time_limit: float | None = None,
) -> Allocation:
    """Solve the lexicographic allocation on a grid with several GPU pools.

    Args:
        values: ``(n_cells, 4)`` cell metrics in METRICS order.
        problem: classes ``(n_classes,)``, ``pool_gpus``/``usd_per_gpu_hour`` ``(n_pools,)``.
        tol, time_limit: as :func:`~fleetsieve_bayes.allocation.milp.allocate_milp`.
    """
    values = np.asarray(values, np.float64)
    k, n_p = grid.n_classes, grid.n_pools
    lam = np.asarray(problem.demand, np.float64)
    adm = admissible(grid, values, problem)
    budgets = pool_budgets(grid, problem, tol)
    price = pool_prices(problem, n_p)
    opt = pool_options(grid, values, adm, lam, budgets)
    n_o = opt.klass.shape[0]

    s = np.zeros(k)
    np.maximum.at(s, opt.klass, opt.served)
    rho = s / lam
    lo = np.where(problem.critical, problem.floor, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        u_floor = np.where(lo > 0, within(lo, tol) / rho, 0.0)
    if np.any(u_floor > 1.0):  # a critical floor above what the class can reach alone
        return infeasible_allocation(k, problem)
    t_scale = float(rho.min()) if k else 0.0
    g_scale = float(s.sum()) if s.sum() > 0 else 1.0
    coef = opt.served / np.where(s[opt.klass] > 0, s[opt.klass], 1.0)  # u added by each option
    cost_o = price[opt.pool] * opt.gpus  # dollars per hour of each option
    cost_scale = float(max(np.dot(price, budgets), 1e-12))
    cap = float(problem.usd_per_hour_max)
    total = int(problem.gpus) if int(problem.gpus) < int(budgets.sum()) else None

    def model(
        tau_min: float, good_min: float | None, cost_max: float | None
    ) -> tuple[mip.Model, list[mip.Var], mip.Var, mip.LinExpr, mip.LinExpr, mip.LinExpr]:
        m = mip.Model(sense=mip.MAXIMIZE, solver_name="CBC")
        m.verbose = 0
        m.threads = 1  # deterministic
        m.max_mip_gap = 0.0
        m.max_mip_gap_abs = 1e-10
        m.integer_tol = 1e-9
        m.preprocess = 0  # as in the single-pool model (milp.py)
        _no_clique_strengthening(m)
        z = [m.add_var(var_type=mip.BINARY) for _ in range(n_o)]
        tau = m.add_var(lb=max(tau_min, 0.0), ub=1.0)
        mine = [np.flatnonzero(opt.klass == i) for i in range(k)]
        for i in range(k):
            u_i = mip.xsum(float(coef[o]) * z[o] for o in mine[i])
            if mine[i].size:
                m += mip.xsum(z[o] for o in mine[i]) <= 1
            if u_floor[i] > 0:
                m += u_i >= float(u_floor[i])
            if s[i] > 0:  # r_i ≥ t  ⇔  u_i ≥ τ·T/ρ_i
                m += u_i >= float(t_scale / rho[i]) * tau
        for p in range(n_p):
            on_p = np.flatnonzero(opt.pool == p)
            if on_p.size:
                m += mip.xsum(int(opt.gpus[o]) * z[o] for o in on_p) <= int(budgets[p])
        gpu_expr = mip.xsum(int(opt.gpus[o]) * z[o] for o in range(n_o))
        if total is not None and n_o:
            m += gpu_expr <= total
        if np.isfinite(cap) and n_o:
            m += mip.xsum(float(cost_o[o] / within_cap(cap, tol)) * z[o] for o in range(n_o)) <= 1.0
        cost_expr = mip.xsum(float(cost_o[o] / cost_scale) * z[o] for o in range(n_o))
        good_expr = mip.xsum(float(opt.served[o] / g_scale) * z[o] for o in range(n_o))
        if good_min is not None:
            m += good_expr >= good_min
        if cost_max is not None:
            m += cost_expr <= cost_max
        return m, z, tau, gpu_expr, cost_expr, good_expr

    def chosen(z: list[mip.Var]) -> np.ndarray:
        return np.array([round(v.x) > 0 for v in z], bool) if n_o else np.zeros(0, bool)

    def fulfillment(pick: np.ndarray) -> tuple[float, float]:
        served = np.zeros(k)
        np.add.at(served, opt.klass[pick], opt.served[pick])
        return float(np.min(served / lam)), float(served.sum())

    t_star = _max_min_threshold(opt, lam, lo, budgets, total, price, cap, tol, time_limit)
    if t_star is None:
        return infeasible_allocation(k, problem)
    tau_star = t_star / t_scale if t_scale > 0 else 0.0
    pick = _stages_3_to_5(model, chosen, fulfillment, cost_o, n_o, tau_star, (g_scale, cost_scale), tol, time_limit)

    w = np.zeros(k, np.int64)
    on = np.zeros(k, np.int64)
    w[opt.klass[pick]] = opt.gpus[pick]
    on[opt.klass[pick]] = opt.pool[pick]
    cell, reps = canonical_cells(grid, values, adm, lam, w, tol, on)
    return allocation_from_choice(grid, values, problem, cell, reps, feasible=True)


def cheapest_at_service(
    grid: CellGrid,
    values: np.ndarray,
    problem: AllocationProblem,
    min_fulfillment: float,
    goodput: float,
    *,
    tol: float = DEFAULT_TOL,
    time_limit: float | None = None,
) -> tuple[float, np.ndarray] | None:
    """The least dollars per hour of any allocation on ``values`` that serves every class at
    least ``min_fulfillment`` of its demand (and its critical floor) and ``goodput`` req/s in
    all, under the pool, total and dollar limits: ``(usd_per_hour, pick)`` with ``pick``
    bool ``(n_cells,)`` the cells one such allocation commits to; None when none does.

    On the optimistic table at the conservative allocation's service this is a lower
    bound on the dollars of every fleet serving as much on the truth (the certificate's
    dollar stage, :func:`fleetsieve_bayes.decision.certificate.dollar_gap`).

    Args:
        values: ``(n_cells, 4)`` cell metrics in METRICS order.
    """
    values = np.asarray(values, np.float64)
    k = grid.n_classes
    lam = np.asarray(problem.demand, np.float64)
    adm = admissible(grid, values, problem)
    budgets = pool_budgets(grid, problem, tol)
    price = pool_prices(problem, grid.n_pools)
    opt = pool_options(grid, values, adm, lam, budgets)
    n_o = opt.klass.shape[0]
    lo = np.maximum(np.where(problem.critical, problem.floor, 0.0), float(min_fulfillment))
    m = mip.Model(sense=mip.MINIMIZE, solver_name="CBC")
    m.verbose = 0
    m.threads = 1
    m.max_mip_gap = 0.0
    m.max_mip_gap_abs = 1e-10
    m.preprocess = 0
    _no_clique_strengthening(m)
    z = [m.add_var(var_type=mip.BINARY) for _ in range(n_o)]
    for i in range(k):
        mine = np.flatnonzero(opt.klass == i)
        if mine.size:
            m += mip.xsum(z[o] for o in mine) <= 1
        need = float(within(lo[i], tol))
        if need > 0:
            if not mine.size:
                return None
            m += mip.xsum(float(opt.served[o] / lam[i]) * z[o] for o in mine) >= need
    for p in range(grid.n_pools):
        on_p = np.flatnonzero(opt.pool == p)
        if on_p.size:
            m += mip.xsum(int(opt.gpus[o]) * z[o] for o in on_p) <= int(budgets[p])
    if int(problem.gpus) < int(budgets.sum()) and n_o:
        m += mip.xsum(int(opt.gpus[o]) * z[o] for o in range(n_o)) <= int(problem.gpus)
    cost_o = price[opt.pool] * opt.gpus
    cap = float(problem.usd_per_hour_max)
    if np.isfinite(cap) and n_o:
        m += mip.xsum(float(cost_o[o] / within_cap(cap, tol)) * z[o] for o in range(n_o)) <= 1.0
    g_scale = float(max(lam.sum(), 1e-12))
    if goodput > 0:
        if not n_o:
            return None
        m += mip.xsum(float(opt.served[o] / g_scale) * z[o] for o in range(n_o)) >= float(within(goodput, tol)) / g_scale
    if not n_o:  # nothing to place and nothing asked
        return 0.0, np.zeros(grid.n_cells, bool)
    cost_scale = float(max(np.dot(price, budgets), 1e-12))
    m.objective = mip.minimize(mip.xsum(float(cost_o[o] / cost_scale) * z[o] for o in range(n_o)))
    if not _optimize(m, "cheapest at service", time_limit):
        return None
    chosen = np.array([round(v.x) > 0 for v in z], bool) if n_o else np.zeros(0, bool)
    w = np.zeros(k, np.int64)
    on = np.zeros(k, np.int64)
    w[opt.klass[chosen]] = opt.gpus[chosen]
    on[opt.klass[chosen]] = opt.pool[chosen]
    cell, reps = canonical_cells(grid, values, adm, lam, w, tol, on)
    pick = np.zeros(grid.n_cells, bool)
    pick[[int(c) for c, n in zip(cell, reps, strict=True) if c >= 0 and n > 0]] = True
    return float(cost_o[chosen].sum()), pick
