"""The lexicographic objective: its stages, tolerance, gap weights, results and JSON.

One owner for what both allocators (:mod:`~fleetsieve_bayes.allocation.milp`,
:mod:`~fleetsieve_bayes.allocation.batched`), the certificate, the acquisition
kernel, the evaluation and the CLI must agree on.

Stages (:data:`STAGES`), each fixing the previous optimum up to the tolerance:

1. every critical class reaches ``r_i ≥ δ_i`` (otherwise: infeasible);
2. maximise ``min_i r_i`` (``r_i = x_i / λ_i``);
3. maximise total goodput ``Σ x_i``;
4. minimise dollars per hour ``Σ_pools price_p·GPUs_p`` (a later stage keeps
   ``cost ≤ c*·(1 + tol)``, :func:`~fleetsieve_bayes.allocation.problem.within_cap`);
5. minimise GPUs used.

With one pool (or unpriced pools) stage 4 is stage 5 (dollars are
proportional to GPUs), so the allocators skip it: a single-type problem is
solved exactly as before pools existed.

Tolerance (:func:`within`): relative to the stage's own optimum, never to the
demand — stage 2 keeps ``t ≥ t*·(1 − tol)``, stage 3 keeps
``Σx ≥ g*·(1 − tol)``, the critical floors are ``r_i ≥ δ_i·(1 − tol)``. So
scaling every demand by any factor changes no comparison, and a demand of
1e-6 or 1e9 req/s is solved like one of 10.

The gap between the optimistic and the conservative allocation has one term
per continuous stage plus a critical-feasibility term; stages 4 and 5 are
tie-breakers among equally good fleets and are deliberately not in the gap.
:func:`scalar_gap` weighs critical disagreement by :data:`CRITICAL_WEIGHT`
(more than the two continuous terms, each in [0, 1], can add up to). The gap
functions use array operators only, so NumPy callers and the JAX kernel share
them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.problem import (
    Allocation,
    AllocationProblem,
    CellGrid,
    pool_prices,
    priced,
)
from fleetsieve_bayes.numerics import at_most

__all__ = [
    "STAGES",
    "DEFAULT_TOL",
    "CRITICAL_WEIGHT",
    "within",
    "Gap",
    "stagewise_gap",
    "gap_within",
    "weigh",
    "scalar_gap",
    "objective_value",
    "infeasible_allocation",
    "allocation_from_choice",
    "objective_json",
]

STAGES: tuple[str, ...] = (
    "critical floors",
    "max min fulfillment",
    "max goodput",
    "min dollars per hour",
    "min GPUs",
)
# Relative stage tolerance shared by both allocators.
DEFAULT_TOL = 1e-6
# Weight of critical disagreement in the scalar gap: the two continuous terms
# are each in [0, 1], so a weight above 2 makes critical feasibility dominate.
CRITICAL_WEIGHT = 10.0


def within(best: Any, tol: float) -> Any:
    """The least value a later stage may keep of a stage optimum ``best`` (≥ 0): ``best·(1 − tol)``."""
    return best * (1.0 - tol)


class Gap(NamedTuple):
    """Stage-wise gap between the optimistic and conservative allocations; each ``(...)``."""

    critical: Any  # 1.0 where A⁺ is feasible and A⁻ is not, else 0.0
    min_fulfillment: Any  # max(0, r⁺ − r⁻); 0 when both are infeasible
    goodput: Any  # max(0, g⁺ − g⁻) / Σλ; 0 when both are infeasible


def stagewise_gap(
    cons_feasible: Any,
    cons_min_fulfillment: Any,
    cons_goodput: Any,
    opt_feasible: Any,
    opt_min_fulfillment: Any,
    opt_goodput: Any,
    total_demand: float,
) -> Gap:
    """The stage-wise gap; works on Python/NumPy/JAX scalars or arrays of one shape ``(...)``.

    An infeasible allocation counts as fulfillment 0 and goodput 0, so when
    only A⁻ is infeasible the later stages show the full distance to A⁺.
    """
    cf = cons_feasible * 1.0
    of = opt_feasible * 1.0
    r_minus = cons_min_fulfillment * cf
    r_plus = opt_min_fulfillment * of
    g_minus = cons_goodput * cf
    g_plus = opt_goodput * of
    zero = 0.0 * r_plus
    critical = of * (1.0 - cf)
    dr = r_plus - r_minus
    dg = (g_plus - g_minus) / total_demand
    # max(0, ·) written arithmetically so NumPy and JAX share it.
    return Gap(critical=critical, min_fulfillment=(dr + abs(dr)) / 2 + zero, goodput=(dg + abs(dg)) / 2 + zero)


def gap_within(gap: Any, epsilon: float) -> bool:
    """No critical disagreement and both continuous stage terms ≤ ``epsilon`` (a :class:`Gap` or alike),
    up to the tie tolerance of :func:`fleetsieve_bayes.numerics.at_most`."""
    return (
        float(gap.critical) == 0.0
        and at_most(float(gap.min_fulfillment), epsilon)
        and at_most(float(gap.goodput), epsilon)
    )


def weigh(critical: Any, min_fulfillment: Any, goodput: Any) -> Any:
    """Stage terms → one number: ``CRITICAL_WEIGHT·critical + min_fulfillment + goodput``."""
    return CRITICAL_WEIGHT * critical + min_fulfillment + goodput


def scalar_gap(gap: Gap) -> Any:
    """One number to minimise: critical disagreement dominates, then the two continuous stages."""
    return weigh(gap.critical, gap.min_fulfillment, gap.goodput)


def objective_value(feasible: Any, min_fulfillment: Any, goodput: Any, total_demand: float) -> Any:
    """An allocation's objective as one number, weighted like :func:`scalar_gap`.

    ``CRITICAL_WEIGHT·feasible + min_fulfillment + goodput/Σλ`` (0 when
    infeasible), so that ``scalar_gap`` = optimistic value − conservative value
    when A⁺ dominates.
    """
    f = feasible * 1.0
    return weigh(f, f * min_fulfillment, f * goodput / total_demand)


def infeasible_allocation(n_classes: int, problem: AllocationProblem | None = None) -> Allocation:
    """The :class:`Allocation` of an instance whose critical floors cannot be met.

    A priced ``problem`` reports 0 dollars per hour (like its 0 GPUs).
    """
    k = n_classes
    usd = 0.0 if problem is not None and priced(problem) else None
    return Allocation(
        "infeasible", np.full(k, -1, np.int64), np.zeros(k, np.int64), np.zeros(k), 0.0, 0.0, 0, usd
    )


def allocation_from_choice(
    grid: CellGrid,
    values: np.ndarray,
    problem: AllocationProblem,
    cell: np.ndarray,
    replicas: np.ndarray,
    *,
    feasible: bool,
) -> Allocation:
    """An :class:`Allocation` from ``cell (K,)`` and ``replicas (K,)``, objectives in float64.

    Args:
        values: ``(n_cells, 4)`` the table the choice was made on.
        cell: grid index per class, -1 for none; replicas: per class.
    """
    if not feasible:
        return infeasible_allocation(grid.n_classes, problem)
    cell = np.asarray(cell, np.int64)
    replicas = np.where(cell >= 0, np.asarray(replicas, np.int64), 0)
    thr = np.where(cell >= 0, np.asarray(values, np.float64)[np.maximum(cell, 0), 0], 0.0)
    demand = np.asarray(problem.demand, np.float64)
    served = np.minimum(demand, replicas * thr)
    per_class = np.where(cell >= 0, replicas * grid.tp[np.maximum(cell, 0)], 0)
    gpus = int(np.sum(per_class))
    pool = np.where(cell >= 0, grid.gpu_idx[np.maximum(cell, 0)] if grid.n_cells else 0, 0)
    by_pool = np.bincount(pool, weights=per_class, minlength=grid.n_pools).astype(np.int64)
    usd = float(np.dot(by_pool, pool_prices(problem, grid.n_pools))) if priced(problem) else None
    return Allocation(
        status="feasible",
        cell=np.where(replicas > 0, cell, -1),
        replicas=replicas,
        served=served,
        min_fulfillment=float(np.min(served / demand)),
        goodput_rps=float(np.sum(served)),
        gpus_used=gpus,
        usd_per_hour=usd,
        pool_gpus_used=by_pool,
    )


def objective_json(alloc: Allocation, *, with_feasible: bool = False, digits: int | None = None) -> dict[str, Any]:
    """``{min_fulfillment, goodput_rps, gpus_used}`` (``feasible`` first when asked).

    A priced allocation adds ``usd_per_hour`` (dollars per hour of the fleet).

    ``digits``: floats rounded to this many *significant* digits (scale-free:
    a fulfillment of 1.1e-9 keeps its digits).
    """
    num = (lambda x: float(x)) if digits is None else (lambda x: float(f"{float(x):.{digits}g}"))
    out: dict[str, Any] = {"feasible": alloc.feasible} if with_feasible else {}
    out.update(
        min_fulfillment=num(alloc.min_fulfillment),
        goodput_rps=num(alloc.goodput_rps),
        gpus_used=int(alloc.gpus_used),
    )
    if alloc.usd_per_hour is not None:
        out["usd_per_hour"] = num(alloc.usd_per_hour)
    return out
