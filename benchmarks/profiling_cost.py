"""Profiling cost of the acquisition strategies against ground truth.

Runs every strategy to its stopping rule on a replayed campaign, many times
(random: one run per reveal order = seed), and reports per strategy:
GPU-seconds to the decision (mean, 95% bootstrap CI), regret of the final
allocation evaluated on the true table against the full-table optimum, regret
AUC, the hindsight-floor ratio, and — against uniform random — the
ratio-of-means saving (bootstrap CI) and how often one fleetsieve run beats a
single random order. ``--split`` adds chat-only and code-only campaigns (same
table, one class). ``--suite N`` runs N synthetic ground-truth fleets
(:mod:`fleetsieve_bayes.evaluation.synthetic`, ``random_spec(hard=True)``)
instead and reports per fleet its cost against the full grid and the
hindsight floor, ε-correctness and false certificates (a certificate of
either kind whose decision is not ε-correct on the truth).

``--noisy N`` runs N fleets of the noisy suite instead
(:mod:`fleetsieve_bayes.evaluation.noisy`: window noise around the ``true_*``
curves, 5 replicate rows per cell, each cell's true attainment), every campaign
at ``slo_attainment = --level`` (0.9) with at most ``--max-windows`` windows per
cell, and scores each decision against the truth at that level: correct (every
committed cell's true attainment ≥ the level and ε-correct against the
optimum of the truth at the level), false certificates, GPU-seconds against a
fully measured grid with one window per cell, beside that grid's own
correctness with one window and with three (median of three); the calibration
of the committed cells' reported attainment and the final posterior's TTFT /
completion medians at cells never measured (``calibration_study.py --studies
campaign`` reads the same runs). ``--partial FILE --resume`` checkpoints per
fleet and skips the fleets already there; ``--workdir DIR`` keeps each fleet's
campaign directory (an interrupted campaign resumes); ``--quick``: 3 fleets.

Prints a markdown table, writes JSON (default
``benchmarks/results/profiling_cost.json``) and a PNG of regret against
GPU-seconds next to it.

Examples::

    python benchmarks/profiling_cost.py                       # quick: 20 random orders
    python benchmarks/profiling_cost.py examples/h100_31b_fp8/campaign.toml \
        --orders 200 --split --out benchmarks/results/profiling_cost_1.0.json
    python benchmarks/profiling_cost.py --demand-scale 1.0,1.3 --level point --orders 200
    python benchmarks/profiling_cost.py --suite 30 --orders 5
    python benchmarks/profiling_cost.py --noisy 40 --jobs 2 --partial noisy.jsonl --resume --publish
    python benchmarks/profiling_cost.py --noisy 40 --quick
    python benchmarks/profiling_cost.py --pools 30 --partial pools.jsonl   # mixed GPU pools
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CAMPAIGN = REPO / "examples" / "h100_31b_fp8" / "campaign.toml"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "profiling_cost.json"
BOOT_SEED = 20240531
N_BOOT = 4000
RANDOMISED = {"random"}  # strategies whose runs differ only by the reveal order


# --------------------------------------------------------------------------- runs


def _load_scenario(
    campaign_path: str, demand_scale: float, only: str | None, inference: str | None, level: float | str | None = None
) -> Any:
    """The campaign (scaled, optionally restricted to one class, at ``level`` when given), its grid and problem."""
    from fleetsieve_bayes.allocation.problem import grid_from_table
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.table import read_table

    campaign = load_campaign(campaign_path).scaled(demand_scale)
    if only is not None:
        campaign = replace(campaign, workloads=tuple(w for w in campaign.workloads if w.name == only))
    if inference is not None:
        campaign = replace(campaign, inference=inference)
    if level is not None:
        campaign = campaign.at_level(level)
    table = read_table(campaign.measurement.table)
    grid = grid_from_table(table, campaign.workload_names)
    return campaign, grid, campaign.problem()


def _true_values(campaign: Any, grid: Any, truth: str) -> np.ndarray:
    """``(n_cells, 4)``: the replayed table, or its noise-free ``true_*`` columns (synthetic)."""
    import pandas as pd

    from fleetsieve_bayes.allocation.problem import values_from_table
    from fleetsieve_bayes.evaluation.synthetic import truth_table
    from fleetsieve_bayes.table import read_table

    df = read_table(campaign.measurement.table)
    if truth == "curve":
        raw = pd.read_csv(campaign.measurement.table)
        df = truth_table(raw) if "true_throughput_rps" in raw.columns else df
    return values_from_table(grid, df)


def run_one(task: dict[str, Any]) -> dict[str, Any]:
    """Run one campaign to its stop in a temporary directory and evaluate it on the truth."""
    from fleetsieve_bayes.campaign.journal import read_journal
    from fleetsieve_bayes.campaign.runner import run_campaign
    from fleetsieve_bayes.evaluation.regret import evaluate_run, make_oracle

    campaign, grid, problem = _load_scenario(
        task["campaign"], task["demand_scale"], task["only"], task["inference"], task.get("level")
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fsb-bench-") as tmp:
        outcome = run_campaign(campaign, Path(tmp), strategy=task["strategy"], seed=task["seed"])
        records, _ = read_journal(Path(tmp) / "journal.jsonl")
    wall = time.perf_counter() - t0
    evals: dict[str, Any] = {}
    for truth in task["truths"]:
        values = _true_values(campaign, grid, truth)
        oracle = make_oracle(grid, values, problem)
        evals[truth] = evaluate_run(grid, values, problem, oracle, outcome.result, records, campaign.epsilon)
    main = evals[task["truths"][0]]
    return {
        "scenario": task["scenario"],
        "strategy": task["strategy"],
        "seed": task["seed"],
        "wall_s": wall,
        "measured": [f"{c['workload']} TP{c['tp']}@{c['load']}" for c in outcome.result["measured"]],
        # Seconds of each certification attempt (certifying posterior + joint check).
        "certify_s": [r["certify_s"] for r in outcome.result["timings"]["per_round"] if r.get("certify_s")],
        "certificate": outcome.result.get("certificate"),
        "allocation": outcome.result["allocation"],
        **main,
        "by_truth": {k: {kk: v[kk] for kk in ("eps_correct", "zero_regret", "false_certificate", "scalar_regret")} for k, v in evals.items()},
    }


def _safe_run(task: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_one` (:func:`run_noisy` for a noisy-suite task), or an ``error`` record
    (a broken run must not lose the others)."""
    try:
        return run_noisy(task) if task.get("noisy") else run_one(task)
    except Exception as exc:  # noqa: BLE001 - reported and excluded from the summaries
        return {"error": f"{type(exc).__name__}: {exc}", **{k: task[k] for k in ("scenario", "strategy", "seed")}}


def _run_all(tasks: list[dict[str, Any]], jobs: int, label: str, partial: Path | None = None) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []

    def note(r: dict[str, Any]) -> None:
        if partial is not None:  # one line per finished run: an interrupted benchmark keeps its runs
            with partial.open("a") as fh:
                fh.write(json.dumps({k: v for k, v in r.items() if k != "curve"}, default=_json_default) + "\n")
        if "error" in r:
            print(f"[{label}] ERROR {r['scenario']} {r['strategy']} seed {r['seed']}: {r['error']}", file=sys.stderr, flush=True)
            errors.append(r)
            return
        results.append(r)
        done = len(results)
        if done == 1 or done % 10 == 0 or done + len(errors) == len(tasks):
            el = time.perf_counter() - t0
            print(f"[{label}] {done}/{len(tasks)} runs, {el:.0f} s (last {r['strategy']} seed {r['seed']}: "
                  f"{r['gpu_seconds']:.0f} GPU-s, {r['status']}, {r['wall_s']:.1f} s)", file=sys.stderr, flush=True)

    # Runs on one grid share its compiled programs, so one process serves
    # them all. Runs on several grids (a suite) each get a fresh worker, even
    # with --jobs 1: a long-lived process accumulates every fleet's compiled
    # programs (each fleet has its own shapes) until it hits the kernel's
    # limit on memory maps (vm.max_map_count, 65530: "LLVM compilation error:
    # Cannot allocate memory", then a crashed CBC), after ~12 fleets in one
    # process or ~35 fleets in a long-lived worker.
    if jobs <= 1 and len({t["scenario"] for t in tasks}) <= 1:
        for t in tasks:
            note(_safe_run(t))
    else:
        jobs = max(1, jobs)
        # spawn: JAX is not fork-safe. One fresh worker per run. Not max_tasks_per_child:
        # on Python 3.11 that pool stopped once its workers retired, with tasks
        # still queued. The persistent compilation cache keeps a fresh worker's
        # start cheap.
        from fleetsieve_bayes.backends.lifeline import (
            arm_parent_death_signal,
            stop_workers_on_sigterm,
        )

        ctx = get_context("spawn")
        pending = list(tasks)
        running: dict[Any, ProcessPoolExecutor] = {}

        # A SIGTERM to this process stops the workers too (they would
        # otherwise run on, orphaned, holding cores and gigabytes); a SIGKILL
        # does through each worker's parent-death signal.
        stop_workers_on_sigterm(running)
        while pending or running:
            while pending and len(running) < jobs:
                ex = ProcessPoolExecutor(1, mp_context=ctx, initializer=arm_parent_death_signal)
                running[ex.submit(_safe_run, pending.pop(0))] = ex
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                running.pop(f).shutdown(wait=True)
                # recorded as it finishes: an interrupted benchmark keeps every
                # finished run in --partial
                note(f.result())
    return results


# ------------------------------------------------------------------- statistics


def boot_mean_ci(x: np.ndarray, *, seed: int = BOOT_SEED) -> tuple[float, float]:
    """95% percentile-bootstrap CI of the mean of ``x (n,)``."""
    if len(x) < 2:
        return (float(np.mean(x)), float(np.mean(x)))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), (N_BOOT, len(x)))].mean(axis=1)
    return (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def saving_ci(a: np.ndarray, b: np.ndarray, *, seed: int = BOOT_SEED) -> tuple[float, float, float]:
    """Ratio-of-means saving ``1 − mean(a)/mean(b)`` and its 95% bootstrap CI (independent resamples)."""
    est = 1.0 - float(np.mean(a)) / float(np.mean(b))
    rng = np.random.default_rng(seed)
    ma = a[rng.integers(0, len(a), (N_BOOT, len(a)))].mean(axis=1)
    mb = b[rng.integers(0, len(b), (N_BOOT, len(b)))].mean(axis=1)
    s = 1.0 - ma / mb
    return est, float(np.percentile(s, 2.5)), float(np.percentile(s, 97.5))


def beats_fraction(a: np.ndarray, b: np.ndarray) -> float:
    """P(one run of ``a`` uses fewer GPU-seconds than one run of ``b``), ties counting half."""
    d = a[:, None] - b[None, :]
    return float(np.mean((d < 0) + 0.5 * (d == 0)))


def summarise(runs: list[dict[str, Any]], floor_gpu_s: float) -> dict[str, Any]:
    g = np.array([r["gpu_seconds"] for r in runs])
    lo, hi = boot_mean_ci(g)
    statuses: dict[str, int] = {}
    for r in runs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {
        "runs": len(runs),
        "gpu_seconds_mean": float(g.mean()),
        "gpu_seconds_ci95": [lo, hi],
        "gpu_seconds_min": float(g.min()),
        "gpu_seconds_max": float(g.max()),
        "floor_ratio": float(g.mean() / floor_gpu_s),
        "zero_regret_frac": float(np.mean([r["zero_regret"] for r in runs])),
        "eps_correct_frac": float(np.mean([r["eps_correct"] for r in runs])),
        "regret_mean": float(np.mean([r["scalar_regret"] for r in runs])),
        "regret_min_fulfillment_mean": float(np.mean([r["regret"]["min_fulfillment"] for r in runs])),
        "regret_goodput_mean": float(np.mean([r["regret"]["goodput"] for r in runs])),
        "regret_auc_mean": float(np.mean([r["regret_auc"] for r in runs])),
        "false_certificates": int(sum(r["false_certificate"] for r in runs)),
        "statuses": statuses,
        "wall_s_mean": float(np.mean([r["wall_s"] for r in runs])),
    }


def compare(fs: list[dict[str, Any]], rnd: list[dict[str, Any]]) -> dict[str, Any]:
    a = np.array([r["gpu_seconds"] for r in fs])
    b = np.array([r["gpu_seconds"] for r in rnd])
    est, lo, hi = saving_ci(a, b)
    return {"saving": est, "saving_ci95": [lo, hi], "p_fleetsieve_beats_single_random": beats_fraction(a, b)}


# -------------------------------------------------------------------- campaign


def _seeds(strategy: str, orders: int, fs_seeds: int) -> list[int]:
    if strategy in RANDOMISED:
        return list(range(orders))
    if strategy == "fleetsieve":
        return list(range(fs_seeds))
    return [0]


def bench_campaign(args: argparse.Namespace) -> dict[str, Any]:
    from fleetsieve_bayes.allocation.problem import allocation_to_json
    from fleetsieve_bayes.evaluation.regret import make_oracle

    campaign0, _, _ = _load_scenario(str(args.campaign), args.demand_scales[0], None, args.inference)
    # One scenario per demand scale ("aggregate" when there is one), each with its one-class splits.
    scenarios: list[tuple[str, float, str | None]] = []
    for scale in args.demand_scales:
        head = "aggregate" if len(args.demand_scales) == 1 else f"demand {scale:.1f}×"
        scenarios.append((head, scale, None))
        if args.split:
            scenarios += [(f"{w}-only" if head == "aggregate" else f"{head}, {w}-only", scale, w)
                          for w in campaign0.workload_names]
    out: dict[str, Any] = {"scenarios": {}, "level": args.level}
    tasks = []
    for name, scale, only in scenarios:
        for s in args.strategies:
            for seed in _seeds(s, args.orders, args.fs_seeds):
                tasks.append({
                    "scenario": name, "campaign": str(args.campaign), "demand_scale": scale, "level": args.level,
                    "only": only, "inference": args.inference, "strategy": s, "seed": seed, "truths": ["table"],
                })
    # Interleave strategies so a slow or interrupted run still compares side by side.
    tasks.sort(key=lambda t: (t["seed"], t["scenario"], t["strategy"]))
    runs = [] if args.floors_only else _run_all(tasks, args.jobs, "campaign", args.partial)
    for name, scale, only in scenarios:
        campaign, grid, problem = _load_scenario(str(args.campaign), scale, only, args.inference, args.level)
        values = _true_values(campaign, grid, "table")
        oracle = make_oracle(grid, values, problem)
        sc: dict[str, Any] = {
            "oracle": {
                "allocation": allocation_to_json(oracle.allocation, grid),
                "min_fulfillment": oracle.outcome.min_fulfillment,
                "goodput_rps": oracle.outcome.goodput_rps,
                "full_gpu_s": oracle.full_gpu_s,
                "floor_gpu_s": oracle.floor_gpu_s,
                "random_floor_gpu_s": oracle.random_floor_gpu_s,
                # The best saving vs random any method can show if random stops as soon
                # as it has revealed the committed cells and the method stops at the floor.
                "max_saving_vs_random_floor": 1.0 - oracle.floor_gpu_s / oracle.random_floor_gpu_s,
            },
            "strategies": {},
            "runs": {},
        }
        for s in args.strategies:
            rs = [r for r in runs if r["scenario"] == name and r["strategy"] == s]
            if rs:
                sc["strategies"][s] = summarise(rs, oracle.floor_gpu_s)
                sc["runs"][s] = rs
        if "fleetsieve" in sc["runs"]:
            for s in sc["runs"]:
                if s != "fleetsieve":
                    sc["strategies"][s]["vs"] = compare(sc["runs"]["fleetsieve"], sc["runs"][s])
        out["scenarios"][name] = sc
    return out


def campaign_markdown(res: dict[str, Any]) -> str:
    lines = []
    if res.get("level") is not None:
        lines.append(f"Every campaign decides at `slo_attainment = {json.dumps(res['level'])}`.")
    for name, sc in res["scenarios"].items():
        o = sc["oracle"]
        lines.append(f"\n**{name}**: oracle min fulfillment {o['min_fulfillment']:.3f}, goodput "
                     f"{o['goodput_rps']:.2f} req/s; full grid {o['full_gpu_s']:.0f} GPU-s, hindsight floor {o['floor_gpu_s']:.0f} GPU-s; "
                     f"random must spend ≥ {o['random_floor_gpu_s']:.0f} GPU-s in expectation to reveal the committed cells "
                     f"(so saving at the floor ≤ {o['max_saving_vs_random_floor']:.1%})\n")
        lines.append("| strategy | runs | GPU-s mean [95% CI] | ×floor | zero regret | ε-correct | mean regret | regret AUC | saving of FS vs it [CI] | P(FS < one run) | statuses |")
        lines.append("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---|")
        for s, st in sc["strategies"].items():
            vs = st.get("vs")
            sv = f"{vs['saving']:+.1%} [{vs['saving_ci95'][0]:+.1%}, {vs['saving_ci95'][1]:+.1%}]" if vs else "—"
            pb = f"{vs['p_fleetsieve_beats_single_random']:.2f}" if vs else "—"
            stat = ", ".join(f"{k}:{v}" for k, v in st["statuses"].items())
            lines.append(
                f"| {s} | {st['runs']} | {st['gpu_seconds_mean']:.0f} [{st['gpu_seconds_ci95'][0]:.0f}, {st['gpu_seconds_ci95'][1]:.0f}] "
                f"| {st['floor_ratio']:.2f} | {st['zero_regret_frac']:.0%} | {st['eps_correct_frac']:.0%} | {st['regret_mean']:.3f} "
                f"| {st['regret_auc_mean']:.4f} | {sv} | {pb} | {stat} |"
            )
    return "\n".join(lines)


# ----------------------------------------------------------------------- suite


def _suite_slices(spec: dict[str, Any]) -> dict[str, str]:
    knees = spec["knees"]
    kmix = "all-interior" if all(k == "interior" for k in knees) else ("has-edge-knee")
    return {
        "classes": str(spec["n_classes"]),
        "tps": "/".join(map(str, spec["tps"])),
        "knees": kmix,
        "pressure": str(spec["pressure"]),
        "critical": spec["critical"],
        "noise": str(spec["noise"]),
        "gpus": str(spec["gpus"]),
    }


def bench_suite(args: argparse.Namespace) -> dict[str, Any]:
    from fleetsieve_bayes.evaluation.synthetic import random_spec, synthetic_fleet, write_synthetic

    root = Path(tempfile.mkdtemp(prefix="fsb-suite-"))
    tasks = []
    specs = []
    for k in range(args.suite):
        rng = np.random.default_rng([args.suite_seed, k])
        spec = random_spec(rng, hard=args.suite_family == "hard")
        df, camp = synthetic_fleet(rng, spec)
        camp["name"] = f"synthetic-{k}"
        if args.inference is not None:
            camp["model"]["inference"] = args.inference
        if args.family is not None:
            camp["model"]["family"] = _family_ref(args.family)
        c = write_synthetic(root / f"c{k:03d}", df, camp)
        from fleetsieve_bayes.allocation.problem import (
            grid_from_table,
            values_from_table,
        )
        from fleetsieve_bayes.evaluation.regret import make_oracle
        from fleetsieve_bayes.table import read_table

        tab = read_table(c.measurement.table)
        grid = grid_from_table(tab, c.workload_names)
        oracle = make_oracle(grid, values_from_table(grid, tab), c.problem())
        specs.append({
            **spec._asdict(), "campaign": str(c.path), "cells": grid.n_cells,
            "full_gpu_s": oracle.full_gpu_s, "floor_gpu_s": oracle.floor_gpu_s,
            "truly_feasible": oracle.allocation.feasible,
        })
        for s in args.strategies:
            for seed in _seeds(s, args.orders, args.fs_seeds):
                tasks.append({
                    "scenario": f"c{k:03d}", "campaign": str(c.path), "demand_scale": 1.0, "only": None,
                    "inference": None, "strategy": s, "seed": seed, "truths": ["table", "curve"],
                })
    tasks.sort(key=lambda t: (t["seed"], t["scenario"], t["strategy"]))
    if args.fleets:  # a subset, run in the order given (e.g. the fleets an interrupted run missed)
        order = {f"c{int(k):03d}": i for i, k in enumerate(args.fleets.split(","))}
        tasks = sorted((t for t in tasks if t["scenario"] in order), key=lambda t: (order[t["scenario"]], t["seed"]))
    if args.partial is not None:
        args.partial.with_suffix(".specs.json").write_text(json.dumps(specs, indent=1, default=_json_default))
    runs = _run_all(tasks, args.jobs, "suite", args.partial)
    per: list[dict[str, Any]] = []
    for k, spec in enumerate(specs):
        name = f"c{k:03d}"
        entry: dict[str, Any] = {
            "name": name, "spec": spec, "slices": _suite_slices(spec), "strategies": {},
            "cells": spec["cells"], "full_gpu_s": spec["full_gpu_s"], "floor_gpu_s": spec["floor_gpu_s"],
            "truly_feasible": spec["truly_feasible"],
        }
        for s in args.strategies:
            rs = [r for r in runs if r["scenario"] == name and r["strategy"] == s]
            if not rs:
                continue
            entry["strategies"][s] = {
                "gpu_seconds_mean": float(np.mean([r["gpu_seconds"] for r in rs])),
                "eps_correct_frac": float(np.mean([r["eps_correct"] for r in rs])),
                "eps_correct_curve_frac": float(np.mean([r["by_truth"]["curve"]["eps_correct"] for r in rs])),
                "false_certificates": int(sum(r["false_certificate"] for r in rs)),
                "false_certificates_curve": int(sum(r["by_truth"]["curve"]["false_certificate"] for r in rs)),
                "statuses": [r["status"] for r in rs],
                "regret_auc_mean": float(np.mean([r["regret_auc"] for r in rs])),
                "floor_ratio_mean": float(np.mean([r["floor_ratio"] for r in rs])),
                "full_ratio_mean": float(np.mean([r["gpu_seconds"] for r in rs])) / spec["full_gpu_s"],
                "runs": rs,
            }
        per.append(entry)
    out: dict[str, Any] = {"campaigns": per, "strategies": {}}
    for s in args.strategies:
        es = [e["strategies"][s] for e in per if s in e["strategies"]]
        if not es:
            continue
        out["strategies"][s] = {
            "campaigns": len(es),
            "eps_correct_frac": float(np.mean([e["eps_correct_frac"] for e in es])),
            "eps_correct_curve_frac": float(np.mean([e["eps_correct_curve_frac"] for e in es])),
            "false_certificates": int(sum(e["false_certificates"] for e in es)),
            "false_certificates_curve": int(sum(e["false_certificates_curve"] for e in es)),
            "gpu_seconds_mean": float(np.mean([e["gpu_seconds_mean"] for e in es])),
            "floor_ratio_mean": float(np.mean([e["floor_ratio_mean"] for e in es])),
            "floor_ratio_max": float(np.max([e["floor_ratio_mean"] for e in es])),
            # Mean of per-fleet ratios, and ratio of summed means (big fleets weigh more).
            "full_ratio_mean": float(np.mean([e["full_ratio_mean"] for e in es])),
            "full_ratio_pooled": float(
                sum(e["gpu_seconds_mean"] for e in es) / sum(p["full_gpu_s"] for p in per if s in p["strategies"])
            ),
            "regret_auc_mean": float(np.mean([e["regret_auc_mean"] for e in es])),
            "statuses": {st: sum(e["statuses"].count(st) for e in es) for st in sorted({x for e in es for x in e["statuses"]})},
        }
    if "fleetsieve" in args.strategies and "random" in args.strategies:
        both = [e for e in per if "fleetsieve" in e["strategies"] and "random" in e["strategies"]]
        a = np.array([e["strategies"]["fleetsieve"]["gpu_seconds_mean"] for e in both])
        b = np.array([e["strategies"]["random"]["gpu_seconds_mean"] for e in both])
        rng = np.random.default_rng(BOOT_SEED)
        idx = rng.integers(0, len(a), (N_BOOT, len(a)))
        boot = 1.0 - a[idx].sum(axis=1) / b[idx].sum(axis=1)  # paired over campaigns
        out["saving_vs_random"] = {
            "saving": float(1.0 - a.sum() / b.sum()),
            "saving_ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
            "per_campaign_fs_better_frac": float(np.mean(a < b)),
        }
        slices: dict[str, dict[str, Any]] = {}
        for e, x, y in zip(both, a, b, strict=True):
            for dim, val in e["slices"].items():
                d = slices.setdefault(f"{dim}={val}", {"n": 0, "fs": 0.0, "random": 0.0})
                d["n"] += 1
                d["fs"] += float(x)
                d["random"] += float(y)
        for d in slices.values():
            d["saving"] = 1.0 - d["fs"] / d["random"]
        out["slices"] = dict(sorted(slices.items()))
    return out


def suite_markdown(res: dict[str, Any]) -> str:
    lines = ["\n### synthetic suite, per fleet\n",
             "| fleet | cells | classes | TPs | truly feasible | strategy | GPU-s | ×full grid | ×floor | ε-correct | false certificates | statuses |",
             "|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|"]
    for e in res["campaigns"]:
        for s, st in e["strategies"].items():
            lines.append(
                f"| {e['name']} | {e['cells']} | {e['spec']['n_classes']} | {'/'.join(map(str, e['spec']['tps']))} | "
                f"{'yes' if e['truly_feasible'] else 'no'} | {s} | {st['gpu_seconds_mean']:.0f} | {st['full_ratio_mean']:.2f} | "
                f"{st['floor_ratio_mean']:.2f} | {st['eps_correct_frac']:.0%} | {st['false_certificates']} | "
                f"{', '.join(sorted(set(st['statuses'])))} |"
            )
    lines += ["\n### synthetic suite\n",
              "| strategy | campaigns | ε-correct (table) | ε-correct (noise-free curve) | false certificates (table / curve) | mean GPU-s | ×full grid (mean / pooled) | ×floor (mean / max) | regret AUC | statuses |",
              "|---|---:|---:|---:|---|---:|---|---|---:|---|"]
    for s, st in res["strategies"].items():
        stat = ", ".join(f"{k}:{v}" for k, v in st["statuses"].items())
        lines.append(f"| {s} | {st['campaigns']} | {st['eps_correct_frac']:.1%} | {st['eps_correct_curve_frac']:.1%} | "
                     f"{st['false_certificates']} / {st['false_certificates_curve']} | {st['gpu_seconds_mean']:.0f} | "
                     f"{st['full_ratio_mean']:.2f} / {st['full_ratio_pooled']:.2f} | "
                     f"{st['floor_ratio_mean']:.2f} / {st['floor_ratio_max']:.2f} | {st['regret_auc_mean']:.4f} | {stat} |")
    if "saving_vs_random" in res:
        sv = res["saving_vs_random"]
        lines.append(f"\nfleetsieve vs random (ratio of summed per-campaign means): saving {sv['saving']:+.1%} "
                     f"[{sv['saving_ci95'][0]:+.1%}, {sv['saving_ci95'][1]:+.1%}]; fleetsieve cheaper in "
                     f"{sv['per_campaign_fs_better_frac']:.0%} of campaigns\n")
        lines.append("| slice | campaigns | saving vs random |\n|---|---:|---:|")
        for k, d in res["slices"].items():
            lines.append(f"| {k} | {d['n']} | {d['saving']:+.1%} |")
    return "\n".join(lines)


# ------------------------------------------------------------------- noisy suite


def run_noisy(task: dict[str, Any]) -> dict[str, Any]:
    """Fleet ``task["k"]`` of the noisy suite: its campaign at ``task["level"]`` to its stop,
    scored on the truth at that level beside the full grid with one and with three windows."""
    from fleetsieve_bayes.campaign.journal import plan_seconds
    from fleetsieve_bayes.campaign.runner import run_campaign
    from fleetsieve_bayes.evaluation.attainment import noisy_fleet
    from fleetsieve_bayes.evaluation.noisy import (
        conservative_answer,
        full_grid_scores,
        noisy_suite_fleet,
        repeat_truth,
        score_campaign,
    )
    from fleetsieve_bayes.evaluation.synthetic import write_synthetic
    from fleetsieve_bayes.model.storage import load_idata

    spec, table, camp = noisy_suite_fleet(task["suite_seed"], task["k"], windows=task["windows"],
                                          level=task["level"], max_windows=task["max_windows"])
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        # --workdir keeps each fleet's campaign directory: a rerun resumes (or rescores) it.
        where = Path(task["workdir"]) / task["scenario"] if task.get("workdir") else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="fsb-noisy-")))
        if task.get("family"):
            camp = {**camp, "model": {**camp["model"], "family": task["family"]}}
        campaign = write_synthetic(where, table, camp)  # every replicate row: the replay table
        problem = campaign.problem()
        fleet = noisy_fleet(table, campaign.workload_names)
        outcome = run_campaign(campaign, where / "run", strategy=task["strategy"], seed=task["seed"])
        conservative = conservative_answer(fleet, problem, where / "run", task["level"], campaign.epsilon)
        post = where / "run" / "posterior.nc"
        plan = plan_seconds(where / "run" / "journal.jsonl")
        latent = np.asarray(load_idata(post).posterior["latent"]) if post.exists() else None
    wall = time.perf_counter() - t0
    median = None if latent is None else np.median(latent.reshape(-1, *latent.shape[-2:]), axis=0)
    score = score_campaign(fleet, problem, outcome.result, task["level"], campaign.epsilon, median)
    for o in score["oracle_cells"]:  # an oracle cell the campaign measured as often as it may
        o["at_limit"] = o["windows"] >= task["max_windows"]
    return {
        "scenario": task["scenario"], "strategy": task["strategy"], "seed": task["seed"], "wall_s": wall,
        "k": task["k"], "cells": fleet.grid.n_cells, "classes": fleet.grid.n_classes,
        "spec": spec._asdict(), "level": task["level"],
        **score,
        "full_grid": full_grid_scores(fleet, table, problem, task["level"], campaign.epsilon),
        "allocation": outcome.result["allocation"],
        "repeat": outcome.result.get("repeat"),
        "repeat_truth": repeat_truth(fleet, outcome.result.get("repeat"), task["max_windows"]),
        "answer": outcome.result.get("answer"),
        "conservative_answer": conservative,
        "plan_s": plan,
        "commit": _code_commit(),
    }


def _code_commit() -> str | None:
    """The commit of the fleetsieve_bayes a run imported (its checkout's ``git rev-parse
    --short HEAD``, ``+dirty`` with uncommitted changes to the campaign code there, the
    scoring in ``evaluation/`` aside), or None outside a checkout:
    a checkpoint file gathers runs across commits, and the published table says which."""
    import fleetsieve_bayes

    root = Path(fleetsieve_bayes.__file__).resolve().parent.parent
    try:
        full = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "fleetsieve_bayes",
                                ":!fleetsieve_bayes/evaluation"],  # the scoring, not the campaign
                               cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return (full + ("+dirty" if dirty else "")) or None


def _commits(runs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The fleets of each commit their campaigns ran at (``"unrecorded"``: a record from before
    runs carried it)."""
    out: dict[str, list[str]] = {}
    for r in sorted(runs, key=lambda r: r["k"]):
        out.setdefault(r.get("commit") or "unrecorded", []).append(r["scenario"])
    return out


def _with_repeat_truth(r: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """A checkpointed record written before ``repeat_truth`` existed, with it (the suite's
    fleets are deterministic: fleet ``k`` is rebuilt to read its cell's true attainment)."""
    if "repeat_truth" in r:
        return r
    from fleetsieve_bayes.evaluation.attainment import noisy_fleet
    from fleetsieve_bayes.evaluation.noisy import noisy_suite_fleet, repeat_truth

    _, table, camp = noisy_suite_fleet(args.suite_seed, r["k"], windows=args.windows, level=args.level,
                                       max_windows=args.max_windows)
    names = tuple(w["name"] for w in camp["workloads"])
    return {**r, "repeat_truth": repeat_truth(noisy_fleet(table, names), r.get("repeat"), args.max_windows)}


def _pooled(runs: list[dict[str, Any]], key: str, sub: str) -> float | None:
    """Cell-weighted mean of ``run[key][sub]`` over runs that have cells there."""
    vals = [(r[key][sub], r[key]["cells"]) for r in runs if r.get(key) and r[key]["cells"]]
    return float(sum(v * n for v, n in vals) / sum(n for _, n in vals)) if vals else None


def summarise_noisy(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The suite's figures against issue 29's targets (``runs``: :func:`run_noisy` records)."""
    gpu = np.array([r["gpu_seconds"] for r in runs])
    full = {w: np.array([r["full_grid"][w]["gpu_seconds"] for r in runs]) for w in ("1", "3")}
    committed = [c for r in runs for c in r["committed"]]
    err = np.array([abs(c["median"] - c["truth"]) for c in committed])
    cov = np.array([c["lo"] - 1e-9 <= c["truth"] <= c["hi"] + 1e-9 for c in committed])
    wrong = [r for r in runs if not r["correct"]]
    capped = [r for r in wrong if r["status"] in ("undecided", "exhausted") and (r.get("repeat_truth") or {}).get("at_limit")]
    statuses: dict[str, int] = {}
    for r in runs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {
        "fleets": len(runs),
        "correct_frac": float(np.mean([r["correct"] for r in runs])),
        "false_certificates": int(sum(r["false_certificate"] for r in runs)),
        "truly_feasible_at_level": int(sum(r["oracle_feasible"] for r in runs)),
        "statuses": dict(sorted(statuses.items())),
        "gpu_seconds_mean": float(gpu.mean()),
        "full1_ratio_pooled": float(gpu.sum() / full["1"].sum()),
        "full1_ratio_mean": float(np.mean(gpu / full["1"])),
        "floor_ratio_mean": float(np.mean([r["gpu_seconds"] / r["floor_gpu_s"] for r in runs])),
        "floor_ratio_max": float(np.max([r["gpu_seconds"] / r["floor_gpu_s"] for r in runs])),
        "repeats": int(sum(r["repeats"] for r in runs)),
        "fleets_with_repeats": int(sum(r["repeats"] > 0 for r in runs)),
        # Round planning wall times (fit, allocations, acquisition, certification attempt),
        # pooled over the runs that recorded them.
        **_plan_summary(runs),
        "full_grid": {w: {"correct_frac": float(np.mean([r["full_grid"][w]["correct"] for r in runs])),
                          "gpu_seconds_mean": float(full[w].mean())} for w in ("1", "3")},
        "committed_cells": len(committed),
        "committed_mae": float(err.mean()) if err.size else None,
        "committed_coverage": float(cov.mean()) if cov.size else None,
        "tails_cells": int(sum(r["tails_unmeasured"]["cells"] for r in runs if r.get("tails_unmeasured"))),
        "tails_ttft_within_20": _pooled(runs, "tails_unmeasured", "ttft"),
        "tails_completion_within_20": _pooled(runs, "tails_unmeasured", "completion"),
        "tails_throughput_within_20": _pooled(runs, "tails_unmeasured", "throughput"),
        # How the wrong decisions end: uncertified with the cell to repeat at its window limit,
        # and how many of those cells truly attain the level (more windows would admit them).
        "commits": _commits(runs),
        "wrong": len(wrong),
        "wrong_capped": len(capped),
        "wrong_capped_truly_admissible": sum(r["repeat_truth"]["truth"] >= r["level"] for r in capped),
        # Of the wrong runs that recorded the oracle's cells: those whose oracle commits a cell the
        # campaign measured to its window limit (only more windows could have admitted it).
        "wrong_with_oracle": len(with_oracle := [r for r in wrong if "oracle_cells" in r]),
        "wrong_oracle_at_limit": sum(any(o.get("at_limit") for o in r["oracle_cells"]) for r in with_oracle),
        # The same runs answering with the final conservative allocation ([stopping]
        # uncertified_answer = "conservative"), over the runs that recorded it.
        **_conservative_summary(runs),
    }


def _plan_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and max round planning time (s) over every round of the runs that recorded them."""
    plans = [t for r in runs for t in r.get("plan_s") or []]
    if not plans:
        return {"plan_rounds": 0}
    return {"plan_rounds": len(plans), "plan_s_median": float(np.median(plans)), "plan_s_max": float(np.max(plans)),
            "plan_fleets": sum(bool(r.get("plan_s")) for r in runs)}


def _answer_words(s: dict[str, Any]) -> str:
    """How a summary's runs answered: the rules they recorded (a summary written before
    the key existed: best estimate, then the default)."""
    rules = s.get("answer_rules")
    if rules is None:
        return "best estimate by default"
    return " and ".join(f"`{r}`" for r in rules) or "none uncertified"


def _conservative_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Correct decisions of the recorded answers against the conservative answers of the
    same runs (the records that carry both; an older record carries neither)."""
    both = [r for r in runs if r.get("conservative_answer") is not None and r.get("answer")]
    if not both:
        return {"answers_compared": 0}
    return {
        "answers_compared": len(both),
        # result.json's answer of the uncertified runs ("credible", "best-estimate").
        "answer_rules": sorted({str(r["answer"]) for r in both if r["answer"] not in ("conservative", "measured-only")}),
        "answer_correct": int(sum(r["correct"] for r in both)),
        "conservative_correct": int(sum(r["conservative_answer"]["correct"] for r in both)),
        "answer_slo_ok": int(sum(r["slo_ok"] for r in both)),
        "conservative_slo_ok": int(sum(r["conservative_answer"]["slo_ok"] for r in both)),
        "answers_differ": int(sum(not r["conservative_answer"]["same"] for r in both)),
    }


def _done_noisy(partial: Path | None, scenarios: set[str]) -> dict[str, dict[str, Any]]:
    """Finished noisy-suite records already in ``partial`` (JSONL), by scenario (the last of each)."""
    if partial is None or not partial.exists():
        return {}
    done: dict[str, dict[str, Any]] = {}
    for line in partial.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by an interrupted write
            continue
        if r.get("scenario") in scenarios and "error" not in r and "full_grid" in r:
            done[r["scenario"]] = r
    return done


def noisy_baselines(ks: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """``--noisy N --floors-only``: no campaign, only each fleet's full grids (1 and 3 windows)
    scored at the level, and the hindsight floor of the truth at that level."""
    from fleetsieve_bayes.evaluation.attainment import noisy_fleet, true_level_table
    from fleetsieve_bayes.evaluation.noisy import full_grid_scores, noisy_suite_fleet
    from fleetsieve_bayes.evaluation.regret import make_oracle
    from fleetsieve_bayes.evaluation.synthetic import write_synthetic

    per = []
    for k in ks:
        _, table, camp = noisy_suite_fleet(args.suite_seed, k, windows=args.windows, level=args.level,
                                           max_windows=args.max_windows)
        with tempfile.TemporaryDirectory(prefix="fsb-noisy-") as tmp:
            campaign = write_synthetic(tmp, table, camp)
        problem, fleet = campaign.problem(), noisy_fleet(table, campaign.workload_names)
        oracle = make_oracle(fleet.grid, true_level_table(fleet, problem, args.level), problem)
        per.append({"scenario": f"n{k:03d}", "cells": fleet.grid.n_cells, "oracle_feasible": bool(oracle.allocation.feasible),
                    "floor_gpu_s": oracle.floor_gpu_s,
                    "full_grid": full_grid_scores(fleet, table, problem, args.level, campaign.epsilon)})
    return {"fleets": len(per), "feasible": int(sum(r["oracle_feasible"] for r in per)),
            "full_grid": {w: {"correct_frac": float(np.mean([r["full_grid"][w]["correct"] for r in per])),
                              "gpu_seconds_mean": float(np.mean([r["full_grid"][w]["gpu_seconds"] for r in per]))}
                          for w in ("1", "3")},
            "floor_over_full1_pooled": float(sum(r["floor_gpu_s"] for r in per)
                                             / sum(r["full_grid"]["1"]["gpu_seconds"] for r in per)),
            "per_fleet": per}


def _family_ref(family: str) -> str:
    """A prior card as a campaign written elsewhere reads it: a shipped card's name, or an absolute path."""
    from fleetsieve_bayes.model.priors import card_path

    p = card_path(family)  # refuses an unknown name or a missing file, with a did-you-mean
    return family if p.parent.name == "priors" and p.stem == family else str(p.resolve())


def bench_noisy(args: argparse.Namespace) -> dict[str, Any]:
    """Every fleet of the noisy suite (or ``--fleets``), resumed from ``--partial`` when ``--resume``."""
    ks = [int(k) for k in args.fleets.split(",")] if args.fleets else list(range(args.noisy))
    if args.floors_only:
        return {"noisy_baselines": {"level": args.level, "windows": args.windows, **noisy_baselines(ks, args)}}
    tasks = [{
        "noisy": True, "scenario": f"n{k:03d}", "k": k, "suite_seed": args.suite_seed, "windows": args.windows,
        "level": args.level, "max_windows": args.max_windows, "strategy": "fleetsieve", "seed": 0,
        "workdir": None if args.workdir is None else str(args.workdir.resolve()),
        "family": None if args.family is None else _family_ref(args.family),
    } for k in ks]
    done = _done_noisy(args.partial, {t["scenario"] for t in tasks}) if args.resume else {}
    if done:
        print(f"[noisy] {len(done)} fleets already in {args.partial}", file=sys.stderr, flush=True)
    runs = [_with_repeat_truth(r, args) for r in done.values()] + _run_all([t for t in tasks if t["scenario"] not in done], args.jobs, "noisy", args.partial)
    runs.sort(key=lambda r: r["k"])
    from fleetsieve_bayes.model.priors import load_card

    family = args.family or "generic"
    card = load_card(family)
    window = {f.name.removeprefix("window_"): getattr(card, f.name) for f in dataclasses.fields(card)
              if f.name.startswith("window_")}
    tp_sd = {"capacity": card.capacity_tp_sd, "ttft": card.ttft_tp_sd, "completion": card.completion_tp_sd}
    return {"noisy": {"card": card.name, "card_window": window, "card_tp_sd": tp_sd, "level": args.level, "windows": args.windows, "max_windows_per_cell": args.max_windows,
                      "suite_seed": args.suite_seed, "summary": summarise_noisy(runs) if runs else None, "runs": runs}}


def _burst_p95(window: dict[str, float]) -> float:
    """The 95th percentile of a card's prior burst probability (logit-normal, family and class sds)."""
    p, sd = window["burst_probability"], math.hypot(window["burst_logit_sd"], window["burst_class_sd"])
    return 1.0 / (1.0 + math.exp(-(math.log(p / (1.0 - p)) + 1.6448536 * sd)))


MODEL_SHAPE = (
    "One measurement window of a cell is not the cell. The window-noise model (`model/joint.py`, the prior "
    "card's `[window]` section; card `{card}`) takes its shape and its prior scales from published repeats. "
    "**Tails scatter more near and past the knee**: three identical vLLM benchmark runs gave p99 TTFT of 533, "
    "741 and 597 ms (vllm-project/vllm PR 7062), a standard deviation of the logs of 0.17; the card's tail "
    "window sd is `tail_light_sd` {tail_light_sd:g} at light load plus `tail_knee_sd` {tail_knee_sd:g} near and "
    "past utilisation {knee_utilisation:g} (log-normal priors, sd {tail_log_sd:g} at the family level and "
    "{tail_class_sd:g} between classes). **Success mostly sits near its truth, sometimes drops in a burst**: "
    "the FleetSieve paper repeated eight boundary cells over five seeds and chat TP4@C96 fell from about 0.99 "
    "to 94.3 % once in 40 windows, a drop of 1.8 on the logit; the card's success window is a mixture — with "
    "probability `burst_probability` {burst_probability:g} the logit drops by an exponential amount of mean "
    "`burst_drop` {burst_drop:g}, otherwise a normal scatter of sd `success_sd` {success_sd:g}. The burst "
    "probability's prior is that count's own evidence: one burst in 40 windows under Jeffreys' prior is "
    "Beta(1.5, 39.5), median 0.029 and 95th percentile 0.094; the card's logit-normal (centre "
    "{burst_probability:g}, sd {burst_logit_sd:g} at the family level and {burst_class_sd:g} between classes) "
    "has its 95th percentile at {burst_p95:.2f}. **Throughput "
    "barely moves** (`throughput_sd` {throughput_sd:g}): a served rate over a 300 s window averages thousands "
    "of requests. A cell's windows share its departure from the model's curve, so several windows of one "
    "cell pin its own truth while the window scales are learnt from the spread within repeated cells."
)

NOISE_SHAPE = (
    "Each fleet is the hard suite's (`random_spec`) with window noise (`evaluation/synthetic.py`, "
    "`window_noise_params`, drawn per class): a window's p99 tails scatter log-normally with sd "
    "0.02–0.06 at light load plus 0.08–0.25 near and past the knee (`s0 + s1·sigmoid((ρ − 0.85)/0.1)`); "
    "its success sits near its truth (logit sd 0.15–0.5) but with probability 0.01–0.08 drops in a "
    "burst (an exponential logit drop of mean 0.8–2); throughput barely moves (log-sd 0.01). Each cell "
    "has {windows} replicate rows and its exact true attainment (the probability that one window meets "
    "its class's SLOs). A decision is **correct** when every committed cell's true attainment is at "
    "least the level and it is ε-correct against the optimum of the truth at that level; a **false "
    "certificate** is a certified decision that is not correct. The full grids measure every cell once, "
    "or three times and read the median window, and decide the point way."
)


def _repeat_cell(r: dict[str, Any]) -> str:
    """A run's cell to repeat: ``chat TP4@C7 3/3 0.97`` (windows / limit, true attainment),
    ``chat TP4@C7 3`` from a record without its truth, or — for none."""
    rt, rep = r.get("repeat_truth"), r.get("repeat")
    if rt:
        return f"{rt['cell']} {rt['windows']}/{rt['limit']} {rt['truth']:.2f}"
    return "—" if not rep else f"{rep['workload']} TP{rep['tp']}@{rep['load']} {rep['windows']}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def noisy_markdown(res: dict[str, Any]) -> str:
    """The noisy suite's tables: the summary against issue 29's targets, then per fleet."""
    nz = res["noisy"]
    s = nz["summary"]
    if s is None:
        return "No fleet finished."
    f1, f3 = s["full_grid"]["1"], s["full_grid"]["3"]
    mae = "—" if s["committed_mae"] is None else f"{s['committed_mae']:.3f}"
    stat = ", ".join(f"{k}: {v}" for k, v in s["statuses"].items())
    from fleetsieve_bayes.evaluation.noisy import SUITE_LEVEL

    # The suite's own level carries the model and the suite's description and issue 29's
    # targets; another level's section reads them there (only 0 false certificates holds at any level).
    main = nz["level"] == SUITE_LEVEL
    target = (lambda t: t) if main else (lambda t: "")
    model = MODEL_SHAPE.format(card=nz["card"], burst_p95=_burst_p95(nz["card_window"]), **nz["card_window"]) if nz.get("card_window") else ""
    intro = [model, "", "**The noisy suite.** " + NOISE_SHAPE.format(windows=nz["windows"]), ""] if main else [
        f"The noisy suite of the section above, its campaigns at `slo_attainment = {nz['level']:g}` and scored "
        "at that level: a cell is admissible when at least that share of its windows meets its class's SLOs.", ""]
    lines = [
        *intro,
        f"{s['fleets']} fleets at level {nz['level']:g} ({s['truly_feasible_at_level']} feasible on the truth at "
        f"that level), at most {nz['max_windows_per_cell']} windows per cell; statuses {stat}; "
        f"{s['repeats']} repeated windows in {s['fleets_with_repeats']} fleets.", "",
        *([f"![committed cells' attainment, reported against true; each fleet's GPU-seconds]"
           f"(../benchmarks/published/{nz['figure']})", ""] if nz.get("figure") else []),
        "| measure | fleetsieve | full grid, 1 window | full grid, 3 windows | target |",
        "|---|---:|---:|---:|---|",
        f"| decisions correct at the level | {_pct(s['correct_frac'])} | {_pct(f1['correct_frac'])} | "
        f"{_pct(f3['correct_frac'])} | {target('≥ 95 %')} |",
        f"| false certificates | {s['false_certificates']} | — | — | 0 |",
        f"| mean GPU-s | {s['gpu_seconds_mean']:.0f} | {f1['gpu_seconds_mean']:.0f} | {f3['gpu_seconds_mean']:.0f} | |",
        f"| GPU-s × full grid (1 window), pooled / mean | {s['full1_ratio_pooled']:.2f} / {s['full1_ratio_mean']:.2f} "
        f"| 1 | — | {target('≤ 0.6')} |",
        f"| × hindsight floor at the level, mean / max | {s['floor_ratio_mean']:.2f} / {s['floor_ratio_max']:.2f} | | | |",
        f"| committed cells' attainment: MAE ({s['committed_cells']} cells) | {mae} | | | {target('≤ 0.05')} |",
        f"| committed cells: 90 % intervals containing the truth | {_pct(s['committed_coverage'])} | | | {target('≥ 85 %')} |",
        f"| unmeasured cells below saturation ({s['tails_cells']}): TTFT p99 within 20 % | "
        f"{_pct(s['tails_ttft_within_20'])} | | | {target('≥ 75 %')} |",
        f"| … completion p99 within 20 % | {_pct(s['tails_completion_within_20'])} | | | {target('≥ 75 %')} |",
        f"| … throughput within 20 % | {_pct(s['tails_throughput_within_20'])} | | | |",
        *([f"| round planning s, median / max ({s['plan_rounds']} rounds of {s['plan_fleets']} fleets) | "
           f"{s['plan_s_median']:.1f} / {s['plan_s_max']:.1f} | | | {target('≤ 30 / ≤ 120')} |"] if s.get("plan_rounds") else []),
        "",
    ]
    if s.get("answers_compared"):
        n = s["answers_compared"]
        lines += [
            f"**Uncertified answers.** On the {n} fleets whose runs recorded both, the answer "
            f"(`[stopping] uncertified_answer`, {_answer_words(s)}) is correct at the level on "
            f"{s['answer_correct']} and meets every committed cell's level on {s['answer_slo_ok']}; the final "
            f"conservative allocation of the same runs is correct on {s['conservative_correct']} and meets the "
            f"levels on {s['conservative_slo_ok']} (the two differ on {s['answers_differ']} fleets).", "",
        ]
    if s.get("commits"):
        lines += [
            "The campaigns ran at these commits of the package (the checkpoint file gathers runs across "
            "commits; a later rule can move a fleet run before it): "
            + "; ".join(f"`{c}`: {', '.join(f)}" for c, f in s["commits"].items()) + ".", "",
        ]
    if s.get("wrong"):
        lines += [
            f"Of the {s['wrong']} decisions not correct at the level, {s['wrong_capped']} end uncertified (undecided "
            f"or exhausted) with the cell to repeat at its window limit (`max_windows_per_cell`); "
            f"{s['wrong_capped_truly_admissible']} of those cells truly attain the level (more windows would admit "
            "them) and the others do not (more windows would rule them out of the optimistic allocation). The "
            "per-fleet table's last column names each fleet's cell to repeat: its windows out of its limit and its "
            "true attainment.", "",
        ]
        if s.get("wrong_with_oracle"):
            lines += [
                f"Wrong decisions whose runs recorded the oracle's cells: {s['wrong_with_oracle']}; of those, "
                f"{s['wrong_oracle_at_limit']} leave out an oracle cell the campaign had measured to its window limit.", "",
            ]
    lines += [
        "| fleet | cells | classes | feasible at level | status | GPU-s | ×full (1) | ×floor | repeats | correct "
        "| false cert. | full 1 / 3 correct | planning s, median / max | committed: true attainment (reported) "
        "| cell to repeat: windows, true attainment |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---|---|---|---|---|---|",
    ]
    for r in nz["runs"]:
        com = "; ".join(f"{c['cell']} {c['truth']:.2f} ({c['median']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}])"
                        for c in r["committed"]) or "—"
        lines.append(
            f"| {r['scenario']} | {r['cells']} | {r['classes']} | {'yes' if r['oracle_feasible'] else 'no'} | {r['status']} "
            f"| {r['gpu_seconds']:.0f} | {r['gpu_seconds'] / r['full_grid']['1']['gpu_seconds']:.2f} "
            f"| {r['gpu_seconds'] / r['floor_gpu_s']:.2f} | {r['repeats']} | {'yes' if r['correct'] else 'no'} "
            f"| {'**yes**' if r['false_certificate'] else 'no'} "
            f"| {'yes' if r['full_grid']['1']['correct'] else 'no'} / {'yes' if r['full_grid']['3']['correct'] else 'no'} "
            f"| {_plan_cell(r)} | {com} | {_repeat_cell(r)} |"
        )
    return "\n".join(lines)


def _plan_cell(r: dict[str, Any]) -> str:
    """A fleet's round planning times, median / max (s); — for a run that did not record them."""
    plan = r.get("plan_s")
    return f"{np.median(plan):.1f} / {np.max(plan):.1f}" if plan else "—"


# ------------------------------------------------------------------------ plot


def plot_noisy(res: dict[str, Any], path: Path) -> None:
    """The noisy suite at a glance: each committed cell's reported attainment (median and
    interval) against its true attainment, and each fleet's GPU-seconds against its
    one-window full grid, coloured by whether its decision is correct at the level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nz = res["noisy"]
    runs, level = nz["runs"], nz["level"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
    com = [c for r in runs for c in r["committed"]]
    if com:
        t = np.array([c["truth"] for c in com])
        m = np.array([c["median"] for c in com])
        lo, hi = np.array([c["lo"] for c in com]), np.array([c["hi"] for c in com])
        a1.errorbar(t, m, yerr=[m - lo, hi - m], fmt="o", ms=3, lw=0.8, capsize=2, color="tab:blue")
    edge = min([level - 0.05] + [c["truth"] for c in com] + [c["lo"] for c in com])
    a1.plot([edge, 1.0], [edge, 1.0], color="grey", lw=0.8, ls=":")
    a1.axvline(level, color="tab:red", lw=0.8, ls="--")
    a1.axhline(level, color="tab:red", lw=0.8, ls="--", label=f"level {level:g}")
    a1.set_xlabel("true attainment")
    a1.set_ylabel("reported attainment (median, interval)")
    a1.set_title(f"committed cells ({len(com)})")
    a1.legend(fontsize=8, loc="lower right")
    names = [r["scenario"] for r in runs]
    ratio = [r["gpu_seconds"] / r["full_grid"]["1"]["gpu_seconds"] for r in runs]
    colours = ["tab:green" if r["correct"] else "tab:red" for r in runs]
    a2.bar(range(len(runs)), ratio, color=colours)
    for i, r in enumerate(runs):
        a2.text(i, ratio[i] + 0.02, {"certified-feasible": "F", "certified-infeasible": "I", "exhausted": "x"}.get(r["status"], "u"),
                ha="center", fontsize=7)
    from fleetsieve_bayes.evaluation.noisy import SUITE_LEVEL

    if level == SUITE_LEVEL:  # the cost target is stated at the suite's level only
        a2.axhline(0.6, color="grey", lw=0.8, ls="--", label="target 0.6")
    a2.set_xticks(range(len(runs)), names, rotation=90, fontsize=7)
    a2.set_ylabel("GPU-s × full grid (1 window)")
    a2.set_title("per fleet: green correct, red not; F/I certified feasible/infeasible, u undecided, x exhausted",
                 fontsize=10)
    if level == SUITE_LEVEL:
        a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fleetsieve_bayes.evaluation.regret import curve_at

    scen = res.get("scenarios", {})
    if not scen:
        return
    fig, axes = plt.subplots(1, len(scen), figsize=(5.5 * len(scen), 4), squeeze=False)
    for ax, (name, sc) in zip(axes[0], scen.items(), strict=True):
        full = sc["oracle"]["full_gpu_s"]
        xs = np.linspace(0.0, full, 400)
        for s, rs in sc["runs"].items():
            ys = np.mean([curve_at(np.array(r["curve"]["spent"]), np.array(r["curve"]["regret"]), xs) for r in rs], axis=0)
            ax.step(xs / 3600, ys, where="post", label=f"{s} (n={len(rs)})")
        ax.axvline(sc["oracle"]["floor_gpu_s"] / 3600, color="grey", ls=":", lw=1, label="hindsight floor")
        ax.set_xlabel("GPU-hours spent")
        ax.set_ylabel("mean regret of the conservative allocation")
        ax.set_title(name)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    from fleetsieve_bayes.settings import MAX_WINDOWS_PER_CELL

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("campaign", nargs="?", default=str(DEFAULT_CAMPAIGN), help="campaign TOML (default: the shipped H100 grid)")
    p.add_argument("--strategies", default="fleetsieve,random,grid", help="comma-separated strategy names")
    p.add_argument("--orders", type=int, default=20, help="random reveal orders (seeds)")
    p.add_argument("--fs-seeds", type=int, default=3, help="seeds of fleetsieve (posterior sampling noise)")
    p.add_argument("--demand-scale", default="1.0",
                   help="multiply every class's demand; a comma list (1.0,1.3) runs one scenario per scale")
    p.add_argument("--split", action="store_true", help="also run one-class (chat-only, code-only) campaigns")
    p.add_argument("--suite", type=int, default=0, help="run N synthetic fleets instead of the campaign")
    p.add_argument("--suite-seed", type=int, default=0)
    p.add_argument("--suite-family", choices=("hard", "v1"), default="hard",
                   help="hard: the suite of docs/results.md (failures, closed loop, SLOs on cells); v1: the easier suite")
    p.add_argument("--noisy", type=int, default=0,
                   help="run N fleets of the noisy suite (window noise, replicate rows) at --level instead")
    p.add_argument("--quick", action="store_true", help="with --noisy: the first 3 fleets only")
    p.add_argument("--no-figure", action="store_true",
                   help="--noisy --publish: publish the table without its figure (the plot is still written beside --out)")
    p.add_argument("--level", type=_level_arg, default=None,
                   help="the campaigns' slo_attainment: a level in (0, 1) or 'point' (noisy suite: default 0.9; "
                        "a campaign: its own)")
    p.add_argument("--windows", type=int, default=5, help="noisy suite: replicate rows per cell in the table")
    p.add_argument("--max-windows", type=int, default=MAX_WINDOWS_PER_CELL,
                   help=f"noisy suite: max_windows_per_cell (default {MAX_WINDOWS_PER_CELL}, the package's)")
    p.add_argument("--resume", action="store_true",
                   help="noisy suite: reuse the fleets already finished in --partial (a checkpoint)")
    p.add_argument("--workdir", type=Path, default=None,
                   help="noisy suite: keep each fleet's campaign directory here (a rerun resumes it)")
    p.add_argument("--inference", default=None, help="override the campaign's inference preset")
    p.add_argument("--family", default=None,
                   help="with --suite or --noisy: the campaigns' prior card (a shipped name or a path; default generic), "
                   "e.g. a copy of generic with [capacity], [ttft] and [completion] tp_sd = 0.3")
    p.add_argument("--floors-only", action="store_true", help="only the oracle, hindsight floor and random's reveal floor (no model runs)")
    p.add_argument("--fleets", default="", help="with --suite or --noisy: only these fleet numbers, in this order (e.g. 30,31,24)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1: shared 2-core machine)")
    p.add_argument("--partial", type=Path, default=None, help="append each finished run to this JSONL file")
    p.add_argument("--out", type=Path, default=None, help=f"JSON path (default {DEFAULT_OUT.relative_to(REPO)})")
    p.add_argument("--publish", action="store_true", help="write benchmarks/published/<study>.json, its docs/results.md section and MANIFEST.json")
    p.add_argument("--pools", type=int, default=0,
                   help="run N mixed-pool fleets: the mixed campaign against one campaign per GPU type "
                   "and the best single-type fleet (benchmarks/mixed_pools.py; --partial resumes)")
    args = p.parse_args(argv)
    if args.pools:
        return _pools_mode(args, argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    try:
        args.demand_scales = [float(x) for x in args.demand_scale.split(",") if x.strip()]
    except ValueError:
        p.error(f"--demand-scale: expected numbers separated by commas, got {args.demand_scale!r}")
    if not args.demand_scales or min(args.demand_scales) <= 0:
        p.error(f"--demand-scale: expected positive numbers, got {args.demand_scale!r}")
    if args.noisy and args.level is None:
        from fleetsieve_bayes.evaluation.noisy import SUITE_LEVEL

        args.level = SUITE_LEVEL
    if args.noisy and args.level == "point":
        p.error("--level: the noisy suite decides at a level in (0, 1), not 'point'")
    if args.quick and args.noisy:
        args.noisy = min(args.noisy, 3)
    default = "profiling_cost_noisy.json" if args.noisy else "profiling_cost_suite.json" if args.suite else DEFAULT_OUT.name
    out = args.out or DEFAULT_OUT.with_name(default)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = bench_noisy(args) if args.noisy else bench_suite(args) if args.suite else bench_campaign(args)
    figure = None
    if args.noisy and not args.floors_only and res["noisy"]["runs"]:
        figure = out.with_suffix(".png")
        plot_noisy(res, figure)
        if args.publish and not args.no_figure:
            res["noisy"]["figure"] = f"{study_name(args)}.png"  # the published section shows it
    md = published_table(res)
    res["meta"] = {
        "command": " ".join(["python", "benchmarks/profiling_cost.py", *(argv if argv is not None else sys.argv[1:])]),
        "campaign": None if args.suite else str(args.campaign),
        "demand_scale": args.demand_scales,
        "strategies": args.strategies,
        "orders": args.orders,
        "fs_seeds": args.fs_seeds,
        "suite": args.suite,
        "noisy": args.noisy,
        "wall_s": time.perf_counter() - t0,
        "bootstrap": {"seed": BOOT_SEED, "resamples": N_BOOT},
    }
    out.write_text(json.dumps(res, indent=1, default=_json_default) + "\n")
    suite = bool(args.suite or args.noisy)
    if not suite:
        plot(res, out.with_suffix(".png"))
    print(md)
    print(f"\nJSON: {out}" + ("" if suite and figure is None else f"; plot: {out.with_suffix('.png')}"))
    if args.publish:
        from publish import PUBLISHED, command_line, publish

        files = []
        if figure is not None and res["noisy"].get("figure"):
            shutil.copyfile(figure, REPO / PUBLISHED / res["noisy"]["figure"])
            files = [res["noisy"]["figure"]]
        publish(study_name(args), json.loads(json.dumps(res, default=_json_default)), md, command_line(__file__, argv),
                files=files)
    return 0


def _pools_mode(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``--pools N``: the mixed-pool study of benchmarks/mixed_pools.py (seed ``--suite-seed``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mixed_pools import run_study

    args.pool_seed = args.suite_seed
    args.work = None
    return run_study(args, argv)


def published_table(res: dict[str, Any]) -> str:
    """The markdown of a run's JSON ``res`` (a campaign run or a synthetic suite)."""
    if "noisy_baselines" in res:
        b = res["noisy_baselines"]
        f1, f3 = b["full_grid"]["1"], b["full_grid"]["3"]
        return (f"Noisy suite, {b['fleets']} fleets ({b['feasible']} feasible on the truth at level {b['level']:g}), "
                f"no campaign: the fully measured grid read the point way is correct at the level in "
                f"{f1['correct_frac']:.0%} of fleets with one window per cell (mean {f1['gpu_seconds_mean']:.0f} GPU-s) "
                f"and {f3['correct_frac']:.0%} with three (median window; {f3['gpu_seconds_mean']:.0f} GPU-s); the "
                f"hindsight floor at the level is {b['floor_over_full1_pooled']:.2f}× the one-window grid (pooled).")
    if "noisy" in res:
        return noisy_markdown(res)
    return suite_markdown(res) if "campaigns" in res else campaign_markdown(res)


def _level_arg(text: str) -> float | str:
    """``--level``: ``point`` or a level in (0, 1), by the package's own rule (``check_level``)."""
    from fleetsieve_bayes.decision.intervals import check_level

    try:
        value: float | str = float(text)
    except ValueError:
        value = text
    try:
        return check_level(value, "--level")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def study_name(args: argparse.Namespace) -> str:
    """The published study a run belongs to: ``profiling_cost_1.3x``, ``…_split``, ``…_floors``, ``…_suite40_seed1``."""
    if args.noisy:
        from fleetsieve_bayes.evaluation.noisy import SUITE_LEVEL

        return ("profiling_cost_noisy" + ("_baselines" if args.floors_only else "")
                + (f"_level{args.level:g}" if args.level != SUITE_LEVEL else "")
                + (f"_seed{args.suite_seed}" if args.suite_seed else ""))
    if args.suite:
        return f"profiling_cost_suite{args.suite}" + (f"_seed{args.suite_seed}" if args.suite_seed else "")
    if len(args.demand_scales) > 1:
        campaign = Path(args.campaign).resolve()
        name = "profiling_cost_" + ("shipped" if campaign == DEFAULT_CAMPAIGN.resolve() else campaign.parent.name)
    else:
        scale = args.demand_scales[0]
        name = f"profiling_cost_{scale:g}x" if scale != 1.0 else "profiling_cost_1.0x"
    if args.level is not None:
        name += "_point" if args.level == "point" else f"_level{args.level:g}"
    if args.floors_only:
        name += "_floors"
    elif args.split:
        name += "_split"
    return name


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, float) and math.isnan(o):
        return None
    raise TypeError(type(o).__name__)


if __name__ == "__main__":
    raise SystemExit(main())
