"""Summarise an interrupted (or finished) ``profiling_cost.py --suite N --partial FILE`` run.

Reads the per-run JSONL and the ``.specs.json`` written beside it, and prints
per fleet and in aggregate: GPU-seconds against the full grid and the
hindsight floor, ε-correctness, false certificates (a certificate of either
kind whose decision is not ε-correct on the truth), statuses, and — where no
random runs exist — the saving against uniform random's *reveal floor* (the
expected GPU-seconds random must spend before it has seen the cells the
oracle commits to: a lower bound on random's cost under any stopping rule that
measures its committed cells, so the saving shown is a lower bound too).

    python benchmarks/suite_partial.py /tmp/suite.jsonl --out FILE
    python benchmarks/suite_partial.py random.jsonl fleetsieve.jsonl --publish suite40

A fleet whose campaign file (in the specs) no longer exists is rebuilt from
its number and ``--suite-seed``, exactly as ``profiling_cost.py --suite``
builds it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def _random_floor(campaign_path: str) -> float:
    from fleetsieve_bayes.allocation.problem import (
        grid_from_table,
        values_from_table,
    )
    from fleetsieve_bayes.campaign.config import load_campaign
    from fleetsieve_bayes.evaluation.regret import make_oracle
    from fleetsieve_bayes.table import read_table

    c = load_campaign(campaign_path)
    t = read_table(c.measurement.table)
    g = grid_from_table(t, c.workload_names)
    return make_oracle(g, values_from_table(g, t), c.problem()).random_floor_gpu_s


def _campaign_of(k: int, spec: dict[str, Any], root: Path, suite_seed: int) -> str:
    """Fleet ``k``'s campaign file: the spec's, else fleet ``k`` of the suite rebuilt under ``root``."""
    if Path(spec["campaign"]).exists():
        return spec["campaign"]
    from certification_time import suite_fleet  # the suite exactly as profiling_cost.py builds it

    return str(suite_fleet(k, root, suite_seed))


def summarise(
    runs: list[dict[str, Any]], specs: list[dict[str, Any]], suite_seed: int = 0, root: Path | None = None
) -> dict[str, Any]:
    per: list[dict[str, Any]] = []
    by_name = {f"c{k:03d}": s for k, s in enumerate(specs)}
    tmp = Path(tempfile.mkdtemp(prefix="fsb-suite-partial-")) if root is None else root
    floors: dict[str, float] = {}
    for r in runs:
        s = by_name[r["scenario"]]
        if r["scenario"] not in floors:
            k = int(r["scenario"][1:])
            floors[r["scenario"]] = _random_floor(_campaign_of(k, s, tmp, suite_seed))
        per.append({
            "fleet": r["scenario"], "strategy": r["strategy"], "cells": s["cells"], "classes": s["n_classes"],
            "tps": s["tps"], "truly_feasible": s["truly_feasible"], "status": r["status"],
            "gpu_seconds": r["gpu_seconds"], "full_gpu_s": s["full_gpu_s"], "floor_gpu_s": s["floor_gpu_s"],
            "random_floor_gpu_s": floors[r["scenario"]],
            "x_full": r["gpu_seconds"] / s["full_gpu_s"], "x_floor": r["gpu_seconds"] / s["floor_gpu_s"],
            "eps_correct": r["eps_correct"], "false_certificate": r["false_certificate"],
            "regret": r["regret"], "wall_s": r["wall_s"],
        })
    agg: dict[str, Any] = {}
    for strat in sorted({p["strategy"] for p in per}):
        ps = [p for p in per if p["strategy"] == strat]
        g = np.array([p["gpu_seconds"] for p in ps])
        agg[strat] = {
            "fleets": len(ps),
            "false_certificates": int(sum(p["false_certificate"] for p in ps)),
            "eps_correct_frac": float(np.mean([p["eps_correct"] for p in ps])),
            "x_full_mean": float(np.mean([p["x_full"] for p in ps])),
            "x_full_pooled": float(g.sum() / sum(p["full_gpu_s"] for p in ps)),
            "x_floor_mean": float(np.mean([p["x_floor"] for p in ps])),
            "x_floor_max": float(np.max([p["x_floor"] for p in ps])),
            "saving_vs_random_reveal_floor": float(1.0 - g.sum() / sum(p["random_floor_gpu_s"] for p in ps)),
            "statuses": {st: sum(p["status"] == st for p in ps) for st in sorted({p["status"] for p in ps})},
            "wall_s_mean": float(np.mean([p["wall_s"] for p in ps])),
        }
    if {"fleetsieve", "random"} <= set(agg):
        agg["fleetsieve_vs_random"] = _paired_saving(per)
    return {"fleets": per, "aggregate": agg}


def _paired_saving(per: list[dict[str, Any]]) -> dict[str, Any]:
    """fleetsieve against uniform random on the fleets both ran: pooled saving
    ``1 − Σ fleetsieve / Σ random`` with a paired bootstrap 95 % interval over fleets."""
    fs = {p["fleet"]: p["gpu_seconds"] for p in per if p["strategy"] == "fleetsieve"}
    rnd: dict[str, list[float]] = {}
    for p in per:
        if p["strategy"] == "random":
            rnd.setdefault(p["fleet"], []).append(p["gpu_seconds"])
    both = sorted(set(fs) & set(rnd))
    a = np.array([fs[f] for f in both])
    b = np.array([np.mean(rnd[f]) for f in both])
    idx = np.random.default_rng(0).integers(0, len(both), (10_000, len(both)))
    boot = 1.0 - a[idx].sum(axis=1) / b[idx].sum(axis=1)
    return {
        "fleets": len(both),
        "saving": float(1.0 - a.sum() / b.sum()),
        "saving_ci95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
        "fleetsieve_cheaper_frac": float(np.mean(a < b)),
        "per_fleet_saving_mean": float(np.mean(1.0 - a / b)),
    }


def published_table(res: dict[str, Any]) -> str:
    """The aggregate table of a summary ``res``, then the per-fleet table folded away."""
    lines = ["| strategy | fleets | false certificates | ε-correct | × full grid (mean / pooled) | × hindsight floor (mean / max) | statuses |",
             "|---|---:|---:|---:|---|---|---|"]
    vs = None
    for s, a in res["aggregate"].items():
        if s == "fleetsieve_vs_random":
            vs = a
            continue
        stat = ", ".join(f"{k} {v}" for k, v in a["statuses"].items())
        lines.append(f"| {s} | {a['fleets']} | {a['false_certificates']} | {a['eps_correct_frac']:.1%} | "
                     f"{a['x_full_mean']:.2f} / {a['x_full_pooled']:.2f} | {a['x_floor_mean']:.3f} / {a['x_floor_max']:.2f} | {stat} |")
    if vs:
        lines.append(
            f"\nfleetsieve against uniform random, {vs['fleets']} fleets: pooled saving {vs['saving']:.1%} "
            f"[{vs['saving_ci95'][0]:.1%}, {vs['saving_ci95'][1]:.1%}], fleetsieve cheaper on "
            f"{vs['fleetsieve_cheaper_frac']:.1%} of fleets, mean per-fleet saving {vs['per_fleet_saving_mean']:.1%}."
        )
    per_fleet = markdown({"fleets": res["fleets"], "aggregate": {}})
    lines += ["", "<details><summary>Per fleet</summary>", "", per_fleet, "", "</details>"]
    return "\n".join(lines)


def markdown(res: dict[str, Any]) -> str:
    lines = ["| fleet | strategy | cells | classes | TPs | feasible | status | GPU-s | ×full | ×floor | ε-correct | false cert. |",
             "|---|---|---:|---:|---|---|---|---:|---:|---:|---|---|"]
    for p in sorted(res["fleets"], key=lambda p: (p["fleet"], p["strategy"])):
        lines.append(
            f"| {p['fleet']} | {p['strategy']} | {p['cells']} | {p['classes']} | {'/'.join(map(str, p['tps']))} | "
            f"{'yes' if p['truly_feasible'] else 'no'} | {p['status']} | {p['gpu_seconds']:.0f} | {p['x_full']:.2f} | "
            f"{p['x_floor']:.2f} | {'yes' if p['eps_correct'] else '**no**'} | {'**yes**' if p['false_certificate'] else 'no'} |"
        )
    for s, a in res["aggregate"].items():
        if s == "fleetsieve_vs_random":
            lines.append(
                f"\n**fleetsieve vs uniform random**, {a['fleets']} fleets: pooled saving {a['saving']:.1%} "
                f"[{a['saving_ci95'][0]:.1%}, {a['saving_ci95'][1]:.1%}], fleetsieve cheaper on "
                f"{a['fleetsieve_cheaper_frac']:.0%} of fleets, mean per-fleet saving {a['per_fleet_saving_mean']:.1%}"
            )
            continue
        lines.append(
            f"\n**{s}**, {a['fleets']} fleets: false certificates {a['false_certificates']}, ε-correct "
            f"{a['eps_correct_frac']:.1%}, cost ×full grid {a['x_full_mean']:.2f} (pooled {a['x_full_pooled']:.2f}), "
            f"×hindsight floor {a['x_floor_mean']:.2f} (max {a['x_floor_max']:.2f}), saving vs random's reveal floor "
            f"{a['saving_vs_random_reveal_floor']:+.1%}; statuses {a['statuses']}; mean wall {a['wall_s_mean']:.0f} s"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("partial", type=Path, nargs="+",
                    help="per-run JSONL files of the same suite; a fleet in a later file replaces the earlier run")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--suite-seed", type=int, default=0, help="the suite's seed, to rebuild fleets whose campaign is gone")
    ap.add_argument("--publish", metavar="STUDY", default=None,
                    help="write benchmarks/published/STUDY.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for k, path in enumerate(args.partial):
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else None
            if r and "error" not in r:
                latest[(r["scenario"], r["strategy"], r["seed"])] = {**r, "source": str(path), "source_index": k}
    runs = list(latest.values())
    specs = json.loads(args.partial[-1].with_suffix(".specs.json").read_text())
    res = summarise(runs, specs, args.suite_seed)
    for p, r in zip(res["fleets"], runs, strict=True):
        p["source"] = r["source"]
    print(markdown(res))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**res, "source": [str(p) for p in args.partial], "specs": specs}, indent=1) + "\n")
    if args.publish:
        from publish import command_line, publish

        published = {**res, "source": [p.name for p in args.partial], "specs": specs}
        inputs = [str(p) for p in args.partial] + [str(args.partial[-1].with_suffix(".specs.json"))]
        publish(args.publish, published, published_table(published), command_line(__file__), files=inputs)


if __name__ == "__main__":
    main()
