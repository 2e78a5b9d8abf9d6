"""Serving configurations end to end: a campaign over a catalogue of aggregated and disaggregated
configurations, scored against a known truth.

Worlds come from :mod:`fleetsieve_bayes.evaluation.config_worlds` (world ``k`` of seed ``S`` is
``config_world(1000·S + k, …)``; its regime, "disagg", "agg" or "mixed", is drawn unless
``--regime`` names one). For each world:

* the **campaign** (its ``[[configs]]`` catalogue, the replay backend, ``slo_attainment =
  "point"``, the generic card) runs to its stop; with ``--budget-share F`` its profiling
  budget (``[stopping] max_gpu_seconds``) is F times its world's full grid, and a campaign
  the budget stops is scored on the answer it gives;
* it is scored on the noise-free truth (the ``true_*`` columns; the oracle is the exact
  optimum over the full truth table) and on the windows the replay reveals: ε-correct
  (the lexicographic regret within the campaign's ε), a false certificate (certified, and
  not ε-correct or committing to a cell that violates its SLO there); its GPU-seconds as a
  share of the full grid's;
* the **best aggregated-only fleet** (the optimum of the truth over the aggregated
  configurations alone) is scored beside it: is it ε-correct against the full optimum?
* the **sweep** baseline measures one configuration after another in catalogue order
  (every class and load of each) until the GPU-seconds the campaign used are spent, never
  past them, and decides on what it measured (the exact allocation on the measured
  windows; a cell not measured is not a candidate): is that ε-correct?

``--allocate-only``: no campaign. For each of ``--worlds`` worlds (default 12), fully
measured, the exact allocation on the truth table, both from ``fleetsieve-bayes allocate
CAMPAIGN --table TRUTH --json`` (a subprocess on this checkout) and from
:func:`~fleetsieve_bayes.allocation.milp.allocate_milp`, is checked against an independent
brute-force oracle: every combination of per-class (cell, replicas) choices, ranked
lexicographically (critical floors, min fulfilment, goodput, GPUs) with the allocators'
relative tolerance.

    python benchmarks/configs.py --worlds 24 --jobs 2 [--seed 0] [--partial FILE] [--work DIR] [--publish]
    python benchmarks/configs.py --worlds 1 --classes 2 --configs 12 --loads 4      # a small check
    python benchmarks/configs.py --allocate-only [--worlds 12]

Prints a markdown table and writes JSON (default benchmarks/results/configs.json, or
configs_allocate.json with ``--allocate-only``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
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
# This checkout's package, whatever copy is installed (spawned workers inherit the path).
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
CERTIFIED = ("certified-feasible", "certified-infeasible")
TOL = 1e-6  # the allocators' relative stage tolerance (allocation.objective.DEFAULT_TOL)


# ------------------------------------------------------------------- worlds


def world_seed(seed: int, k: int) -> int:
    return 1000 * int(seed) + int(k)


def make_world(task: dict[str, Any]) -> Any:
    from fleetsieve_bayes.evaluation.config_worlds import config_world

    return config_world(world_seed(task["seed"], task["k"]), n_classes=task["classes"], n_configs=task["configs"],
                        n_loads=task["loads"], regime=task["regime"])


def cells_of(grid: Any, allocation: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``(cell, replicas)`` ``(n_classes,)`` of a result.json / ``allocate --json`` allocation (None: none)."""
    from fleetsieve_bayes.evaluation.regret import cells_from_json

    return cells_from_json(grid, allocation)


def score(grid: Any, values: np.ndarray, problem: Any, epsilon: float, cr: tuple[np.ndarray, np.ndarray] | None,
          certified: bool = False, oracle: Any = None) -> dict[str, Any]:
    """A decision ``cr`` judged on ``values (n_cells, 4)`` against the optimum there."""
    from fleetsieve_bayes.evaluation.regret import (
        eps_correct,
        evaluate_cells,
        make_oracle,
        regret,
        scalar_regret,
    )

    oracle = oracle if oracle is not None else make_oracle(grid, values, problem)
    out = evaluate_cells(grid, values, problem, *(cr if cr else (None, None)))
    reg = regret(out, oracle, problem)
    ok = eps_correct(reg, epsilon)
    return {
        "eps_correct": bool(ok), "regret": reg._asdict(), "scalar_regret": scalar_regret(reg),
        "false_certificate": bool(certified and (out.violations or not ok)),
        "slo_violations": [grid.describe(c) for c in out.violations],
        "min_fulfillment": out.min_fulfillment, "goodput_rps": out.goodput_rps,
        "gpus": int(sum(int(grid.gpus[c]) * int(n) for c, n in zip(*cr, strict=True) if c >= 0)) if cr else 0,
    }


def _configs_used(grid: Any, cr: tuple[np.ndarray, np.ndarray] | None) -> list[str]:
    if cr is None:
        return []
    return [grid.serving_config(int(c)).name for c, n in zip(*cr, strict=True) if c >= 0 and n > 0]


def _alloc_cr(alloc: Any) -> tuple[np.ndarray, np.ndarray] | None:
    return (alloc.cell, alloc.replicas) if alloc.feasible else None


def aggregated_only_decision(world: Any, grid: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The exact optimum of the truth over the aggregated configurations alone, as cells of ``grid``."""
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.evaluation.config_worlds import aggregated_only, world_grid

    g2, v2, p2 = world_grid(aggregated_only(world))
    cr = _alloc_cr(allocate_milp(g2, v2, p2))
    if cr is None:
        return None
    index = grid.index()
    return np.array([index[g2.key(int(c))] if c >= 0 else -1 for c in cr[0]], np.int64), cr[1]


def sweep_decision(grid: Any, windows: np.ndarray, problem: Any, budget_gpu_s: float) -> dict[str, Any]:
    """Measure configurations in catalogue order (each one's every class and load, loads rising)
    while the next cell fits in ``budget_gpu_s``; decide on the measured windows."""
    from fleetsieve_bayes.allocation.milp import allocate_milp

    order = np.lexsort((grid.offered_rps, grid.workload_idx, grid.config_idx))
    cost = grid.cost_gpu_s
    spent, measured = 0.0, []
    for c in order:
        if spent + cost[c] > budget_gpu_s * (1 + 1e-12):
            break
        spent += float(cost[c])
        measured.append(int(c))
    seen = np.zeros(grid.n_cells, bool)
    seen[measured] = True
    # A cell not measured is no candidate: no throughput, no success.
    values = np.where(seen[:, None], windows, np.array([0.0, np.inf, np.inf, 0.0]))
    alloc = allocate_milp(grid, values, problem)
    configs = sorted({int(grid.config_idx[c]) for c in measured})
    return {"cr": _alloc_cr(alloc), "gpu_seconds": spent, "n_measured": len(measured), "n_configs": len(configs)}


# ------------------------------------------------------------------ campaign


def study_world(task: dict[str, Any]) -> dict[str, Any]:
    """Run world ``task["k"]``'s campaign (or read its finished result back) and score it."""
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.campaign.journal import plan_seconds
    from fleetsieve_bayes.campaign.runner import run_campaign
    from fleetsieve_bayes.evaluation.config_worlds import world_grid, write_config_world
    from fleetsieve_bayes.evaluation.regret import make_oracle

    world = make_world(task)
    work = Path(task["work"]) / f"w{task['k']:03d}"
    path = write_config_world(work, world)
    campaign = load_campaign(path)
    grid, truth, problem = world_grid(world)
    full = float(grid.cost_gpu_s.sum())  # every cell measured once
    if task.get("max_rounds"):
        campaign = replace(campaign, max_rounds=int(task["max_rounds"]))
    if task.get("budget_share"):
        campaign = replace(campaign, max_gpu_seconds=float(task["budget_share"]) * full)
    out = work / "out"
    done = out / "result.json"
    if done.exists():
        result = json.loads(done.read_text())
    else:
        t0 = time.perf_counter()
        result = run_campaign(campaign, out, strategy=task["strategy"], seed=task["campaign_seed"]).result
        result["wall_s"] = time.perf_counter() - t0
        done.write_text(json.dumps(result, default=float))
    plan = plan_seconds(out / "journal.jsonl")
    _, windows, _ = world_grid(world, truth=False)
    eps = float(campaign.epsilon)
    certified = result["status"] in CERTIFIED
    cr = cells_of(grid, result.get("allocation"))
    oracle = make_oracle(grid, truth, problem)
    scores = {"curve": score(grid, truth, problem, eps, cr, certified, oracle),
              "table": score(grid, windows, problem, eps, cr, certified)}
    agg = aggregated_only_decision(world, grid)
    sweep = sweep_decision(grid, windows, problem, float(result["gpu_seconds"]))
    assert abs(full - float(oracle.full_gpu_s)) <= 1e-6 * full
    return {
        "world": task["k"], "world_seed": world_seed(task["seed"], task["k"]), "regime": world.regime,
        "classes": [c["name"] for c in world.spec["classes"]], "gpus": int(problem.gpus),
        "n_configs": len(world.catalogue), "n_cells": grid.n_cells, "full_gpu_seconds": full,
        "oracle_configs": _configs_used(grid, _alloc_cr(oracle.allocation)),
        "oracle_uses_disagg": any(grid.serving_config(c).disaggregated for c in oracle.allocation.committed()),
        "status": result["status"], "stop_reason": result.get("stop_reason"), "certified": certified, "gpu_seconds": float(result["gpu_seconds"]),
        "gpu_share": float(result["gpu_seconds"]) / full, "n_measured": len(result.get("measured", [])),
        "wall_s": result.get("wall_s"), "decision_configs": _configs_used(grid, cr),
        "plan_s": plan, "plan_s_median": float(np.median(plan)) if plan else None,
        "plan_s_max": float(np.max(plan)) if plan else None,
        "eps_correct": scores["curve"]["eps_correct"], "false_certificate": scores["curve"]["false_certificate"],
        "by_truth": scores,
        "aggregated_only": {"configs": _configs_used(grid, agg), **score(grid, truth, problem, eps, agg, oracle=oracle)},
        "sweep": {k: v for k, v in sweep.items() if k != "cr"} | {
            "configs": _configs_used(grid, sweep["cr"]),
            **score(grid, truth, problem, eps, sweep["cr"], oracle=oracle)},
    }


def _safe(fn: Any, task: dict[str, Any]) -> dict[str, Any]:
    try:
        return fn(task)
    except Exception as exc:  # noqa: BLE001 - reported, excluded from the summary
        import traceback

        return {"world": task["k"], "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=-6)}


def _study_safe(task: dict[str, Any]) -> dict[str, Any]:
    return _safe(study_world, task)


def run_worlds(tasks: list[dict[str, Any]], jobs: int, partial: Path | None) -> list[dict[str, Any]]:
    """:func:`study_world` of every task, ``jobs`` at a time, each in a fresh worker process
    (JAX is not fork-safe, and one process collects every world's compiled programs);
    each finished world is appended to ``partial``."""

    from fleetsieve_bayes.backends.lifeline import arm_parent_death_signal, stop_workers_on_sigterm

    ctx = get_context("spawn")
    pending, running, done = list(tasks), {}, []

    stop_workers_on_sigterm(running)
    while pending or running:
        while pending and len(running) < max(1, jobs):
            ex = ProcessPoolExecutor(1, mp_context=ctx, initializer=arm_parent_death_signal)
            running[ex.submit(_study_safe, pending.pop(0))] = ex
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for f in finished:
            running.pop(f).shutdown(wait=True)
            r = f.result()
            done.append(r)
            if partial is not None:
                with partial.open("a") as fh:
                    fh.write(json.dumps(r, default=float) + "\n")
            what = r.get("error") or (f"{r['status']}, {r['gpu_share']:.1%} of the grid, "
                                      f"ε-correct {r['eps_correct']}")
            print(f"world {r['world']}: {what}", file=sys.stderr, flush=True)
    return done


def summarise(worlds: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [w for w in worlds if "error" not in w]
    share = [w["gpu_share"] for w in ok]

    def count(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "worlds": len(rows), "certified": sum(w["certified"] for w in rows),
            "eps_correct": sum(w["eps_correct"] for w in rows),
            "false_certificates": sum(w["false_certificate"] for w in rows),
            "eps_correct_table": sum(w["by_truth"]["table"]["eps_correct"] for w in rows),
            "false_certificates_table": sum(w["by_truth"]["table"]["false_certificate"] for w in rows),
            "aggregated_only_eps_correct": sum(w["aggregated_only"]["eps_correct"] for w in rows),
            "sweep_eps_correct": sum(w["sweep"]["eps_correct"] for w in rows),
            "oracle_uses_disagg": sum(w["oracle_uses_disagg"] for w in rows),
        }

    plans = [t for w in ok for t in w.get("plan_s") or []]
    return {
        **count(ok), "errors": len(worlds) - len(ok),
        "plan_s_median": float(np.median(plans)) if plans else None,
        "plan_s_max": float(np.max(plans)) if plans else None,
        "rounds": len(plans),
        "gpu_share_mean": float(np.mean(share)) if share else None,
        "gpu_share_median": float(np.median(share)) if share else None,
        "gpu_share_max": float(np.max(share)) if share else None,
        "by_regime": {r: count([w for w in ok if w["regime"] == r]) for r in sorted({w["regime"] for w in ok})},
    }


def _plan(row: dict[str, Any]) -> str:
    if row.get("plan_s_median") is None:
        return "—"
    return f"{row['plan_s_median']:.1f} / {row['plan_s_max']:.1f}"


def _status(row: dict[str, Any]) -> str:
    reason = row.get("stop_reason")
    return row["status"] + (f" ({reason})" if reason and row["status"] == "undecided" else "")


def _yn(x: bool) -> str:
    return "yes" if x else "no"


def campaign_markdown(res: dict[str, Any]) -> str:
    s = res["summary"]
    lines = [
        "| world | regime | classes | GPUs | configs | status | GPU-s | share of grid | ε-correct (curves / windows) "
        "| false cert. | decision | oracle | best agg-only ε-correct | sweep ε-correct (configs) | plan s (median / max) "
        "| wall min |",
        "|---:|---|---|---:|---:|---|---:|---:|---|---|---|---|---|---|---|---:|",
    ]
    for w in res["worlds"]:
        if "error" in w:
            lines.append(f"| {w['world']} | error: {w['error'][:80]} ||||||||||||||")
            continue
        lines.append(
            f"| {w['world']} | {w['regime']} | {', '.join(w['classes'])} | {w['gpus']} | {w['n_configs']} "
            f"| {_status(w)} | {w['gpu_seconds']:,.0f} | {w['gpu_share']:.1%} "
            f"| {_yn(w['eps_correct'])} / {_yn(w['by_truth']['table']['eps_correct'])} "
            f"| {_yn(w['false_certificate'])} | {', '.join(w['decision_configs']) or '—'} "
            f"| {', '.join(w['oracle_configs']) or '—'} | {_yn(w['aggregated_only']['eps_correct'])} "
            f"| {_yn(w['sweep']['eps_correct'])} ({w['sweep']['n_configs']}) | {_plan(w)} "
            f"| {'—' if w.get('wall_s') is None else format(w['wall_s'] / 60, '.1f')} |")
    n = s["worlds"]
    share = "n/a" if s["gpu_share_mean"] is None else (
        f"mean {s['gpu_share_mean']:.1%}, median {s['gpu_share_median']:.1%}, max {s['gpu_share_max']:.1%}")
    lines += [
        "",
        f"{n} world{'s' if n != 1 else ''} ({s['errors']} errors), {s['certified']} certified; the optimum uses a "
        f"disaggregated configuration in {s['oracle_uses_disagg']}. On the noise-free truth: ε-correct "
        f"{s['eps_correct']}/{n}, false certificates {s['false_certificates']}; on the windows replayed: ε-correct "
        f"{s['eps_correct_table']}/{n}, false certificates {s['false_certificates_table']}. Profiling GPU-seconds "
        f"as a share of the full grid: {share}. The best aggregated-only fleet is ε-correct in "
        f"{s['aggregated_only_eps_correct']}/{n}; a sweep of configurations in catalogue order with the "
        f"campaign's GPU-seconds decides ε-correctly in {s['sweep_eps_correct']}/{n}. Round planning "
        f"(fit, bounds, allocations, acquisition, certification attempt) over {s.get('rounds', 0)} rounds: "
        f"{_plan(s)} s (median / max).",
    ]
    if s["by_regime"]:
        lines += ["", "| regime | worlds | ε-correct | false cert. | agg-only ε-correct | sweep ε-correct | optimum disaggregated |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r, c in s["by_regime"].items():
            lines.append(f"| {r} | {c['worlds']} | {c['eps_correct']} | {c['false_certificates']} "
                         f"| {c['aggregated_only_eps_correct']} | {c['sweep_eps_correct']} | {c['oracle_uses_disagg']} |")
    return "\n".join(lines)


# -------------------------------------------------------------- allocate only


def brute_force(grid: Any, values: np.ndarray, problem: Any, tol: float = TOL) -> dict[str, Any]:
    """The lexicographic optimum by enumeration, sharing no code with the allocators.

    Per class, every admissible cell ``q`` (success ≥ its minimum, each named tail ≤ its
    limit, throughput > 0) and replica count ``n`` with ``n·gpus_q ≤ G`` serves
    ``min(λ, n·c_q)`` on ``n·gpus_q`` GPUs; per class only the options that serve more than
    every option on fewer GPUs are kept, and every combination of one option per class within
    ``G`` GPUs is ranked: critical floors, then min fulfilment, goodput (each kept within
    ``tol`` of its best, relative) and GPUs.
    """
    lam = np.asarray(problem.demand, np.float64)
    g_max = int(problem.gpus)
    thr, ttft, comp, succ = (values[:, j] for j in range(4))
    w = grid.workload_idx
    ok = ((succ >= problem.success_min[w] - 1e-9) & (np.nan_to_num(ttft, nan=np.inf) <= problem.ttft_max[w] + 1e-9)
          & (np.nan_to_num(comp, nan=np.inf) <= problem.completion_max[w] + 1e-9) & (thr > 0))
    options = []
    for i in range(grid.n_classes):
        best = {0: 0.0}  # GPUs → the most served on exactly that many
        for q in np.flatnonzero(ok & (w == i)):
            g = int(grid.gpus[q])
            for n in range(1, g_max // g + 1):
                best[n * g] = max(best.get(n * g, 0.0), min(lam[i], n * float(thr[q])))
        front, top = [], -1.0
        for gpus in sorted(best):
            if best[gpus] > top:
                front.append((gpus, best[gpus]))
                top = best[gpus]
        options.append(front)
    floors = np.where(problem.critical, problem.floor, 0.0)
    rows = []
    for combo in itertools.product(*options):
        gpus = sum(o[0] for o in combo)
        if gpus > g_max:
            continue
        r = np.array([o[1] for o in combo]) / lam
        if np.any(r < floors * (1 - tol)):
            continue
        rows.append((float(r.min()), float(sum(o[1] for o in combo)), gpus))
    if not rows:
        return {"status": "infeasible"}
    arr = np.array(rows)
    r_star = arr[:, 0].max()
    arr = arr[arr[:, 0] >= r_star * (1 - tol)]
    g_star = arr[:, 1].max()
    arr = arr[arr[:, 1] >= g_star * (1 - tol)]
    return {"status": "feasible", "min_fulfillment": float(r_star), "goodput_rps": float(g_star),
            "gpus": int(arr[:, 2].min())}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.get("status") != b.get("status"):
        return False
    if a["status"] != "feasible":
        return True
    return (abs(a["min_fulfillment"] - b["min_fulfillment"]) <= 1e-5
            and abs(a["goodput_rps"] - b["goodput_rps"]) <= 1e-5 * max(1.0, b["goodput_rps"])
            and int(a["gpus"]) == int(b["gpus"]))


def check_allocate(task: dict[str, Any]) -> dict[str, Any]:
    """World ``task["k"]``, fully measured: ``allocate --json`` and the MILP against :func:`brute_force` on the truth."""
    from fleetsieve_bayes.allocation.milp import allocate_milp
    from fleetsieve_bayes.evaluation.config_worlds import (
        truth_table,
        world_grid,
        write_config_world,
    )
    from fleetsieve_bayes.evaluation.regret import evaluate_cells

    world = make_world(task)
    work = Path(task["work"]) / f"a{task['k']:03d}"
    path = write_config_world(work, world)
    truth_path = work / "truth.csv"
    truth_table(world.table).to_csv(truth_path, index=False)
    grid, truth, problem = world_grid(world)
    t0 = time.perf_counter()
    oracle = brute_force(grid, truth, problem)
    brute_s = time.perf_counter() - t0

    def judged(cr: tuple[np.ndarray, np.ndarray] | None, claimed: dict[str, Any] | None = None) -> dict[str, Any]:
        """A decision's objective evaluated on the truth (and what the allocator claimed for it)."""
        if cr is None:
            return {"status": "infeasible"}
        out = evaluate_cells(grid, truth, problem, *cr)
        gpus = int(sum(int(grid.gpus[c]) * int(n) for c, n in zip(*cr, strict=True) if c >= 0))
        got = {"status": "feasible", "min_fulfillment": out.min_fulfillment, "goodput_rps": out.goodput_rps,
               "gpus": gpus, "violations": [grid.describe(c) for c in out.violations]}
        if claimed is not None:
            got["claimed"] = claimed
        return got

    t0 = time.perf_counter()
    alloc = allocate_milp(grid, truth, problem)
    milp_s = time.perf_counter() - t0
    milp = judged(_alloc_cr(alloc), {"min_fulfillment": alloc.min_fulfillment, "goodput_rps": alloc.goodput_rps,
                                    "gpus": int(alloc.gpus_used)})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run([sys.executable, "-m", "fleetsieve_bayes", "allocate", str(path), "--table", str(truth_path),
                           "--json"], capture_output=True, text=True, env=env, cwd=work, timeout=600)
    if proc.returncode != 0:
        cli: dict[str, Any] = {"error": (proc.stderr.strip().splitlines() or ["(no output)"])[-1],
                               "stderr_tail": proc.stderr.strip().splitlines()[-6:]}
    else:
        obj = json.loads(proc.stdout)
        cli = judged(cells_of(grid, obj.get("allocation")), obj.get("objective"))
    return {
        "world": task["k"], "world_seed": world_seed(task["seed"], task["k"]), "regime": world.regime,
        "n_cells": grid.n_cells, "gpus": int(problem.gpus), "brute_force": oracle, "brute_force_s": brute_s,
        "milp": milp, "milp_s": milp_s, "milp_matches": _same(milp, oracle) and not milp.get("violations"),
        "cli": cli, "cli_matches": "error" not in cli and _same(cli, oracle) and not cli.get("violations"),
    }


def allocate_markdown(res: dict[str, Any]) -> str:
    lines = ["| world | regime | cells | GPUs | brute force (min fulfil., goodput, GPUs) | MILP | `allocate` |",
             "|---:|---|---:|---:|---|---|---|"]

    def fmt(d: dict[str, Any]) -> str:
        if "error" in d:
            return f"error: {d['error'][:90]}"
        if d.get("status") != "feasible":
            return d.get("status", "?")
        return f"{d['min_fulfillment']:.4f}, {d['goodput_rps']:.3f}, {d['gpus']}"

    for w in res["worlds"]:
        if "error" in w:
            lines.append(f"| {w['world']} | error: {w['error'][:90]} ||||||")
            continue
        lines.append(f"| {w['world']} | {w['regime']} | {w['n_cells']} | {w['gpus']} | {fmt(w['brute_force'])} "
                     f"| {fmt(w['milp'])} ({'=' if w['milp_matches'] else '≠'}) "
                     f"| {fmt(w['cli'])} ({'=' if w['cli_matches'] else '≠'}) |")
    s = res["summary"]
    lines += ["", f"{s['worlds']} worlds fully measured: the MILP equals the brute-force optimum on "
                  f"{s['milp_matches']}, `fleetsieve-bayes allocate` on {s['cli_matches']} "
                  f"({s['cli_errors']} errors)."]
    return "\n".join(lines)


# ----------------------------------------------------------------------- main


def published_table(res: dict[str, Any]) -> str:
    """The markdown of a run's JSON ``res`` (what ``--publish`` writes to docs/results.md)."""
    return allocate_markdown(res) if res.get("mode") == "allocate" else campaign_markdown(res)


def _tasks(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    ks = sorted({int(k) for k in args.only.split(",")}) if args.only else list(range(args.worlds))
    return [{"k": k, "seed": args.seed, "classes": args.classes, "configs": args.configs, "loads": args.loads,
             "regime": args.regime, "work": str(work), "strategy": args.strategy, "campaign_seed": args.campaign_seed,
             "max_rounds": args.max_rounds, "budget_share": args.budget_share} for k in ks]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=int, default=None, help="worlds to run (default 24; --allocate-only: 12)")
    p.add_argument("--only", default=None, metavar="K,K,…", help="run these world numbers only")
    p.add_argument("--seed", type=int, default=0, help="world k is config_world(1000·seed + k)")
    p.add_argument("--classes", type=int, default=3)
    p.add_argument("--configs", type=int, default=63, help="catalogue size (every aggregated configuration kept)")
    p.add_argument("--loads", type=int, default=6)
    p.add_argument("--regime", choices=("disagg", "agg", "mixed"), default=None, help="default: drawn per world")
    p.add_argument("--strategy", default="fleetsieve")
    p.add_argument("--campaign-seed", type=int, default=0)
    p.add_argument("--max-rounds", type=int, default=None, help="each campaign stops undecided after this many rounds")
    p.add_argument("--budget-share", type=float, default=None, metavar="F",
                   help="each campaign's [stopping] max_gpu_seconds: F × its world's full grid (default: none)")
    p.add_argument("--jobs", type=int, default=1, help="worlds at once (each in its own process)")
    p.add_argument("--partial", type=Path, default=None, help="append each finished world here (JSONL) and skip those already in it")
    p.add_argument("--work", type=Path, default=None, help="keep each world's campaign and run here (a finished run is read back)")
    p.add_argument("--allocate-only", action="store_true", help="no campaigns: check allocate / the MILP against brute force")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--publish", action="store_true", help="write benchmarks/published/<study>.json and its docs/results.md section")
    p.add_argument("--study", default=None,
                   help="the published study's name (default: configs, or configs_allocate with --allocate-only)")
    args = p.parse_args(argv)
    if args.worlds is None:
        args.worlds = 12 if args.allocate_only else 24
    mode = "allocate" if args.allocate_only else "campaign"
    out = args.out or RESULTS / ("configs_allocate.json" if args.allocate_only else "configs.json")
    done: dict[int, dict[str, Any]] = {}
    if args.partial is not None and args.partial.exists():
        for line in args.partial.read_text().splitlines():
            r = json.loads(line)
            if "error" not in r:
                done[int(r["world"])] = r
    with tempfile.TemporaryDirectory(prefix="fsb-configs-") as tmp:
        work = args.work or Path(tmp)
        tasks = [t for t in _tasks(args, work) if t["k"] not in done]
        if args.allocate_only:
            rows = []
            for t in tasks:
                r = _safe(check_allocate, t)
                rows.append(r)
                if args.partial is not None:
                    with args.partial.open("a") as fh:
                        fh.write(json.dumps(r, default=float) + "\n")
                print(f"world {t['k']}: {r.get('error') or ('MILP ' + ('=' if r['milp_matches'] else '≠') + ', allocate ' + ('=' if r['cli_matches'] else '≠'))}",
                      file=sys.stderr, flush=True)
        else:
            rows = run_worlds(tasks, args.jobs, args.partial)
    for r in rows:
        done[int(r["world"])] = r
    worlds = [done[k] for k in sorted(done)]
    settings = {k: getattr(args, k) for k in ("seed", "classes", "configs", "loads", "regime", "strategy", "campaign_seed",
                                               "max_rounds", "budget_share")}
    if args.allocate_only:
        ok = [w for w in worlds if "error" not in w]
        summary = {"worlds": len(worlds), "errors": len(worlds) - len(ok), "milp_matches": sum(w["milp_matches"] for w in ok),
                   "cli_matches": sum(w["cli_matches"] for w in ok), "cli_errors": sum("error" in w["cli"] for w in ok)}
    else:
        summary = summarise(worlds)
    res = {"study": "configs", "mode": mode, "settings": settings, "worlds": worlds, "summary": summary}
    md = published_table(res)
    print(md)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=float))
    print(f"\nJSON: {out}", file=sys.stderr)
    if args.publish:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from publish import command_line, publish

        publish(args.study or ("configs_allocate" if args.allocate_only else "configs"), res, md, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
