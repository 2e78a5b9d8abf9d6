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

With several priced GPU pools a certified-feasible verdict also needs the
**dollar stage** (:func:`dollar_gap`): A⁻'s dollars per hour within ε of the
least any fleet could cost that serves as much — the cheapest allocation on
the optimistic table at A⁻'s fulfillment and goodput, a lower bound on the
dollars of every fleet serving that much on the truth. One pool (or unpriced
pools) never has it: single-type campaigns certify as before.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fleetsieve_bayes.allocation.objective import Gap, gap_within, scalar_gap, stagewise_gap
from fleetsieve_bayes.allocation.problem import (
    Allocation,
    AllocationProblem,
    CellGrid,
    admissible,
    priced,
)

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
    "dollar_gap",
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
    # The dollar stage (several priced pools, A⁻ feasible): (usd(A⁻) − floor) / usd(A⁻); else None.
    dollars: float | None = None


def dollar_gap(
    grid: CellGrid, problem: AllocationProblem, conservative: Allocation, optimistic_table: np.ndarray
) -> tuple[float, float, np.ndarray] | None:
    """The dollar stage: ``(gap, floor, cells)`` with ``floor`` the least dollars per hour of
    any allocation on ``optimistic_table (n_cells, 4)`` serving at least A⁻'s min
    fulfillment and goodput (:func:`~fleetsieve_bayes.allocation.milp_pools.cheapest_at_service`),
    ``gap = max(0, usd(A⁻) − floor) / usd(A⁻)`` and ``cells`` bool ``(n_cells,)`` the
    cells that cheapest allocation commits to. None with one pool, unpriced pools or an
    infeasible A⁻."""
    if grid.n_pools == 1 or not priced(problem) or not conservative.feasible or conservative.usd_per_hour is None:
        return None
    from fleetsieve_bayes.allocation.milp_pools import cheapest_at_service

    usd = float(conservative.usd_per_hour)
    found = cheapest_at_service(
        grid, optimistic_table, problem, conservative.min_fulfillment, conservative.goodput_rps
    )
    if found is None or usd <= 0.0:  # A⁻ itself serves that much on the optimistic table
        return 0.0, usd, np.zeros(grid.n_cells, bool)
    floor, cells = found
    return max(0.0, usd - floor) / usd, floor, cells


def certify(
    grid: CellGrid,
    problem: AllocationProblem,
    conservative: Allocation,
    optimistic: Allocation,
    measured: np.ndarray,
    measured_values: np.ndarray,
    epsilon: float,
    optimistic_table: np.ndarray | None = None,
) -> Certificate:
    """Decide the round's certificate.

    Args:
        measured: ``(n_cells,)`` bool, which cells are measured.
        measured_values: ``(n_cells, 4)`` measured metrics (rows of unmeasured
            cells are ignored); a committed cell must be admissible on these.
        epsilon: tolerance on each continuous stage of the gap (and on the dollar stage).
        optimistic_table: ``(n_cells, 4)`` the table A⁺ was solved on: with several
            priced pools, the dollar stage (:func:`dollar_gap`) reads it.
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
    stage = None if optimistic_table is None else dollar_gap(grid, problem, conservative, optimistic_table)
    if stage is not None and stage[0] > epsilon:
        usd_gap, floor, cheaper = stage
        # what could settle it: the cheaper fleet's cells not measured yet
        todo = tuple(int(c) for c in np.flatnonzero(cheaper & ~np.asarray(measured, bool)))
        return Certificate(
            UNDECIDED, gap, todo,
            f"dollar gap above epsilon={epsilon:g}: {float(conservative.usd_per_hour):.2f} $/h against at least "
            f"{floor:.2f} $/h for the same service",
            usd_gap,
        )
    return Certificate(
        CERTIFIED_FEASIBLE,
        gap,
        (),
        f"gap within epsilon={epsilon:g} and every committed cell measured within SLO",
        None if stage is None else stage[0],
    )
