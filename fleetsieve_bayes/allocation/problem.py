"""The allocation problem as fixed-shape arrays, and its result.

Both allocators (the exact MILP in :mod:`fleetsieve_bayes.allocation.milp` and
the batched JAX one in :mod:`fleetsieve_bayes.allocation.batched`) take the same
inputs: a :class:`CellGrid` (which cells exist), a ``(n_cells, 4)`` array of cell
values in :data:`~fleetsieve_bayes.table.METRICS` order, and an
:class:`AllocationProblem` (classes, demands, floors, SLOs, GPU budget). They
know nothing about Bayesian bounds: a conservative or optimistic table is just
another values array.

GPU pools: every cell runs on one GPU type (``CellGrid.gpu``, an index into
``CellGrid.pools``); the budget is a count per pool
(``AllocationProblem.pool_gpus``), optionally priced
(``usd_per_gpu_hour``) and capped in dollars per hour
(``usd_per_hour_max``). A grid that names no pool has one pool,
:data:`DEFAULT_POOL`, holding every cell, and a problem without
``pool_gpus`` has one pool of ``gpus``: every single-type caller means what
it meant.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.arrays import namespace
from fleetsieve_bayes.configs import ServingConfig
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import METRICS, first_windows

__all__ = [
    "CellGrid",
    "AllocationProblem",
    "Allocation",
    "grid_from_table",
    "row_pools",
    "values_from_table",
    "admissible",
    "meets_slo",
    "allocation_to_json",
    "ADMISSIBILITY_TOL",
    "DEMAND_RANGE",
    "check_demand",
    "DEFAULT_POOL",
    "pool_counts",
    "pool_prices",
    "priced",
    "profiling_cost",
    "effective_single_budget",
    "within_cap",
]

# The name of the one pool of a grid built without pools (every cell on it).
DEFAULT_POOL = ""

# Demands (req/s) the allocators resolve: the stages are scale-free inside this
# range (tested from 1e-6 to 1e9); beyond it float32 (JAX) fulfillment ratios
# and CBC's tolerances stop being meaningful, so such input is refused.
DEMAND_RANGE = (1e-9, 1e12)
# Tolerance when comparing a cell's metric with an SLO limit, so that a value
# equal to its limit (up to float rounding) is admissible in both allocators.
ADMISSIBILITY_TOL = 1e-9


class CellGrid(NamedTuple):
    """The candidate cells of a campaign, in a fixed order.

    Cells are sorted by workload (campaign order), then GPU pool (pool order),
    then configuration (TP, or catalogue order), then offered load. Every array
    has shape ``(n_cells,)``.

    ``gpu`` is each cell's pool (an index into ``pools``, the GPU type names);
    ``None`` (the default) puts every cell on the one pool
    :data:`DEFAULT_POOL`. With one pool a cell's key is ``(workload, tp,
    load)``; with several it is ``(workload, tp, load, gpu)``.

    ``configs``: the campaign's catalogue of serving configurations
    (:mod:`fleetsieve_bayes.configs`) and ``config`` each cell's entry in it;
    ``None`` (the default): every TP degree is its own aggregated
    configuration. A catalogued cell's key names its configuration in place of
    its TP: ``(workload, config, load[, gpu])``. ``tp`` is always the GPUs of
    one replica of the cell's configuration (its TP when aggregated).
    """

    workloads: tuple[str, ...]  # class names, campaign order; (n_classes,)
    workload_idx: np.ndarray  # int64 (n_cells,)
    tp: np.ndarray  # int64 (n_cells,): GPUs of one replica (the TP of an aggregated configuration)
    load: tuple[str, ...]  # load labels (n_cells,)
    offered_rps: np.ndarray  # float64 (n_cells,): arrival rate of the load setting
    duration_s: np.ndarray  # float64 (n_cells,): expected measurement duration
    gpu: np.ndarray | None = None  # int64 (n_cells,): pool of each cell; None: all on pool 0
    pools: tuple[str, ...] = (DEFAULT_POOL,)  # GPU type of each pool; (n_pools,)
    config: np.ndarray | None = None  # int64 (n_cells,): catalogue entry of each cell; None: no catalogue
    configs: tuple[ServingConfig, ...] | None = None  # the catalogue; (n_configs,)

    @property
    def catalogued(self) -> bool:
        """Whether the campaign declares a catalogue of configurations."""
        return self.configs is not None

    @property
    def gpus(self) -> np.ndarray:
        """GPUs of one replica of each cell, int64 ``(n_cells,)``."""
        return np.asarray(self.tp, np.int64)

    @property
    def config_idx(self) -> np.ndarray:
        """Each cell's configuration, int64 ``(n_cells,)``: its catalogue entry, or without a
        catalogue the rank of its TP among the grid's TP degrees (one aggregated configuration each)."""
        if self.config is not None:
            return np.asarray(self.config, np.int64)
        return np.searchsorted(np.unique(self.tp), self.tp).astype(np.int64)

    def serving_config(self, i: int) -> ServingConfig:
        """The configuration of cell ``i`` (an implicit ``TP{n}`` one without a catalogue)."""
        if self.configs is not None and self.config is not None:
            return self.configs[int(self.config[i])]
        return ServingConfig(name=f"TP{int(self.tp[i])}", tp=int(self.tp[i]))

    @property
    def n_cells(self) -> int:
        return len(self.load)

    @property
    def n_pools(self) -> int:
        return len(self.pools)

    @property
    def gpu_idx(self) -> np.ndarray:
        """Pool index of every cell, int64 ``(n_cells,)`` (zeros for a grid without pools)."""
        if self.gpu is None:
            return np.zeros(self.n_cells, np.int64)
        return np.asarray(self.gpu, np.int64)

    @property
    def named_pools(self) -> bool:
        """Whether the grid names its GPU types (results then report each class's ``gpu``)."""
        return self.pools != (DEFAULT_POOL,)

    @property
    def n_classes(self) -> int:
        return len(self.workloads)

    @property
    def cost_gpu_s(self) -> np.ndarray:
        """Expected profiling cost of each cell, ``duration_s × tp``; shape ``(n_cells,)``."""
        return self.duration_s * self.tp

    def cost_usd(self, usd_per_gpu_hour: np.ndarray) -> np.ndarray:
        """Expected profiling cost of each cell in dollars, ``cost_gpu_s × price of its pool / 3600``.

        Args:
            usd_per_gpu_hour: ``(n_pools,)``.

        Returns:
            ``(n_cells,)`` float64.
        """
        return self.cost_gpu_s * np.asarray(usd_per_gpu_hour, np.float64)[self.gpu_idx] / 3600.0

    def same_curve(self, i: int) -> np.ndarray:
        """bool ``(n_cells,)``: the cells of cell ``i``'s class, GPU pool and TP (its load
        ladder; cell ``i`` among them). A failure or a tail there says something of
        the other loads; another GPU type or TP is another engine."""
        i = int(i)
        conf = self.config_idx
        return (self.workload_idx == self.workload_idx[i]) & (conf == conf[i]) & (
            self.gpu_idx == self.gpu_idx[i])

    def key(self, i: int) -> tuple[Any, ...]:
        """``(workload, tp, load)`` of cell ``i``; ``(workload, tp, load, gpu)`` with several pools.

        A catalogued grid names the configuration in place of the TP: ``(workload, config, load[, gpu])``."""
        conf: Any = self.serving_config(i).name if self.catalogued else int(self.tp[i])
        base = (self.workloads[int(self.workload_idx[i])], conf, self.load[i])
        return base if self.n_pools == 1 else (*base, self.gpu_name(i))

    def gpu_name(self, i: int) -> str:
        """The GPU type (pool name) of cell ``i``."""
        return self.pools[0] if self.gpu is None else self.pools[int(self.gpu[i])]

    def index(self) -> dict[tuple[Any, ...], int]:
        """Map :meth:`key` → cell index."""
        return {self.key(i): i for i in range(self.n_cells)}

    def describe(self, i: int) -> str:
        """``chat TP4@C96`` (``chat agg-tp4-s256@C96`` in a catalogued grid), `` on H100`` with pools."""
        w, conf, load = self.key(i)[:3]
        name = conf if self.catalogued else f"TP{conf}"
        return f"{w} {name}@{load}" + ("" if self.n_pools == 1 else f" on {self.gpu_name(i)}")


class AllocationProblem(NamedTuple):
    """Classes, budget and SLOs. Every class array has shape ``(n_classes,)``.

    ``gpus`` caps the GPUs used over all pools. ``pool_gpus`` ``(n_pools,)``
    are the GPUs available per pool (``None``: one pool of ``gpus``);
    ``usd_per_gpu_hour`` ``(n_pools,)`` their prices (``None``: unpriced —
    the dollar stage is then the GPU stage and no dollars are reported);
    ``usd_per_hour_max`` caps the fleet's dollars per hour (``inf``: no cap;
    a cap needs prices).
    """

    demand: np.ndarray  # req/s, > 0
    critical: np.ndarray  # bool
    floor: np.ndarray  # fulfillment floor δ_i in [0, 1]; only binding where critical
    success_min: np.ndarray
    ttft_max: np.ndarray  # +inf where the policy names no TTFT limit
    completion_max: np.ndarray  # +inf where the policy names no completion limit
    gpus: int
    pool_gpus: np.ndarray | None = None  # int (n_pools,), available per pool
    usd_per_gpu_hour: np.ndarray | None = None  # float (n_pools,), > 0
    usd_per_hour_max: float = float("inf")


def pool_counts(problem: AllocationProblem, n_pools: int = 1) -> np.ndarray:
    """GPUs available per pool, int64 ``(n_pools,)``, each capped at ``problem.gpus``.

    Raises:
        ValueError: ``pool_gpus`` does not have ``n_pools`` entries.
    """
    if problem.pool_gpus is None:
        if n_pools != 1:
            raise ValueError(f"the grid has {n_pools} GPU pools but the problem gives no pool_gpus")
        return np.array([int(problem.gpus)], np.int64)
    counts = np.asarray(problem.pool_gpus, np.int64).reshape(-1)
    if counts.shape[0] != n_pools:
        raise ValueError(f"the grid has {n_pools} GPU pools but pool_gpus has {counts.shape[0]} entries")
    return np.minimum(counts, int(problem.gpus))


def priced(problem: AllocationProblem) -> bool:
    """Whether the problem prices its pools (dollars are then a stage and are reported)."""
    return problem.usd_per_gpu_hour is not None


def profiling_cost(grid: CellGrid, problem: AllocationProblem | None = None) -> np.ndarray:
    """What measuring each cell is expected to cost, the currency acquisition weighs and
    breaks ties by: dollars (:meth:`CellGrid.cost_usd`) when the grid spans several
    priced pools, else GPU-seconds (:attr:`CellGrid.cost_gpu_s`).

    A GPU-second of one pool is not a GPU-second of another: with an H100 at 4 $/h and
    an A100 at 1.8 $/h, two cells of equal duration and TP differ 2.2× in what they cost.

    Returns:
        ``(n_cells,)`` float64.
    """
    if problem is None or grid.n_pools == 1 or not priced(problem):
        return np.asarray(grid.cost_gpu_s, np.float64)
    return grid.cost_usd(pool_prices(problem, grid.n_pools))


def pool_prices(problem: AllocationProblem, n_pools: int = 1) -> np.ndarray:
    """Dollars per GPU-hour of each pool, float64 ``(n_pools,)``; ones when unpriced.

    Raises:
        ValueError: prices of the wrong length or not > 0, or a cap without prices.
    """
    if problem.usd_per_gpu_hour is None:
        if np.isfinite(problem.usd_per_hour_max):
            raise ValueError("usd_per_hour_max needs usd_per_gpu_hour")
        return np.ones(n_pools)
    p = np.asarray(problem.usd_per_gpu_hour, np.float64).reshape(-1)
    if p.shape[0] != n_pools or not np.all(p > 0) or not np.all(np.isfinite(p)):
        raise ValueError(f"usd_per_gpu_hour must be {n_pools} finite prices > 0, got {p.tolist()}")
    return p


def within_cap(cap: float, tol: float) -> float:
    """The most dollars per hour a fleet may cost under a cap ``cap``: ``cap·(1 + tol)``.

    The same relative tolerance as the stages (a fleet costing exactly the cap,
    up to float rounding, is within it); also the rule of the min-dollars stage
    (a later stage keeps ``cost ≤ c*·(1 + tol)``).
    """
    return cap * (1.0 + tol)


def effective_single_budget(problem: AllocationProblem, tol: float) -> int:
    """The GPU budget of a one-pool problem: ``gpus``, its pool's count and the dollar cap in GPUs."""
    g = int(pool_counts(problem, 1)[0])
    cap = float(problem.usd_per_hour_max)
    if np.isfinite(cap):
        price = float(pool_prices(problem, 1)[0])
        g = min(g, int(np.floor(within_cap(cap, tol) / price)))
    return max(g, 0)


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
    # Dollars per hour of the fleet; None for an unpriced problem (or when infeasible).
    usd_per_hour: float | None = None
    # GPUs used per pool, int64 (n_pools,); None when infeasible.
    pool_gpus_used: np.ndarray | None = None

    @property
    def feasible(self) -> bool:
        return self.status == "feasible"

    def committed(self) -> list[int]:
        """The cells this allocation commits to (a replica or more), in class order."""
        return [int(c) for c, n in zip(self.cell, self.replicas, strict=True) if c >= 0 and n > 0]


def _row_pools(df: pd.DataFrame, pools: tuple[str, ...], source: str) -> np.ndarray:
    """Pool index of every row of ``df`` (by its ``gpu`` column), int64 ``(n_rows,)``.

    A row without a GPU (no column, or an empty value) is on the only pool.
    GPU names compare case-insensitively.

    Raises:
        InputError: a row names a GPU in no pool, or names none while there are several pools.
    """
    n = len(df)
    if "gpu" not in df.columns:
        if len(pools) == 1:
            return np.zeros(n, np.int64)
        raise InputError(
            f"{source}: no 'gpu' column, but the campaign has {len(pools)} GPU pools "
            f"({', '.join(pools)}): every row must name the GPU it ran on"
        )
    lookup = {p.lower(): j for j, p in enumerate(pools)}
    out = np.empty(n, np.int64)
    for r, (w, tp, load, g) in enumerate(zip(df["workload"], df["tp"], df["load"], df["gpu"], strict=True)):
        name = "" if g is None or (isinstance(g, float) and np.isnan(g)) else str(g).strip()
        if not name:
            if len(pools) != 1:
                raise InputError(
                    f"{source}: cell {w} TP{int(tp)}@{load}: column 'gpu' is empty, but the campaign "
                    f"has {len(pools)} GPU pools ({', '.join(pools)})"
                )
            out[r] = 0
        elif pools == (DEFAULT_POOL,):
            out[r] = 0  # a campaign without pools: the table's one GPU type is the campaign's
        elif name.lower() in lookup:
            out[r] = lookup[name.lower()]
        else:
            raise InputError(
                f"{source}: cell {w} TP{int(tp)}@{load}: column 'gpu' {name!r} is in no "
                f"[[fleet.pools]] entry (pools: {', '.join(pools)})"
            )
    if pools == (DEFAULT_POOL,):
        named = sorted({str(g).strip() for g in df["gpu"] if str(g).strip() and str(g) != "nan"})
        if len(named) > 1:
            raise InputError(
                f"{source}: column 'gpu' holds {len(named)} GPU types ({', '.join(named)}); a campaign "
                f"with several types declares them as [[fleet.pools]]"
            )
    return out


def row_pools(df: pd.DataFrame, pools: tuple[str, ...], source: str = "table") -> np.ndarray:
    """The pool of every row of ``df``, int64 ``(n_rows,)`` (its ``gpu`` matched to ``pools``, case-insensitive).

    Raises:
        InputError: a row names a GPU in no pool, or names none while there are several pools.
    """
    return _row_pools(df, tuple(pools), source)


def grid_from_table(
    df: pd.DataFrame,
    workloads: tuple[str, ...],
    *,
    source: str = "table",
    pools: tuple[str, ...] | None = None,
    configs: tuple[ServingConfig, ...] | None = None,
) -> CellGrid:
    """Candidate cells = every row of ``df`` whose workload is one of ``workloads``.

    ``pools``: the campaign's GPU types, in pool order (``None``: one unnamed
    pool; the table's ``gpu`` column, if any, may then hold one type only).
    ``configs``: the campaign's catalogue; ``df`` must then be resolved
    against it (:func:`fleetsieve_bayes.configs.resolve_configs`).

    Raises:
        InputError: a campaign workload has no row in the table, a row's GPU
            is in no pool (:func:`_row_pools`).
    """
    pools = (DEFAULT_POOL,) if pools is None else tuple(pools)
    df = first_windows(df)  # a cell with repeated windows once, by its replicate-0 row
    rows = df[df["workload"].isin(workloads)]
    for w in workloads:
        if not (rows["workload"] == w).any():
            raise InputError(f"{source}: no rows for workload {w!r} named in the campaign")
    order = {w: i for i, w in enumerate(workloads)}
    widx = rows["workload"].map(order).to_numpy(np.int64)
    gidx = _row_pools(rows, pools, source)
    if configs is not None:
        cidx = rows["config"].map({c.name: j for j, c in enumerate(configs)}).to_numpy(np.int64)
        rows = rows.assign(_w=widx, _g=gidx, _c=cidx).sort_values(
            ["_w", "_g", "_c", "offered_rps", "load"], kind="stable")
    else:
        rows = rows.assign(_w=widx, _g=gidx).sort_values(["_w", "_g", "tp", "offered_rps", "load"], kind="stable")
    return CellGrid(
        workloads=tuple(workloads),
        workload_idx=rows["_w"].to_numpy(np.int64),
        tp=rows["tp"].to_numpy(np.int64),
        load=tuple(str(x) for x in rows["load"]),
        offered_rps=rows["offered_rps"].to_numpy(np.float64),
        duration_s=rows["duration_s"].to_numpy(np.float64),
        gpu=None if pools == (DEFAULT_POOL,) else rows["_g"].to_numpy(np.int64),
        pools=pools,
        config=None if configs is None else rows["_c"].to_numpy(np.int64),
        configs=None if configs is None else tuple(configs),
    )


def values_from_table(grid: CellGrid, df: pd.DataFrame, *, source: str = "table") -> np.ndarray:
    """The ``(n_cells, 4)`` METRICS array of ``grid``'s cells, looked up in ``df``.

    Rows are matched by :meth:`CellGrid.key` (with the GPU when the grid has
    several pools).

    Raises:
        InputError: a cell of the grid has no row in ``df``.
    """
    df = first_windows(df)  # a cell with repeated windows: its replicate-0 row
    conf = df["config"] if grid.catalogued else df["tp"].astype(int)
    cols = [df["workload"], conf, df["load"]]
    if grid.n_pools > 1:
        rows = df[df["workload"].isin(grid.workloads)]
        g = np.full(len(df), -1, np.int64)
        g[np.flatnonzero(df["workload"].isin(grid.workloads).to_numpy())] = _row_pools(rows, grid.pools, source)
        cols.append([grid.pools[j] if j >= 0 else None for j in g])
    lookup = {
        (w, c, str(load), *rest): i
        for i, (w, c, load, *rest) in enumerate(zip(*cols, strict=True))
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
    A grid that names its GPU pools adds each class's ``gpu`` (null for none). A
    catalogued grid adds each class's ``config`` and ``gpus_per_replica`` (``tp``
    is then null for a disaggregated configuration).
    """
    if not alloc.feasible:
        return None
    out: dict[str, Any] = {}
    for i, name in enumerate(grid.workloads):
        c = int(alloc.cell[i])
        if c < 0 or int(alloc.replicas[i]) == 0:
            out[name] = {"tp": None, "load": None, "replicas": 0}
            if grid.catalogued:
                out[name] |= {"config": None, "gpus_per_replica": None}
            if grid.named_pools:
                out[name]["gpu"] = None
        else:
            cfg = grid.serving_config(c)
            out[name] = {"tp": cfg.tp, "load": grid.load[c], "replicas": int(alloc.replicas[i])}
            if grid.catalogued:
                out[name] |= {"config": cfg.name, "gpus_per_replica": cfg.gpus}
            if grid.named_pools:
                out[name]["gpu"] = grid.gpu_name(c)
    return out
