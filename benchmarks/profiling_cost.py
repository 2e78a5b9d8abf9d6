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

Prints a markdown table, writes JSON (default
``benchmarks/results/profiling_cost.json``) and a PNG of regret against
GPU-seconds next to it.

Examples::

    python benchmarks/profiling_cost.py                       # quick: 20 random orders
    python benchmarks/profiling_cost.py examples/h100_31b_fp8/campaign.toml \
        --orders 200 --split --out benchmarks/results/profiling_cost_1.0.json
    python benchmarks/profiling_cost.py --demand-scale 1.3 --orders 200
    python benchmarks/profiling_cost.py --suite 30 --orders 5
    python benchmarks/profiling_cost.py --pools 30 --partial pools.jsonl   # mixed GPU pools
"""

from __future__ import annotations

import argparse
import json
import math
import signal
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


def _load_scenario(campaign_path: str, demand_scale: float, only: str | None, inference: str | None) -> Any:
    """The campaign (scaled, optionally restricted to one class), its grid, true values and problem."""
    from fleetsieve_bayes.allocation.problem import grid_from_table
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.table import read_table

    campaign = load_campaign(campaign_path).scaled(demand_scale)
    if only is not None:
        campaign = replace(campaign, workloads=tuple(w for w in campaign.workloads if w.name == only))
    if inference is not None:
        campaign = replace(campaign, inference=inference)
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
        task["campaign"], task["demand_scale"], task["only"], task["inference"]
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
    """:func:`run_one`, or an ``error`` record (a broken run must not lose the others)."""
    try:
        return run_one(task)
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
        ctx = get_context("spawn")
        pending = list(tasks)
        running: dict[Any, ProcessPoolExecutor] = {}

        # A SIGTERM to this process stops the workers too (they would
        # otherwise run on, orphaned, holding cores and gigabytes).
        def stop(signum: int, frame: Any) -> None:
            for ex in running.values():
                for proc in list(getattr(ex, "_processes", {}).values()):
                    proc.kill()
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        while pending or running:
            while pending and len(running) < jobs:
                ex = ProcessPoolExecutor(1, mp_context=ctx)
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

    campaign0, _, _ = _load_scenario(str(args.campaign), args.demand_scale, None, args.inference)
    scenarios: list[tuple[str, str | None]] = [("aggregate", None)]
    if args.split:
        scenarios += [(f"{w}-only", w) for w in campaign0.workload_names]
    out: dict[str, Any] = {"scenarios": {}}
    tasks = []
    for name, only in scenarios:
        for s in args.strategies:
            for seed in _seeds(s, args.orders, args.fs_seeds):
                tasks.append({
                    "scenario": name, "campaign": str(args.campaign), "demand_scale": args.demand_scale,
                    "only": only, "inference": args.inference, "strategy": s, "seed": seed, "truths": ["table"],
                })
    # Interleave strategies so a slow or interrupted run still compares side by side.
    tasks.sort(key=lambda t: (t["seed"], t["scenario"], t["strategy"]))
    runs = [] if args.floors_only else _run_all(tasks, args.jobs, "campaign", args.partial)
    for name, only in scenarios:
        campaign, grid, problem = _load_scenario(str(args.campaign), args.demand_scale, only, args.inference)
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


# ------------------------------------------------------------------------ plot


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("campaign", nargs="?", default=str(DEFAULT_CAMPAIGN), help="campaign TOML (default: the shipped H100 grid)")
    p.add_argument("--strategies", default="fleetsieve,random,grid", help="comma-separated strategy names")
    p.add_argument("--orders", type=int, default=20, help="random reveal orders (seeds)")
    p.add_argument("--fs-seeds", type=int, default=3, help="seeds of fleetsieve (posterior sampling noise)")
    p.add_argument("--demand-scale", type=float, default=1.0)
    p.add_argument("--split", action="store_true", help="also run one-class (chat-only, code-only) campaigns")
    p.add_argument("--suite", type=int, default=0, help="run N synthetic fleets instead of the campaign")
    p.add_argument("--suite-seed", type=int, default=0)
    p.add_argument("--suite-family", choices=("hard", "v1"), default="hard",
                   help="hard: the suite of docs/results.md (failures, closed loop, SLOs on cells); v1: the easier suite")
    p.add_argument("--inference", default=None, help="override the campaign's inference preset")
    p.add_argument("--floors-only", action="store_true", help="only the oracle, hindsight floor and random's reveal floor (no model runs)")
    p.add_argument("--fleets", default="", help="with --suite: only these fleet numbers, in this order (e.g. 30,31,24)")
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
    out = args.out or (DEFAULT_OUT.with_name("profiling_cost_suite.json") if args.suite else DEFAULT_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = bench_suite(args) if args.suite else bench_campaign(args)
    md = published_table(res)
    res["meta"] = {
        "command": " ".join(["python", "benchmarks/profiling_cost.py", *(argv if argv is not None else sys.argv[1:])]),
        "campaign": None if args.suite else str(args.campaign),
        "demand_scale": args.demand_scale,
        "strategies": args.strategies,
        "orders": args.orders,
        "fs_seeds": args.fs_seeds,
        "suite": args.suite,
        "wall_s": time.perf_counter() - t0,
        "bootstrap": {"seed": BOOT_SEED, "resamples": N_BOOT},
    }
    out.write_text(json.dumps(res, indent=1, default=_json_default) + "\n")
    if not args.suite:
        plot(res, out.with_suffix(".png"))
    print(md)
    print(f"\nJSON: {out}" + ("" if args.suite else f"; plot: {out.with_suffix('.png')}"))
    if args.publish:
        from publish import command_line, publish

        publish(study_name(args), json.loads(json.dumps(res, default=_json_default)), md, command_line(__file__, argv))
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
    return suite_markdown(res) if "campaigns" in res else campaign_markdown(res)


def study_name(args: argparse.Namespace) -> str:
    """The published study a run belongs to: ``profiling_cost_1.3x``, ``…_split``, ``…_floors``, ``…_suite40_seed1``."""
    if args.suite:
        return f"profiling_cost_suite{args.suite}" + (f"_seed{args.suite_seed}" if args.suite_seed else "")
    name = f"profiling_cost_{args.demand_scale:g}x" if args.demand_scale != 1.0 else "profiling_cost_1.0x"
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
