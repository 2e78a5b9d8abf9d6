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

* ``attainment``: noisy synthetic fleets with window noise
  (:func:`fleetsieve_bayes.evaluation.synthetic.synthetic_fleet`,
  ``window_noise``): measure the initial design plus random cells, some of
  them ``--windows`` times, fit the window-noise model, and score (a) the
  attainment of measured cells (median's mean absolute error against the
  true attainment, share of 90 % intervals containing it), (b) for unmeasured
  cells below saturation the share whose posterior median TTFT p99 and
  completion p99 are within 20 % of the truth.

* ``campaign``: the same scores at the END of campaigns on the noisy suite
  (``benchmarks/profiling_cost.py --noisy``: each fleet's campaign at
  ``slo_attainment = --level`` to its stop): the attainment ``result.json``
  reports for its committed cells against their true attainment (MAE, share
  of 90 % intervals containing it) and, below saturation, the share of cells
  the campaign never measured whose final posterior median TTFT p99 and
  completion p99 (``posterior.nc``) are within 20 % of the truth. ``--from``
  reads a finished ``profiling_cost.py --noisy`` JSON (or its ``--partial``
  JSONL) instead of running the campaigns again.

    python benchmarks/calibration_study.py                       # quick: loo-cell + loo-tp + 10 fleets
    python benchmarks/calibration_study.py --studies campaign --from benchmarks/results/profiling_cost_noisy.json
    python benchmarks/calibration_study.py --studies attainment --fleets 8
    python benchmarks/calibration_study.py --fleets 100 --preset default --out FILE

Prints markdown tables and writes JSON (default benchmarks/results/calibration_study.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

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


def attainment_study(preset: str, level: float, fleets: int, seed: int, windows: int, share: float,
                     tp_sd: tuple[float, float, float] | None = None, burst: tuple[float, float, float] | None = None) -> dict:
    """Noisy synthetic fleets: attainment of measured cells and tails of unmeasured ones,
    and what the conservative table at ``level`` admits (:func:`admission_scores`).

    With ``tp_sd`` ``(capacity, ttft, completion)``, every fleet is fitted
    twice, side by side: with the ``generic`` card's per-(class, TP)
    departures (``[capacity]``, ``[ttft]`` and ``[completion]`` ``tp_sd``) all
    at 0 (the summary's own keys) and set to it (``"tp_sd"``, the same form). With ``burst`` ``(burst_probability,
    burst_logit_sd, burst_class_sd)``, likewise with the card's ``[window]``
    burst prior set to it (``"burst"``).
    """
    import dataclasses
    import tempfile

    from fleetsieve_bayes.evaluation.attainment import noisy_fleet, windows_of
    from fleetsieve_bayes.evaluation.synthetic import random_spec, synthetic_fleet, write_synthetic
    from fleetsieve_bayes.model.priors import load_card

    generic = load_card("generic")
    if tp_sd is not None:  # the study compares departures with none, whatever the card ships
        generic = dataclasses.replace(generic, capacity_tp_sd=0.0, ttft_tp_sd=0.0, completion_tp_sd=0.0)
    cards = {"generic": generic}
    if tp_sd is not None:
        cards["tp_sd"] = dataclasses.replace(generic, capacity_tp_sd=tp_sd[0], ttft_tp_sd=tp_sd[1], completion_tp_sd=tp_sd[2])
    if burst is not None:
        cards["burst"] = dataclasses.replace(generic, window_burst_probability=burst[0], window_burst_logit_sd=burst[1],
                                             window_burst_class_sd=burst[2])
    runs: dict[str, list[dict]] = {k: [] for k in cards}
    for f in range(fleets):
        rng = np.random.default_rng([seed, f])
        spec = random_spec(rng)._replace(window_noise=True, windows=windows)
        table, camp = synthetic_fleet(rng, spec)
        with tempfile.TemporaryDirectory(prefix="fsb-att-") as tmp:
            campaign = write_synthetic(tmp, table[table["replicate"] == 0], camp)
            problem = campaign.problem()
        fleet = noisy_fleet(table, campaign.workload_names)
        n = fleet.grid.n_cells
        counts = np.zeros(n, np.int64)
        counts[initial_design(fleet.grid)] = 1
        free = np.flatnonzero(counts == 0)
        extra = rng.choice(free, size=min(len(free), max(0, int(share * n) - int(counts.sum()))), replace=False)
        counts[extra] = 1
        meas = np.flatnonzero(counts > 0)
        counts[rng.choice(meas, size=len(meas) // 3, replace=False)] = windows
        observed, measured, rows, cells = windows_of(fleet, counts)
        for name, card in cards.items():
            runs[name].append(_attainment_fit(fleet, problem, counts, observed, measured, rows, cells, card, preset,
                                              level, f))
            r = runs[name][-1]
            print(f"fleet {f} ({name}): {r['measured']}/{n} measured, MAE {r['measured_cells']['mae']:.3f}, "
                  f"coverage {r['measured_cells']['coverage']:.2f}, tails {r['tails_unmeasured']}", flush=True)
    out = _attainment_summary(runs["generic"], fleets, windows, share)
    out["card_tp_sd"] = [generic.capacity_tp_sd, generic.ttft_tp_sd, generic.completion_tp_sd]
    if tp_sd is not None:
        value: float | list[float] = tp_sd[0] if len(set(tp_sd)) == 1 else list(tp_sd)
        out["tp_sd"] = {"value": value, **_attainment_summary(runs["tp_sd"], fleets, windows, share)}
    if burst is not None:
        out["burst"] = {"value": list(burst), **_attainment_summary(runs["burst"], fleets, windows, share)}
    return out


def _attainment_fit(fleet: Any, problem: Any, counts: np.ndarray, observed: np.ndarray, measured: np.ndarray,
                    rows: np.ndarray, cells: np.ndarray, card: Any, preset: str, level: float, f: int) -> dict:
    """One fleet's fit with ``card`` and its scores (a row of :func:`attainment_study`)."""
    from fleetsieve_bayes.decision.bounds import attainment_bounds
    from fleetsieve_bayes.decision.intervals import DEFAULT_RULES
    from fleetsieve_bayes.evaluation.attainment import (
        admission_scores,
        attainment_scores,
        tail_accuracy,
    )

    n = fleet.grid.n_cells
    t0 = time.perf_counter()
    post = fit(fleet.grid, observed, measured, card, preset, seed=f, rows=rows, row_cell=cells)
    att = attainment_bounds(post, fleet.grid, problem, observed, measured, level, 0.0, DEFAULT_RULES, seed=f)
    fit_s = time.perf_counter() - t0
    # Cells whose truth failed outright (0 throughput) are trivially 0: score the rest.
    live = fleet.truth[:, 0] > 0
    m = measured & live
    med = np.median(post.latent, axis=0)
    return {
        "fleet": f,
        "cells": n,
        "measured": int(measured.sum()),
        "windows": int(counts.sum()),
        "fit_s": fit_s,
        "measured_cells": attainment_scores(att.median[m], att.lo[m], att.hi[m], fleet.attainment[m]),
        "unmeasured_cells": attainment_scores(
            att.median[~measured & live], att.lo[~measured & live], att.hi[~measured & live], fleet.attainment[~measured & live]
        ),
        "admission_measured": admission_scores(att.lo[m], fleet.attainment[m], level),
        "admission_unmeasured": admission_scores(att.lo[~measured & live], fleet.attainment[~measured & live], level),
        "tails_unmeasured": tail_accuracy(med, fleet.truth, fleet.offered, np.flatnonzero(~measured)),
        "tails_log_error": _tail_log_error(med, fleet.truth, fleet.offered, ~measured),
        "abs_err": np.abs(att.median[m] - fleet.attainment[m]).tolist(),
        "covered": ((att.lo[m] - 1e-9 <= fleet.attainment[m]) & (fleet.attainment[m] <= att.hi[m] + 1e-9)).tolist(),
    }


def _tail_log_error(med: np.ndarray, truth: np.ndarray, offered: np.ndarray, cells: np.ndarray) -> list[list[float]]:
    """``log(median / truth)`` of TTFT and completion p99 ``(n, 2)`` at the cells (bool ``(n_cells,)``)
    below saturation, as :func:`~fleetsieve_bayes.evaluation.attainment.tail_accuracy` selects them."""
    sel = cells & (truth[:, 0] > 0) & (truth[:, 0] >= 0.95 * offered)
    return np.log(med[sel, 1:3] / truth[sel, 1:3]).tolist()


def _attainment_summary(rows_out: list[dict], fleets: int, windows: int, share: float) -> dict:
    """Pooled scores of :func:`attainment_study`'s fits of one card."""

    def pool(key: str, sub: str) -> float | None:
        vals = [(r[key][sub], r[key]["cells"]) for r in rows_out if r[key]["cells"]]
        if not vals:
            return None
        return float(sum(v * n for v, n in vals) / sum(n for _, n in vals))

    cov = np.concatenate([np.asarray(r["covered"], bool) for r in rows_out]) if rows_out else np.zeros(0)
    err = np.concatenate([np.asarray(r["abs_err"]) for r in rows_out]) if rows_out else np.zeros(0)
    return {
        "fleets": fleets,
        "windows": windows,
        "share_measured": share,
        "measured_mae": float(err.mean()) if err.size else None,
        "measured_coverage": float(cov.mean()) if cov.size else None,
        "unmeasured_mae": pool("unmeasured_cells", "mae"),
        "unmeasured_coverage": pool("unmeasured_cells", "coverage"),
        "tails_ttft_within_20": pool("tails_unmeasured", "ttft"),
        "tails_completion_within_20": pool("tails_unmeasured", "completion"),
        "throughput_within_20": pool("tails_unmeasured", "throughput"),
        "tails_log_bias": (np.concatenate([np.reshape(r["tails_log_error"], (-1, 2)) for r in rows_out]).mean(0).tolist()
                           if any(r["tails_log_error"] for r in rows_out) else None),
        "fit_s_median": float(np.median([r["fit_s"] for r in rows_out])) if rows_out else None,
        **{f"admission_{k}": {s: int(sum(r[f"admission_{k}"][s] for r in rows_out))
                              for s in ("admissible", "admitted", "inadmissible_admitted")}
           for k in ("measured", "unmeasured")},
        "per_fleet": rows_out,
    }


def campaign_study(level: float, fleets: int, seed: int, source: Path | None, jobs: int = 1) -> dict:
    """End-of-campaign calibration on the noisy suite: committed cells' reported attainment
    and unmeasured cells' tails (runs of ``profiling_cost.run_noisy``, read from ``source``
    — its JSON or ``--partial`` JSONL — or run here)."""
    import profiling_cost as pc

    if source is not None:
        text = source.read_text()
        if source.suffix == ".jsonl":
            runs = []
            for line in text.splitlines():
                try:
                    runs.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by an interrupted run
                    continue
            runs = [r for r in runs if "full_grid" in r and "error" not in r]
            runs = list({r["scenario"]: r for r in runs}.values())
        else:
            runs = json.loads(text)["noisy"]["runs"]
    else:
        tasks = [{"noisy": True, "scenario": f"n{k:03d}", "k": k, "suite_seed": seed, "windows": 5, "level": level,
                  "max_windows": 3, "strategy": "fleetsieve", "seed": 0} for k in range(fleets)]
        runs = pc._run_all(tasks, jobs, "calibration")
    runs = sorted(runs, key=lambda r: r["k"])
    s = pc.summarise_noisy(runs) if runs else {}
    per = [{"fleet": r["scenario"], "status": r["status"], "committed": r["committed"],
            "tails_unmeasured": r["tails_unmeasured"]} for r in runs]
    keys = ("committed_cells", "committed_mae", "committed_coverage", "tails_cells", "tails_ttft_within_20",
            "tails_completion_within_20", "tails_throughput_within_20")
    return {"fleets": len(runs), "source": None if source is None else str(source),
            **{k: s.get(k) for k in keys}, "per_fleet": per}


def _campaign_lines(c: dict, level: float) -> list[str]:
    """The end-of-campaign calibration table (:func:`campaign_study`)."""
    def f(x: float | None, fmt: str) -> str:
        return "—" if x is None else format(x, fmt)

    return [f"At the end of campaigns on the noisy suite ({c['fleets']} fleets, slo_attainment {level:g}; "
            "`profiling_cost.py --noisy`):", "",
            "| measure | value | target |", "|---|---:|---|",
            f"| committed cells ({c['committed_cells']}): reported attainment MAE | {f(c['committed_mae'], '.3f')} | ≤ 0.05 |",
            f"| committed cells: 90 % intervals containing the true attainment | {f(c['committed_coverage'], '.0%')} | ≥ 85 % |",
            f"| unmeasured cells below saturation ({c['tails_cells']}): TTFT p99 within 20 % | "
            f"{f(c['tails_ttft_within_20'], '.0%')} | ≥ 75 % |",
            f"| … completion p99 within 20 % | {f(c['tails_completion_within_20'], '.0%')} | ≥ 75 % |",
            f"| … throughput within 20 % | {f(c['tails_throughput_within_20'], '.0%')} | |", ""]


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
    if "attainment" in res:
        a = res["attainment"]
        fits = [("generic without departures (tp_sd 0)" if "tp_sd" in a else "generic", a)]
        if "tp_sd" in a:
            v = a["tp_sd"]["value"]
            label = f"{v:g}" if isinstance(v, (int, float)) else "{:g} / {:g} / {:g} (capacity / TTFT / completion)".format(*v)
            fits.append((f"generic, tp_sd {label}", a["tp_sd"]))
        if "burst" in a:
            p, sd, csd = a["burst"]["value"]
            fits.append((f"generic, burst prior {p:g} (logit sd {sd:g}, class sd {csd:g})", a["burst"]))
        out += [f"SLO attainment on noisy synthetic fleets ({a['fleets']} fleets, {a['share_measured']:.0%} of cells "
                f"measured, a third of them {a['windows']} times, {level:.0%} intervals), each card fitted to the "
                "same windows:", "",
                "| card | measured: attainment MAE | coverage | unmeasured: attainment MAE | coverage "
                "| unmeasured tails within 20 %: TTFT | completion | throughput | mean log error: TTFT | completion "
                "| fit s (median) |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in fits:
            bias = r.get("tails_log_bias") or [float("nan"), float("nan")]
            out.append(f"| {name} | {r['measured_mae']:.3f} | {r['measured_coverage']:.2f} | {r['unmeasured_mae']:.3f} "
                       f"| {r['unmeasured_coverage']:.2f} | {r['tails_ttft_within_20']:.2f} "
                       f"| {r['tails_completion_within_20']:.2f} | {r['throughput_within_20']:.2f} "
                       f"| {bias[0]:+.2f} | {bias[1]:+.2f} | {r.get('fit_s_median') or float('nan'):.0f} |")
        admitted = [(name, r["admission_measured"], r["admission_unmeasured"]) for name, r in fits
                    if "admission_measured" in r and "admission_unmeasured" in r]
        if admitted:  # (runs published before the admission counts have none)
            out += ["", f"What the conservative table admits at level {level:g} (lower bound ≥ level), same fits:", "",
                    "| card | measured cells truly admissible: admitted | measured inadmissible admitted "
                    "| unmeasured truly admissible: admitted | unmeasured inadmissible admitted |",
                    "|---|---|---|---|---|"]
        for name, am, au in admitted:
            out.append(f"| {name} | {am['admitted']} of {am['admissible']} | {am['inadmissible_admitted']} "
                       f"| {au['admitted']} of {au['admissible']} | {au['inadmissible_admitted']} |")
        out.append("")
    if "campaign" in res:
        out += _campaign_lines(res["campaign"], level)
    return "\n".join(out).strip()


def _burst(text: str | None) -> tuple[float, float, float] | None:
    """``--burst P,SD,CLASS_SD`` as three floats (None when not given)."""
    if text is None:
        return None
    parts = [float(x) for x in text.split(",")]
    if len(parts) != 3:
        raise SystemExit(f"--burst: expected P,SD,CLASS_SD (three numbers), got {text!r}")
    return parts[0], parts[1], parts[2]


def _tp_sd(text: str | None) -> tuple[float, float, float] | None:
    """``--tp-sd``: one sd for capacity, TTFT and completion, or three comma-separated."""
    if text is None:
        return None
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"--tp-sd: expected a number or CAP,TTFT,COMPLETION, got {text!r}") from None
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) < 0:
        raise SystemExit(f"--tp-sd: expected a number or CAP,TTFT,COMPLETION (each >= 0), got {text!r}")
    return parts[0], parts[1], parts[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="fast")
    ap.add_argument("--level", type=float, default=0.9)
    ap.add_argument("--fleets", type=int, default=10)
    ap.add_argument("--extra", type=int, default=4, help="random cells measured beyond the design")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--studies", default="loo-cell,loo-tp,sbc")
    ap.add_argument("--windows", type=int, default=3, help="attainment: windows of a repeated cell")
    ap.add_argument("--share", type=float, default=0.5, help="attainment: share of cells measured")
    ap.add_argument("--tp-sd", default=None, metavar="SD | CAP,TTFT,COMPLETION",
                    help="attainment: also fit every fleet with the generic card's per-(class, TP) departures at this "
                    "sd (one for all three, or capacity,ttft,completion)")
    ap.add_argument("--burst", default=None, metavar="P,SD,CLASS_SD",
                    help="attainment: also fit every fleet with the generic card's [window] burst prior set to "
                    "burst_probability,burst_logit_sd,burst_class_sd (e.g. 0.05,1.0,0.5)")
    ap.add_argument("--from", dest="source", type=Path, default=None,
                    help="campaign: a profiling_cost.py --noisy JSON (or --partial JSONL) to score instead of running")
    ap.add_argument("--jobs", type=int, default=1, help="campaign: worker processes")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "calibration_study.json")
    ap.add_argument("--study", default=None,
                    help="with --publish: the study's name (default calibration_<studies>_<preset>)")
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
    if "attainment" in studies:
        res["attainment"] = attainment_study(args.preset, args.level, args.fleets, args.seed, args.windows, args.share,
                                             _tp_sd(args.tp_sd), _burst(args.burst))
    if "campaign" in studies:
        res["campaign"] = campaign_study(args.level, args.fleets, args.seed, args.source, args.jobs)
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
        publish(args.study or f"calibration_{kinds}_{args.preset}", res, md, command_line(__file__))


if __name__ == "__main__":
    main()
