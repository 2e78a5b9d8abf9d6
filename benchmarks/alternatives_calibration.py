"""Calibration of the ranked alternatives' P(ε-optimal) under a profiling budget, and budgets that do not bind.

Three passes over the hard suite of ``profiling_cost.py --suite`` (the
campaigns as the suite writes them: ``slo_attainment = "point"``, one window
per cell, strategy ``fleetsieve``, seed 0):

1. ``uncapped``: each fleet's campaign to its stop;
2. ``capped``: the same campaign with ``[stopping] max_gpu_seconds`` at
   ``--cap-fraction`` (0.5) of the uncapped run's GPU-seconds, raised to the
   initial design's cost where that is more (a budget below the design is
   refused); every entry of result.json's ``alternatives`` is scored on the
   full table: ε-optimal when its lexicographic regret against the table's
   optimum is within ε (:mod:`fleetsieve_bayes.evaluation.regret`, as the
   suite scores a decision);
3. ``unbound``: ``max_gpu_seconds`` at ``--unbound-factor`` (10) × the fleet's
   full grid, a budget that never binds: the run must stop with the same
   status, allocation and GPU-seconds, after measuring the same cells in the
   same order, as the uncapped one ("same trail"); ``--unbound-fleets`` runs
   this pass on a subset.

The reliability table bins the capped runs' alternatives by their
P(ε-optimal) (``--edges``, default five bins of width 0.2, the last closed)
and gives per bin the count, the mean predicted probability, the observed
share truly ε-optimal (Wilson 95 % interval) and the difference in points.

Each finished run is appended to ``--partial`` (JSONL) as it ends; ``--resume``
keeps the runs already there and runs only the rest (a capped run starts once
its fleet's uncapped run is in). ``--uncapped-runs FILE`` takes the uncapped
pass from a ``profiling_cost.py --suite N --strategies fleetsieve --fs-seeds 1
--partial FILE`` run of the same suite (the same campaign, seed and call).

    python benchmarks/alternatives_calibration.py --suite 40 --jobs 2 --partial runs.jsonl --resume
    python benchmarks/alternatives_calibration.py --suite 40 --passes uncapped,capped --fleets 0,1,2
    python benchmarks/alternatives_calibration.py --suite 40 --jobs 2 \\
        --partial benchmarks/published/alternatives_calibration.jsonl --resume --publish
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "alternatives_calibration.json"
STUDY = "alternatives_calibration"
PASSES = ("uncapped", "capped", "unbound")
DEFAULT_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
TARGET_POINTS = 10.0


# --------------------------------------------------------------------------- runs


def _label(c: dict[str, Any]) -> str:
    return f"{c['workload']} TP{c['tp']}@{c['load']}"


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """One campaign of the suite to its stop under ``task["max_gpu_seconds"]`` (None: no budget),
    its decision and every ranked alternative scored on the full table."""
    from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.campaign.journal import read_journal
    from fleetsieve_bayes.campaign.runner import run_campaign
    from fleetsieve_bayes.evaluation.regret import (
        cells_from_json,
        eps_correct,
        evaluate_cells,
        evaluate_run,
        make_oracle,
        regret,
        scalar_regret,
    )
    from fleetsieve_bayes.jax_cache import enable_compilation_cache
    from fleetsieve_bayes.table import read_table

    # The persistent compilation cache (as the command line has it): a fleet's three runs share
    # their programs' shapes, so its later runs load what its first compiled.
    enable_compilation_cache()
    campaign = load_campaign(task["campaign"])
    if task["max_gpu_seconds"] is not None:
        campaign = dataclasses.replace(campaign, max_gpu_seconds=float(task["max_gpu_seconds"]))
    table = read_table(campaign.measurement.table)
    grid = grid_from_table(table, campaign.workload_names)
    values = values_from_table(grid, table)
    problem = campaign.problem()
    oracle = make_oracle(grid, values, problem)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fsb-altcal-") as tmp:
        result = run_campaign(campaign, Path(tmp), strategy="fleetsieve", seed=task["seed"]).result
        records, _ = read_journal(Path(tmp) / "journal.jsonl")
    wall = time.perf_counter() - t0
    ev = evaluate_run(grid, values, problem, oracle, result, records, campaign.epsilon)
    alts = []
    for e in result.get("alternatives") or []:
        cr = cells_from_json(grid, e["allocation"])
        reg = regret(evaluate_cells(grid, values, problem, *(cr if cr else (None, None))), oracle, problem)
        alts.append({
            "rank": int(e["rank"]), "p_epsilon_optimal": float(e["p_epsilon_optimal"]),
            "p_slo_met": float(e["p_slo_met"]), "gpus": int(e["gpus"]),
            "predicted_cells": len(e.get("predicted_cells") or []),
            "eps_optimal": bool(eps_correct(reg, campaign.epsilon)), "scalar_regret": scalar_regret(reg),
            "allocation": e["allocation"],
        })
    return {
        "pass": task["pass"], "fleet": task["fleet"], "seed": task["seed"],
        "max_gpu_seconds": task["max_gpu_seconds"], "cap_raised_to_design": task.get("cap_raised_to_design", False),
        "status": result["status"], "stop_reason": result.get("stop_reason"),
        "gpu_seconds": float(result["gpu_seconds"]), "measured": [_label(c) for c in result["measured"]],
        "allocation": result["allocation"], "eps_correct": ev["eps_correct"],
        "false_certificate": ev["false_certificate"], "alternatives": alts,
        "alternatives_draws": result.get("alternatives_draws"), "wall_s": wall,
    }


def _safe_run(task: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_task`, or an ``error`` record (a broken run must not lose the others)."""
    try:
        return run_task(task)
    except Exception as exc:  # noqa: BLE001 - reported and left out of the summary
        return {"error": f"{type(exc).__name__}: {exc}", "pass": task["pass"], "fleet": task["fleet"]}


# ------------------------------------------------------------------------ suite


# One fleet of the suite: ``fleet``, ``campaign``, ``cells``, ``full_gpu_s``, ``design_gpu_s``.
Fleet = dict[str, Any]


def build_fleets(ks: list[int], root: Path, suite_seed: int) -> list[Fleet]:
    """Fleets ``ks`` of the hard suite written under ``root`` (as ``profiling_cost.py --suite`` writes them)."""
    from certification_time import suite_fleet

    from fleetsieve_bayes.allocation.problem import grid_from_table
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.decision.design import initial_design
    from fleetsieve_bayes.table import read_table

    out = []
    for k in ks:
        path = suite_fleet(k, root, suite_seed)
        c = load_campaign(path)
        grid = grid_from_table(read_table(c.measurement.table), c.workload_names)
        out.append({"fleet": f"c{k:03d}", "campaign": str(path), "cells": int(grid.n_cells),
                    "full_gpu_s": float(grid.cost_gpu_s.sum()),
                    "design_gpu_s": float(grid.cost_gpu_s[initial_design(grid)].sum())})
    return out


def read_partial(path: Path | None) -> dict[tuple[str, str], dict[str, Any]]:
    """Finished runs in ``path`` by (pass, fleet), the last of each; errors skipped."""
    done: dict[tuple[str, str], dict[str, Any]] = {}
    if path is None or not path.exists():
        return done
    for line in path.read_text().splitlines():
        r = json.loads(line) if line.strip() else None
        if r and "error" not in r:
            done[(r["pass"], r["fleet"])] = r
    return done


def import_uncapped(path: Path) -> list[dict[str, Any]]:
    """The uncapped pass from a ``profiling_cost.py --suite … --partial`` JSONL (fleetsieve, seed 0)."""
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line) if line.strip() else None
        if not r or "error" in r or r.get("strategy") != "fleetsieve" or r.get("seed") != 0:
            continue
        out.append({
            "pass": "uncapped", "fleet": r["scenario"], "seed": 0, "max_gpu_seconds": None,
            "cap_raised_to_design": False, "status": r["status"], "stop_reason": None,
            "gpu_seconds": float(r["gpu_seconds"]), "measured": list(r["measured"]), "allocation": r["allocation"],
            "eps_correct": r["eps_correct"], "false_certificate": r["false_certificate"], "alternatives": None,
            "alternatives_draws": None, "wall_s": r["wall_s"], "source": "profiling_cost.py",
        })
    return out


def task_for(pass_: str, fleet: Fleet, done: dict[tuple[str, str], dict[str, Any]],
             args: argparse.Namespace) -> dict[str, Any] | None:
    """The task of ``pass_`` on ``fleet``, or None while it waits for the fleet's uncapped run."""
    task = {"pass": pass_, "fleet": fleet["fleet"], "campaign": fleet["campaign"], "seed": 0,
            "max_gpu_seconds": None}
    if pass_ == "capped":
        base = done.get(("uncapped", fleet["fleet"]))
        if base is None:
            return None
        cap = args.cap_fraction * base["gpu_seconds"]
        task["cap_raised_to_design"] = cap < fleet["design_gpu_s"]
        task["max_gpu_seconds"] = max(cap, fleet["design_gpu_s"])
    elif pass_ == "unbound":
        task["max_gpu_seconds"] = args.unbound_factor * fleet["full_gpu_s"]
    return task


def run_passes(fleets: list[Fleet], passes: list[str], done: dict[tuple[str, str], dict[str, Any]],
               args: argparse.Namespace) -> None:
    """Run every (pass, fleet) not in ``done``, ``args.jobs`` at a time, each in a fresh spawned
    worker (each fleet compiles its own shapes), appending each finished run to ``args.partial``."""
    from fleetsieve_bayes.backends.lifeline import arm_parent_death_signal, stop_workers_on_sigterm

    # Fleet by fleet (in the order given): a capped run starts as soon as its uncapped run is in,
    # so an interrupted benchmark leaves whole fleets.
    todo = [(p, f) for f in fleets for p in passes if (p, f["fleet"]) not in done
            and (p != "unbound" or args.unbound_fleets is None or f["fleet"] in args.unbound_fleets)]
    if not todo:
        return
    ctx = get_context("spawn")
    running: dict[Future[dict[str, Any]], ProcessPoolExecutor] = {}
    t0 = time.perf_counter()
    total = len(todo)

    stop_workers_on_sigterm(running)
    while todo or running:
        while len(running) < args.jobs:
            pick = next(((i, t) for i, (p, f) in enumerate(todo) if (t := task_for(p, f, done, args)) is not None), None)
            if pick is None:
                break
            todo.pop(pick[0])
            ex = ProcessPoolExecutor(1, mp_context=ctx, initializer=arm_parent_death_signal)
            running[ex.submit(_safe_run, pick[1])] = ex
        if not running:  # what is left waits on uncapped runs that failed
            for p, f in todo:
                print(f"[altcal] skipped {p} {f['fleet']}: its uncapped run is missing", file=sys.stderr)
            return
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for fut in finished:
            running.pop(fut).shutdown(wait=True)
            r = fut.result()
            if args.partial is not None:
                with args.partial.open("a") as fh:
                    fh.write(json.dumps(r) + "\n")
            if "error" in r:
                print(f"[altcal] ERROR {r['pass']} {r['fleet']}: {r['error']}", file=sys.stderr, flush=True)
                continue
            done[(r["pass"], r["fleet"])] = r
            n = total - len(todo) - len(running)
            print(f"[altcal] {n}/{total} {r['pass']} {r['fleet']}: {r['status']} ({r['stop_reason']}), "
                  f"{r['gpu_seconds']:.0f} GPU-s, {len(r['alternatives'] or [])} alternatives, {r['wall_s']:.0f} s; "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)


# --------------------------------------------------------------------- summary


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial share ``k / n`` (``(nan, nan)`` for n = 0)."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def _bin_row(lo: float, hi: float, ps: np.ndarray, ys: np.ndarray) -> dict[str, Any]:
    n = int(ps.size)
    k = int(ys.sum()) if n else 0
    mean_p = float(ps.mean()) if n else math.nan
    share = k / n if n else math.nan
    lo_ci, hi_ci = wilson(k, n)
    diff = 100.0 * (share - mean_p) if n else math.nan
    return {"lo": lo, "hi": hi, "count": n, "eps_optimal": k, "mean_p": mean_p, "observed": share,
            "observed_ci95": [lo_ci, hi_ci], "difference_points": diff,
            "within_target": bool(n and abs(diff) <= TARGET_POINTS)}


def reliability(alts: list[dict[str, Any]], edges: tuple[float, ...]) -> list[dict[str, Any]]:
    """Per bin ``[lo, hi)`` of P(ε-optimal) (the last bin closed): count, mean predicted,
    observed share ε-optimal (Wilson 95 %), difference in points."""
    ps = np.array([a["p_epsilon_optimal"] for a in alts], np.float64)
    ys = np.array([a["eps_optimal"] for a in alts], bool)
    rows = []
    for j, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        last = j == len(edges) - 2
        sel = (ps >= lo) & ((ps <= hi) if last else (ps < hi))
        rows.append(_bin_row(lo, hi, ps[sel], ys[sel]))
    return rows


def summarise(fleets: list[Fleet], done: dict[tuple[str, str], dict[str, Any]],
              edges: tuple[float, ...]) -> dict[str, Any]:
    """Per-fleet rows, the reliability table of the capped runs' alternatives, the same-trail count."""
    rows: list[dict[str, Any]] = []
    alts: list[dict[str, Any]] = []
    uncapped_alts: list[dict[str, Any]] = []
    for f in sorted(fleets, key=lambda f: f["fleet"]):
        u, c, b = (done.get((p, f["fleet"])) for p in PASSES)
        row: dict[str, Any] = {"fleet": f["fleet"], "cells": f["cells"], "full_gpu_s": f["full_gpu_s"],
                               "design_gpu_s": f["design_gpu_s"]}
        if u is not None:
            row.update(uncapped_status=u["status"], uncapped_gpu_s=u["gpu_seconds"], uncapped_eps_correct=u["eps_correct"])
            uncapped_alts += [{"fleet": f["fleet"], "rank": a["rank"], "p_epsilon_optimal": a["p_epsilon_optimal"],
                               "eps_optimal": a["eps_optimal"]} for a in u.get("alternatives") or []]
        if c is not None:
            ca = c["alternatives"] or []
            row.update(cap=c["max_gpu_seconds"], cap_raised_to_design=c["cap_raised_to_design"],
                       capped_status=c["status"], capped_reason=c["stop_reason"], capped_gpu_s=c["gpu_seconds"],
                       capped_eps_correct=c["eps_correct"], alternatives=len(ca),
                       alternatives_eps_optimal=sum(a["eps_optimal"] for a in ca),
                       alternatives_posterior=(c.get("alternatives_draws") or {}).get("posterior"))
            alts += [{**{k: v for k, v in a.items() if k != "allocation"}, "fleet": f["fleet"],
                      "posterior": row["alternatives_posterior"]} for a in ca]
        if u is not None and b is not None:
            same = {k: (u[k] == b[k]) for k in ("status", "gpu_seconds", "allocation", "measured")}
            row.update(unbound_budget=b["max_gpu_seconds"], unbound_status=b["status"],
                       unbound_gpu_s=b["gpu_seconds"], same_decision=same["status"] and same["allocation"],
                       same_gpu_s=same["gpu_seconds"], same_trail=all(same.values()))
        rows.append(row)
    capped = [r for r in rows if "capped_status" in r]
    unbound = [r for r in rows if "same_trail" in r]
    ranks = sorted({a["rank"] for a in alts})
    by_rank = [{"rank": k, **_bin_row(0.0, 1.0, np.array([a["p_epsilon_optimal"] for a in alts if a["rank"] == k]),
                                      np.array([a["eps_optimal"] for a in alts if a["rank"] == k], bool))}
               for k in ranks]
    by_posterior = [{"posterior": k, **_bin_row(0.0, 1.0, np.array([a["p_epsilon_optimal"] for a in alts if a["posterior"] == k]),
                                                np.array([a["eps_optimal"] for a in alts if a["posterior"] == k], bool))}
                    for k in sorted({str(a["posterior"]) for a in alts})]
    ps = np.array([a["p_epsilon_optimal"] for a in alts], np.float64)
    ys = np.array([a["eps_optimal"] for a in alts], np.float64)
    return {
        "fleets": rows,
        "alternatives": alts,
        "edges": list(edges),
        "reliability": reliability(alts, edges),
        # For comparison: the alternatives the uncapped runs rank at their stop.
        "uncapped_reliability": reliability(uncapped_alts, edges),
        "uncapped_alternatives": uncapped_alts,
        "by_rank": by_rank,
        "by_posterior": by_posterior,
        "capped": {
            "fleets": len(capped), "alternatives": len(alts),
            "statuses": _count(r["capped_status"] for r in capped),
            "reasons": _count(str(r["capped_reason"]) for r in capped),
            "cap_raised_to_design": sum(r["cap_raised_to_design"] for r in capped),
            "brier": float(np.mean((ps - ys) ** 2)) if alts else None,
            "mean_p": float(ps.mean()) if alts else None, "observed": float(ys.mean()) if alts else None,
            "bins_within_target": sum(b["within_target"] for b in reliability(alts, edges) if b["count"]),
            "bins_filled": sum(1 for b in reliability(alts, edges) if b["count"]),
        },
        "unbound": {
            "fleets": len(unbound), "same_trail": sum(r["same_trail"] for r in unbound),
            "same_decision": sum(r["same_decision"] for r in unbound),
            "same_gpu_s": sum(r["same_gpu_s"] for r in unbound),
            "differ": [r["fleet"] for r in unbound if not r["same_trail"]],
        },
    }


def _count(xs: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def _pct(x: float | None) -> str:
    return "—" if x is None or x != x else f"{100 * x:.1f}%"


def published_table(res: dict[str, Any]) -> str:
    """The reliability table, the per-rank rows, the same-trail total, then the per-fleet table folded away."""
    cap, ub = res["capped"], res["unbound"]
    lines = [
        f"Capped at {res.get('cap_fraction', 0.5):g}× each fleet's uncapped GPU-seconds: {cap['fleets']} fleets "
        f"of suite{res.get('suite', 40)} ({', '.join(r['fleet'] for r in res['fleets'])}), "
        f"{cap['alternatives']} alternatives; statuses "
        + ", ".join(f"{k} {v}" for k, v in cap["statuses"].items())
        + "; stop reasons " + ", ".join(f"{k} {v}" for k, v in cap["reasons"].items())
        + (f"; {cap['cap_raised_to_design']} caps raised to the initial design's cost" if cap["cap_raised_to_design"] else "")
        + ".",
        "",
        "| P(ε-optimal) | alternatives | mean predicted | observed ε-optimal [95% CI] | difference (points) | within 10 |",
        "|---|---:|---:|---|---:|---|",
    ]
    for j, b in enumerate(res["reliability"]):
        close = "]" if j == len(res["reliability"]) - 1 else ")"
        if not b["count"]:
            lines.append(f"| [{b['lo']:.1f}, {b['hi']:.1f}{close} | 0 | — | — | — | — |")
            continue
        ci = b["observed_ci95"]
        lines.append(f"| [{b['lo']:.1f}, {b['hi']:.1f}{close} | {b['count']} | {_pct(b['mean_p'])} | "
                     f"{_pct(b['observed'])} [{_pct(ci[0])}, {_pct(ci[1])}] | {b['difference_points']:+.1f} | "
                     f"{'yes' if b['within_target'] else '**no**'} |")
    lines.append(f"| all | {cap['alternatives']} | {_pct(cap['mean_p'])} | {_pct(cap['observed'])} | "
                 f"{100 * ((cap['observed'] or 0) - (cap['mean_p'] or 0)):+.1f} | Brier {cap['brier'] or 0:.3f} |")
    un = [b for b in res.get("uncapped_reliability", []) if b["count"]]
    if un:
        lines += ["", "The same bins for the alternatives the uncapped runs rank at their stop: "
                  + "; ".join(f"[{b['lo']:.1f}, {b['hi']:.1f}{']' if b['hi'] == 1.0 else ')'} {b['count']} alternatives, "
                              f"predicted {_pct(b['mean_p'])}, observed {_pct(b['observed'])}" for b in un) + "."]
    lines += ["", "| rank | alternatives | mean predicted | observed ε-optimal | difference (points) |", "|---:|---:|---:|---:|---:|"]
    for b in res["by_rank"]:
        lines.append(f"| {b['rank']} | {b['count']} | {_pct(b['mean_p'])} | {_pct(b['observed'])} | {b['difference_points']:+.1f} |")
    lines += ["", "| draws ranked on | alternatives | mean predicted | observed ε-optimal | difference (points) |",
              "|---|---:|---:|---:|---:|"]
    for b in res.get("by_posterior", []):
        name = {"round": "the round's posterior", "certifying": "the certifying posterior"}.get(b["posterior"], b["posterior"])
        lines.append(f"| {name} | {b['count']} | {_pct(b['mean_p'])} | {_pct(b['observed'])} | {b['difference_points']:+.1f} |")
    if ub["fleets"]:
        lines += ["", f"A budget of {res.get('unbound_factor', 10):g}× the full grid (never binding), on "
                  f"{', '.join(r['fleet'] for r in res['fleets'] if 'same_trail' in r)}: same trail "
                  f"(status, allocation, GPU-seconds, cells measured in order) on {ub['same_trail']} of {ub['fleets']} "
                  f"fleets; same decision {ub['same_decision']}, same GPU-seconds {ub['same_gpu_s']}"
                  + (f"; differ: {', '.join(ub['differ'])}" if ub["differ"] else "") + "."]
    lines += ["", "<details><summary>Per fleet</summary>", "", per_fleet_table(res), "", "</details>"]
    return "\n".join(lines)


def per_fleet_table(res: dict[str, Any]) -> str:
    lines = ["| fleet | cells | uncapped status | uncapped GPU-s | cap | capped status | reason | capped GPU-s | "
             "alternatives (ε-optimal), draws | unbound: same trail |",
             "|---|---:|---|---:|---:|---|---|---:|---|---|"]
    for r in res["fleets"]:
        cap = "—" if "cap" not in r else f"{r['cap']:,.0f}" + (" (design)" if r["cap_raised_to_design"] else "")
        alts = "—" if "alternatives" not in r else (f"{r['alternatives']} ({r['alternatives_eps_optimal']}), "
                                                    f"{r['alternatives_posterior']}")
        same = "—" if "same_trail" not in r else ("yes" if r["same_trail"] else "**no**")
        lines.append(
            f"| {r['fleet']} | {r['cells']} | {r.get('uncapped_status', '—')} | {r.get('uncapped_gpu_s', math.nan):,.0f} | "
            f"{cap} | {r.get('capped_status', '—')} | {r.get('capped_reason') or '—'} | {r.get('capped_gpu_s', math.nan):,.0f} | "
            f"{alts} | {same} |"
        )
    return "\n".join(lines).replace("| nan |", "| — |")


# ------------------------------------------------------------------------ main


def _edges(text: str) -> tuple[float, ...]:
    e = tuple(float(x) for x in text.split(","))
    if len(e) < 2 or e[0] != 0.0 or e[-1] != 1.0 or any(b <= a for a, b in zip(e, e[1:], strict=False)):
        raise argparse.ArgumentTypeError(f"--edges: increasing from 0 to 1, got {text!r}")
    return e


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=int, default=40, help="fleets of the hard suite (default 40: suite40)")
    ap.add_argument("--suite-seed", type=int, default=0)
    ap.add_argument("--fleets", default="", help="only these fleet numbers, run in this order (e.g. 28,31,27)")
    ap.add_argument("--passes", default=",".join(PASSES), help="which passes to run (default all three)")
    ap.add_argument("--cap-fraction", type=float, default=0.5, help="the capped pass's budget against the uncapped GPU-s")
    ap.add_argument("--unbound-factor", type=float, default=10.0, help="the unbound pass's budget against the full grid")
    ap.add_argument("--unbound-fleets", default="", help="the unbound pass on these fleet numbers only (default: every fleet)")
    ap.add_argument("--edges", type=_edges, default=DEFAULT_EDGES, help="bin edges of P(ε-optimal), e.g. 0,0.5,0.9,1")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1: shared 2-core machine)")
    ap.add_argument("--partial", type=Path, default=None, help="append each finished run to this JSONL file")
    ap.add_argument("--resume", action="store_true", help="keep the runs already in --partial")
    ap.add_argument("--uncapped-runs", type=Path, default=None,
                    help="a profiling_cost.py --suite --partial JSONL of the same suite: its fleetsieve runs are the uncapped pass")
    ap.add_argument("--workdir", type=Path, default=None, help="write the fleets here (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--publish", action="store_true",
                    help=f"write benchmarks/published/{STUDY}.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "benchmarks"))
    passes = [p for p in args.passes.split(",") if p]
    if bad := [p for p in passes if p not in PASSES]:
        ap.error(f"--passes: unknown {bad}; choose from {PASSES}")
    ks = [int(k) for k in args.fleets.split(",")] if args.fleets else list(range(args.suite))
    args.unbound_fleets = {f"c{int(k):03d}" for k in args.unbound_fleets.split(",")} if args.unbound_fleets else None
    root = args.workdir or Path(tempfile.mkdtemp(prefix="fsb-altcal-suite-"))
    fleets = build_fleets(ks, root, args.suite_seed)
    names = {f["fleet"] for f in fleets}
    done = {k: v for k, v in read_partial(args.partial if args.resume else None).items() if k[1] in names}
    if args.uncapped_runs is not None:
        for r in import_uncapped(args.uncapped_runs):
            if r["fleet"] in names and ("uncapped", r["fleet"]) not in done:
                done[("uncapped", r["fleet"])] = r
                if args.partial is not None:
                    with args.partial.open("a") as fh:
                        fh.write(json.dumps(r) + "\n")
    if done:
        print(f"[altcal] {len(done)} runs already done", file=sys.stderr, flush=True)
    run_passes(fleets, passes, done, args)
    res = {**summarise(fleets, done, args.edges), "suite": args.suite, "suite_seed": args.suite_seed,
           "cap_fraction": args.cap_fraction, "unbound_factor": args.unbound_factor, "level": "point",
           "strategy": "fleetsieve", "seed": 0}
    table = published_table(res)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    if args.publish:
        from publish import command_line, publish

        files = [str(args.partial)] if args.partial is not None and args.partial.parent.resolve() == (REPO / "benchmarks" / "published").resolve() else []
        publish(STUDY, res, table, command_line(__file__, argv), files=files)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
