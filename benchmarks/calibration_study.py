"""Calibration of the model's 90 % intervals: held-out cells of the shipped grid and simulated fleets.

Three studies, each a fit per held-out set with the chosen inference preset:

* ``loo-cell``: on the shipped H100 grid (22 cells), leave each cell out in
  turn (fit on the other 21) and check whether the central ``--level``
  posterior-predictive interval (:func:`fleetsieve_bayes.decision.bounds.credible_bounds`)
  contains each of its 4 measured metrics — with the decision's margins
  (``[model] tail_margin`` and ``success_margin``, defaults
  :data:`fleetsieve_bayes.decision.intervals.MODEL_MARGIN` and
  :data:`~fleetsieve_bayes.decision.intervals.SUCCESS_MARGIN`) and without
  them (the posterior predictive alone: the model's own calibration).
* ``loo-tp``: leave out every cell of one TP (both classes) and check the
  interval of per-GPU served throughput of the left-out cells.
* ``sbc``: simulate ``--fleets`` fleets from the prior card on the shipped
  grid's cells, measure the initial design plus ``--extra`` random cells, fit,
  and count how often the held-out cells' intervals contain the simulated
  values (nominal ``--level``), again with and without the margin (fleets
  drawn from the model itself have no model discrepancy, so the margin-free
  column is the one that tests the posterior). Also reports the posterior z-score of the
  true knee (recovery).

    python benchmarks/calibration_study.py                       # quick: loo-cell + loo-tp + 10 fleets
    python benchmarks/calibration_study.py --fleets 100 --preset default --out FILE

Prints markdown tables and writes JSON (default benchmarks/results/calibration_study.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from fleetsieve_bayes.allocation.problem import CellGrid, grid_from_table, values_from_table
from fleetsieve_bayes.decision.bounds import credible_bounds
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.decision.intervals import MODEL_MARGIN, SUCCESS_MARGIN
from fleetsieve_bayes.model.inference import fit, load_preset, prior_predictive
from fleetsieve_bayes.table import METRICS, read_table

REPO = Path(__file__).resolve().parent.parent
GRID = REPO / "examples" / "h100_31b_fp8" / "grid.csv"
CARD = "dense-31b-fp8-h100"


def shipped() -> tuple[CellGrid, np.ndarray]:
    """The shipped grid and its measured values ``(22, 4)``."""
    df = read_table(GRID)
    grid = grid_from_table(df, ("chat", "code"))
    return grid, values_from_table(grid, df)


def covered(lo: np.ndarray, hi: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Elementwise ``lo <= y <= hi`` (arrays of one shape)."""
    return (lo <= y) & (y <= hi)


def loo_cell(grid: CellGrid, obs: np.ndarray, preset: str, level: float) -> dict:
    """Leave each cell out; per-cell, per-metric coverage and the intervals."""
    rows = []
    post = None
    for c in range(grid.n_cells):
        m = np.ones(grid.n_cells, bool)
        m[c] = False
        post = fit(grid, obs, m, CARD, preset, seed=c, warm_start=post)
        b = credible_bounds(post, obs, m, level)
        b0 = credible_bounds(post, obs, m, level, model_margin=0.0, success_margin=0.0)
        cov = covered(b.lo[c], b.hi[c], obs[c])
        rows.append(
            {
                "cell": grid.describe(c),
                "measured": obs[c].tolist(),
                "lo": b.lo[c].tolist(),
                "hi": b.hi[c].tolist(),
                "median": np.median(post.latent[:, c], axis=0).tolist(),
                "covered": cov.tolist(),
                "covered_no_margin": covered(b0.lo[c], b0.hi[c], obs[c]).tolist(),
            }
        )
    cov = np.array([r["covered"] for r in rows])
    cov0 = np.array([r["covered_no_margin"] for r in rows])
    return {
        "tail_margin": MODEL_MARGIN,
        "success_margin": SUCCESS_MARGIN,
        "per_metric": dict(zip(METRICS, cov.mean(0).tolist(), strict=True)),
        "overall": float(cov.mean()),
        "per_metric_no_margin": dict(zip(METRICS, cov0.mean(0).tolist(), strict=True)),
        "overall_no_margin": float(cov0.mean()),
        "cells": rows,
    }


def loo_tp(grid: CellGrid, obs: np.ndarray, preset: str, level: float) -> dict:
    """Leave out each TP (all classes); coverage of per-GPU served throughput."""
    out = []
    for tp in np.unique(grid.tp):
        m = grid.tp != tp
        post = fit(grid, obs, m, CARD, preset, seed=int(tp))
        b = credible_bounds(post, obs, m, level)
        for c in np.flatnonzero(~m):
            out.append(
                {
                    "cell": grid.describe(int(c)),
                    "per_gpu_measured": float(obs[c, 0] / tp),
                    "per_gpu_lo": float(b.lo[c, 0] / tp),
                    "per_gpu_hi": float(b.hi[c, 0] / tp),
                    "covered": bool(covered(b.lo[c, 0], b.hi[c, 0], obs[c, 0])),
                }
            )
    return {"coverage": float(np.mean([r["covered"] for r in out])), "cells": out}


def simulate_fleets(grid: CellGrid, card_name: str, n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` fleets from the prior: ``y (n, n_cells, 4)``, ``latent``, ``knee (n, n_classes)``."""
    pred = prior_predictive(grid, card_name, n, seed=seed)
    return {"y": pred["y"], "latent": pred["latent"], "knee": pred["knee"]}


def sbc(grid: CellGrid, preset: str, level: float, fleets: int, extra: int, seed: int) -> dict:
    """Simulated fleets: coverage of held-out cells and knee recovery."""
    sims = simulate_fleets(grid, CARD, fleets, seed)
    rng = np.random.default_rng(seed)
    hits, zs, per_metric, hits0, per_metric0 = [], [], [], [], []
    for f in range(fleets):
        y = sims["y"][f]
        m = np.zeros(grid.n_cells, bool)
        m[initial_design(grid)] = True
        m[rng.choice(np.flatnonzero(~m), size=extra, replace=False)] = True
        # A cold fit per fleet: warm-starting from another fleet's sampler
        # state (no warm-up, its last positions) is not a posterior of this one.
        post = fit(grid, y, m, CARD, preset, seed=f)
        b = credible_bounds(post, y, m, level)
        cov = covered(b.lo[~m], b.hi[~m], y[~m])
        hits.append(float(cov.mean()))
        per_metric.append(cov.mean(0))
        b0 = credible_bounds(post, y, m, level, model_margin=0.0, success_margin=0.0)
        cov0 = covered(b0.lo[~m], b0.hi[~m], y[~m])
        hits0.append(float(cov0.mean()))
        per_metric0.append(cov0.mean(0))
        knee = np.asarray(post.idata.posterior["knee"]).reshape(-1, grid.n_classes)
        zs.extend(((sims["knee"][f] - knee.mean(0)) / knee.std(0)).tolist())
    return {
        "fleets": fleets,
        "coverage": float(np.mean(hits)),
        "coverage_per_metric": dict(zip(METRICS, np.mean(per_metric, 0).tolist(), strict=True)),
        "coverage_fleet_min": float(np.min(hits)),
        "coverage_no_margin": float(np.mean(hits0)),
        "coverage_per_metric_no_margin": dict(zip(METRICS, np.mean(per_metric0, 0).tolist(), strict=True)),
        "knee_z_mean": float(np.mean(zs)),
        "knee_z_sd": float(np.std(zs)),
    }


def published_table(res: dict) -> str:
    """The markdown tables of a run's JSON ``res`` (the studies it holds)."""
    level, out = res["level"], []
    if "loo_cell" in res:
        lc = res["loo_cell"]
        out += [f"Leave one cell out (shipped grid, 22 cells, preset {res['preset']}, {level:.0%}):", "",
                "| intervals | " + " | ".join(lc["per_metric"]) + " | overall |",
                "|---|" + "---|" * (len(lc["per_metric"]) + 1),
                f"| with margins (tails {lc['tail_margin']}, success {lc['success_margin']}) | "
                + " | ".join(f"{v:.2f}" for v in lc["per_metric"].values()) + f" | {lc['overall']:.3f} |",
                "| posterior predictive alone | "
                + " | ".join(f"{v:.2f}" for v in lc["per_metric_no_margin"].values()) + f" | {lc['overall_no_margin']:.3f} |",
                "", "Cells missed (with the margins):", "",
                "| cell | metric | measured | interval |", "|---|---|---|---|"]
        for r in lc["cells"]:
            for j, name in enumerate(METRICS):
                if not r["covered"][j]:
                    out.append(f"| {r['cell']} | {name} | {r['measured'][j]:.4g} | [{r['lo'][j]:.4g}, {r['hi'][j]:.4g}] |")
        out.append("")
    if "loo_tp" in res:
        lt = res["loo_tp"]
        missed = [r for r in lt["cells"] if not r["covered"]]
        out += [f"Leave one TP out, per-GPU served throughput ({level:.0%}): coverage {lt['coverage']:.3f}"
                + (f"; missed: {', '.join(r['cell'] for r in missed)}" if missed else ""), ""]
    if "sbc" in res:
        s = res["sbc"]
        pm = ", ".join(f"{k} {v:.2f}" for k, v in s["coverage_per_metric"].items())
        pm0 = ", ".join(f"{k} {v:.2f}" for k, v in s["coverage_per_metric_no_margin"].items())
        out += [f"Simulated fleets drawn from the card ({s['fleets']} fleets, held-out cells, {level:.0%}):", "",
                "| intervals | coverage | per metric | worst fleet | knee z mean | knee z sd |",
                "|---|---|---|---|---|---|",
                f"| posterior predictive | {s['coverage_no_margin']:.3f} | {pm0} | | {s['knee_z_mean']:.2f} | {s['knee_z_sd']:.2f} |",
                f"| with margins | {s['coverage']:.3f} | {pm} | {s['coverage_fleet_min']:.2f} | | |", ""]
    return "\n".join(out).strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="fast")
    ap.add_argument("--level", type=float, default=0.9)
    ap.add_argument("--fleets", type=int, default=10)
    ap.add_argument("--extra", type=int, default=4, help="random cells measured beyond the design")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--studies", default="loo-cell,loo-tp,sbc")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "calibration_study.json")
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/calibration_<studies>_<preset>.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args()
    load_preset(args.preset)
    grid, obs = shipped()
    res: dict = {"preset": args.preset, "level": args.level, "card": CARD}
    studies = args.studies.split(",")
    t0 = time.perf_counter()
    if "loo-cell" in studies:
        res["loo_cell"] = loo_cell(grid, obs, args.preset, args.level)
    if "loo-tp" in studies:
        res["loo_tp"] = loo_tp(grid, obs, args.preset, args.level)
    if "sbc" in studies:
        res["sbc"] = sbc(grid, args.preset, args.level, args.fleets, args.extra, args.seed)
    res["seconds"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    md = published_table(res)
    print(md)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"\n{res['seconds']:.0f} s; wrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        kinds = "_".join(sorted({s.split("-")[0] for s in studies}))
        publish(f"calibration_{kinds}_{args.preset}", res, md, command_line(__file__))


if __name__ == "__main__":
    main()
