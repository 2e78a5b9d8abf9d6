"""The decision certificate and the stage-wise allocation gap.

Given the conservative allocation A⁻ (lower capacity, upper tails, lower
success) and the optimistic allocation A⁺ (the reverse), the campaign is

- **certified-infeasible** when even A⁺ cannot meet the critical floors;
- **certified-feasible** when A⁻ meets the critical floors, every cell A⁻
  commits to (replicas > 0) is measured and admissible on its measured values,
  and the stage-wise gap is at most ε at every stage;
- **undecided** otherwise.

The gap has one term per lexicographic stage: critical feasibility (1 if A⁺
meets the floors and A⁻ does not), min fulfillment (A⁺ − A⁻), and goodput
normalised by total demand (A⁺ − A⁻)/Σλ. Its definition and weights live in
:mod:`fleetsieve_bayes.allocation.objective` (re-exported here), shared with
the JAX acquisition kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.objective import Gap, gap_within, scalar_gap, stagewise_gap
from fleetsieve_bayes.allocation.problem import Allocation, AllocationProblem, CellGrid, admissible

__all__ = [
    "CERTIFIED_FEASIBLE",
    "CERTIFIED_INFEASIBLE",
    "UNDECIDED",
    "EXHAUSTED",
    "Gap",
    "stagewise_gap",
    "scalar_gap",
    "Certificate",
    "certify",
]

CERTIFIED_FEASIBLE = "certified-feasible"
CERTIFIED_INFEASIBLE = "certified-infeasible"
UNDECIDED = "undecided"
EXHAUSTED = "exhausted"


class Certificate(NamedTuple):
    """The certificate of one round."""

    status: str  # certified-feasible | certified-infeasible | undecided
    gap: Gap  # floats
    unmeasured_committed: tuple[int, ...]  # cells A⁻ commits to that are not measured yet
    reason: str  # one line: why this status


def certify(
    grid: CellGrid,
    problem: AllocationProblem,
    conservative: Allocation,
    optimistic: Allocation,
    measured: np.ndarray,
    measured_values: np.ndarray,
    epsilon: float,
) -> Certificate:
    """Decide the round's certificate.

    Args:
        measured: ``(n_cells,)`` bool, which cells are measured.
        measured_values: ``(n_cells, 4)`` measured metrics (rows of unmeasured
            cells are ignored); a committed cell must be admissible on these.
        epsilon: tolerance on each continuous stage of the gap.
    """
    total = float(problem.demand.sum())
    gap = Gap(
        *(
            float(x)
            for x in stagewise_gap(
                conservative.feasible,
                conservative.min_fulfillment,
                conservative.goodput_rps,
                optimistic.feasible,
                optimistic.min_fulfillment,
                optimistic.goodput_rps,
                total,
            )
        )
    )
    if not optimistic.feasible:
        return Certificate(
            CERTIFIED_INFEASIBLE, gap, (), "even the optimistic allocation cannot meet the critical floors"
        )
    committed = conservative.committed()
    unmeasured = tuple(c for c in committed if not measured[c])
    if not conservative.feasible:
        return Certificate(UNDECIDED, gap, unmeasured, "the conservative allocation does not meet the critical floors yet")
    ok_values = admissible(grid, measured_values, problem)
    bad = [c for c in committed if measured[c] and not ok_values[c]]
    if bad:  # cannot happen when A⁻ was solved on measured values; kept as a guard
        return Certificate(UNDECIDED, gap, unmeasured, f"committed cell {grid.describe(bad[0])} violates its SLO")
    if not gap_within(gap, epsilon):
        return Certificate(
            UNDECIDED,
            gap,
            unmeasured,
            f"gap above epsilon={epsilon:g}: min fulfillment {gap.min_fulfillment:.3f}, goodput {gap.goodput:.3f}",
        )
    if unmeasured:
        return Certificate(
            UNDECIDED, gap, unmeasured, f"committed cell {grid.describe(unmeasured[0])} is not measured yet"
        )
    return Certificate(
        CERTIFIED_FEASIBLE,
        gap,
        (),
        f"gap within epsilon={epsilon:g} and every committed cell measured within SLO",
    )
