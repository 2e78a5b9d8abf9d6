"""Acquisition kernel: time and memory against the number of candidate cells.

Synthetic grids with 2 classes × TP {1, 2, 4, 8} × L loads (so the allocator's
own cost, which grows with classes and GPUs, stays fixed while the number of
candidates grows), a synthetic posterior with shared structure, a quarter of the
cells measured. For each size: compile time, warm time per call (median of
``--repeats``), time per candidate, the chunk size the memory budget chose,
and the same with ``n_related`` (the big-grid approximation). Prints a markdown
table and writes JSON (default ``benchmarks/results/acquisition_scaling.json``).

    python benchmarks/acquisition_scaling.py                 # quick: 16, 32, 64 cells
    python benchmarks/acquisition_scaling.py --loads 2 4 8 16 --draws 500 --fantasies 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.acquisition import make_acquisition

TPS = (1, 2, 4, 8)


def synthetic(n_loads: int, n_draws: int, seed: int = 0) -> tuple[CellGrid, AllocationProblem, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    widx, tp, load, offered = [], [], [], []
    for w in range(2):
        for t in TPS:
            for j in range(n_loads):
                widx.append(w)
                tp.append(t)
                load.append(f"L{j}")
                offered.append(1.0 + 2.0 * j)
    n = len(tp)
    grid = CellGrid(
        workloads=("a", "b"),
        workload_idx=np.array(widx),
        tp=np.array(tp),
        load=tuple(load),
        offered_rps=np.array(offered),
        duration_s=np.full(n, 300.0),
    )
    problem = AllocationProblem(
        demand=np.array([12.0, 16.0]),
        critical=np.array([False, False]),
        floor=np.ones(2),
        success_min=np.full(2, 0.99),
        ttft_max=np.array([2.0, 5.0]),
        completion_max=np.array([30.0, np.inf]),
        gpus=16,
    )
    tpa, off = grid.tp.astype(float), grid.offered_rps
    cap = 1.2 * tpa * np.exp(-0.3 * (np.log2(tpa) - 2) ** 2)  # interior knee at TP4
    # Shared draw-level factors (per class) + cell-level noise: correlated cells.
    shared = rng.normal(size=(n_draws, 2, 1))[:, grid.workload_idx, 0]
    thr = np.minimum(off, cap) * np.exp(0.2 * shared + 0.15 * rng.normal(size=(n_draws, n)))
    rho = off / cap
    ttft = 0.3 * (1 + rho**3) * np.exp(0.3 * shared + 0.2 * rng.normal(size=(n_draws, n)))
    comp = 8.0 * (1 + rho**3) * np.exp(0.3 * shared + 0.2 * rng.normal(size=(n_draws, n)))
    succ = 1.0 / (1.0 + np.exp(-(6.0 - 2.0 * rho + 0.5 * rng.normal(size=(n_draws, n)))))
    latent = np.stack([thr, ttft, comp, succ], axis=-1).astype(np.float32)
    noise = np.tile(np.array([0.05, 0.1, 0.1, 0.3], np.float32), (n_draws, 1))
    measured = np.zeros(n, bool)
    measured[rng.choice(n, n // 4, replace=False)] = True
    observed = np.where(measured[:, None], latent[0], 1.0).astype(np.float32)
    return grid, problem, latent, noise, observed, measured


def run(n_loads: int, n_draws: int, n_fantasies: int, repeats: int, n_related: int | None) -> dict:
    grid, problem, latent, noise, observed, measured = synthetic(n_loads, n_draws)
    acq = make_acquisition(grid, problem, n_fantasies=n_fantasies, n_related=n_related)
    args = tuple(jnp.asarray(a) for a in (latent, noise, observed, measured))
    t0 = time.perf_counter()
    jax.block_until_ready(acq.score(jax.random.PRNGKey(0), *args))
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        s = jax.block_until_ready(acq.score(jax.random.PRNGKey(r + 1), *args))
        times.append(time.perf_counter() - t0)
    warm = statistics.median(times)
    unmeasured = ~measured
    return {
        "cells": grid.n_cells,
        "draws": n_draws,
        "fantasies": n_fantasies,
        "n_related": n_related,
        "compile_s": compile_s,
        "warm_s": warm,
        "per_candidate_ms": 1e3 * warm / grid.n_cells,
        "gap_now": float(s.gap_now),
        "fallback_share": float(np.asarray(s.fallback)[unmeasured].mean()),
        "median_ess_min": float(np.median(np.asarray(s.ess_min)[unmeasured])),
        "chosen": grid.describe(acq.select(s, grid.cost_gpu_s)),
    }


def published_table(res: dict) -> str:
    """The markdown table of a run's JSON ``res``."""
    lines = [
        "| cells | draws | F | n_related | compile s | warm s | ms/candidate | fallback share | median ESS | chosen |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['cells']} | {r['draws']} | {r['fantasies']} | {r['n_related'] or 'all'} | {r['compile_s']:.1f} | "
            f"{r['warm_s']:.3f} | {r['per_candidate_ms']:.1f} | {r['fallback_share']:.2f} | {r['median_ess_min']:.3f} | {r['chosen']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", type=int, nargs="+", default=[2, 4, 8], help="loads per (class, TP); cells = 8 × loads")
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--fantasies", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--related", type=int, default=8, help="n_related for the approximate rows (0: skip)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "acquisition_scaling.json")
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/acquisition_scaling.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args()
    rows = []
    for n_loads in args.loads:
        rows.append(run(n_loads, args.draws, args.fantasies, args.repeats, None))
        if args.related:
            rows.append(run(n_loads, args.draws, args.fantasies, args.repeats, args.related))
    res = {"rows": rows, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    md = published_table(res)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    print(f"\nwrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("acquisition_scaling", res, md, command_line(__file__))


if __name__ == "__main__":
    main()
