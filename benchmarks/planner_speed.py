"""Planner speed: seconds per round split into fit / allocate / acquire, and
acquisition time as the number of candidate cells grows.

Part 1 runs the shipped campaign (replay backend, fleetsieve) and reports each
round's planning time from ``result.json``'s timings; the target is the whole
planning step of a round under 1% of one 300 s cell (3 s) after the first
round. Part 2 times the acquisition kernel exactly as the ``fleetsieve``
strategy builds it (exact up to 64 cells, ``n_related`` beyond) on synthetic
grids from ~25 to 2,000 cells and reports time per candidate, which must not
grow with the grid (linear cost). Prints markdown tables and writes JSON
(default ``benchmarks/results/planner_speed.json``).

    python benchmarks/planner_speed.py                      # shipped grid + 24..512 cells
    python benchmarks/planner_speed.py --loads 3 8 32 125 250   # up to 2,000 cells
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from acquisition_scaling import synthetic  # noqa: E402

from fleetsieve_bayes.campaign.config import load_campaign  # noqa: E402
from fleetsieve_bayes.campaign.runner import run_campaign  # noqa: E402
from fleetsieve_bayes.decision.strategies.gap import shared_acquisition  # noqa: E402

CELL_S = 300.0


def shipped_rounds(campaign_path: Path, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = run_campaign(load_campaign(campaign_path), Path(tmp), seed=seed).result
        wall = time.perf_counter() - t0
    rounds = result["timings"]["per_round"]
    later = [r["total_s"] for r in rounds[1:]]
    return {
        "status": result["status"],
        "gpu_seconds": result["gpu_seconds"],
        "wall_s": wall,
        "rounds": rounds,
        "later_rounds_max_s": max(later) if later else None,
        "later_rounds_median_s": statistics.median(later) if later else None,
        "target_s": 0.01 * CELL_S,
    }


def acquisition_point(n_loads: int, n_draws: int, repeats: int) -> dict:
    grid, problem, latent, noise, observed, measured = synthetic(n_loads, n_draws)
    acq = shared_acquisition(grid, problem, 16, 0.9, 0.0)
    args = tuple(jnp.asarray(a) for a in (latent, noise, observed, measured))
    t0 = time.perf_counter()
    jax.block_until_ready(acq.score(jax.random.PRNGKey(0), *args))
    first = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(acq.score(jax.random.PRNGKey(r + 1), *args))
        times.append(time.perf_counter() - t0)
    warm = statistics.median(times)
    n_cand = int((~measured).sum())
    return {
        "cells": grid.n_cells,
        "candidates": n_cand,
        "draws": n_draws,
        "exact": grid.n_cells <= 64,
        "first_call_s": first,
        "warm_s": warm,
        "ms_per_candidate": 1e3 * warm / n_cand,
    }


def published_table(res: dict) -> str:
    """The markdown tables of a run's JSON ``res``: the shipped campaign's rounds, then the kernel."""
    lines = []
    shipped = res.get("shipped")
    if shipped:
        lines += [f"Shipped grid: {shipped['status']}, {shipped['gpu_seconds']:.0f} GPU-s", "",
                  "| round | fit s | allocate s | acquire s | planning s |", "|---:|---:|---:|---:|---:|"]
        for r in shipped["rounds"]:
            lines.append(f"| {r['round']} | {r['fit_s']:.2f} | {r['allocate_s']:.2f} | {r['acquire_s']:.2f} | {r['total_s']:.2f} |")
        if shipped["later_rounds_max_s"] is not None:
            lines += ["", f"After round 1: max {shipped['later_rounds_max_s']:.2f} s, median "
                      f"{shipped['later_rounds_median_s']:.2f} s per round (target < {shipped['target_s']:.0f} s)."]
        lines.append("")
    points = res["acquisition"]
    base = points[0]["ms_per_candidate"]
    lines += ["Acquisition kernel against candidates:", "",
              "| cells | candidates | mode | first call s | warm s | ms / candidate | vs smallest |",
              "|---:|---:|---|---:|---:|---:|---:|"]
    for p in points:
        mode = "exact" if p["exact"] else "n_related=16"
        lines.append(
            f"| {p['cells']} | {p['candidates']} | {mode} | {p['first_call_s']:.1f} | {p['warm_s']:.3f} | "
            f"{p['ms_per_candidate']:.2f} | {p['ms_per_candidate'] / base:.2f}× |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--campaign", type=Path, default=REPO / "examples" / "h100_31b_fp8" / "campaign.toml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loads", type=int, nargs="+", default=[3, 8, 32, 64], help="cells = 8 × loads")
    ap.add_argument("--draws", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-campaign", action="store_true")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "planner_speed.json")
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/planner_speed.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args()

    out: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    if not args.skip_campaign:
        shipped = shipped_rounds(args.campaign, args.seed)
        out["shipped"] = shipped
    points = [acquisition_point(n, args.draws, args.repeats) for n in args.loads]
    out["acquisition"] = points
    md = published_table(out)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=float))
    print(f"\nwrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("planner_speed", json.loads(json.dumps(out, default=float)), md, command_line(__file__))


if __name__ == "__main__":
    main()
