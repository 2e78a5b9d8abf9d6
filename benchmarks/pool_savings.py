"""What a mixed GPU fleet saves over the best single-type fleet, on fully known tables.

Synthetic fleets (fixed seed): random classes on a reference H100 table
(:func:`allocator_speed.synthetic_instance`), each class with its own prompt
and output lengths; the same cells on other GPU types scaled by the roofline
ratios of a 31B dense FP8 decoder for that class's request shape
(:func:`fleetsieve_bayes.model.gpu_axis.gpu_axis`: decode-bound capacity
follows bandwidth, prefill FLOP/s, the batch memory), so the best type
differs by class. Each fleet gets 2–3 pools of random size and the
illustrative prices of :data:`PRICES`. "Roomy" fleets: 8–24 GPUs per pool
and 0.35× :func:`allocator_speed.synthetic_instance`'s demand (a single type
can often serve everything); "tight": 2–6 H100s and 0.6× the demand.

For every fleet it solves the exact allocation (MILP) with all pools, and
with each pool alone, and reports whether the mixed fleet is at least as good
as every single-type fleet lexicographically (min fulfillment, then goodput,
then dollars — it must be: the single-type fleets are feasible for it), how
often it serves strictly more, and its dollar saving where it serves the same
as the best single-type fleet. The JAX allocator is checked against the
MILP on every mixed problem.

    python benchmarks/pool_savings.py [--fleets 30] [--seed 0] [--out FILE] [--publish]

Prints a markdown table and writes JSON (default benchmarks/results/pool_savings.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from allocator_speed import synthetic_instance  # noqa: E402

from fleetsieve_bayes.allocation.batched import allocate_jax  # noqa: E402
from fleetsieve_bayes.allocation.milp import allocate_milp  # noqa: E402
from fleetsieve_bayes.allocation.objective import DEFAULT_TOL, within  # noqa: E402
from fleetsieve_bayes.allocation.problem import Allocation, CellGrid  # noqa: E402
from fleetsieve_bayes.model.derive import Workload, load_architecture, load_gpus  # noqa: E402
from fleetsieve_bayes.model.gpu_axis import gpu_axis  # noqa: E402

# Illustrative on-demand prices, $/GPU-hour (not quotes; the study's ranking
# of fleets depends on their ratios only).
PRICES = {"h100-sxm-80gb": 4.0, "h200-141gb": 5.0, "a100-80gb": 2.0, "l40s-48gb": 1.0}
TPS = (1, 2, 4, 8)


def mixed_fleet(rng: np.random.Generator, n_classes: int, cells_per_class: int, tight: bool) -> dict[str, Any]:
    """One synthetic fleet: grid over 2–3 GPU types, values, problem, and its description."""
    types = ["h100-sxm-80gb"] + list(rng.choice(["h200-141gb", "a100-80gb", "l40s-48gb"], rng.integers(1, 3), replace=False))
    base_grid, base_values, base_problem = synthetic_instance(rng, n_classes, cells_per_class, 16)
    arch = load_architecture("dense-31b")
    specs = load_gpus()
    shapes = [Workload(float(rng.choice([300, 1000, 4000])), float(rng.choice([100, 300, 1000]))) for _ in range(n_classes)]
    ratios = [
        gpu_axis(arch, [specs[t] for t in types], "h100-sxm-80gb", dtype="fp8", workload=w, tps=TPS) for w in shapes
    ]
    rows_w, rows_g, rows_tp, rows_v, rows_load, rows_off = [], [], [], [], [], []
    for c in range(base_grid.n_cells):
        i, tp = int(base_grid.workload_idx[c]), int(base_grid.tp[c])
        j = TPS.index(tp)
        for g in range(len(types)):
            ax = ratios[i]
            if not ax.feasible[g, j]:
                continue
            v = base_values[c].copy()
            v[0] *= float(np.exp(ax.log_capacity[g, j]))
            v[1] *= float(np.exp(ax.log_ttft[g, j]))
            v[2] *= float(np.exp(ax.log_completion[g, j]))
            rows_w.append(i)
            rows_g.append(g)
            rows_tp.append(tp)
            rows_v.append(v)
            rows_load.append(base_grid.load[c])
            rows_off.append(base_grid.offered_rps[c])
    order = np.lexsort((np.array(rows_off), np.array(rows_tp), np.array(rows_g), np.array(rows_w)))
    n = len(order)
    grid = CellGrid(
        workloads=base_grid.workloads,
        workload_idx=np.array(rows_w, np.int64)[order],
        tp=np.array(rows_tp, np.int64)[order],
        load=tuple(f"{rows_load[k]}" for k in order),
        offered_rps=np.array(rows_off)[order],
        duration_s=np.full(n, 300.0),
        gpu=np.array(rows_g, np.int64)[order],
        pools=tuple(types),
    )
    values = np.array(rows_v)[order]
    counts = rng.integers(8, 25, len(types))
    if tight:
        counts[0] = rng.integers(2, 7)  # too few H100s for the demand
    price = np.array([PRICES[t] for t in types])
    problem = base_problem._replace(
        demand=base_problem.demand * (0.6 if tight else 0.35),
        gpus=int(counts.sum()),
        pool_gpus=counts,
        usd_per_gpu_hour=price,
    )
    return {"grid": grid, "values": values, "problem": problem, "types": types, "counts": counts.tolist()}


def _better_or_equal(a: Allocation, b: Allocation, tol: float = DEFAULT_TOL) -> bool:
    """``a`` is lexicographically at least ``b`` (feasibility, min r, goodput, then dollars)."""
    if a.feasible != b.feasible:
        return a.feasible
    if not a.feasible:
        return True
    if a.min_fulfillment < within(b.min_fulfillment, tol):
        return False
    if a.min_fulfillment > b.min_fulfillment * (1 + tol):
        return True
    if a.goodput_rps < within(b.goodput_rps, tol):
        return False
    if a.goodput_rps > b.goodput_rps * (1 + tol):
        return True
    return a.usd_per_hour <= b.usd_per_hour * (1 + tol)


def _same_service(a: Allocation, b: Allocation, tol: float = 1e-6) -> bool:
    return (
        a.feasible == b.feasible
        and abs(a.min_fulfillment - b.min_fulfillment) <= tol * max(1.0, b.min_fulfillment)
        and abs(a.goodput_rps - b.goodput_rps) <= tol * max(1.0, b.goodput_rps)
    )


def study_fleet(fleet: dict[str, Any]) -> dict[str, Any]:
    grid, values, problem = fleet["grid"], fleet["values"], fleet["problem"]
    mixed = allocate_milp(grid, values, problem)
    jx = allocate_jax(grid, values, problem)
    singles = []
    for p in range(grid.n_pools):
        only = problem._replace(pool_gpus=np.where(np.arange(grid.n_pools) == p, problem.pool_gpus, 0))
        singles.append(allocate_milp(grid, values, only))
    k_best = 0
    for k in range(1, len(singles)):
        if not _better_or_equal(singles[k_best], singles[k]):
            k_best = k
    best = singles[k_best]
    used = [] if mixed.pool_gpus_used is None else [int(x) for x in mixed.pool_gpus_used]
    same = _same_service(mixed, best)
    saving = (best.usd_per_hour - mixed.usd_per_hour) / best.usd_per_hour if same and best.usd_per_hour else None
    return {
        "types": fleet["types"],
        "counts": fleet["counts"],
        "cells": grid.n_cells,
        "mixed": {
            "min_fulfillment": mixed.min_fulfillment,
            "goodput_rps": mixed.goodput_rps,
            "usd_per_hour": mixed.usd_per_hour,
            "pool_gpus_used": used,
        },
        "best_single": {
            "gpu": fleet["types"][k_best],
            "min_fulfillment": best.min_fulfillment,
            "goodput_rps": best.goodput_rps,
            "usd_per_hour": best.usd_per_hour,
        },
        "dominates_every_single": all(_better_or_equal(mixed, s) for s in singles),
        "serves_more": (not same) and _better_or_equal(mixed, best),
        "feasible": mixed.feasible,
        "uses_several_types": int(np.count_nonzero(used)) > 1,
        "saving": saving,
        "jax_agrees": bool(
            jx.feasible == mixed.feasible
            and abs(jx.min_fulfillment - mixed.min_fulfillment) <= 1e-5
            and abs(jx.goodput_rps - mixed.goodput_rps) <= 1e-5 * float(problem.demand.sum())
            and abs((jx.usd_per_hour or 0.0) - (mixed.usd_per_hour or 0.0)) <= 1e-5 * max(1.0, mixed.usd_per_hour or 0.0)
            and jx.gpus_used == mixed.gpus_used
        ),
    }


def published_table(res: dict[str, Any]) -> str:
    """Summary per fleet kind (tight: too few H100s; roomy), then one row per fleet."""
    lines = [
        "| fleets | kind | mix ≥ every single type | mix serves more | same service: mean saving | max saving | uses ≥ 2 types | JAX = MILP |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind in ("tight", "roomy"):
        rows = [r for r in res["fleets"] if r["kind"] == kind]
        if not rows:
            continue
        sav = [r["saving"] for r in rows if r["saving"] is not None]
        lines.append(
            f"| {len(rows)} | {kind} | {sum(r['dominates_every_single'] for r in rows)}/{len(rows)} | "
            f"{sum(r['serves_more'] for r in rows)} | "
            + (f"{100 * float(np.mean(sav)):.1f} % of {len(sav)} | {100 * max(sav):.1f} % | " if sav else "— of 0 | — | ")
            + f"{sum(r['uses_several_types'] for r in rows)} | "
            f"{sum(r['jax_agrees'] for r in rows)}/{len(rows)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fleets", type=int, default=30, help="fleets per kind (tight, roomy)")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--cells-per-class", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "pool_savings.json")
    p.add_argument("--publish", action="store_true", help="publish the JSON and its docs/results.md section")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    fleets = []
    for kind in ("tight", "roomy"):
        for _ in range(args.fleets):
            row = study_fleet(mixed_fleet(rng, args.classes, args.cells_per_class, kind == "tight"))
            fleets.append({"kind": kind, **row})
    meta = {"seed": args.seed, "jax": jax.__version__, "machine": platform.machine(), "prices": PRICES}
    res = {"meta": meta, "fleets": fleets}
    md = published_table(res)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    print(f"\nwrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("pool_savings", res, md, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
