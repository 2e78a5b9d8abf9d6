"""``fleetsieve-bayes allocate CAMPAIGN.toml [--table FILE] [--demand-scale X[,Y,...]] [--solver milp|jax] [--json]``.

Solves the exact lexicographic allocation on a fully known table (by default
the campaign's replay table). With one demand scale, ``--json`` prints
``{status, allocation, objective: {min_fulfillment, goodput_rps, gpus_used}}``
(with ``[[fleet.pools]]``: each class's ``gpu`` and the fleet's ``usd_per_hour``);
with several, a list of those objects, each with its ``demand_scale``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from fleetsieve_bayes.allocation.objective import objective_json
from fleetsieve_bayes.allocation.problem import (
    Allocation,
    CellGrid,
    allocation_to_json,
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import Campaign, load_campaign
from fleetsieve_bayes.configs import table_for_campaign
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import read_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "allocate",
        help="solve the exact fleet allocation on a fully known table",
        description="Solve the lexicographic fleet allocation (critical floors, max min-fulfillment, "
        "max goodput, min GPUs) on a fully measured table.",
    )
    p.add_argument("campaign", type=Path, help="campaign TOML file")
    p.add_argument(
        "--table",
        type=Path,
        default=None,
        help="measurement table (default: the campaign's replay table)",
    )
    p.add_argument(
        "--demand-scale",
        default="1.0",
        help="multiply every class's demand; a comma-separated list solves each (e.g. 0.7,1.0,1.3)",
    )
    p.add_argument(
        "--solver", choices=("milp", "jax"), default="milp", help="exact allocator to use"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=main)


def parse_scales(text: str) -> list[float]:
    """``"0.7,1.0,1.3"`` → ``[0.7, 1.0, 1.3]``; each must be a finite number > 0."""
    scales: list[float] = []
    for part in text.split(","):
        try:
            x = float(part)
        except ValueError:
            raise InputError(f"--demand-scale: {part.strip()!r} is not a number") from None
        if not math.isfinite(x) or x <= 0:
            raise InputError(f"--demand-scale: must be a finite number > 0, got {part.strip()!r}")
        scales.append(x)
    return scales


def _table_path(campaign: Campaign, table: Path | None) -> Path:
    if table is not None:
        return table
    path = campaign.measurement.table
    if path is None:
        raise InputError(
            f"{campaign.path}: [measurement] has no table (backend {campaign.measurement.backend!r}); pass --table FILE"
        )
    return path


def solve(campaign: Campaign, grid: CellGrid, values: Any, scale: float, solver: str) -> Allocation:
    """One allocation at ``scale`` × demand with the chosen exact solver."""
    problem = campaign.problem(demand_scale=scale)
    if solver == "jax":
        from fleetsieve_bayes.allocation.batched import allocate_jax

        return allocate_jax(grid, values, problem)
    from fleetsieve_bayes.allocation.milp import allocate_milp

    return allocate_milp(grid, values, problem)


def result_json(alloc: Allocation, grid: CellGrid) -> dict[str, Any]:
    """The ``{status, allocation, objective}`` object of ``allocate --json`` (docs/contracts.md)."""
    return {
        "status": alloc.status,
        "allocation": allocation_to_json(alloc, grid),
        "objective": objective_json(alloc, digits=9),
    }


def main(args: argparse.Namespace) -> int:
    scales = parse_scales(args.demand_scale)
    campaign = load_campaign(args.campaign)
    path = _table_path(campaign, args.table)
    df = read_table(path)
    df = table_for_campaign(df, campaign.configs, str(path), str(campaign.path))
    grid = grid_from_table(df, campaign.workload_names, source=str(path), pools=campaign.pool_names,
                           configs=campaign.configs)
    values = values_from_table(grid, df, source=str(path))
    results = []
    for s in scales:
        obj = result_json(solve(campaign, grid, values, s, args.solver), grid)
        results.append({"demand_scale": s, **obj})
    if args.json:
        if len(scales) == 1:
            results[0].pop("demand_scale")
            print(json.dumps(results[0], indent=2))
        else:
            print(json.dumps(results, indent=2))
    else:
        _print_table(campaign, results)
    return 0


def _print_table(campaign: Campaign, results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    budget = " + ".join(f"{p.count} {p.gpu}" for p in campaign.pools) or str(campaign.gpus)
    table = Table(title=f"{campaign.name}: {budget} GPUs")
    table.add_column("demand ×", justify="right")
    table.add_column("status")
    table.add_column("min fulfil.", justify="right")
    table.add_column("goodput req/s", justify="right")
    table.add_column("GPUs", justify="right")
    priced = any("usd_per_hour" in r["objective"] for r in results)
    if priced:
        table.add_column("$/h", justify="right")
    for name in campaign.workload_names:
        table.add_column(name, no_wrap=True)
    for r in results:
        obj = r["objective"]
        cells = []
        for name in campaign.workload_names:
            a = (r["allocation"] or {}).get(name)
            on = f" {a['gpu']}" if a and a.get("gpu") else ""
            cells.append(
                "—" if not a or not a["replicas"] else f"{a.get('config') or 'TP' + str(a['tp'])}@{a['load']} ×{a['replicas']}{on}"
            )
        table.add_row(
            f"{r['demand_scale']:g}",
            r["status"],
            f"{obj['min_fulfillment']:.3f}",
            f"{obj['goodput_rps']:.2f}",
            str(obj["gpus_used"]),
            *([f"{obj['usd_per_hour']:.2f}"] if priced else []),
            *cells,
        )
    Console().print(table)
