"""Judging a campaign's decision against the true (fully measured) table.

An allocation is re-evaluated on the TRUE table: each class's committed cell
serves ``min(λ_i, n_i·c_true)`` if that cell is admissible for the class on the
true table, and 0 otherwise (a fleet that violates the SLO serves no goodput
for that class). The reference is the full-table optimum from
:func:`~fleetsieve_bayes.allocation.milp.allocate_milp`.

Regret is lexicographic, stage by stage like the certificate's gap:

- ``critical``: 1 when the decision gets critical feasibility wrong — the
  truth meets the critical floors and the decision does not, or the truth
  cannot meet them and the decision still returns an allocation;
- ``min_fulfillment``: ``r* − r`` (≥ 0 up to the allocator tolerance);
- ``goodput``: ``(g* − g)/Σλ`` (may be negative when ``r < r*``).

A decision is ε-correct when critical feasibility is right and both
continuous stages are ≤ ε. Regret AUC is the area under the scalar regret of
the per-round conservative allocation against GPU-seconds spent, normalised
by the full-grid GPU-seconds (horizon = the full grid; the final decision's
regret is held to the horizon). The hindsight floor is the GPU-seconds of the
initial design plus the cells the optimal allocation commits to: the least a
method that must measure its committed cells can spend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.objective import gap_within, weigh
from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid, admissible
from fleetsieve_bayes.campaign.journal import rounds_of, unique_rounds
from fleetsieve_bayes.decision.design import initial_design

__all__ = [
    "TrueOutcome",
    "Regret",
    "Oracle",
    "evaluate_cells",
    "evaluate_allocation",
    "cells_from_json",
    "make_oracle",
    "regret",
    "scalar_regret",
    "eps_correct",
    "regret_curve",
    "regret_auc",
    "curve_at",
    "hindsight_floor",
    "random_reveal_floor",
    "evaluate_run",
]


class TrueOutcome(NamedTuple):
    """An allocation evaluated on the true table. Arrays are ``(n_classes,)``."""

    present: bool  # False: no allocation (the decision was "infeasible")
    served: np.ndarray  # req/s actually served within SLO
    min_fulfillment: float
    goodput_rps: float
    meets_floors: bool  # every critical class reaches its floor
    violations: tuple[int, ...]  # committed cells inadmissible on the true table


class Regret(NamedTuple):
    """Lexicographic regret against the full-table optimum."""

    critical: float  # 1.0 when critical feasibility is decided wrongly
    min_fulfillment: float  # r* − r
    goodput: float  # (g* − g) / Σλ


class Oracle(NamedTuple):
    """The full-table optimum and the GPU-seconds yardsticks of one campaign."""

    allocation: Allocation
    outcome: TrueOutcome
    full_gpu_s: float  # every candidate measured
    floor_gpu_s: float  # hindsight floor: initial design ∪ committed cells
    random_floor_gpu_s: float  # E[GPU-s] of a uniform random order until the committed cells are revealed


def evaluate_cells(
    grid: CellGrid,
    true_values: np.ndarray,
    problem: AllocationProblem,
    cell: np.ndarray | None,
    replicas: np.ndarray | None,
) -> TrueOutcome:
    """Evaluate per-class cells and replica counts on the true table.

    Args:
        true_values: ``(n_cells, 4)`` true metrics in METRICS order.
        cell: ``(n_classes,)`` int, -1 for a class with nothing; None for no
            allocation at all.
        replicas: ``(n_classes,)`` int.
    """
    lam = np.asarray(problem.demand, np.float64)
    k = len(lam)
    floors = np.where(problem.critical, problem.floor, 0.0)
    if cell is None or replicas is None:
        served = np.zeros(k)
        return TrueOutcome(False, served, 0.0, 0.0, bool(np.all(floors <= 0)), ())
    cell = np.asarray(cell, np.int64)
    replicas = np.asarray(replicas, np.int64)
    adm = admissible(grid, true_values, problem)
    served = np.zeros(k)
    bad: list[int] = []
    for i in range(k):
        c, n = int(cell[i]), int(replicas[i])
        if c < 0 or n <= 0:
            continue
        if int(grid.workload_idx[c]) != i:
            raise ValueError(f"cell {grid.describe(c)} is not a cell of class {grid.workloads[i]!r}")
        if not adm[c]:
            bad.append(c)
            continue
        served[i] = min(lam[i], n * float(true_values[c, 0]))
    r = served / lam
    meets = bool(np.all(r >= floors - 1e-6))
    return TrueOutcome(True, served, float(r.min()), float(served.sum()), meets, tuple(bad))


def evaluate_allocation(
    grid: CellGrid, true_values: np.ndarray, problem: AllocationProblem, alloc: Allocation | None
) -> TrueOutcome:
    """:func:`evaluate_cells` of an :class:`Allocation` (an infeasible one counts as none)."""
    if alloc is None or not alloc.feasible:
        return evaluate_cells(grid, true_values, problem, None, None)
    return evaluate_cells(grid, true_values, problem, alloc.cell, alloc.replicas)


def cells_from_json(grid: CellGrid, alloc_json: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``(cell, replicas)`` arrays ``(n_classes,)`` of a result.json ``allocation`` object (None → None)."""
    if alloc_json is None:
        return None
    index = grid.index()
    cell = np.full(grid.n_classes, -1, np.int64)
    reps = np.zeros(grid.n_classes, np.int64)
    for i, name in enumerate(grid.workloads):
        entry = alloc_json.get(name)
        if not entry or not entry.get("replicas") or (entry.get("tp") is None and not entry.get("config")):
            continue
        gpu = (str(entry["gpu"]),) if grid.n_pools > 1 else ()  # several pools: the key names the GPU
        conf = str(entry["config"]) if grid.catalogued else int(entry["tp"])  # a catalogue keys by name
        cell[i] = index[(name, conf, str(entry["load"]), *gpu)]
        reps[i] = int(entry["replicas"])
    return cell, reps


def hindsight_floor(grid: CellGrid, optimum: Allocation) -> float:
    """GPU-seconds of the initial design plus the cells ``optimum`` commits to (each counted once)."""
    cells = set(initial_design(grid))
    if optimum.feasible:
        cells |= set(optimum.committed())
    cost = grid.cost_gpu_s
    return float(sum(cost[c] for c in cells))


def random_reveal_floor(grid: CellGrid, optimum: Allocation) -> float:
    """Expected GPU-seconds of uniform random profiling until every committed cell is revealed.

    A lower bound on random's cost under any stopping rule that must measure
    the cells it commits to (when the optimum is unique). After the design,
    the m committed cells outside it are always paid; any other remaining
    cell is paid iff it comes before the last of them in the order, which
    happens with probability m/(m+1). Exact, no sampling.
    """
    design = set(initial_design(grid))
    cost = grid.cost_gpu_s
    committed = set(optimum.committed()) if optimum.feasible else set()
    need = committed - design
    m = len(need)
    others = [c for c in range(grid.n_cells) if c not in design and c not in need]
    base = sum(cost[c] for c in design) + sum(cost[c] for c in need)
    return float(base + (m / (m + 1)) * sum(cost[c] for c in others))


def make_oracle(grid: CellGrid, true_values: np.ndarray, problem: AllocationProblem) -> Oracle:
    """Solve the full-table optimum on ``true_values (n_cells, 4)`` and the GPU-seconds yardsticks."""
    opt = allocate_milp(grid, true_values, problem)
    return Oracle(
        allocation=opt,
        outcome=evaluate_allocation(grid, true_values, problem, opt),
        full_gpu_s=float(grid.cost_gpu_s.sum()),
        floor_gpu_s=hindsight_floor(grid, opt),
        random_floor_gpu_s=random_reveal_floor(grid, opt),
    )


def regret(outcome: TrueOutcome, oracle: Oracle, problem: AllocationProblem) -> Regret:
    """Lexicographic regret of ``outcome`` against the oracle."""
    best = oracle.outcome
    truly_feasible = oracle.allocation.feasible
    if not truly_feasible:
        # The right decision is "infeasible"; any allocation is a false claim.
        return Regret(1.0 if outcome.present else 0.0, 0.0, 0.0)
    wrong = best.meets_floors and not outcome.meets_floors
    total = float(np.sum(problem.demand))
    return Regret(
        critical=1.0 if wrong else 0.0,
        min_fulfillment=best.min_fulfillment - outcome.min_fulfillment,
        goodput=(best.goodput_rps - outcome.goodput_rps) / total,
    )


def scalar_regret(r: Regret) -> float:
    """One number, weighted as the certificate's scalar gap: ``weigh(critical, max(0, Δr), max(0, Δg))``."""
    return float(weigh(r.critical, max(0.0, r.min_fulfillment), max(0.0, r.goodput)))


def eps_correct(r: Regret, epsilon: float) -> bool:
    """Critical feasibility right and both continuous stages within ``epsilon``."""
    return gap_within(r, epsilon)


def regret_curve(
    grid: CellGrid,
    true_values: np.ndarray,
    problem: AllocationProblem,
    oracle: Oracle,
    journal_records: Sequence[Any],
    final_allocation: dict[str, Any] | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Scalar regret as a step function of GPU-seconds spent.

    Point j holds from ``spent[j]`` until ``spent[j+1]`` (the last to the
    horizon). Point 0 is "no decision yet" at 0 GPU-seconds; then one point per
    ``round`` record (its conservative allocation, at the GPU-seconds spent when
    it was computed); the run's final allocation replaces the last round's
    (they differ only for an exhausted campaign, whose answer is the best
    allocation over measured cells).

    Returns:
        ``spent (n_points,)`` nondecreasing and ``regret (n_points,)``.
    """
    none = regret(evaluate_cells(grid, true_values, problem, None, None), oracle, problem)
    spent = [0.0]
    values = [scalar_regret(none)]
    rounds = unique_rounds(rounds_of(journal_records))
    for j, rec in enumerate(rounds):
        alloc_json = rec.conservative.allocation
        if j == len(rounds) - 1:
            alloc_json = final_allocation
        cr = cells_from_json(grid, alloc_json)
        out = evaluate_cells(grid, true_values, problem, *(cr if cr else (None, None)))
        spent.append(rec.gpu_seconds)
        values.append(scalar_regret(regret(out, oracle, problem)))
    return np.asarray(spent), np.asarray(values)


def curve_at(spent: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The step function of :func:`regret_curve` evaluated at GPU-seconds ``at (n,)``."""
    j = np.searchsorted(spent, at, side="right") - 1
    return values[np.clip(j, 0, len(values) - 1)]


def regret_auc(spent: np.ndarray, values: np.ndarray, horizon_gpu_s: float) -> float:
    """Area under the step curve on ``[0, horizon]``, divided by ``horizon``.

    Args:
        spent, values: ``(n_points,)`` from :func:`regret_curve`.
        horizon_gpu_s: the full-grid GPU-seconds.
    """
    edges = np.append(np.minimum(spent, horizon_gpu_s), horizon_gpu_s)
    widths = np.diff(edges)
    return float(np.sum(widths * values) / horizon_gpu_s)


def evaluate_run(
    grid: CellGrid,
    true_values: np.ndarray,
    problem: AllocationProblem,
    oracle: Oracle,
    result: dict[str, Any],
    journal_records: Sequence[Any],
    epsilon: float,
) -> dict[str, Any]:
    """Everything the benchmark reports about one finished campaign (JSON-ready)."""
    cr = cells_from_json(grid, result.get("allocation"))
    out = evaluate_cells(grid, true_values, problem, *(cr if cr else (None, None)))
    reg = regret(out, oracle, problem)
    spent, values = regret_curve(grid, true_values, problem, oracle, journal_records, result.get("allocation"))
    certified = result["status"] in ("certified-feasible", "certified-infeasible")
    eps_ok = eps_correct(reg, epsilon)
    return {
        "status": result["status"],
        "gpu_seconds": float(result["gpu_seconds"]),
        "n_measured": len(result.get("measured", [])),
        "regret": reg._asdict(),
        "scalar_regret": scalar_regret(reg),
        "eps_correct": eps_ok,
        "zero_regret": scalar_regret(reg) <= 1e-6,
        # A certificate (either kind) whose decision is not ε-correct on the
        # truth, or that commits to a cell violating its SLO there.
        "false_certificate": bool(certified and (out.violations or not eps_ok)),
        "slo_violations": [grid.describe(c) for c in out.violations],
        "regret_auc": regret_auc(spent, values, oracle.full_gpu_s),
        "curve": {"spent": spent.tolist(), "regret": values.tolist()},
        "floor_ratio": float(result["gpu_seconds"]) / oracle.floor_gpu_s,
    }
