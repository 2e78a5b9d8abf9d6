"""Campaign files (TOML): loading and validation.

A campaign names the fleet budget, the model family (prior card), the
measurement backend, the stopping rule and the workload classes with their
demand and SLO. See docs/contracts.md for the contract; this module keeps it exactly
and adds only optional keys. Every problem is reported as one
:class:`~fleetsieve_bayes.errors.InputError` naming the file and the field.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleetsieve_bayes.allocation.problem import AllocationProblem, check_demand
from fleetsieve_bayes.configs import ServingConfig, parse_catalogue
from fleetsieve_bayes.decision.intervals import DEFAULT_SLO_ATTAINMENT, POINT, check_level
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.settings import (
    ALTERNATIVES,
    CERTIFY_INFERENCE,
    KNEE_GUARD,
    MAX_WINDOWS_PER_CELL,
    MODEL_MARGIN,
    SUCCESS_MARGIN,
    UNCERTIFIED_ANSWER,
    UNCERTIFIED_ANSWERS,
    DecisionSettings,
    IntervalRules,
)
from fleetsieve_bayes.validation import Validator

__all__ = [
    "SLO",
    "Workload",
    "Measurement",
    "ProfilingPool",
    "FleetPool",
    "Campaign",
    "parse_pools",
    "load_campaign",
    "parse_campaign",
]


@dataclass(frozen=True)
class SLO:
    """Per-class service-level objective. A tail limit of ``None`` is not checked."""

    success_min: float
    ttft_p99_s: float | None = None
    completion_p99_s: float | None = None


@dataclass(frozen=True)
class Workload:
    """One workload class: demand (req/s), SLO, and an optional critical floor."""

    name: str
    demand_rps: float
    slo: SLO
    critical: bool = False
    floor: float = 1.0
    # The class's own SLO-attainment level (None: the campaign's [stopping] slo_attainment).
    slo_attainment: float | str | None = None

    def to_json(self) -> dict[str, Any]:
        """The class as the journal header and the fingerprint record it (docs/contracts.md)."""
        out: dict[str, Any] = {
            "demand_rps": self.demand_rps,
            "critical": self.critical,
            "floor": self.floor,
            "slo": {
                "success_min": self.slo.success_min,
                "ttft_p99_s": self.slo.ttft_p99_s,
                "completion_p99_s": self.slo.completion_p99_s,
            },
        }
        if self.slo_attainment is not None:
            out["slo_attainment"] = self.slo_attainment
        return out


@dataclass(frozen=True)
class Measurement:
    """The ``[measurement]`` table: the backend name and its own keys.

    ``options`` holds every key but ``backend`` and ``seed_tables``, verbatim;
    each backend validates its own keys (the replay backend: ``table``).
    ``base_dir`` is the campaign file's folder, against which relative paths
    resolve. ``seed_tables`` are tables measured earlier whose rows enter the
    campaign as measured cells at no cost (resolved paths, in order).
    """

    backend: str
    options: dict[str, Any]
    base_dir: Path
    seed_tables: tuple[Path, ...] = ()

    @property
    def table(self) -> Path | None:
        """The replay table's resolved path (``None`` for backends without one)."""
        value = self.options.get("table")
        return None if value is None else (self.base_dir / str(value)).resolve()


@dataclass(frozen=True)
class ProfilingPool:
    """How many cells may be measured at once, and where (``[measurement]``).

    ``pool_gpus``: GPUs available for profiling at once (``None``: one cell at
    a time, the sequential loop). ``executor``: ``"local"`` (this machine) or
    ``"ray"`` (a Ray cluster at ``ray_address``; ``None`` starts a local Ray
    for the campaign). The deployment budget ``[fleet] gpus`` is separate.
    """

    pool_gpus: int | None = None
    executor: str = "local"
    ray_address: str | None = None
    # With two or more [[fleet.pools]], ``pool_gpus = { TYPE = n, … }``: the
    # profiling GPUs of each pool (pool order); ``pool_gpus`` is then their sum
    # and a cell runs on GPUs of its own type only.
    per_gpu: tuple[int, ...] | None = None

    @property
    def parallel(self) -> bool:
        """Whether the campaign runs the parallel driver (a pool or Ray was asked for)."""
        return self.pool_gpus is not None or self.executor != "local"


@dataclass(frozen=True)
class FleetPool:
    """One ``[[fleet.pools]]`` entry: GPUs of one type available to the fleet, and their price.

    ``gpu`` is the type's name in the GPU spec table (``fleetsieve_bayes/data/priors/hardware/gpus.toml``,
    or the file ``spec`` when the campaign gave a path); measurement rows name
    it in their ``gpu`` column. ``nodes``/``gpus_per_node`` say where the pool's
    GPUs are (for a backend that places servers; the allocator uses ``count``).
    """

    gpu: str
    count: int
    usd_per_gpu_hour: float
    nodes: tuple[str, ...] = ()
    gpus_per_node: int | None = None
    spec: str | None = None


@dataclass(frozen=True)
class Campaign:
    """A validated campaign file."""

    name: str
    path: Path
    gpus: int
    family: str
    measurement: Measurement
    workloads: tuple[Workload, ...]
    epsilon: float = 0.05
    credible_level: float = 0.9
    max_rounds: int | None = None
    inference: str = "fast"
    # The certifying fit's NUTS preset (a name or a resolved path).
    certify_inference: str = CERTIFY_INFERENCE
    repeatability: float = 0.0
    # Model discrepancy of unmeasured tails (decision.intervals.MODEL_MARGIN).
    tail_margin: float = MODEL_MARGIN
    # ... and of their failure probability (decision.intervals.SUCCESS_MARGIN).
    success_margin: float = SUCCESS_MARGIN
    # Load steps beneath a measured cell the model cannot rule out (decision.intervals.KNEE_GUARD).
    knee_guard: int = KNEE_GUARD
    extra: dict[str, Any] = field(default_factory=dict)
    # The parsed TOML as written (the journal header keeps it to name what changed).
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    pool: ProfilingPool = field(default_factory=ProfilingPool)
    # A certified state needs the joint check's probability ≥ 1 − risk.
    risk: float = 0.05
    # SLO attainment (decision.intervals, rule 5): a cell is admissible when one
    # window of it meets its class's SLOs with probability ≥ this level;
    # "point": its measured or predicted value against the SLOs.
    slo_attainment: float | str = DEFAULT_SLO_ATTAINMENT
    # Windows of one cell a campaign may measure (the first and its repeats).
    max_windows_per_cell: int = MAX_WINDOWS_PER_CELL
    # At a level, what an uncertified campaign answers (settings.UNCERTIFIED_ANSWERS, or a confidence).
    uncertified_answer: str | float = UNCERTIFIED_ANSWER

    def slo_levels(self) -> tuple[float, ...] | str:
        """Each class's attainment level (its override, else the campaign's), in
        class order; ``"point"`` when the campaign's level and every override are
        ``"point"``. A mix of levels and ``"point"`` is refused at parse time."""
        levels = [self.slo_attainment if w.slo_attainment is None else w.slo_attainment for w in self.workloads]
        if all(q == POINT for q in levels):
            return POINT
        return tuple(float(q) for q in levels)
    # [[fleet.pools]] (empty: one unnamed pool of `gpus`) and [fleet] usd_per_hour_max.
    pools: tuple[FleetPool, ...] = ()
    usd_per_hour_max: float | None = None
    # [stopping] max_gpu_seconds / max_wall_s: the profiling budget (None: no limit; campaign.budget).
    max_gpu_seconds: float | None = None
    max_wall_s: float | None = None
    # [stopping] alternatives: ranked fleets result.json lists beside the answer (0: none).
    alternatives: int = ALTERNATIVES
    # [[configs]]: the catalogue of serving configurations (None: each TP of the table is one).
    configs: tuple[ServingConfig, ...] | None = None

    @property
    def pool_names(self) -> tuple[str, ...] | None:
        """The GPU type of each pool, in order; ``None`` for a campaign without ``[[fleet.pools]]``."""
        return tuple(p.gpu for p in self.pools) if self.pools else None

    @property
    def settings(self) -> DecisionSettings:
        """The decision's settings of this file as one value (:class:`DecisionSettings`)."""
        return DecisionSettings.from_campaign(self)

    @property
    def interval_rules(self) -> IntervalRules:
        """The interval rules of ``[model]`` as one value (:class:`IntervalRules`)."""
        return IntervalRules(self.tail_margin, self.success_margin, self.knee_guard)

    def problem(self, *, demand_scale: float = 1.0) -> AllocationProblem:
        """The allocation problem: arrays of the classes, demand multiplied by ``demand_scale``.

        Raises:
            InputError: a (scaled) demand outside the range the allocators resolve
                (:data:`fleetsieve_bayes.allocation.problem.DEMAND_RANGE`).
        """
        ws = self.workloads
        inf = np.inf
        demand = np.array([w.demand_rps * demand_scale for w in ws], dtype=np.float64)
        where = str(self.path) + ("" if demand_scale == 1.0 else f" (demand × {demand_scale:g})")
        check_demand(demand, self.workload_names, source=where)
        return AllocationProblem(
            demand=demand,
            critical=np.array([w.critical for w in ws], dtype=bool),
            floor=np.array([w.floor for w in ws], dtype=np.float64),
            success_min=np.array([w.slo.success_min for w in ws], dtype=np.float64),
            ttft_max=np.array([inf if w.slo.ttft_p99_s is None else w.slo.ttft_p99_s for w in ws]),
            completion_max=np.array(
                [inf if w.slo.completion_p99_s is None else w.slo.completion_p99_s for w in ws]
            ),
            gpus=int(self.gpus),
            **self._pool_fields(),
        )

    def _pool_fields(self) -> dict[str, Any]:
        """``[[fleet.pools]]`` as :class:`AllocationProblem` fields (none without pools: one pool of ``gpus``)."""
        if not self.pools:
            return {}
        cap = self.usd_per_hour_max
        return {
            "pool_gpus": np.array([p.count for p in self.pools], np.int64),
            "usd_per_gpu_hour": np.array([p.usd_per_gpu_hour for p in self.pools], np.float64),
            "usd_per_hour_max": float("inf") if cap is None else float(cap),
        }

    @property
    def workload_names(self) -> tuple[str, ...]:
        return tuple(w.name for w in self.workloads)

    def at_level(self, slo_attainment: float | str) -> Campaign:
        """The same campaign deciding at ``slo_attainment`` (a level in (0, 1) or
        ``"point"``) for every class, its per-class overrides dropped.

        Raises:
            ValueError: one line, for a level outside (0, 1) or an unknown word.
        """
        from dataclasses import replace

        level = check_level(slo_attainment, "slo_attainment")
        return replace(self, slo_attainment=level,
                       workloads=tuple(replace(w, slo_attainment=None) for w in self.workloads))

    def scaled(self, demand_scale: float) -> Campaign:
        """The same campaign with every class's demand multiplied by ``demand_scale``."""
        from dataclasses import replace

        return replace(
            self,
            workloads=tuple(replace(w, demand_rps=w.demand_rps * demand_scale) for w in self.workloads),
        )


# Allowed keys per section, so a typo is an error instead of a silent default.
_TOP_KEYS = {"name", "fleet", "model", "measurement", "stopping", "workloads", "configs"}
_FLEET_KEYS = {"gpus", "pools", "usd_per_hour_max"}
_FLEET_POOL_KEYS = {"gpu", "count", "usd_per_gpu_hour", "nodes", "gpus_per_node"}
_MODEL_KEYS = {
    "family", "inference", "certify_inference", "repeatability", "tail_margin", "success_margin", "knee_guard",
}
_STOPPING_KEYS = {
    "epsilon", "credible_level", "max_rounds", "risk", "slo_attainment", "max_windows_per_cell", "uncertified_answer",
    "max_gpu_seconds", "max_wall_s", "alternatives",
}
_WORKLOAD_KEYS = {"name", "demand_rps", "critical", "floor", "slo", "slo_attainment"}
_SLO_KEYS = {"success_min", "ttft_p99_s", "completion_p99_s"}
# Keys of every backend: how many cells run at once, and where.
_POOL_KEYS = {"pool_gpus", "executor", "ray_address"}
EXECUTORS = ("local", "ray")


def load_campaign(path: str | Path) -> Campaign:
    """Read and validate a campaign TOML file.

    Raises:
        InputError: one line naming the file and the offending field.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: campaign file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read campaign file: {exc}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None
    return parse_campaign(raw, path)


def _uncertified_answer(ctx: Validator, raw: Any) -> str | float:
    """``[stopping] uncertified_answer``: a name of :data:`UNCERTIFIED_ANSWERS`, or a
    confidence in [0.5, 1) (P(attainment ≥ level) a measured cell needs in the answer)."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return ctx.number("[stopping] uncertified_answer", raw, lo=0.5, hi=1.0, hi_open=True)
    answer = ctx.string("[stopping] uncertified_answer", raw)
    if answer not in UNCERTIFIED_ANSWERS:
        raise ctx.fail("[stopping] uncertified_answer",
                       f"expected one of {', '.join(map(repr, UNCERTIFIED_ANSWERS))} "
                       f"or a confidence in [0.5, 1), got {answer!r}")
    return answer


def parse_campaign(raw: dict[str, Any], path: Path) -> Campaign:
    """Validate an already-parsed campaign mapping; ``path`` names it in errors."""
    ctx = Validator(path)
    refuse_todo(ctx, raw)
    ctx.check_keys("top level", raw, _TOP_KEYS)
    name = ctx.string("name", raw.get("name", path.stem))

    fleet = ctx.table("[fleet]", _section(ctx, raw, "fleet"))
    ctx.check_keys("[fleet]", fleet, _FLEET_KEYS)
    gpus, fleet_pools, usd_per_hour_max = parse_pools(ctx, fleet)

    model = ctx.table("[model]", _section(ctx, raw, "model"))
    ctx.check_keys("[model]", model, _MODEL_KEYS)
    if "family" not in model:
        raise ctx.fail("[model] family", "missing")
    base_dir = path.resolve().parent
    family = _name_or_path(ctx.string("[model] family", model["family"]), base_dir)
    inference = _name_or_path(ctx.string("[model] inference", model.get("inference", "fast")), base_dir)
    certify_inference = _name_or_path(
        ctx.string("[model] certify_inference", model.get("certify_inference", CERTIFY_INFERENCE)), base_dir
    )
    repeatability = ctx.number("[model] repeatability", model.get("repeatability", 0.0), lo=0.0, hi=1.0)
    tail_margin = ctx.number("[model] tail_margin", model.get("tail_margin", MODEL_MARGIN), lo=0.0, hi=2.0)
    success_margin = ctx.number(
        "[model] success_margin", model.get("success_margin", SUCCESS_MARGIN), lo=0.0, hi=5.0
    )
    knee_guard = ctx.integer("[model] knee_guard", model.get("knee_guard", KNEE_GUARD), lo=0)

    meas = ctx.table("[measurement]", _section(ctx, raw, "measurement"))
    if "backend" not in meas:
        raise ctx.fail("[measurement] backend", "missing")
    pool = _pool(ctx, meas, fleet_pools)
    meas = {k: v for k, v in meas.items() if k not in _POOL_KEYS}
    backend = ctx.string("[measurement] backend", meas["backend"])
    options = {k: v for k, v in meas.items() if k not in ("backend", "seed_tables")}
    seed_tables = _seed_tables(ctx, meas.get("seed_tables", []), base_dir)
    measurement = Measurement(backend=backend, options=options, base_dir=base_dir, seed_tables=seed_tables)
    _check_parallel_pools(ctx, backend, pool, fleet_pools)

    stopping = ctx.table("[stopping]", raw.get("stopping", {}))
    ctx.check_keys("[stopping]", stopping, _STOPPING_KEYS)
    epsilon = ctx.number("[stopping] epsilon", stopping.get("epsilon", 0.05), lo=0.0, hi=1.0)
    credible_level = ctx.number(
        "[stopping] credible_level",
        stopping.get("credible_level", 0.9),
        lo=0.0,
        hi=1.0,
        lo_open=True,
        hi_open=True,
    )
    risk = ctx.number("[stopping] risk", stopping.get("risk", 0.05), lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    max_rounds = (
        ctx.integer("[stopping] max_rounds", stopping["max_rounds"], lo=1)
        if "max_rounds" in stopping
        else None
    )

    slo_attainment = _level(ctx, "[stopping] slo_attainment", stopping.get("slo_attainment", DEFAULT_SLO_ATTAINMENT))
    max_windows = ctx.integer("[stopping] max_windows_per_cell", stopping.get("max_windows_per_cell", MAX_WINDOWS_PER_CELL), lo=1)
    answer = _uncertified_answer(ctx, stopping.get("uncertified_answer", UNCERTIFIED_ANSWER))
    budget = _budget(ctx, stopping)
    alternatives = ctx.integer("[stopping] alternatives", stopping.get("alternatives", ALTERNATIVES), lo=0)

    workloads = _parse_workloads(ctx, raw)
    kinds = {isinstance(q, str) for q in (slo_attainment, *(w.slo_attainment for w in workloads)) if q is not None}
    if len(kinds) > 1:
        where = next(f"[[workloads]] {w.name!r} slo_attainment" for w in workloads if w.slo_attainment is not None)
        raise ctx.fail(
            where, 'cannot mix "point" with attainment levels: give every class a level, or "point" to all'
        )

    campaign = Campaign(
        name=name,
        path=path.resolve(),
        gpus=gpus,
        family=family,
        measurement=measurement,
        workloads=workloads,
        pool=pool,
        epsilon=epsilon,
        credible_level=credible_level,
        max_rounds=max_rounds,
        inference=inference,
        certify_inference=certify_inference,
        repeatability=repeatability,
        tail_margin=tail_margin,
        success_margin=success_margin,
        knee_guard=knee_guard,
        risk=risk,
        raw=raw,
        slo_attainment=slo_attainment,
        max_windows_per_cell=max_windows,
        uncertified_answer=answer,
        pools=fleet_pools,
        usd_per_hour_max=usd_per_hour_max,
        alternatives=alternatives,
        configs=parse_catalogue(raw["configs"], str(path)) if "configs" in raw else None,
        **budget,
    )
    return campaign


def _budget(ctx: Validator, stopping: dict[str, Any]) -> dict[str, float]:
    """``[stopping] max_gpu_seconds`` and ``max_wall_s`` where set (each > 0)."""
    return {k: ctx.number(f"[stopping] {k}", stopping[k], lo=0.0, lo_open=True)
            for k in ("max_gpu_seconds", "max_wall_s") if k in stopping}


def parse_pools(ctx: Validator, fleet: dict[str, Any]) -> tuple[int, tuple[FleetPool, ...], float | None]:
    """``[fleet]``: the GPU budget, its ``[[fleet.pools]]`` and the dollar cap.

    Without pools, ``gpus`` is required (one unnamed pool). With pools,
    ``gpus`` is optional: the total the fleet may use, at most the pools'
    sum (default: that sum). ``usd_per_hour_max`` needs priced pools.

    Returns:
        ``(gpus, pools, usd_per_hour_max)``.
    """
    cap = (
        ctx.number("[fleet] usd_per_hour_max", fleet["usd_per_hour_max"], lo=0.0, lo_open=True)
        if "usd_per_hour_max" in fleet
        else None
    )
    if "pools" not in fleet:
        if "gpus" not in fleet:
            raise ctx.fail("[fleet] gpus", "missing")
        if cap is not None:
            raise ctx.fail(
                "[fleet] usd_per_hour_max", "needs [[fleet.pools]] entries with usd_per_gpu_hour"
            )
        return ctx.integer("[fleet] gpus", fleet["gpus"], lo=1), (), None
    raw_pools = fleet["pools"]
    if not isinstance(raw_pools, list) or not raw_pools:
        raise ctx.fail("[[fleet.pools]]", "expected a non-empty array of tables")
    pools: list[FleetPool] = []
    for j, item in enumerate(raw_pools):
        where = f"[[fleet.pools]] #{j + 1}"
        item = ctx.table(where, item)
        ctx.check_keys(where, item, _FLEET_POOL_KEYS)
        for key in ("gpu", "count", "usd_per_gpu_hour"):
            if key not in item:
                raise ctx.fail(f"{where} {key}", "missing")
        gpu, spec = _pool_gpu(ctx, f"{where} gpu", ctx.string(f"{where} gpu", item["gpu"]))
        if any(p.gpu == gpu for p in pools):
            raise ctx.fail(f"{where} gpu", f"{gpu!r} is already pool #{[p.gpu for p in pools].index(gpu) + 1}")
        count = ctx.integer(f"{where} count", item["count"], lo=1)
        price = ctx.number(f"{where} usd_per_gpu_hour", item["usd_per_gpu_hour"], lo=0.0, lo_open=True)
        nodes: tuple[str, ...] = ()
        if "nodes" in item:
            if not isinstance(item["nodes"], list) or not item["nodes"]:
                raise ctx.fail(f"{where} nodes", f"expected a non-empty list of node names, got {item['nodes']!r}")
            nodes = tuple(ctx.string(f"{where} nodes[{n}]", v) for n, v in enumerate(item["nodes"]))
            if len(set(nodes)) != len(nodes):
                raise ctx.fail(f"{where} nodes", "a node is listed twice")
        per_node = (
            ctx.integer(f"{where} gpus_per_node", item["gpus_per_node"], lo=1) if "gpus_per_node" in item else None
        )
        if nodes and per_node is not None and count > len(nodes) * per_node:
            raise ctx.fail(
                f"{where} count",
                f"{count} GPUs do not fit {len(nodes)} node(s) × {per_node} GPUs per node",
            )
        pools.append(FleetPool(gpu, count, price, nodes, per_node, spec))
    available = sum(p.count for p in pools)
    gpus = available
    if "gpus" in fleet:
        gpus = ctx.integer("[fleet] gpus", fleet["gpus"], lo=1)
        if gpus > available:
            raise ctx.fail("[fleet] gpus", f"{gpus} is more than the pools hold ({available})")
    return gpus, tuple(pools), cap


def _pool_gpu(ctx: Validator, where: str, value: str) -> tuple[str, str | None]:
    """A pool's GPU type: a name of the shipped spec table, or a path to a table of one GPU.

    Returns:
        ``(name, spec path or None)``.
    """
    from fleetsieve_bayes.model.derive import gpu_spec, load_gpus

    if value.endswith(".toml") or "/" in value:
        p = (ctx.path.resolve().parent / value).resolve()
        if not p.is_file():
            raise ctx.fail(where, f"GPU spec file not found: {p}")
        try:
            table = load_gpus(p)
        except InputError as exc:
            raise ctx.fail(where, str(exc)) from None
        if len(table) != 1:
            raise ctx.fail(where, f"{p} holds {len(table)} GPUs; a pool's spec file holds exactly one")
        return next(iter(table)), str(p)
    if value.lower() in load_gpus():
        return value.lower(), None
    try:
        return gpu_spec(value).name, None
    except InputError as exc:  # unknown: its did-you-mean and the known names
        raise ctx.fail(where, f"{exc} (or a path to a GPU table)") from None


def refuse_todo(ctx: Validator, raw: dict[str, Any]) -> None:
    """A value still marked ``"TODO…"`` (a skeleton written by ``classes``) is refused, naming it."""

    def walk(value: Any, keys: list[str]) -> None:
        if isinstance(value, str) and re.match(r"TODO(:|\s|$)", value.strip()):
            if keys[0] == "workloads":
                w = raw["workloads"][int(keys[1])]
                name = f"{w['name']!r}" if isinstance(w, dict) and "name" in w else f"#{int(keys[1]) + 1}"
                where = f"[[workloads]] {name} {'.'.join(keys[2:])}"
            else:
                where = f"[{keys[0]}] {'.'.join(keys[1:])}" if len(keys) > 1 else keys[0]
            raise ctx.fail(where, f"still {value.strip()!r}; fill it in before running")
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for k, v in items:
            walk(v, [*keys, str(k)])

    for key, value in raw.items():
        walk(value, [key])


def _parse_workloads(ctx: Validator, raw: dict[str, Any]) -> tuple[Workload, ...]:
    """The ``[[workloads]]`` array: names unique, demand > 0, an SLO with ``success_min``."""
    raw_workloads = raw.get("workloads")
    if raw_workloads is None:
        raise ctx.fail("[[workloads]]", "missing: a campaign needs at least one workload class")
    if not isinstance(raw_workloads, list) or not raw_workloads:
        raise ctx.fail("[[workloads]]", "expected a non-empty array of tables")
    workloads: list[Workload] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw_workloads):
        where = f"[[workloads]] #{i + 1}"
        item = ctx.table(where, item)
        ctx.check_keys(where, item, _WORKLOAD_KEYS)
        if "name" not in item:
            raise ctx.fail(f"{where} name", "missing")
        wname = ctx.string(f"{where} name", item["name"])
        where = f"[[workloads]] {wname!r}"
        if wname in seen:
            raise ctx.fail(
                f"{where} name", f"duplicate workload name (also workload #{seen[wname] + 1})"
            )
        seen[wname] = i
        if "demand_rps" not in item:
            raise ctx.fail(f"{where} demand_rps", "missing")
        demand = ctx.number(f"{where} demand_rps", item["demand_rps"], lo=0.0, lo_open=True)
        critical = ctx.boolean(f"{where} critical", item.get("critical", False))
        floor = ctx.number(f"{where} floor", item.get("floor", 1.0), lo=0.0, hi=1.0)
        if "slo" not in item:
            raise ctx.fail(f"{where} slo", "missing")
        slo_raw = ctx.table(f"{where} slo", item["slo"])
        ctx.check_keys(f"{where} slo", slo_raw, _SLO_KEYS)
        if "success_min" not in slo_raw:
            raise ctx.fail(f"{where} slo.success_min", "missing")
        slo = SLO(
            success_min=ctx.number(f"{where} slo.success_min", slo_raw["success_min"], lo=0.0, hi=1.0),
            ttft_p99_s=(
                ctx.number(f"{where} slo.ttft_p99_s", slo_raw["ttft_p99_s"], lo=0.0, lo_open=True)
                if "ttft_p99_s" in slo_raw
                else None
            ),
            completion_p99_s=(
                ctx.number(
                    f"{where} slo.completion_p99_s", slo_raw["completion_p99_s"], lo=0.0, lo_open=True
                )
                if "completion_p99_s" in slo_raw
                else None
            ),
        )
        level = _level(ctx, f"{where} slo_attainment", item["slo_attainment"]) if "slo_attainment" in item else None
        workloads.append(Workload(wname, demand, slo, critical, floor, level))

    return tuple(workloads)


def _level(ctx: Validator, where: str, value: Any) -> float | str:
    """An SLO-attainment setting (:func:`fleetsieve_bayes.decision.intervals.check_level`)."""
    try:
        return check_level(value, where)
    except ValueError as exc:
        raise ctx.fail(where, str(exc).removeprefix(f"{where} ")) from None


def _name_or_path(value: str, base_dir: Path) -> str:
    """A shipped name stays a name; a path (``.toml`` or with a ``/``) resolves against the campaign folder."""
    if value.endswith(".toml") or "/" in value:
        return str((base_dir / value).resolve())
    return value


def _check_file(ctx: Validator, where: str, p: Path) -> None:
    if p.is_dir():
        raise ctx.fail(where, f"{p} is a directory, not a table file")
    if not p.is_file():
        raise ctx.fail(where, f"file not found: {p}")


def _seed_tables(ctx: Validator, value: Any, base_dir: Path) -> tuple[Path, ...]:
    where = "[measurement] seed_tables"
    if not isinstance(value, list):
        raise ctx.fail(where, f"expected a list of table paths, got {value!r}")
    out: list[Path] = []
    for i, v in enumerate(value):
        p = (base_dir / ctx.string(f"{where}[{i}]", v)).resolve()
        _check_file(ctx, f"{where}[{i}]", p)
        if p in out:
            raise ctx.fail(f"{where}[{i}]", f"{p} is listed twice")
        out.append(p)
    return tuple(out)


def _pool(ctx: Validator, meas: dict[str, Any], fleet_pools: tuple[FleetPool, ...]) -> ProfilingPool:
    """The ``[measurement]`` keys shared by every backend: pool size (a count, or a count per
    ``[[fleet.pools]]`` GPU type) and executor."""
    per_gpu = None
    if isinstance(meas.get("pool_gpus"), dict):
        per_gpu = _pool_gpus_table(ctx, meas["pool_gpus"], fleet_pools)
        pool_gpus: int | None = sum(per_gpu)
    else:
        pool_gpus = (
            ctx.integer("[measurement] pool_gpus", meas["pool_gpus"], lo=1) if "pool_gpus" in meas else None
        )
    executor = ctx.string("[measurement] executor", meas.get("executor", "local"))
    if executor not in EXECUTORS:
        raise ctx.fail("[measurement] executor", f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    ray_address = None
    if "ray_address" in meas:
        ray_address = ctx.string("[measurement] ray_address", meas["ray_address"])
        if executor != "ray":
            raise ctx.fail("[measurement] ray_address", 'only meaningful with executor = "ray"')
    return ProfilingPool(pool_gpus=pool_gpus, executor=executor, ray_address=ray_address, per_gpu=per_gpu)


def _pool_gpus_table(ctx: Validator, raw: dict[str, Any], fleet_pools: tuple[FleetPool, ...]) -> tuple[int, ...]:
    """Each pool's profiling GPUs (pool order) from ``pool_gpus = { TYPE = n, … }``: a key is
    a pool's GPU type (any case); every pool needs one."""
    import difflib

    where = "[measurement] pool_gpus"
    names = [p.gpu for p in fleet_pools]
    if len(names) < 2:
        raise ctx.fail(where, f"a table of GPU types needs two or more [[fleet.pools]]; expected a count, e.g. "
                              f"pool_gpus = 8, got {raw!r}")
    aliases = {n.lower(): j for j, n in enumerate(names)}
    counts: dict[int, int] = {}
    for key, value in raw.items():
        j = aliases.get(str(key).strip().lower())
        if j is None:
            close = difflib.get_close_matches(str(key).strip().lower(), sorted(aliases), n=1)
            hint = f" (did you mean {names[aliases[close[0]]]!r}?)" if close else ""
            raise ctx.fail(f"{where}.{key}", f"{key!r} is not the GPU type of a [[fleet.pools]] entry{hint}; "
                                             f"pools: {', '.join(names)}")
        if j in counts:
            raise ctx.fail(f"{where}.{key}", f"pool {names[j]!r} is given twice")
        counts[j] = ctx.integer(f"{where}.{key}", value, lo=1)
    for j, n in enumerate(names):
        if j not in counts:
            raise ctx.fail(f"{where}.{n}", f"missing: pool {n!r} has no profiling GPUs (one entry per [[fleet.pools]])")
    return tuple(counts[j] for j in range(len(names)))


def _check_parallel_pools(ctx: Validator, backend: str, pool: ProfilingPool, fleet_pools: tuple[FleetPool, ...]) -> None:
    """A vLLM campaign of several ``[[fleet.pools]]`` measures several cells at once with a
    count per GPU type: each cell on its own pool's devices (local), or on a Ray node
    advertising its type (Ray)."""
    if backend != "vllm" or len(fleet_pools) < 2 or not pool.parallel:
        return
    n = len(fleet_pools)
    if pool.per_gpu is None:
        example = ", ".join(f"{p.gpu} = {min(p.count, 4)}" for p in fleet_pools)
        got = "" if pool.pool_gpus is None else f", got {pool.pool_gpus}"
        raise ctx.fail(
            "[measurement] pool_gpus",
            f"a vLLM campaign of {n} [[fleet.pools]] needs the profiling GPUs of each type, e.g. "
            f"pool_gpus = {{ {example} }}{got}",
        )


def _section(ctx: Validator, raw: dict[str, Any], name: str) -> Any:
    """A required top-level section, or an error naming it."""
    if name not in raw:
        raise ctx.fail(f"[{name}]", "missing section")
    return raw[name]
