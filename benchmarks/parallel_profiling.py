"""Profiling wall clock and GPU-seconds to the certificate, a GPU pool against one cell at a time.

For each scenario — the shipped grid and synthetic ground-truth fleets
(:mod:`fleetsieve_bayes.evaluation.synthetic`) — runs the campaign with one
cell at a time and with ``[measurement] pool_gpus`` of each ``--pools`` size
(local executor, replay on the simulated clock), for each pool at each value
gate fraction of ``--gates`` (:data:`fleetsieve_bayes.decision.batch.GATE_FRACTION`;
``0`` fills every free GPU with believer picks, the planner without a gate), so
the planners sit side by side in one run. Reports per run: status,
``profiling_wall_s``, ``gpu_seconds``, ratios against the same strategy one
cell at a time, whether the certified decision is the one-at-a-time one,
ε-correctness on the truth, false certificates, and the refit + batch
selection seconds per completion (median / max wall, and max CPU seconds of
the process, which bounds the wall time on an idle machine; the first
completion — JIT compilation — excluded). Then, per fleet side by side and as
means over the synthetic fleets: the GPU-s ratio, the wall ratio and the
same-decision rate of each (pool, gate).

Prints markdown tables and writes JSON (default
``benchmarks/results/parallel_profiling.json``).

Examples::

    python benchmarks/parallel_profiling.py                             # shipped grid + 3 fleets, pool 16
    python benchmarks/parallel_profiling.py --suite 0                   # shipped grid only
    python benchmarks/parallel_profiling.py --suite 0 --level point     # shipped grid by the metric rule
    python benchmarks/parallel_profiling.py --suite 8 --gates 0 0.5 --no-campaign
    python benchmarks/parallel_profiling.py --baseline benchmarks/published/parallel_profiling.json

``--baseline`` reuses the one-cell-at-a-time runs of an earlier JSON (the pool's
planner never changes them); the reused runs say so (``reused``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
DEFAULT_CAMPAIGN = REPO / "examples" / "h100_31b_fp8" / "campaign.toml"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "parallel_profiling.json"


def run_one(
    campaign_path: str, scenario: str, pool: int | None, strategy: str, seed: int, truths: list[str],
    gate: float | None = None, level: float | str | None = None,
) -> dict[str, Any]:
    """One campaign to its stop with ``pool`` GPUs (None: one cell at a time) and the pool's value
    gate at ``gate`` (None: the package's default), at the SLO-attainment rule ``level`` (None: the
    campaign's own), evaluated on the truth."""
    from profiling_cost import _true_values

    import fleetsieve_bayes.decision.batch as batch
    from fleetsieve_bayes.allocation.problem import grid_from_table
    from fleetsieve_bayes.campaign.config import ProfilingPool, load_campaign
    from fleetsieve_bayes.campaign.journal import read_journal
    from fleetsieve_bayes.campaign.runner import run_campaign
    from fleetsieve_bayes.evaluation.regret import evaluate_run, make_oracle
    from fleetsieve_bayes.table import read_table

    campaign = load_campaign(campaign_path)
    if level is not None:
        campaign = campaign.at_level(level)
    if pool is not None:
        campaign = replace(campaign, pool=ProfilingPool(pool_gpus=pool))
    grid = grid_from_table(read_table(campaign.measurement.table), campaign.workload_names)
    problem = campaign.problem()
    default_gate = batch.GATE_FRACTION
    gate = default_gate if gate is None else float(gate)
    t0 = time.perf_counter()
    try:
        batch.GATE_FRACTION = gate  # read by the pool driver at each planning step
        with tempfile.TemporaryDirectory(prefix="fsb-par-") as tmp:
            outcome = run_campaign(campaign, Path(tmp), strategy=strategy, seed=seed)
            records, _ = read_journal(Path(tmp) / "journal.jsonl")
    finally:
        batch.GATE_FRACTION = default_gate
    r = outcome.result
    evals = {}
    for truth in truths:
        values = _true_values(campaign, grid, truth)
        ev = evaluate_run(grid, values, problem, make_oracle(grid, values, problem), r, records, campaign.epsilon)
        evals[truth] = {k: ev[k] for k in ("eps_correct", "false_certificate", "scalar_regret")}
    per = r["timings"].get("per_completion_s", [])
    cpu = r["timings"].get("per_completion_cpu_s", [])
    return {
        "scenario": scenario,
        "pool": pool,
        "gate": None if pool is None else gate,
        "strategy": strategy,
        "seed": seed,
        "level": campaign.slo_attainment,
        "status": r["status"],
        "profiling_wall_s": r["profiling_wall_s"],
        "gpu_seconds": r["gpu_seconds"],
        "n_measured": len(r["measured"]),
        "cancelled": len(r.get("cancelled", [])),
        "allocation": r["allocation"],
        "eval": evals,
        "plan_s_median": float(np.median(per[1:])) if len(per) > 1 else None,
        "plan_s_max": float(np.max(per[1:])) if len(per) > 1 else None,
        "plan_cpu_s_median": float(np.median(cpu[1:])) if len(cpu) > 1 else None,
        "plan_cpu_s_max": float(np.max(cpu[1:])) if len(cpu) > 1 else None,
        "run_s": time.perf_counter() - t0,
    }


def _scenarios(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    out = [] if args.no_campaign else [("shipped", str(args.campaign), ["table"])]
    if args.suite:
        from fleetsieve_bayes.evaluation.synthetic import (
            random_spec,
            synthetic_fleet,
            write_synthetic,
        )

        root = Path(tempfile.mkdtemp(prefix="fsb-par-suite-"))
        for k in range(args.suite):
            rng = np.random.default_rng([args.suite_seed, k])
            spec = random_spec(rng)
            df, camp = synthetic_fleet(rng, spec)
            camp["name"] = f"synthetic-{k}"
            c = write_synthetic(root / f"c{k:03d}", df, camp)
            out.append((f"c{k:03d}", str(c.path), ["table", "curve"]))
    return out


def _alloc(r: dict[str, Any]) -> str:
    return json.dumps(r["allocation"], sort_keys=True)


def _variants(runs: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """The (pool, gate) pairs of the runs, one cell at a time first."""
    keys = {(r["pool"], r.get("gate")) for r in runs}
    return sorted(keys, key=lambda k: (-1, -1) if k[0] is None else (k[0], -1.0 if k[1] is None else k[1]))


def _label(pool: Any, gate: Any) -> str:
    if pool is None:
        return "1 cell"
    return f"{pool}" if gate is None else f"{pool}, gate {gate:g}"


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scenario, strategy, pool, gate): means over seeds and ratios against the same strategy
    one at a time; ``same_decision`` is the share of runs whose allocation is a one-at-a-time one."""
    rows = []
    for scen, strat in sorted({(r["scenario"], r["strategy"]) for r in runs}):
        mine = [r for r in runs if r["scenario"] == scen and r["strategy"] == strat]
        base = [r for r in mine if r["pool"] is None]
        if not base:
            continue
        b_wall = float(np.mean([r["profiling_wall_s"] for r in base]))
        b_gpu = float(np.mean([r["gpu_seconds"] for r in base]))
        b_alloc = {_alloc(r) for r in base}
        for pool, gate in _variants(mine):
            rs = [r for r in mine if r["pool"] == pool and r.get("gate") == gate]
            wall = float(np.mean([r["profiling_wall_s"] for r in rs]))
            gpu = float(np.mean([r["gpu_seconds"] for r in rs]))
            plans = [r["plan_s_max"] for r in rs if r["plan_s_max"] is not None]
            meds = [r["plan_s_median"] for r in rs if r["plan_s_median"] is not None]
            cpus = [r["plan_cpu_s_max"] for r in rs if r.get("plan_cpu_s_max") is not None]
            rows.append({
                "scenario": scen,
                "strategy": strat,
                "pool": "1 cell" if pool is None else pool,
                "gate": gate,
                "runs": len(rs),
                "status": sorted({r["status"] for r in rs}),
                "wall_s": wall,
                "gpu_s": gpu,
                "n_measured": float(np.mean([r["n_measured"] for r in rs])),
                "wall_ratio": wall / b_wall if b_wall else float("nan"),
                "gpu_ratio": gpu / b_gpu if b_gpu else float("nan"),
                "same_decision": float(np.mean([_alloc(r) in b_alloc for r in rs])),
                "eps_correct": float(np.mean([r["eval"][list(r["eval"])[-1]]["eps_correct"] for r in rs])),
                "false_certificates": int(sum(r["eval"][t]["false_certificate"] for r in rs for t in r["eval"])),
                "plan_s_median": float(np.median(meds)) if meds else None,
                "plan_s_max": float(np.max(plans)) if plans else None,
                "plan_cpu_s_max": float(np.max(cpus)) if cpus else None,
            })
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """Every (scenario, strategy, pool, gate) row in full."""
    lines = [
        "| scenario | strategy | pool GPUs | runs | status | cells | wall s | GPU-s | wall ratio | GPU-s ratio | same decision | ε-correct | false cert. | plan s (med / max) | plan CPU-s max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        plan = "—" if r["plan_s_max"] is None else f"{r['plan_s_median']:.2f} / {r['plan_s_max']:.2f}"
        cpu = "—" if r.get("plan_cpu_s_max") is None else f"{r['plan_cpu_s_max']:.2f}"
        pool = r["pool"] if r.get("gate") is None else f"{r['pool']}, gate {r['gate']:g}"
        cells = "—" if r.get("n_measured") is None else f"{r['n_measured']:.0f}"
        lines.append(
            f"| {r['scenario']} | {r['strategy']} | {pool} | {r['runs']} | {', '.join(r['status'])} | {cells} | "
            f"{r['wall_s']:,.0f} | {r['gpu_s']:,.0f} | {r['wall_ratio']:.2f} | {r['gpu_ratio']:.2f} | "
            f"{float(r['same_decision']):.0%} | {r['eps_correct']:.2f} | {r['false_certificates']} | {plan} | {cpu} |"
        )
    return "\n".join(lines)


def side_by_side(rows: list[dict[str, Any]], means: dict[str, Any]) -> str:
    """One line per (scenario, strategy): one cell at a time, then each (pool, gate)'s GPU-s ratio,
    wall ratio and decision (= the one-at-a-time one, ≠ not); the suite means last."""
    variants = sorted({(r["pool"], r.get("gate")) for r in rows if r["pool"] != "1 cell"},
                      key=lambda k: (k[0], -1.0 if k[1] is None else k[1]))
    head = ["scenario", "strategy", "1 cell: wall s / GPU-s"] + [
        f"pool {_label(p, g)}: GPU-s / wall / same" for p, g in variants
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scen, strat in sorted({(r["scenario"], r["strategy"]) for r in rows}):
        mine = {(r["pool"], r.get("gate")): r for r in rows if r["scenario"] == scen and r["strategy"] == strat}
        base = mine.get(("1 cell", None))
        if base is None:
            continue
        cells = [scen, strat, f"{base['wall_s']:,.0f} / {base['gpu_s']:,.0f}"]
        for v in variants:
            r = mine.get(v)
            cells.append("—" if r is None else f"{r['gpu_ratio']:.2f}x / {r['wall_ratio']:.2f}x / {float(r['same_decision']):.0%}")
        lines.append("| " + " | ".join(cells) + " |")
    for strat in sorted({r["strategy"] for r in rows}):
        ms = [means.get(f"{strat}@{_label(p, g)}") for p, g in variants]
        if not any(ms):
            continue
        n = max(m["fleets"] for m in ms if m)
        cells = [f"mean over {n} synthetic fleets", strat, "1.00x / 1.00x"] + [
            "—" if m is None else f"{m['mean_gpu_ratio']:.2f}x / {m['mean_wall_ratio']:.2f}x / {m['same_decision_rate']:.0%}"
            for m in ms
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def suite_means(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the synthetic fleets (the shipped grid apart), per (strategy, pool, gate): wall
    and GPU-s ratios, the same-decision rate, ε-correctness and the false certificates."""
    out: dict[str, Any] = {}
    for r in rows:
        if r["scenario"] == "shipped" or r["pool"] == "1 cell":
            continue
        k = f"{r['strategy']}@{_label(r['pool'], r.get('gate'))}"
        out.setdefault(k, {"wall_ratio": [], "gpu_ratio": [], "same": [], "eps_correct": [], "false_certificates": 0})
        out[k]["wall_ratio"].append(r["wall_ratio"])
        out[k]["gpu_ratio"].append(r["gpu_ratio"])
        out[k]["same"].append(float(r["same_decision"]))
        out[k]["eps_correct"].append(r["eps_correct"])
        out[k]["false_certificates"] += r["false_certificates"]
    return {
        k: {
            "fleets": len(v["wall_ratio"]),
            "mean_wall_ratio": float(np.mean(v["wall_ratio"])),
            "mean_gpu_ratio": float(np.mean(v["gpu_ratio"])),
            "same_decision_rate": float(np.mean(v["same"])),
            "eps_correct": float(np.mean(v["eps_correct"])),
            "false_certificates": v["false_certificates"],
        }
        for k, v in out.items()
    }


def published_table(res: dict[str, Any]) -> str:
    """The side-by-side table of a run's JSON ``res`` (with the suite means), then every row in full."""
    means = res.get("suite_means") or {}
    lines = [side_by_side(res["summary"], means), "", markdown(res["summary"])]
    if means:
        lines += ["", "Synthetic fleets, means over fleets:", ""]
        for k, v in means.items():
            same = v.get("same_decision_rate")
            lines.append(
                f"- {k}: GPU-s ratio {v['mean_gpu_ratio']:.2f}, wall ratio {v['mean_wall_ratio']:.2f}"
                + ("" if same is None else f", same decision {same:.0%}")
                + f", ε-correct {v['eps_correct']:.2f}, false certificates {v['false_certificates']} ({v['fleets']} fleets)"
            )
    return "\n".join(lines)


def _baseline_runs(path: Path | None) -> dict[tuple[str, str, int], dict[str, Any]]:
    """One-cell-at-a-time runs of an earlier JSON by (scenario, strategy, seed), marked ``reused``."""
    if path is None:
        return {}
    runs = json.loads(path.read_text()).get("runs", [])
    return {
        (r["scenario"], r["strategy"], int(r["seed"])): {**r, "reused": str(path)}
        for r in runs
        if r.get("pool") is None and "error" not in r
    }


def _run_logged(
    path: str, scen: str, pool: int | None, strat: str, seed: int, truths: list[str], gate: float | None,
    level: float | str | None = None,
) -> dict[str, Any]:
    label = _label(pool, gate)
    try:
        r = run_one(path, scen, pool, strat, seed, truths, gate, level)
    except Exception as exc:  # noqa: BLE001 - one broken run must not lose the others
        r = {"scenario": scen, "pool": pool, "gate": gate, "strategy": strat, "seed": seed,
             "error": f"{type(exc).__name__}: {exc}"}
        print(f"  {scen} {strat} pool={label} seed={seed}: ERROR {r['error']}", file=sys.stderr)
    else:
        print(
            f"  {scen} {strat} pool={label} seed={seed}: {r['status']}, wall {r['profiling_wall_s']:.0f} s, "
            f"{r['gpu_seconds']:.0f} GPU-s, {r['n_measured']} cells ({r['run_s']:.0f} s)",
            file=sys.stderr,
        )
    return r


def _level_arg(text: str) -> float | str:
    """``--level``: ``point`` or a level in (0, 1) (profiling_cost.py's rule)."""
    from profiling_cost import _level_arg as level_arg

    return level_arg(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("campaign", nargs="?", type=Path, default=DEFAULT_CAMPAIGN)
    p.add_argument("--pools", type=int, nargs="*", default=[16], help="pool sizes besides one cell at a time")
    p.add_argument("--gates", type=float, nargs="*", default=None,
                   help="value gate fractions of each pool (0: fill every free GPU; default: the package's)")
    p.add_argument("--suite", type=int, default=3, help="synthetic fleets (0: shipped grid only)")
    p.add_argument("--suite-seed", type=int, default=0)
    p.add_argument("--no-campaign", action="store_true", help="synthetic fleets only")
    p.add_argument("--random-seeds", type=int, default=2, help="random-baseline orders per scenario and pool")
    p.add_argument("--strategies", nargs="*", default=["fleetsieve"])
    p.add_argument("--level", type=_level_arg, default=None,
                   help="every campaign's [stopping] slo_attainment: 'point' or a level in (0, 1) (default: each campaign's own)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="reuse the one-cell-at-a-time runs of this earlier JSON (same scenario, strategy and "
                        "seed; the pool never changes them) instead of running them again")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--publish", action="store_true", help="write benchmarks/published/parallel_profiling.json, its docs/results.md section and MANIFEST.json")
    args = p.parse_args(argv)

    runs: list[dict[str, Any]] = []
    reused = _baseline_runs(args.baseline)
    t0 = time.perf_counter()
    for scen, path, truths in _scenarios(args):
        for strat in args.strategies:
            seeds = list(range(args.random_seeds)) if strat == "random" else [0]
            variants = [(None, None)] + [(pool, g) for pool in args.pools for g in (args.gates or [None])]
            for pool, gate in variants:
                for seed in seeds:
                    old = reused.get((scen, strat, seed)) if pool is None else None
                    if old is not None and old.get("level") != args.level and args.level is not None:
                        old = None  # an earlier run at another rule is no baseline
                    runs.append(old if old is not None else _run_logged(path, scen, pool, strat, seed, truths, gate, args.level))
    ok = [r for r in runs if "error" not in r]
    rows = summarise(ok)
    means = suite_means(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    res = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "summary": rows,
        "suite_means": means,
        "runs": runs,
        "errors": [r for r in runs if "error" in r],
        "total_s": time.perf_counter() - t0,
    }
    md = published_table(res)
    print(md)
    args.out.write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(f"\nJSON: {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("parallel_profiling", json.loads(json.dumps(res, default=str)), md, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
