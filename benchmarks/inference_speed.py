"""Fit time of the model: NUTS (``fast``/``default``) and SVI, first fit and warm refit.

For the shipped H100 grid (22 cells) and synthetic grids (``--sizes``, cells;
classes = cells / 50, TP in {1, 2, 4, 8}, values simulated from the generic
card's prior), in one run side by side:

* ``first``: the first fit of a fresh process for that shape and preset
  (trace + XLA compile + run; the persistent compilation cache is off);
* ``warm``: the median of ``--refits`` warm refits, each after one more cell is
  measured (what a campaign round pays);
* diagnostics of the last warm refit (max r_hat over parameters, divergences,
  mean leapfrog steps).

    python benchmarks/inference_speed.py                      # quick: shipped grid + 500 cells
    python benchmarks/inference_speed.py --sizes 500,2000 --presets fast,svi,default

Prints a markdown table and writes JSON (default benchmarks/results/inference_speed.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("FLEETSIEVE_JAX_CACHE", "off")

import numpy as np  # noqa: E402

from fleetsieve_bayes.allocation.problem import CellGrid, grid_from_table, values_from_table  # noqa: E402
from fleetsieve_bayes.decision.design import initial_design  # noqa: E402
from fleetsieve_bayes.model.diagnostics import summarize  # noqa: E402
from fleetsieve_bayes.model.inference import fit, prior_predictive  # noqa: E402
from fleetsieve_bayes.table import read_table  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def synthetic_grid(n_cells: int, seed: int = 0) -> tuple[CellGrid, np.ndarray]:
    """``n_cells`` cells over ``n_cells // 50`` classes (≥ 2) and values drawn from the generic prior."""
    rng = np.random.default_rng(seed)
    n_classes = max(2, n_cells // 50)
    per = n_cells // n_classes
    widx, tp, load, offered = [], [], [], []
    for w in range(n_classes):
        base = rng.uniform(0.5, 3.0)
        for i in range(per):
            t = int((1, 2, 4, 8)[i % 4])
            f = 0.2 + 1.3 * (i // 4) / max(1, per // 4)
            widx.append(w)
            tp.append(t)
            load.append(f"L{i}")
            offered.append(round(base * t * f, 4))
    order = np.lexsort((np.array(offered), np.array(tp), np.array(widx)))
    grid = CellGrid(
        workloads=tuple(f"w{w}" for w in range(n_classes)),
        workload_idx=np.array(widx)[order],
        tp=np.array(tp)[order],
        load=tuple(np.array(load)[order]),
        offered_rps=np.array(offered)[order],
        duration_s=np.full(len(order), 300.0),
    )
    return grid, prior_predictive(grid, "generic", 1, seed=seed)["y"][0]


def bench(grid: CellGrid, obs: np.ndarray, card: str, preset: str, refits: int) -> dict:
    m = np.zeros(grid.n_cells, bool)
    m[initial_design(grid)] = True
    t0 = time.perf_counter()
    post = fit(grid, obs, m, card, preset, seed=0)
    first = time.perf_counter() - t0
    warm = []
    rng = np.random.default_rng(0)
    for r in range(refits):
        m[rng.choice(np.flatnonzero(~m))] = True
        t0 = time.perf_counter()
        post = fit(grid, obs, m, card, preset, seed=r + 1, warm_start=post)
        warm.append(time.perf_counter() - t0)
    # the first warm refit compiles the energy/gradient program; report the steady state
    steady = warm[1:] if len(warm) > 1 else warm
    diag = summarize(post.idata)
    ss = post.idata.sample_stats
    return {
        "first_s": first,
        "warm_s": statistics.median(steady),
        "warm_all_s": warm,
        "r_hat_max": diag["r_hat_max"],
        "divergences": diag["divergences"],
        "mean_steps": float(np.mean(ss["n_steps"])) if "n_steps" in ss else None,
        "n_draws": int(post.latent.shape[0]),
    }


def published_table(res: dict) -> str:
    """The markdown table of a run's JSON ``res``, then NUTS-fast against SVI per grid."""
    lines = [
        "| grid | preset | first fit (s) | warm refit (s) | warm / 300 s cell | draws | r_hat max | div | mean steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        steps = f"{r['mean_steps']:.1f}" if r["mean_steps"] is not None else "-"
        rh = f"{r['r_hat_max']:.3f}" if r["r_hat_max"] is not None else "-"
        lines.append(f"| {r['grid']} | {r['preset']} | {r['first_s']:.1f} | {r['warm_s']:.2f} | "
                     f"{r['warm_s'] / 300:.2%} | {r['n_draws']} | {rh} | {r['divergences']} | {steps} |")
    by = {(r["grid"], r["preset"]): r for r in res["rows"]}
    lines.append("")
    for name in dict.fromkeys(r["grid"] for r in res["rows"]):
        if (name, "fast") in by and (name, "svi") in by:
            f, s = by[(name, "fast")], by[(name, "svi")]
            lines.append(f"- {name}: warm refit NUTS-fast / SVI = {f['warm_s'] / s['warm_s']:.2f}; "
                         f"first fit NUTS-fast / SVI = {f['first_s'] / s['first_s']:.2f}")
    return "\n".join(lines).strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="500", help="synthetic grid sizes (cells), comma-separated; '' for none")
    ap.add_argument("--presets", default="fast,svi")
    ap.add_argument("--refits", type=int, default=4)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "inference_speed.json")
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/inference_speed.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args()
    df = read_table(REPO / "examples" / "h100_31b_fp8" / "grid.csv")
    g = grid_from_table(df, ("chat", "code"))
    cases = [("shipped (22)", g, values_from_table(g, df), "dense-31b-fp8-h100")]
    for s in filter(None, args.sizes.split(",")):
        grid, obs = synthetic_grid(int(s))
        cases.append((f"synthetic ({grid.n_cells})", grid, obs, "generic"))
    rows = []
    for name, grid, obs, card in cases:
        for preset in args.presets.split(","):
            r = bench(grid, obs, card, preset, args.refits)
            r.update(grid=name, preset=preset, n_cells=grid.n_cells)
            rows.append(r)
            print(f"{name} {preset}: first {r['first_s']:.1f} s, warm {r['warm_s']:.2f} s", flush=True)
    res = {"machine": platform.platform(), "cpus": os.cpu_count(), "rows": rows}
    md = published_table(res)
    print("\n" + md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("inference_speed", res, md, command_line(__file__))


if __name__ == "__main__":
    main()
