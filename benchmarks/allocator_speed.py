"""Speed of the exact allocators: MILP (CBC) vs JAX, and JAX batch throughput.

For random synthetic instances (fixed seed) from 2 classes × 20 cells × 16 GPUs
up to 8 classes × 200 cells per class × 512 GPUs it times, side by side in one
run:

* ``allocate_milp`` with the exact Pareto pruning (the default) and without it
  (the full MILP, with a per-stage time limit);
* the JAX allocator's first call (trace + compile + run) and its steady state
  on one table;
* and checks that all of them agree on status, min fulfillment, goodput and
  GPUs used.

Then it measures JAX throughput (tables/second) on a batch of perturbed tables
at the shipped-grid size (2 classes × 11 cells, 16 GPUs) and at one larger size.

Mixed GPU pools (``--pools``): random instances with P GPU types of different
speed and price (:data:`POOL_TYPES`), each class's cells spread over the
pools, a pool count each and a dollar cap; it times the MILP and the JAX
allocator (first call, steady state) and checks that they agree on status,
min fulfillment, goodput, dollars per hour and GPUs. ``POOLSxCLASSESxCELLSxGPUS``
(cells per class over all pools, GPUs per pool; ``16-8-32`` gives each pool its
own count). Beside the JAX allocator, whose DP runs over each pool's own axis
(∏ (G_p + 1) states), it times the same DP on one shared axis ((max G + 1)^P
states), which gives the same answer.

    python benchmarks/allocator_speed.py            # quick default (a few minutes)
    python benchmarks/allocator_speed.py --sizes 2x20x16,8x200x512 --batch 4096 --out FILE
    python benchmarks/allocator_speed.py --pools-only --pools 3x8x200x16,3x8x200x32,3x8x200x32-16-8

Prints a markdown table and writes JSON (default benchmarks/results/allocator_speed.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.allocation.batched import make_jax_allocator, solve_jax_problem
from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid

DEFAULT_SIZES = "2x20x16,4x50x64,8x100x256,8x200x512"
DEFAULT_POOL_SIZES = "2x4x50x16,3x8x200x16,3x8x200x32,3x8x200x32-16-8"
# GPU types of the pool instances: (name, capacity factor vs the first, $/GPU-hour).
POOL_TYPES = (("fast", 1.0, 4.0), ("mid", 0.55, 1.8), ("slow", 0.3, 0.9))
TP_CHOICES = np.array([1, 2, 4, 8])
# Per-GPU efficiency by TP: an interior knee at TP4 (the premise of docs/contracts.md's allocation problem).
TP_EFFICIENCY = {1: 1.0, 2: 1.05, 4: 1.1, 8: 0.8}


def synthetic_instance(
    rng: np.random.Generator, n_classes: int, cells_per_class: int, gpus: int
) -> tuple[CellGrid, np.ndarray, AllocationProblem]:
    """A random instance whose demand roughly fills the budget, about half the cells inadmissible.

    Returns ``grid`` (n_classes·cells_per_class cells), ``values (n_cells, 4)`` and the problem.
    """
    n = n_classes * cells_per_class
    widx = np.repeat(np.arange(n_classes), cells_per_class)
    tp = rng.choice(TP_CHOICES, size=n)
    load = rng.uniform(0.05, 1.0, n)  # load setting as a fraction of saturation
    order = np.lexsort((load, tp, widx))
    widx, tp, load = widx[order], tp[order], load[order]
    base = rng.uniform(0.5, 2.0, n_classes)[widx]  # req/s per GPU at saturation
    eff = np.array([TP_EFFICIENCY[int(t)] for t in tp])
    capacity = tp * base * eff * (0.2 + 0.8 * load) * rng.uniform(0.95, 1.05, n)
    ttft = (0.2 + 4.0 * load**2 / tp**0.3) * rng.uniform(0.8, 1.2, n)
    completion = (4.0 + 50.0 * load**2 / tp**0.2) * rng.uniform(0.8, 1.2, n)
    success = np.clip(1.0 - 0.04 * load**3 * rng.uniform(0.5, 1.5, n), 0.0, 1.0)
    values = np.stack([capacity, ttft, completion, success], axis=1)
    grid = CellGrid(
        workloads=tuple(f"class{i}" for i in range(n_classes)),
        workload_idx=widx.astype(np.int64),
        tp=tp.astype(np.int64),
        load=tuple(f"L{j}" for j in range(n)),
        offered_rps=capacity.copy(),
        duration_s=np.full(n, 300.0),
    )
    # Demand: each class's fair share of the budget at ~2/3 of peak per-GPU capacity, jittered.
    peak = np.array([base[widx == i][0] for i in range(n_classes)]) if n else np.zeros(0)
    demand = peak * (gpus / n_classes) * rng.uniform(0.9, 1.5, n_classes)
    critical = np.zeros(n_classes, bool)
    critical[0] = True
    problem = AllocationProblem(
        demand=demand,
        critical=critical,
        floor=np.full(n_classes, 0.5),
        success_min=np.full(n_classes, 0.99),
        ttft_max=np.full(n_classes, 2.0),
        completion_max=np.where(np.arange(n_classes) % 2 == 0, 30.0, np.inf),
        gpus=gpus,
    )
    return grid, values, problem


def pool_instance(
    rng: np.random.Generator, n_pools: int, n_classes: int, cells_per_class: int, gpus_per_pool: int | tuple[int, ...]
) -> tuple[CellGrid, np.ndarray, AllocationProblem]:
    """A random mixed-pool instance: :func:`synthetic_instance`'s cells spread over ``n_pools`` GPU types.

    Each cell's capacity is scaled by its pool's factor and a class-specific
    affinity (so the best type differs by class); demand fills about the
    fast pool's worth of GPUs, and the dollar cap sits at 70 % of the
    all-pools cost, so the cap, the pools and the prices all bind.

    ``gpus_per_pool``: every pool's count, or each pool's ``(n_pools,)``.
    """
    counts = np.broadcast_to(np.asarray(gpus_per_pool, np.int64), (n_pools,))
    grid, values, problem = synthetic_instance(rng, n_classes, cells_per_class, int(counts.sum()))
    types = POOL_TYPES[:n_pools]
    pool = rng.integers(0, n_pools, grid.n_cells)
    affinity = rng.uniform(0.7, 1.4, (n_classes, n_pools))
    factor = np.array([t[1] for t in types])[pool] * affinity[grid.workload_idx, pool]
    values = values.copy()
    values[:, 0] *= factor
    order = np.lexsort((grid.offered_rps, grid.tp, pool, grid.workload_idx))
    grid = grid._replace(
        workload_idx=grid.workload_idx[order],
        tp=grid.tp[order],
        load=tuple(grid.load[j] for j in order),
        offered_rps=grid.offered_rps[order],
        duration_s=grid.duration_s[order],
        gpu=pool[order].astype(np.int64),
        pools=tuple(t[0] for t in types),
    )
    values = values[order]
    price = np.array([t[2] for t in types])
    problem = problem._replace(
        pool_gpus=counts.copy(),
        usd_per_gpu_hour=price,
        usd_per_hour_max=float(0.7 * (counts * price).sum()),
        demand=problem.demand * 0.6,
    )
    return grid, values, problem


def bench_pools(rng: np.random.Generator, n_p: int, k: int, per: int, g: int | tuple[int, ...], *,
                repeats: int) -> dict[str, Any]:
    """MILP and JAX on one mixed-pool instance: times and agreement; the JAX DP on one shared axis beside it."""
    grid, values, problem = pool_instance(rng, n_p, k, per, g)
    row: dict[str, Any] = {"pools": n_p, "classes": k, "cells_per_class": per,
                           "gpus_per_pool": g if isinstance(g, int) else list(g)}
    row["milp_s"], milp = _time(lambda: allocate_milp(grid, values, problem), repeats)
    allocator = make_jax_allocator(grid, problem)
    v = jnp.asarray(values)
    t0 = time.perf_counter()
    jax.block_until_ready(allocator.solve(v))
    row["jax_first_call_s"] = time.perf_counter() - t0
    row["jax_steady_s"], out = _time(lambda: jax.block_until_ready(allocator.solve(v)), repeats)
    shared = jax.jit(partial(solve_jax_problem, allocator.spec, max_gpus=max(allocator.max_gpus), tol=allocator.tol))
    jax.block_until_ready(shared(v))
    row["jax_shared_axis_steady_s"], one = _time(lambda: jax.block_until_ready(shared(v)), repeats)
    row["shared_axis_agrees"] = bool(np.array_equal(np.asarray(one.cell), np.asarray(out.cell))
                                     and np.array_equal(np.asarray(one.replicas), np.asarray(out.replicas)))
    row.update(
        status=milp.status,
        min_fulfillment=milp.min_fulfillment,
        goodput_rps=milp.goodput_rps,
        usd_per_hour=milp.usd_per_hour,
        gpus_used=milp.gpus_used,
        pool_gpus_used=[int(x) for x in (milp.pool_gpus_used if milp.pool_gpus_used is not None else [])],
    )
    row["jax_agrees"] = bool(
        bool(out.feasible) == milp.feasible
        and abs(float(out.min_fulfillment) - milp.min_fulfillment) <= 1e-5
        and abs(float(out.goodput) - milp.goodput_rps) <= 1e-5 * float(problem.demand.sum()) + 1e-4
        and abs(float(out.usd_per_hour) - (milp.usd_per_hour or 0.0)) <= 1e-5 * max(1.0, milp.usd_per_hour or 0.0)
        and int(out.gpus_used) == milp.gpus_used
    )
    return row


def _time(fn: Any, repeats: int) -> tuple[float, Any]:
    """Median wall time over ``repeats`` calls and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_size(
    rng: np.random.Generator, k: int, per: int, g: int, *, unpruned_limit: float, repeats: int
) -> dict[str, Any]:
    grid, values, problem = synthetic_instance(rng, k, per, g)
    row: dict[str, Any] = {"classes": k, "cells_per_class": per, "gpus": g}
    row["milp_s"], milp = _time(lambda: allocate_milp(grid, values, problem), repeats)
    if unpruned_limit > 0:
        t0 = time.perf_counter()
        try:
            full = allocate_milp(grid, values, problem, prune=False, time_limit=unpruned_limit)
            row["milp_unpruned_s"] = time.perf_counter() - t0
            row["unpruned_agrees"] = _agree(milp, full)
        except RuntimeError:
            row["milp_unpruned_s"] = None  # hit the per-stage time limit
            row["unpruned_agrees"] = None
    allocator = make_jax_allocator(grid, problem)
    v = jnp.asarray(values)
    t0 = time.perf_counter()
    jax.block_until_ready(allocator.solve(v))
    row["jax_first_call_s"] = time.perf_counter() - t0
    row["jax_steady_s"], out = _time(lambda: jax.block_until_ready(allocator.solve(v)), repeats)
    jx = (bool(out.feasible), float(out.min_fulfillment), float(out.goodput), int(out.gpus_used))
    row["status"] = milp.status
    row["min_fulfillment"] = milp.min_fulfillment
    row["goodput_rps"] = milp.goodput_rps
    row["gpus_used"] = milp.gpus_used
    row["jax_agrees"] = (
        jx[0] == milp.feasible
        and abs(jx[1] - milp.min_fulfillment) <= 1e-5
        and abs(jx[2] - milp.goodput_rps) <= 1e-5 * float(problem.demand.sum()) + 1e-4
        and jx[3] == milp.gpus_used
    )
    return row


def _agree(a: Any, b: Any) -> bool:
    return (
        a.status == b.status
        and abs(a.min_fulfillment - b.min_fulfillment) <= 1e-6
        and abs(a.goodput_rps - b.goodput_rps) <= 1e-6 * max(1.0, a.goodput_rps)
        and a.gpus_used == b.gpus_used
    )


def bench_batch(
    rng: np.random.Generator,
    label: str,
    grid: CellGrid,
    values: np.ndarray,
    problem: AllocationProblem,
    batch: int,
) -> dict[str, Any]:
    """Tables/second of ``solve`` on ``batch`` perturbed copies of ``values``."""
    noise = rng.lognormal(0.0, 0.15, size=(batch, *values.shape))
    tables = jnp.asarray(values[None] * noise)
    allocator = make_jax_allocator(grid, problem)
    t0 = time.perf_counter()
    jax.block_until_ready(allocator.solve(tables))
    first = time.perf_counter() - t0
    steady, out = _time(lambda: jax.block_until_ready(allocator.solve(tables)), 3)
    return {
        "size": label,
        "batch": batch,
        "first_call_s": first,
        "steady_s": steady,
        "tables_per_s": batch / steady,
        "feasible_fraction": float(jnp.mean(out.feasible)),
    }


def shipped_grid() -> tuple[CellGrid, np.ndarray, AllocationProblem]:
    from fleetsieve_bayes.allocation.problem import (
        grid_from_table,
        values_from_table,
    )
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.resources import data_dir
    from fleetsieve_bayes.table import read_table

    campaign = load_campaign(data_dir("examples") / "h100_31b_fp8" / "campaign.toml")
    df = read_table(campaign.measurement.table)
    grid = grid_from_table(df, campaign.workload_names)
    return grid, values_from_table(grid, df), campaign.problem()


def published_table(res: dict[str, Any]) -> str:
    """The markdown tables of a run's JSON ``res``: exact solves per size, then JAX batch throughput."""

    def fmt(x: Any) -> str:
        return "timeout" if x is None else f"{x * 1e3:.1f}"

    lines = [
        "| classes × cells/class × GPUs | MILP pruned ms | MILP full ms | JAX first call ms | JAX steady ms | status | min r | goodput | GPUs | agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["sizes"]:
        agree = r["jax_agrees"] and r.get("unpruned_agrees") in (True, None)
        lines.append(
            f"| {r['classes']}×{r['cells_per_class']}×{r['gpus']} | {fmt(r['milp_s'])} | "
            f"{fmt(r.get('milp_unpruned_s'))} | {fmt(r['jax_first_call_s'])} | {fmt(r['jax_steady_s'])} | "
            f"{r['status']} | {r['min_fulfillment']:.4f} | {r['goodput_rps']:.2f} | {r['gpus_used']} | {agree} |"
        )
    lines += ["", "| JAX batch | tables | first call s | steady s | tables/s |", "|---|---|---|---|---|"]
    for b in res["batches"]:
        lines.append(
            f"| {b['size']} | {b['batch']} | {b['first_call_s']:.2f} | {b['steady_s']:.3f} | {b['tables_per_s']:.0f} |"
        )
    if res.get("pools"):
        lines += [
            "",
            "| pools × classes × cells/class × GPUs/pool | MILP ms | JAX first call ms | JAX steady ms "
            "| one shared axis: steady ms (× own axes) | status | min r | goodput | $/h | GPUs per pool | agree |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in res["pools"]:
            usd = "—" if r["usd_per_hour"] is None else f"{r['usd_per_hour']:.2f}"
            g = r["gpus_per_pool"]
            shared = r.get("jax_shared_axis_steady_s")
            vs = "—" if shared is None else f"{fmt(shared)} ({shared / r['jax_steady_s']:.1f}×)"
            agree = r["jax_agrees"] and r.get("shared_axis_agrees", True)
            lines.append(
                f"| {r['pools']}×{r['classes']}×{r['cells_per_class']}×{g if isinstance(g, int) else '/'.join(map(str, g))} "
                f"| {fmt(r['milp_s'])} | {fmt(r['jax_first_call_s'])} | {fmt(r['jax_steady_s'])} | {vs} | {r['status']} | "
                f"{r['min_fulfillment']:.4f} | {r['goodput_rps']:.2f} | {usd} | {r['pool_gpus_used']} | {agree} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", default=DEFAULT_SIZES, help="comma-separated CLASSESxCELLS_PER_CLASSxGPUS"
    )
    p.add_argument(
        "--batch", type=int, default=4096, help="tables per batch for the throughput rows"
    )
    p.add_argument("--large-batch-size", default="4x50x64", help="the larger batch-throughput size")
    p.add_argument(
        "--unpruned-limit",
        type=float,
        default=20.0,
        help="CBC seconds per stage for the unpruned MILP (0: skip)",
    )
    p.add_argument(
        "--pools",
        default=DEFAULT_POOL_SIZES,
        help="comma-separated POOLSxCLASSESxCELLS_PER_CLASSxGPUS_PER_POOL mixed-pool sizes ('' to skip)",
    )
    p.add_argument("--pools-only", action="store_true", help="run only the mixed-pool rows")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "allocator_speed.json",
    )
    p.add_argument("--publish", action="store_true", help="write benchmarks/published/allocator_speed.json, its docs/results.md section and MANIFEST.json")
    args = p.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    sizes = [] if args.pools_only else [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    rows = []
    for k, per, g in sizes:
        rows.append(
            bench_size(rng, k, per, g, unpruned_limit=args.unpruned_limit, repeats=args.repeats)
        )
        print(f"done {k}x{per}x{g}", flush=True)
    batches = []
    if not args.pools_only:
        batches.append(bench_batch(rng, "shipped grid 2x11x16", *shipped_grid(), args.batch))
        k, per, g = (int(x) for x in args.large_batch_size.split("x"))
        batches.append(
            bench_batch(
                rng, f"synthetic {k}x{per}x{g}", *synthetic_instance(rng, k, per, g), args.batch
            )
        )
    pool_rows = []
    prng = np.random.default_rng(args.seed + 1)
    for spec in filter(None, args.pools.split(",")):
        n_p, k, per, gs = spec.split("x")
        counts = tuple(int(x) for x in gs.split("-"))
        pool_rows.append(bench_pools(prng, int(n_p), int(k), int(per), counts[0] if len(counts) == 1 else counts,
                                     repeats=args.repeats))
        print(f"done pools {spec}", flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "seed": args.seed,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "machine": platform.machine(),
    }
    res = {"meta": meta, "sizes": rows, "batches": batches}
    if pool_rows:
        res["pools"] = pool_rows
    md = published_table(res)
    print("\n" + md)
    args.out.write_text(json.dumps(res, indent=2))
    print(f"\nwrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("allocator_speed", res, md, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
