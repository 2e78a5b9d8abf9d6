"""The allocation problem as fixed-shape arrays, and its result.

Both allocators (the exact MILP in :mod:`fleetsieve_bayes.allocation.milp` and
the batched JAX one in :mod:`fleetsieve_bayes.allocation.batched`) take the same
inputs: a :class:`CellGrid` (which cells exist), a ``(n_cells, 4)`` array of cell
values in :data:`~fleetsieve_bayes.table.METRICS` order, and an
:class:`AllocationProblem` (classes, demands, floors, SLOs, GPU budget). They
know nothing about Bayesian bounds: a conservative or optimistic table is just
another values array.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.arrays import namespace
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import METRICS

__all__ = [
    "CellGrid",
    "AllocationProblem",
    "Allocation",
    "grid_from_table",
    "values_from_table",
    "admissible",
    "meets_slo",
    "allocation_to_json",
    "ADMISSIBILITY_TOL",
    "DEMAND_RANGE",
    "check_demand",
]

# Demands (req/s) the allocators resolve: the stages are scale-free inside this
# range (tested from 1e-6 to 1e9); beyond it float32 (JAX) fulfillment ratios
# and CBC's tolerances stop being meaningful, so such input is refused.
DEMAND_RANGE = (1e-9, 1e12)
# Tolerance when comparing a cell's metric with an SLO limit, so that a value
# equal to its limit (up to float rounding) is admissible in both allocators.
ADMISSIBILITY_TOL = 1e-9


class CellGrid(NamedTuple):
    """The candidate cells of a campaign, in a fixed order.

    Cells are sorted by workload (campaign order), then TP, then offered load.
    Every array has shape ``(n_cells,)``.
    """

    workloads: tuple[str, ...]  # class names, campaign order; (n_classes,)
    workload_idx: np.ndarray  # int64 (n_cells,)
    tp: np.ndarray  # int64 (n_cells,)
    load: tuple[str, ...]  # load labels (n_cells,)
    offered_rps: np.ndarray  # float64 (n_cells,): arrival rate of the load setting
    duration_s: np.ndarray  # float64 (n_cells,): expected measurement duration

    @property
    def n_cells(self) -> int:
        return len(self.load)

    @property
    def n_classes(self) -> int:
        return len(self.workloads)

    @property
    def cost_gpu_s(self) -> np.ndarray:
        """Expected profiling cost of each cell, ``duration_s × tp``; shape ``(n_cells,)``."""
        return self.duration_s * self.tp

    def key(self, i: int) -> tuple[str, int, str]:
        """``(workload, tp, load)`` of cell ``i``."""
        return (self.workloads[int(self.workload_idx[i])], int(self.tp[i]), self.load[i])

    def index(self) -> dict[tuple[str, int, str], int]:
        """Map ``(workload, tp, load)`` → cell index."""
        return {self.key(i): i for i in range(self.n_cells)}

    def describe(self, i: int) -> str:
        w, tp, load = self.key(i)
        return f"{w} TP{tp}@{load}"


class AllocationProblem(NamedTuple):
    """Classes, budget and SLOs. Every array has shape ``(n_classes,)``."""

    demand: np.ndarray  # req/s, > 0
    critical: np.ndarray  # bool
    floor: np.ndarray  # fulfillment floor δ_i in [0, 1]; only binding where critical
    success_min: np.ndarray
    ttft_max: np.ndarray  # +inf where the policy names no TTFT limit
    completion_max: np.ndarray  # +inf where the policy names no completion limit
    gpus: int


class Allocation(NamedTuple):
    """Result of one allocation.

    ``status`` is ``"feasible"`` or ``"infeasible"`` (critical floors cannot be
    met). Arrays have shape ``(n_classes,)``; ``cell[i] == -1`` and
    ``replicas[i] == 0`` for a class that gets nothing (and for every class when
    infeasible).
    """

    status: str
    cell: np.ndarray  # int64 (n_classes,)
    replicas: np.ndarray  # int64 (n_classes,)
    served: np.ndarray  # float64 (n_classes,), req/s
    min_fulfillment: float
    goodput_rps: float
    gpus_used: int

    @property
    def feasible(self) -> bool:
        return self.status == "feasible"

    def committed(self) -> list[int]:
        """The cells this allocation commits to (a replica or more), in class order."""
        return [int(c) for c, n in zip(self.cell, self.replicas, strict=True) if c >= 0 and n > 0]


def grid_from_table(df: pd.DataFrame, workloads: tuple[str, ...], *, source: str = "table") -> CellGrid:
    """Candidate cells = every row of ``df`` whose workload is one of ``workloads``.

    Raises:
        InputError: a campaign workload has no row in the table, or one load
            label has different offered rates at different TPs.
    """
    rows = df[df["workload"].isin(workloads)]
    for w in workloads:
        if not (rows["workload"] == w).any():
            raise InputError(f"{source}: no rows for workload {w!r} named in the campaign")
    order = {w: i for i, w in enumerate(workloads)}
    widx = rows["workload"].map(order).to_numpy(np.int64)
    rows = rows.assign(_w=widx).sort_values(["_w", "tp", "offered_rps", "load"], kind="stable")
    return CellGrid(
        workloads=tuple(workloads),
        workload_idx=rows["_w"].to_numpy(np.int64),
        tp=rows["tp"].to_numpy(np.int64),
        load=tuple(str(x) for x in rows["load"]),
        offered_rps=rows["offered_rps"].to_numpy(np.float64),
        duration_s=rows["duration_s"].to_numpy(np.float64),
    )


def values_from_table(grid: CellGrid, df: pd.DataFrame, *, source: str = "table") -> np.ndarray:
    """The ``(n_cells, 4)`` METRICS array of ``grid``'s cells, looked up in ``df``.

    Raises:
        InputError: a cell of the grid has no row in ``df``.
    """
    lookup = {
        (w, int(tp), str(load)): i
        for i, (w, tp, load) in enumerate(zip(df["workload"], df["tp"], df["load"], strict=True))
    }
    metric_cols = df[list(METRICS)].to_numpy(np.float64)
    out = np.empty((grid.n_cells, len(METRICS)), dtype=np.float64)
    for c in range(grid.n_cells):
        key = grid.key(c)
        if key not in lookup:
            raise InputError(f"{source}: no row for cell {grid.describe(c)}")
        out[c] = metric_cols[lookup[key]]
    return out


def check_demand(demand: Any, names: tuple[str, ...] | None = None, *, source: str = "allocation") -> None:
    """Refuse demands the allocators cannot resolve: non-finite or outside :data:`DEMAND_RANGE`.

    Raises:
        InputError: one line naming the class and the value.
    """
    lo, hi = DEMAND_RANGE
    for i, x in enumerate(np.asarray(demand, np.float64).reshape(-1)):
        if not (lo <= x <= hi):  # also catches NaN
            name = f"workload {names[i]!r}" if names else f"class {i}"
            raise InputError(
                f"{source}: {name}: demand {x:g} req/s is outside the range the allocator "
                f"resolves ({lo:g} to {hi:g} req/s)"
            )


def meets_slo(
    values: Any, success_min: Any, ttft_max: Any, completion_max: Any, *, tol: float = ADMISSIBILITY_TOL
) -> Any:
    """The admissibility rule, for any array namespace (NumPy, JAX, pandas-free arrays).

    Args:
        values: ``(..., n, 4)`` metrics in METRICS order.
        success_min, ttft_max, completion_max: ``(n,)`` limits of each cell's
            class (``+inf`` where the policy names no tail limit).

    Returns:
        bool ``(..., n)``: success ≥ success_min and every named tail ≤ its
        limit (each up to ``tol``), with throughput > 0. An unobserved tail
        (NaN: the source had no such timing) passes only a policy that does
        not name it.
    """
    xp = namespace(values)
    thr, succ = values[..., 0], values[..., 3]
    ttft, comp = (xp.where(xp.isnan(values[..., k]), xp.inf, values[..., k]) for k in (1, 2))
    return (
        (succ >= success_min - tol)
        & (ttft <= ttft_max + tol)
        & (comp <= completion_max + tol)
        & (thr > 0)
    )


def admissible(grid: CellGrid, values: np.ndarray, problem: AllocationProblem) -> np.ndarray:
    """Which cells satisfy their class's SLO policy (:func:`meets_slo`).

    Args:
        values: ``(..., n_cells, 4)`` cell metrics in METRICS order.

    Returns:
        bool array ``(..., n_cells)``.
    """
    w = grid.workload_idx
    return meets_slo(values, problem.success_min[w], problem.ttft_max[w], problem.completion_max[w])


def allocation_to_json(alloc: Allocation, grid: CellGrid) -> dict[str, Any] | None:
    """The ``allocation`` object of result.json (docs/contracts.md): ``{workload: {tp, load, replicas}}``, or None if infeasible.

    A class that gets no replica appears as ``{"tp": null, "load": null, "replicas": 0}``.
    """
    if not alloc.feasible:
        return None
    out: dict[str, Any] = {}
    for i, name in enumerate(grid.workloads):
        c = int(alloc.cell[i])
        if c < 0 or int(alloc.replicas[i]) == 0:
            out[name] = {"tp": None, "load": None, "replicas": 0}
        else:
            out[name] = {"tp": int(grid.tp[c]), "load": grid.load[c], "replicas": int(alloc.replicas[i])}
    return out
