"""Exact lexicographic fleet allocation in JAX, batched over tables.

The same problem as :mod:`fleetsieve_bayes.allocation.milp` (docs/contracts.md,
"The allocation problem"), solved by a fixed-shape combinatorial algorithm
so that the acquisition kernel and the certificate can call it inside their own
``jit``/``vmap`` on thousands of tables at once.

Algorithm (all shapes fixed by the grid, the number of classes K and the GPU
budget G; W = G + 1 budget levels ``w = 0..G``):

* For class i given w GPUs, its best served rate is
  ``cap_i[w] = max_q floor(w / tp_q) · c_q`` over its admissible cells q, and
  its fulfillment ``r_i[w] = min(1, cap_i[w] / λ_i)``; both are nondecreasing
  in w. Only the best capacity per (class, TP) matters, so cells are first
  reduced by a segment max over (class, TP level) groups.
* Stages 1–2: the optimal min-fulfillment t* is one of the values
  ``r_i[w]``. For a threshold s the fewest GPUs class i needs is
  ``need_i(s) = min{w : r_i[w] ≥ s·(1 − tol)}`` (a searchsorted on the monotone
  ``r_i``). t is feasible iff ``Σ_i need_i(max(t, L_i)) ≤ G`` with
  ``L_i = δ_i`` for critical classes and 0 otherwise; the critical floors
  are feasible iff t = 0 is. t* is the largest feasible candidate.
* Stage 3: a (max, +) knapsack over classes, value ``min(λ_i, cap_i[w])``
  allowed only where ``r_i[w] ≥ max(t*, L_i)·(1 − tol)``; ``F[b]`` is the best
  goodput with at most b GPUs, O(K·W²).
* Stage 4: the smallest budget b with ``F[b] ≥ F[G]·(1 − tol)``; the
  backtrack (``lax.scan``) recovers each class's GPUs ``w_i`` (smallest w
  among exact ties).
* Cell choice (shared with the MILP): for class i with ``w_i`` GPUs, the
  lowest-index admissible cell whose served rate
  ``min(λ_i, floor(w_i/tp_q)·c_q)`` is within ``tol`` (relative) of the
  best; its replicas are ``floor(w_i / tp_q)``.

GPU pools (a grid with several): the budget axis becomes one axis per pool,
``∏_p (G_p + 1)`` states ``b`` (GPUs used on each pool, ``G_p`` its count);
a state is allowed when every ``b_p ≤ G_p``, ``Σ b_p ≤ G`` and its dollars
``Σ price_p·b_p ≤ cap·(1 + tol)``. Each class takes one pool and ``w`` GPUs
on it, so ``cap_i``, ``r_i`` and ``need_i`` get a pool axis. Stages 1–2: t is
feasible iff some allowed state is reachable when every class adds its
``need_ip(t)`` on some pool p (a boolean DP over states); feasibility is
monotone in t, so t* is found by bisection over the sorted candidates.
Stage 3: the same (max, +) knapsack, each class's move along one pool axis.
Stage 4: among allowed states with ``F[b] ≥ g*·(1 − tol)`` the least dollars
c*; stage 5: among those costing ``≤ c*·(1 + tol)`` the fewest GPUs (lowest
state index among ties); the backtrack recovers each class's pool and GPUs.
With one pool the single-axis algorithm above runs unchanged (the dollar cap
only lowers G), so single-type results are identical.

Tolerance: ``tol`` (default 1e-6, the MILP's) is relative to each stage's
optimum (:func:`fleetsieve_bayes.allocation.objective.within`), so the result
does not depend on the demand's scale. Computation is
in the values' dtype promoted to at least float32 (float32 by default, i.e. a
relative rounding error ~1e-7 per operation, below ``tol``); results agree with
the float64 MILP unless two genuinely different allocations differ by less
than about ``tol`` in some stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.allocation.objective import DEFAULT_TOL, allocation_from_choice, within
from fleetsieve_bayes.allocation.problem import (
    Allocation,
    AllocationProblem,
    CellGrid,
    check_demand,
    meets_slo,
    pool_prices,
    within_cap,
)
from fleetsieve_bayes.errors import InputError

__all__ = [
    "DEFAULT_TOL",
    "JaxAllocation",
    "JaxAllocator",
    "JaxProblem",
    "jax_problem",
    "solve_jax_problem",
    "make_jax_allocator",
    "allocate_jax",
    "allocation_from_choice",
]

# Largest ∏_p (G_p + 1) × (max_p G_p + 1) (states × one pool axis: the knapsack's
# gather per class) the pool allocator accepts: 2^26 float32 = 256 MB per array (3
# pools of 64 GPUs: 65^4 ≈ 1.8e7). Larger pools are the MILP's (allocation/milp_pools.py).
POOL_STATES_MAX = 1 << 26
# Largest (K·W)² for which the per-class GPU needs are counted by broadcast
# compares rather than a searchsorted loop (trace-time switch).
_COMPARE_MAX = 1 << 14


class JaxAllocation(NamedTuple):
    """Result of the JAX allocator; every field has the leading batch shape ``(...)``.

    Infeasible entries have ``cell == -1``, ``replicas == 0`` and zero
    objectives. A feasible class that gets nothing also has ``cell == -1``.
    """

    feasible: jax.Array  # bool (...)
    min_fulfillment: jax.Array  # float (...), min over all classes of served/demand
    goodput: jax.Array  # float (...), Σ served, req/s
    gpus_used: jax.Array  # int32 (...)
    cell: jax.Array  # int32 (..., n_classes), grid cell index or -1
    replicas: jax.Array  # int32 (..., n_classes)
    usd_per_hour: jax.Array  # float (...), Σ replicas·TP·price of the cells' pools (GPUs when unpriced)


class JaxProblem(NamedTuple):
    """The problem as (possibly padded) arrays; a pytree, so it can be traced.

    Shapes: C cells, K classes, T TP levels, P pools. Padding cells have
    ``cell_valid == False``; padding classes have ``class_valid == False``
    (they count as fulfilled and serve nothing). With one pool ``gpus`` is
    the effective budget (pool count, total and dollar cap together).
    """

    cell_class: jax.Array  # int32 (C,), class of each cell
    cell_tp: jax.Array  # int32 (C,), TP of each cell (>= 1)
    cell_group: jax.Array  # int32 (C,), (class * P + pool) * T + index of its TP in tp_levels
    cell_valid: jax.Array  # bool (C,)
    tp_levels: jax.Array  # int32 (T,), distinct TPs (>= 1; padding repeats one)
    demand: jax.Array  # float (K,), > 0 (1.0 for padding classes)
    floor_req: jax.Array  # float (K,), δ_i where critical else 0
    success_min: jax.Array  # float (K,)
    ttft_max: jax.Array  # float (K,), +inf where unchecked
    completion_max: jax.Array  # float (K,), +inf where unchecked
    class_valid: jax.Array  # bool (K,)
    gpus: jax.Array  # int32 (), budget G (over all pools) <= max_gpus with one pool
    cell_pool: jax.Array  # int32 (C,), pool of each cell
    pool_gpus: jax.Array  # int32 (P,), GPUs each pool can give (<= max_gpus)
    usd_per_gpu_hour: jax.Array  # float (P,), > 0 (ones when unpriced)
    usd_cap: jax.Array  # float (), cap·(1 + tol) in dollars per hour, +inf without a cap


class JaxAllocator(NamedTuple):
    """A compiled-on-first-use allocator for one (grid, problem).

    ``solve(values)`` maps ``values (..., n_cells, 4)`` (METRICS order) to a
    :class:`JaxAllocation` with batch shape ``(...)``. It is ``jax.jit``-ed and
    pure, so it can also be called inside another ``jit``/``vmap``.
    """

    solve: Callable[[jax.Array], JaxAllocation]
    spec: JaxProblem
    max_gpus: int | tuple[int, ...]  # the budget axis; with several pools, each pool's (P,)
    tol: float


def jax_problem(
    grid: CellGrid,
    problem: AllocationProblem,
    *,
    n_cells: int | None = None,
    n_classes: int | None = None,
    tp_levels: tuple[int, ...] | None = None,
    tol: float = DEFAULT_TOL,
) -> JaxProblem:
    """Arrays of ``(grid, problem)``, optionally padded to ``n_cells``/``n_classes``.

    Padding lets instances of different sizes share one compiled function
    (the shapes, not the values, decide compilation). ``tp_levels`` must
    contain every TP of the grid (default: the grid's distinct TPs). ``tol``
    is the dollar cap's tolerance (:func:`~fleetsieve_bayes.allocation.problem.within_cap`).
    """
    from fleetsieve_bayes.allocation.cells import pool_budgets

    c, k = grid.n_cells, grid.n_classes
    n_p = grid.n_pools
    budgets = pool_budgets(grid, problem, tol)
    n_cells = c if n_cells is None else n_cells
    n_classes = k if n_classes is None else n_classes
    if n_cells < c or n_classes < k:
        raise ValueError("padding sizes must be at least the problem's sizes")
    levels = tuple(sorted({int(t) for t in grid.tp})) if tp_levels is None else tuple(tp_levels)
    level_of = {t: j for j, t in enumerate(levels)}
    n_t = len(levels)
    cell_class = np.zeros(n_cells, np.int32)
    cell_class[:c] = grid.workload_idx
    cell_tp = np.full(n_cells, levels[0], np.int32)
    cell_tp[:c] = grid.tp
    cell_pool = np.zeros(n_cells, np.int32)
    cell_pool[:c] = grid.gpu_idx
    cell_group = np.zeros(n_cells, np.int32)
    cell_group[:c] = [
        (int(w) * n_p + int(g)) * n_t + level_of[int(t)]
        for w, g, t in zip(grid.workload_idx, grid.gpu_idx, grid.tp, strict=True)
    ]
    cell_valid = np.arange(n_cells) < c
    cap = float(problem.usd_per_hour_max)
    gpus = int(budgets[0]) if n_p == 1 else int(problem.gpus)

    def pad(a: np.ndarray, fill: float) -> np.ndarray:
        out = np.full(n_classes, fill, np.float64)
        out[:k] = a
        return out

    floor_req = np.where(problem.critical, problem.floor, 0.0)
    # Float arrays take JAX's default float dtype (float64 only under x64).
    return JaxProblem(
        cell_class=jnp.asarray(cell_class),
        cell_tp=jnp.asarray(cell_tp),
        cell_group=jnp.asarray(cell_group),
        cell_valid=jnp.asarray(cell_valid),
        tp_levels=jnp.asarray(np.array(levels, np.int32)),
        demand=jnp.asarray(pad(problem.demand, 1.0)),
        floor_req=jnp.asarray(pad(floor_req, 0.0)),
        success_min=jnp.asarray(pad(problem.success_min, 0.0)),
        ttft_max=jnp.asarray(pad(problem.ttft_max, np.inf)),
        completion_max=jnp.asarray(pad(problem.completion_max, np.inf)),
        class_valid=jnp.asarray(np.arange(n_classes) < k),
        gpus=jnp.asarray(gpus, jnp.int32),
        cell_pool=jnp.asarray(cell_pool),
        pool_gpus=jnp.asarray(budgets.astype(np.int32)),
        usd_per_gpu_hour=jnp.asarray(pool_prices(problem, n_p)),
        usd_cap=jnp.asarray(within_cap(cap, tol) if np.isfinite(cap) else np.inf),
    )


def _solve_one(spec: JaxProblem, values: jax.Array, max_gpus: int | tuple[int, ...], tol: float) -> JaxAllocation:
    """One table: ``values (C, 4)`` → scalar/``(K,)`` :class:`JaxAllocation`."""
    n_p = spec.pool_gpus.shape[0]
    if n_p > 1:
        axes = tuple(int(g) + 1 for g in max_gpus) if isinstance(max_gpus, tuple) else (int(max_gpus) + 1,) * n_p
        return _solve_pools(spec, values, axes, tol)
    assert isinstance(max_gpus, int), "one pool: max_gpus is the budget axis"
    dt = jnp.result_type(values.dtype, jnp.float32)
    values = values.astype(dt)
    thr = values[:, 0]
    n_c = values.shape[0]
    n_k = spec.demand.shape[0]
    n_t = spec.tp_levels.shape[0]
    kq = spec.cell_class
    adm = spec.cell_valid & meets_slo(
        values, spec.success_min.astype(dt)[kq], spec.ttft_max.astype(dt)[kq], spec.completion_max.astype(dt)[kq]
    )
    lam = spec.demand.astype(dt)
    valid_k = spec.class_valid

    # Best capacity per (class, TP level): the only cells that can matter.
    best_c = jax.ops.segment_max(jnp.where(adm, thr, 0.0), spec.cell_group, num_segments=n_k * n_t)
    best_c = jnp.maximum(best_c, 0.0).reshape(n_k, n_t)  # empty segments are -inf
    w = jnp.arange(max_gpus + 1, dtype=jnp.int32)
    reps = (w[None, :] // spec.tp_levels[:, None]).astype(dt)  # (T, W)
    cap = jnp.max(reps[None, :, :] * best_c[:, :, None], axis=1)  # (K, W)
    served = jnp.where(valid_k[:, None], jnp.minimum(lam[:, None], cap), 0.0)  # (K, W)
    r = jnp.where(valid_k[:, None], served / lam[:, None], 1.0)  # (K, W), nondecreasing in w

    # Stages 1–2: largest feasible candidate threshold.
    lo = jnp.where(valid_k, spec.floor_req.astype(dt), 0.0)  # (K,)
    big = jnp.int32(max_gpus + 1)
    # Candidates × classes × levels compares vs a searchsorted loop: pick by size.
    small = (n_k * (max_gpus + 1)) ** 2 <= _COMPARE_MAX

    def total_need(t: jax.Array) -> jax.Array:
        s = within(jnp.maximum(t, lo), tol)  # (K,)
        if small:  # count below-threshold levels: no loop, cheaper to compile
            need = jnp.sum(r < s[:, None], axis=1)
        else:
            need = jax.vmap(lambda rk, sk: jnp.searchsorted(rk, sk, side="left"))(r, s)
        return jnp.sum(jnp.minimum(need.astype(jnp.int32), big))

    cand = jnp.concatenate([jnp.zeros((1,), dt), r.reshape(-1)])
    cand_ok = jax.vmap(total_need)(cand) <= spec.gpus
    feasible = jnp.any(cand_ok)
    t_star = jnp.max(jnp.where(cand_ok, cand, -jnp.inf))

    # Stage 3: (max, +) knapsack; F[b] = best goodput with at most b GPUs.
    allowed = r >= within(jnp.maximum(t_star, lo), tol)[:, None]
    val = jnp.where(allowed, served, -jnp.inf)  # (K, W)
    diff = w[:, None] - w[None, :]  # (W, W): b - w
    fits = diff >= 0
    diff = jnp.maximum(diff, 0)

    def dp_step(f_prev: jax.Array, v_k: jax.Array) -> tuple[jax.Array, jax.Array]:
        m = jnp.where(fits, f_prev[diff] + v_k[None, :], -jnp.inf)  # (W budgets, W choices)
        return jnp.max(m, axis=1), jnp.argmax(m, axis=1).astype(jnp.int32)

    # Few classes and a small budget: unrolled scans run (and mostly compile) faster.
    unroll = n_k <= 16 and max_gpus <= 128
    f_final, choice = jax.lax.scan(
        dp_step, jnp.zeros(max_gpus + 1, dt), val, unroll=unroll
    )  # (W,), (K, W)
    g_star = f_final[jnp.clip(spec.gpus, 0, max_gpus)]
    # Stage 4: fewest GPUs that keep goodput within tolerance of the optimum.
    good = (f_final >= within(g_star, tol)) & (w <= spec.gpus)
    b_star = jnp.argmax(good).astype(jnp.int32)

    def back(b: jax.Array, choice_k: jax.Array) -> tuple[jax.Array, jax.Array]:
        wk = choice_k[b]
        return b - wk, wk

    _, w_k = jax.lax.scan(back, b_star, choice, reverse=True, unroll=unroll)  # (K,)

    cell, n_rep = _choose_cells(adm, thr, spec, lam, w_k, tol, n_c, n_k)
    thr_cell = jnp.where(cell >= 0, thr[jnp.maximum(cell, 0)], 0.0)
    tp_cell = jnp.where(cell >= 0, spec.cell_tp[jnp.maximum(cell, 0)], 0)
    served_k = jnp.where(valid_k, jnp.minimum(lam, n_rep.astype(dt) * thr_cell), 0.0)
    min_f = jnp.min(jnp.where(valid_k, served_k / lam, jnp.inf))
    zero = jnp.zeros((), dt)
    gpus_used = jnp.where(feasible, jnp.sum(n_rep * tp_cell), 0).astype(jnp.int32)
    return JaxAllocation(
        feasible=feasible,
        min_fulfillment=jnp.where(feasible, min_f, zero),
        goodput=jnp.where(feasible, jnp.sum(served_k), zero),
        gpus_used=gpus_used,
        cell=jnp.where(feasible, cell, -1),
        replicas=jnp.where(feasible, n_rep, 0),
        usd_per_hour=gpus_used.astype(dt) * spec.usd_per_gpu_hour.astype(dt)[0],
    )


def _pool_service(
    spec: JaxProblem, adm: jax.Array, thr: jax.Array, lam: jax.Array, n_w: int,
    sizes: tuple[int, int, int], dt: Any,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GPU counts ``w (W,)``, and each class's served rate and fulfillment on each pool with
    ``w`` of its GPUs, ``(K, P, W)`` each: best capacity per (class, pool, TP level) first."""
    n_k, n_p, n_t = sizes
    valid_k = spec.class_valid
    best_c = jax.ops.segment_max(jnp.where(adm, thr, 0.0), spec.cell_group, num_segments=n_k * n_p * n_t)
    best_c = jnp.maximum(best_c, 0.0).reshape(n_k, n_p, n_t)
    w = jnp.arange(n_w, dtype=jnp.int32)
    reps = (w[None, :] // spec.tp_levels[:, None]).astype(dt)  # (T, W)
    cap = jnp.max(reps[None, None, :, :] * best_c[:, :, :, None], axis=2)  # (K, P, W)
    served = jnp.where(valid_k[:, None, None], jnp.minimum(lam[:, None, None], cap), 0.0)
    r = jnp.where(valid_k[:, None, None], served / lam[:, None, None], 1.0)  # nondecreasing in w
    return w, served, r


def _pool_states(spec: JaxProblem, axes: tuple[int, ...], dt: Any) -> tuple[Any, ...]:
    """The states of the several-pool DP (GPUs used per pool, flattened row-major over
    ``axes``, pool ``p`` taking 0 … ``axes[p] - 1`` GPUs): strides ``(P,)``, coordinates
    ``(P, S)``, flat index ``(S,)``, prices ``(P,)``, dollars per hour ``(S,)``, GPUs
    ``(S,)`` and which states fit every count and cap ``(S,)``."""
    n_p = len(axes)
    n_s = int(np.prod(axes))
    strides = np.array([int(np.prod(axes[p + 1:])) for p in range(n_p)], np.int32)
    coords = jnp.asarray(np.stack(np.unravel_index(np.arange(n_s), axes)).astype(np.int32))  # (P, S)
    flat = jnp.arange(n_s, dtype=jnp.int32)
    price = spec.usd_per_gpu_hour.astype(dt)
    cost_s = jnp.sum(price[:, None] * coords.astype(dt), axis=0)  # (S,)
    tot_s = jnp.sum(coords, axis=0)
    valid_s = (
        jnp.all(coords <= spec.pool_gpus[:, None], axis=0)
        & (tot_s <= spec.gpus)
        & (cost_s <= spec.usd_cap.astype(dt))
    )
    return strides, coords, flat, price, cost_s, tot_s, valid_s


def _pools_result(
    spec: JaxProblem, adm: jax.Array, thr: jax.Array, lam: jax.Array, w_k: jax.Array, p_k: jax.Array,
    price: jax.Array, feasible: jax.Array, tol: float, n_c: int, n_k: int, dt: Any,
) -> JaxAllocation:
    """The allocation of the DP's GPUs per class ``w_k (K,)`` on pools ``p_k (K,)``."""
    valid_k = spec.class_valid
    cell, n_rep = _choose_cells(adm, thr, spec, lam, w_k, tol, n_c, n_k, p_k)
    c0 = jnp.maximum(cell, 0)
    thr_cell = jnp.where(cell >= 0, thr[c0], 0.0)
    tp_cell = jnp.where(cell >= 0, spec.cell_tp[c0], 0)
    served_k = jnp.where(valid_k, jnp.minimum(lam, n_rep.astype(dt) * thr_cell), 0.0)
    min_f = jnp.min(jnp.where(valid_k, served_k / lam, jnp.inf))
    gpus_k = n_rep * tp_cell
    usd = jnp.sum(jnp.where(cell >= 0, gpus_k.astype(dt) * price[spec.cell_pool[c0]], 0.0))
    zero = jnp.zeros((), dt)
    return JaxAllocation(
        feasible=feasible,
        min_fulfillment=jnp.where(feasible, min_f, zero),
        goodput=jnp.where(feasible, jnp.sum(served_k), zero),
        gpus_used=jnp.where(feasible, jnp.sum(gpus_k), 0).astype(jnp.int32),
        cell=jnp.where(feasible, cell, -1),
        replicas=jnp.where(feasible, n_rep, 0),
        usd_per_hour=jnp.where(feasible, usd, zero),
    )


def _solve_pools(spec: JaxProblem, values: jax.Array, axes: tuple[int, ...], tol: float) -> JaxAllocation:
    """One table on several GPU pools (module docstring): ``values (C, 4)`` → :class:`JaxAllocation`.

    ``axes`` (static, ``(P,)``): pool ``p`` uses 0 … ``axes[p] - 1`` GPUs, so the
    states are ``∏ axes``; pools of different sizes keep only their own counts
    (3 pools of 15, 14 and 32 GPUs: 7,920 states, not 33^3 = 35,937).
    """
    dt = jnp.result_type(values.dtype, jnp.float32)
    values = values.astype(dt)
    thr = values[:, 0]
    n_c = values.shape[0]
    n_k = spec.demand.shape[0]
    n_t = spec.tp_levels.shape[0]
    n_p = spec.pool_gpus.shape[0]
    kq = spec.cell_class
    adm = spec.cell_valid & meets_slo(
        values, spec.success_min.astype(dt)[kq], spec.ttft_max.astype(dt)[kq], spec.completion_max.astype(dt)[kq]
    )
    lam = spec.demand.astype(dt)
    valid_k = spec.class_valid

    n_w = max(axes)
    w, served, r = _pool_service(spec, adm, thr, lam, n_w, (n_k, n_p, n_t), dt)

    # The states: GPUs used per pool, flattened row-major.
    n_s = int(np.prod(axes))
    strides, coords, flat, price, cost_s, tot_s, valid_s = _pool_states(spec, axes, dt)

    lo = jnp.where(valid_k, spec.floor_req.astype(dt), 0.0)  # (K,)

    def feasible_at(t: jax.Array) -> jax.Array:
        s = within(jnp.maximum(t, lo), tol)  # (K,)
        need = jnp.sum(r < s[:, None, None], axis=2).astype(jnp.int32)  # (K, P); W = impossible

        def add(reach: jax.Array, need_k: jax.Array) -> tuple[jax.Array, None]:
            new = jnp.zeros_like(reach)
            for p in range(n_p):
                n = need_k[p]
                ok = (coords[p] >= n) & (n < axes[p])
                new = new | (ok & reach[jnp.maximum(flat - n * strides[p], 0)])
            return new, None

        reach, _ = jax.lax.scan(add, flat == 0, need)
        return jnp.any(reach & valid_s)

    # Stages 1–2: bisection for the largest feasible candidate (feasibility falls with t).
    cand = jnp.sort(jnp.concatenate([jnp.zeros((1,), dt), r.reshape(-1)]))
    n_cand = int(cand.shape[0])
    feasible = feasible_at(jnp.zeros((), dt))

    def bisect(_: int, lohi: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        a, b = lohi
        mid = (a + b) // 2
        ok = feasible_at(cand[mid])
        return jnp.where(ok, mid, a), jnp.where(ok, b, mid)

    n_iter = max(1, int(np.ceil(np.log2(n_cand))) + 1)
    a, _ = jax.lax.fori_loop(0, n_iter, bisect, (jnp.int32(0), jnp.int32(n_cand)))
    t_star = cand[a]

    # Stage 3: (max, +) knapsack over the states; each class moves along one pool axis.
    allowed = r >= within(jnp.maximum(t_star, lo), tol)[:, None, None]
    val = jnp.where(allowed, served, -jnp.inf)  # (K, P, W)
    # Per pool: the GPUs a class takes (``diff``, W_p × W_p) from each budget on its axis.
    diffs = [np.maximum(np.arange(a)[:, None] - np.arange(a)[None, :], 0) for a in axes]
    fits = [np.arange(a)[:, None] >= np.arange(a)[None, :] for a in axes]

    def dp_step(f_prev: jax.Array, v_k: jax.Array) -> tuple[jax.Array, jax.Array]:
        f = f_prev.reshape(axes)
        best = jnp.full((n_s,), -jnp.inf, dt)
        arg = jnp.zeros((n_s,), jnp.int32)
        for p in range(n_p):
            x = jnp.moveaxis(f, p, -1)  # (..., W_p budgets)
            v = v_k[p][: axes[p]]
            m = jnp.where(fits[p], x[..., diffs[p]] + v[None, :], -jnp.inf)  # (..., W_p, W_p choices)
            mp = jnp.moveaxis(jnp.max(m, axis=-1), -1, p).reshape(n_s)
            ap = jnp.moveaxis(jnp.argmax(m, axis=-1).astype(jnp.int32), -1, p).reshape(n_s)
            take = mp > best  # ties keep the lower pool
            best = jnp.where(take, mp, best)
            arg = jnp.where(take, p * n_w + ap, arg)
        return best, arg

    f_final, choice = jax.lax.scan(dp_step, jnp.zeros((n_s,), dt), val)  # (S,), (K, S)
    g_star = jnp.max(jnp.where(valid_s, f_final, -jnp.inf))
    # Stages 4–5: least dollars within tolerance, then fewest GPUs, then the lowest state.
    good = valid_s & (f_final >= within(g_star, tol))
    c_star = jnp.min(jnp.where(good, cost_s, jnp.inf))
    good = good & (cost_s <= within_cap(c_star, tol))
    n_star = jnp.min(jnp.where(good, tot_s, jnp.iinfo(jnp.int32).max))
    b_star = jnp.argmax(good & (tot_s == n_star)).astype(jnp.int32)
    strides_j = jnp.asarray(strides)

    def back(b: jax.Array, choice_k: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        code = choice_k[b]
        p, wk = code // n_w, code % n_w
        return b - wk * strides_j[p], (p, wk)

    _, (p_k, w_k) = jax.lax.scan(back, b_star, choice, reverse=True)  # (K,), (K,)

    return _pools_result(spec, adm, thr, lam, w_k, p_k, price, feasible, tol, n_c, n_k, dt)


def _choose_cells(
    adm: jax.Array,
    thr: jax.Array,
    spec: JaxProblem,
    lam: jax.Array,
    w_k: jax.Array,
    tol: float,
    n_c: int,
    n_k: int,
    pool_k: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Canonical cell per class given its GPUs ``w_k (K,)`` (on pool ``pool_k (K,)``): lowest index within tol of the best.

    Returns ``cell (K,)`` (-1 for none) and ``replicas (K,)``, int32.
    """
    kq = spec.cell_class
    n_q = w_k[kq] // spec.cell_tp  # (C,)
    if pool_k is not None:
        n_q = jnp.where(spec.cell_pool == pool_k[kq], n_q, 0)
    s_q = jnp.where(adm, jnp.minimum(lam[kq], n_q.astype(thr.dtype) * thr), -jnp.inf)
    best = jax.ops.segment_max(s_q, kq, num_segments=n_k)  # (K,)
    ok = adm & (n_q > 0) & (s_q >= within(best[kq], tol))
    idx = jnp.where(ok, jnp.arange(n_c, dtype=jnp.int32), jnp.int32(n_c))
    cell = jax.ops.segment_min(idx, kq, num_segments=n_k)
    cell = jnp.where((cell >= n_c) | ~spec.class_valid, -1, cell).astype(jnp.int32)
    n_rep = jnp.where(cell >= 0, w_k // spec.cell_tp[jnp.maximum(cell, 0)], 0).astype(jnp.int32)
    return cell, n_rep


def solve_jax_problem(
    spec: JaxProblem, values: jax.Array, *, max_gpus: int | tuple[int, ...], tol: float = DEFAULT_TOL
) -> JaxAllocation:
    """Solve every table of ``values (..., C, 4)`` for the (possibly padded) ``spec``.

    Pure and traceable; ``max_gpus`` (static) must be ≥ ``spec.gpus`` with one
    pool. With several: one number bounds every pool's axis, or a tuple ``(P,)``
    bounds each pool's own (each ≥ that pool's ``spec.pool_gpus``). Returns a
    :class:`JaxAllocation` with batch shape ``(...)``.
    """
    batch = values.shape[:-2]
    flat = values.reshape((-1,) + values.shape[-2:])
    out = jax.vmap(lambda v: _solve_one(spec, v, max_gpus, tol))(flat)
    return JaxAllocation(*(x.reshape(batch + x.shape[1:]) for x in out))


_solve_jit = jax.jit(solve_jax_problem, static_argnames=("max_gpus", "tol"))


def make_jax_allocator(
    grid: CellGrid, problem: AllocationProblem, *, tol: float = DEFAULT_TOL
) -> JaxAllocator:
    """A jitted batched allocator for one (grid, problem).

    ``solve(values)``: ``values (..., n_cells, 4)`` in METRICS order →
    :class:`JaxAllocation` with batch shape ``(...)``, ``cell``/``replicas`` of
    shape ``(..., n_classes)``. Compiles once per batch shape.
    """
    spec = jax_problem(grid, problem, tol=tol)
    max_gpus = _axis_gpus(grid, spec)

    @jax.jit
    def solve(values: jax.Array) -> JaxAllocation:
        return solve_jax_problem(spec, values, max_gpus=max_gpus, tol=tol)

    return JaxAllocator(solve=solve, spec=spec, max_gpus=max_gpus, tol=tol)


def _axis_gpus(grid: CellGrid, spec: JaxProblem) -> int | tuple[int, ...]:
    """The static budget axis: the budget with one pool; with several, each pool's own GPUs ``(P,)``.

    Raises:
        InputError: several pools whose state space exceeds :data:`POOL_STATES_MAX`.
    """
    if grid.n_pools == 1:
        return int(spec.gpus)
    axes = tuple(max(int(g), 0) for g in np.asarray(spec.pool_gpus))
    size = int(np.prod([a + 1 for a in axes])) * (max(axes) + 1)
    if size > POOL_STATES_MAX:
        raise InputError(
            f"the JAX allocator's {grid.n_pools}-pool state space "
            f"({' × '.join(str(a + 1) for a in axes)} states × {max(axes) + 1}) "
            f"is over {POOL_STATES_MAX:.3g}; solve it with the MILP (--solver milp)"
        )
    return axes


def allocate_jax(
    grid: CellGrid, values: np.ndarray, problem: AllocationProblem, *, tol: float = DEFAULT_TOL
) -> Allocation:
    """Solve one table ``values (n_cells, 4)`` with the JAX allocator; numpy in, :class:`Allocation` out.

    Shapes are padded (cells to a multiple of 32, TP levels to include 1/2/4/8,
    the budget to a power of two) so that similar problems share one
    compilation. Objectives are recomputed in float64 from the chosen cells and
    replicas.

    Raises:
        InputError: a demand outside :data:`~fleetsieve_bayes.allocation.problem.DEMAND_RANGE`.
    """
    check_demand(problem.demand)
    levels = tuple(sorted({1, 2, 4, 8} | {int(t) for t in grid.tp}))
    n_cells = max(32, -(-grid.n_cells // 32) * 32)
    spec = jax_problem(grid, problem, n_cells=n_cells, tp_levels=levels, tol=tol)
    if grid.n_pools == 1:
        max_gpus = 1 << max(4, int(problem.gpus - 1).bit_length())
    else:  # ∏ (pool GPUs + 1) states: no padding of the budget axes
        max_gpus = _axis_gpus(grid, spec)
    padded = np.zeros((n_cells, 4), np.float64)
    padded[: grid.n_cells] = values
    out = _solve_jit(spec, jnp.asarray(padded), max_gpus=max_gpus, tol=tol)
    return allocation_from_choice(
        grid,
        np.asarray(values, np.float64),
        problem,
        np.asarray(out.cell),
        np.asarray(out.replicas),
        feasible=bool(out.feasible),
    )
