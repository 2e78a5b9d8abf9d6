"""The three certificate states and the stage-wise gap."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid
from fleetsieve_bayes.decision.certificate import (
    CERTIFIED_FEASIBLE,
    CERTIFIED_INFEASIBLE,
    UNDECIDED,
    certify,
    scalar_gap,
    stagewise_gap,
)

GRID = CellGrid(
    workloads=("a", "b"),
    workload_idx=np.array([0, 0, 1]),
    tp=np.array([2, 4, 4]),
    load=("L1", "L1", "L1"),
    offered_rps=np.array([5.0, 5.0, 5.0]),
    duration_s=np.array([300.0, 300.0, 300.0]),
)
PROBLEM = AllocationProblem(
    demand=np.array([4.0, 6.0]),
    critical=np.array([False, False]),
    floor=np.array([1.0, 1.0]),
    success_min=np.array([0.99, 0.99]),
    ttft_max=np.array([2.0, np.inf]),
    completion_max=np.array([np.inf, np.inf]),
    gpus=16,
)
VALUES = np.array([[2.0, 1.0, 5.0, 1.0], [4.0, 1.0, 5.0, 1.0], [3.0, 1.0, 5.0, 1.0]])


def alloc(feasible: bool, r: float, g: float, cells=(1, 2), reps=(1, 2)) -> Allocation:
    return Allocation(
        "feasible" if feasible else "infeasible",
        np.array(cells),
        np.array(reps),
        np.zeros(2),
        r,
        g,
        12,
    )


def test_gap_stages() -> None:
    g = stagewise_gap(True, 0.8, 8.0, True, 0.9, 9.0, 10.0)
    assert (g.critical, g.min_fulfillment, g.goodput) == pytest.approx((0.0, 0.1, 0.1))
    # Conservative infeasible, optimistic feasible: the full distance shows.
    g = stagewise_gap(False, 0.0, 0.0, True, 1.0, 10.0, 10.0)
    assert (g.critical, g.min_fulfillment, g.goodput) == pytest.approx((1.0, 1.0, 1.0))
    assert scalar_gap(g) == pytest.approx(12.0)
    # The gap is never negative even if the "optimistic" side is worse.
    g = stagewise_gap(True, 0.9, 9.0, True, 0.8, 8.0, 10.0)
    assert g.min_fulfillment == 0.0 and g.goodput == 0.0


def test_certified_feasible_needs_measured_committed_cells() -> None:
    measured = np.array([False, True, True])
    c = certify(GRID, PROBLEM, alloc(True, 1.0, 10.0), alloc(True, 1.0, 10.0), measured, VALUES, 0.05)
    assert c.status == CERTIFIED_FEASIBLE
    measured = np.array([True, False, True])
    c = certify(GRID, PROBLEM, alloc(True, 1.0, 10.0), alloc(True, 1.0, 10.0), measured, VALUES, 0.05)
    assert c.status == UNDECIDED and c.unmeasured_committed == (1,)
    assert "a TP4@L1 is not measured" in c.reason


def test_gap_above_epsilon_is_undecided() -> None:
    measured = np.ones(3, dtype=bool)
    c = certify(GRID, PROBLEM, alloc(True, 0.9, 9.0), alloc(True, 0.96, 9.6), measured, VALUES, 0.05)
    assert c.status == UNDECIDED and "gap above epsilon" in c.reason
    c = certify(GRID, PROBLEM, alloc(True, 0.9, 9.0), alloc(True, 0.94, 9.4), measured, VALUES, 0.05)
    assert c.status == CERTIFIED_FEASIBLE


def test_infeasible_when_optimistic_cannot_meet_floors() -> None:
    measured = np.zeros(3, dtype=bool)
    c = certify(GRID, PROBLEM, alloc(False, 0, 0), alloc(False, 0, 0), measured, VALUES, 0.05)
    assert c.status == CERTIFIED_INFEASIBLE
    c = certify(GRID, PROBLEM, alloc(False, 0, 0), alloc(True, 1.0, 10.0), measured, VALUES, 0.05)
    assert c.status == UNDECIDED and c.gap.critical == 1.0


def test_committed_cell_violating_slo_blocks() -> None:
    measured = np.ones(3, dtype=bool)
    bad = VALUES.copy()
    bad[1, 1] = 3.0  # TTFT above class a's 2 s limit
    c = certify(GRID, PROBLEM, alloc(True, 1.0, 10.0), alloc(True, 1.0, 10.0), measured, bad, 0.05)
    assert c.status == UNDECIDED and "violates its SLO" in c.reason
