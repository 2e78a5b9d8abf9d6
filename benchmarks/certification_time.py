"""Wall time of one certification attempt (converged refit + joint check) on suite states.

The suite benchmark (``profiling_cost.py --suite N --jobs 2``) times its
attempts while another fleet's campaign shares the two cores, so its
``certify_s`` overstates what one campaign pays on an idle machine. This
script replays, one at a time, the *final* state of each fleet of a suite run
(the cells it had measured when it stopped, read from the JSONL that
``--partial`` writes) and times one attempt on it: the same refit, the same
joint check, the campaign's settings, nothing else running.

    python benchmarks/certification_time.py runs.jsonl                 # every fleetsieve run in the file
    python benchmarks/certification_time.py runs.jsonl --fleets 7,24 --out FILE
    python benchmarks/certification_time.py runs.jsonl --adaptation windowed --out FILE2   # the other warm-up
    python benchmarks/certification_time.py runs.jsonl --repeat 2     # also the attempt with its programs compiled
    python benchmarks/certification_time.py runs.jsonl --levels point,0.9 --repeat 2   # the two rules side by side
    python benchmarks/certification_time.py runs.jsonl --levels point,0.9 --study certification_time_levels --publish

The first attempt on a fleet compiles its programs (the certifying NUTS
sampler, the interval and joint-check kernels: each fleet has its own
shapes), as a campaign's first attempt does when the persistent compilation
cache has not seen the grid. ``--repeat 2`` times the same attempt again in
the same process: what every later attempt of a campaign (and a resumed one,
through the persistent cache) pays. Same seed, so the same draws.

``--levels point,0.9`` times each state's attempt under each SLO-attainment
rule in turn (the same state, seed and process, one after the other), and
reports the ratio of the medians against the first.

``--baseline REV`` times the package at git revision ``REV`` side by side with
this tree: ``REV``'s own tree (``git archive``) runs its own copy of this
script, fleet by fleet, each fleet in a fresh process for both trees and the
two alternating which goes first, on the same final states; it reports each
fleet's ratio (this tree / ``REV``) and the ratio of the medians, for the
first attempt and the compiled one.

    python benchmarks/certification_time.py runs.jsonl --fleets 0,4,8 --repeat 2 --baseline 44b6d91

Prints a markdown table (fleet, cells measured, attempt seconds, r_hat, ESS,
draws, outcome) and the median / 90th percentile, and writes JSON (default
``benchmarks/results/certification_time.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fleetsieve_bayes.allocation.problem import (
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.decision.attempt import attempt_certification
from fleetsieve_bayes.evaluation.synthetic import random_spec, synthetic_fleet, write_synthetic
from fleetsieve_bayes.model.inference import fit
from fleetsieve_bayes.model.presets import ADAPTATIONS, load_preset
from fleetsieve_bayes.model.priors import card_path, load_card
from fleetsieve_bayes.table import read_table

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "certification_time.json"


def suite_fleet(k: int, root: Path, suite_seed: int = 0) -> Path:
    """Write fleet ``k`` of the hard suite (as ``profiling_cost.py --suite`` builds it); its campaign path."""
    rng = np.random.default_rng([suite_seed, k])
    spec = random_spec(rng, hard=True)
    df, camp = synthetic_fleet(rng, spec)
    camp["name"] = f"synthetic-{k}"
    return write_synthetic(root / f"c{k:03d}", df, camp).path


def time_attempt(
    campaign_path: Path, measured_labels: list[str], seed: int, adaptation: str | None = None, repeat: int = 1,
    level: float | str | None = None,
) -> dict[str, Any]:
    """One certification attempt on the state where ``measured_labels`` are measured
    (``adaptation``: override the ``certify`` preset's warm-up; None keeps it; ``level``:
    the SLO-attainment rule, None keeps the campaign's), and ``repeat − 1`` more of the
    same attempt with its programs compiled (``seconds_compiled``)."""
    c = load_campaign(campaign_path)
    if level is not None:
        c = c.at_level(level)
    table = read_table(c.measurement.table)
    grid = grid_from_table(table, c.workload_names)
    values = values_from_table(grid, table)
    index = {grid.describe(i): i for i in range(grid.n_cells)}
    measured = np.zeros(grid.n_cells, bool)
    measured[[index[label] for label in measured_labels]] = True
    observed = np.where(measured[:, None], values, np.nan)
    card = load_card(card_path(c.family))
    # The round's cheap posterior, as the campaign has it before it attempts
    # (not timed: it is the round's own fit); its draws seed the warm-up's mass.
    cheap = fit(grid, observed, measured, card, c.inference, seed=seed)
    preset = load_preset("certify")
    if adaptation is not None:
        preset = preset._replace(adaptation=adaptation)
    problem = c.problem()
    walls = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        a = attempt_certification(
            grid, problem, card, observed, measured, c.settings, seed=seed, mass_from=cheap, preset=preset
        )
        walls.append(time.perf_counter() - t0)
    d = a.diagnostics
    return {
        "cells": int(measured.sum()),
        "seconds": walls[0],
        **({"seconds_compiled": walls[1:]} if repeat > 1 else {}),
        "status": a.certificate.status,
        "r_hat_max": d.get("r_hat_max"),
        "ess_bulk_min": d.get("ess_bulk_min"),
        "draws": d.get("draws"),
        "converged": d.get("converged"),
        "adaptation": d.get("adaptation"),
        "windowed_fallback": d.get("windowed_fallback"),
        "runs": d.get("attempts"),
        "target_accept": d.get("target_accept"),
        "nuts_runs": d.get("nuts_runs"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="JSONL written by profiling_cost.py --suite --partial")
    ap.add_argument("--fleets", default="", help="only these fleet numbers (e.g. 7,24)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--suite-seed", type=int, default=0)
    ap.add_argument(
        "--adaptation",
        choices=ADAPTATIONS,
        default=None,
        help="override the certify preset's warm-up (compare in separate runs: one process shares compiled kernels)",
    )
    ap.add_argument(
        "--repeat", type=int, default=1, help="attempts per fleet; the later ones run with the programs compiled"
    )
    ap.add_argument("--study", default="certification_time",
                    help="the published study's name (e.g. certification_time_levels for --levels point,0.9)")
    ap.add_argument("--levels", default="", help="comma-separated SLO-attainment rules timed side by side (e.g. point,0.9)")
    ap.add_argument("--baseline", default="",
                    help="git revision timed side by side with this tree (each fleet in a fresh process for both)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/certification_time.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args(argv)
    runs: dict[str, dict[str, Any]] = {}
    for path in args.runs:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("strategy", "fleetsieve") == "fleetsieve":
                runs[r["scenario"]] = r  # a later file wins
    only = {int(x) for x in args.fleets.split(",") if x}
    names = sorted(n for n in runs if not only or int(n[1:]) in only)
    levels: list[float | str | None] = [
        x if x == "point" else float(x) for x in args.levels.split(",") if x
    ] or [None]
    if args.baseline:
        if len(levels) > 1:
            ap.error("--baseline times one rule: give at most one --levels value")
        res = compare_trees(args.baseline, [p.resolve() for p in args.runs], names, args, levels[0])
    else:
        res = time_here(runs, names, args, levels)
    md = published_table(res)
    print("\n" + md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"JSON: {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish(args.study, res, md, command_line(__file__, argv))
    return 0


def time_here(
    runs: dict[str, dict[str, Any]], names: list[str], args: argparse.Namespace, levels: list[float | str | None]
) -> dict[str, Any]:
    """Time each fleet's final state of ``runs`` in this process, under each of ``levels``."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsb-cert-time-") as tmp:
        for name in names:
            path = suite_fleet(int(name[1:]), Path(tmp), args.suite_seed)
            for level in levels:
                row = {"fleet": name, "campaign_status": runs[name]["status"],
                       **({"level": level} if level is not None else {})}
                row.update(time_attempt(path, runs[name]["measured"], args.seed, args.adaptation, args.repeat, level))
                rows.append(row)
                again = f" | {row['seconds_compiled'][-1]:.1f}" if args.repeat > 1 else ""
                print(
                    f"| {name}{'' if level is None else f' @ {level}'} | {row['cells']} | {row['seconds']:.1f}{again} | "
                    f"{row['r_hat_max']:.3f} | {row['ess_bulk_min']:.0f} | {row['draws']} | {row['status']} |",
                    flush=True,
                )
    res: dict[str, Any] = {"summary": _summaries(rows, args.repeat), "rows": rows}
    if len(levels) > 1:
        res["by_level"] = {str(q): _summaries([r for r in rows if r.get("level") == q], args.repeat) for q in levels}
        base = res["by_level"][str(levels[0])]
        for q in levels[1:]:
            sm = res["by_level"][str(q)]
            sm["median_ratio"] = sm["median_s"] / base["median_s"]
            if "compiled" in sm:
                sm["compiled"]["median_ratio"] = sm["compiled"]["median_s"] / base["compiled"]["median_s"]
    return res


def compare_trees(
    rev: str, runs: list[Path], names: list[str], args: argparse.Namespace, level: float | str | None
) -> dict[str, Any]:
    """Each fleet of ``names`` timed by revision ``rev``'s tree and by this one, each in a fresh
    process (``FLEETSIEVE_JAX_CACHE=off``, so both compile), alternating which goes first."""
    with tempfile.TemporaryDirectory(prefix="fsb-cert-base-") as tmp:
        base = Path(tmp) / "tree"
        base.mkdir()
        try:
            commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], check=True,
                                    capture_output=True, text=True).stdout.strip()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True)
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"--baseline {rev}: {e.stderr.strip() if isinstance(e.stderr, str) else e.stderr.decode().strip()}") from None
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        trees = {"baseline": base, "this tree": REPO}
        rows: list[dict[str, Any]] = []
        for i, name in enumerate(names):
            order = list(trees) if i % 2 == 0 else list(trees)[::-1]
            for label in order:
                out = Path(tmp) / f"{label.replace(' ', '_')}_{name}.json"
                cmd = [sys.executable, str(trees[label] / "benchmarks" / "certification_time.py"), *map(str, runs),
                       "--fleets", name[1:], "--repeat", str(args.repeat), "--seed", str(args.seed),
                       "--suite-seed", str(args.suite_seed), "--out", str(out)]
                if level is not None and label == "this tree":
                    cmd += ["--levels", str(level)]
                env = {**os.environ, "PYTHONPATH": str(trees[label]), "FLEETSIEVE_JAX_CACHE": "off"}
                done = subprocess.run(cmd, cwd=trees[label], env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
                    raise SystemExit(f"{label} ({rev if label == 'baseline' else 'HEAD'}) on {name}: {tail}")
                for r in json.loads(out.read_text())["rows"]:
                    rows.append({**r, "tree": label})
                print(f"{name} {label}: {rows[-1]['seconds']:.1f} s", flush=True)
    res: dict[str, Any] = {"baseline": {"rev": rev, "commit": commit}, "level": level, "rows": rows,
                           "by_tree": {t: _summaries([r for r in rows if r["tree"] == t], args.repeat) for t in trees}}
    res["summary"] = res["by_tree"]["this tree"]
    pairs = _pairs(rows)
    for key, pick in (("first", lambda r: r["seconds"]), ("compiled", lambda r: r["seconds_compiled"][-1])):
        if key == "compiled" and args.repeat < 2:
            continue
        ratios = [pick(p["this tree"]) / pick(p["baseline"]) for p in pairs.values()]
        b, h = res["by_tree"]["baseline"], res["by_tree"]["this tree"]
        if key == "compiled":
            b, h = b["compiled"], h["compiled"]
        res[f"ratio_{key}"] = {"median_of_medians": h["median_s"] / b["median_s"],
                               "median_paired": float(np.median(ratios)), "paired": ratios}
    return res


def _pairs(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """A ``--baseline`` run's rows by fleet, then by tree (``"baseline"``, ``"this tree"``)."""
    pairs: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        pairs.setdefault(r["fleet"], {})[r["tree"]] = r
    return pairs


def _summaries(rows: list[dict[str, Any]], repeat: int) -> dict[str, Any]:
    """:func:`_summary` of ``rows``' first attempts, and of their compiled repeats when ``repeat > 1``."""
    summary = _summary(np.array([r["seconds"] for r in rows]))
    if repeat > 1:
        summary["compiled"] = _summary(np.array([r["seconds_compiled"][-1] for r in rows]))
    return summary


def published_table(res: dict[str, Any]) -> str:
    """The markdown table of a run's JSON ``res``: one row per fleet, then the summary."""
    if "by_tree" in res:
        return comparison_table(res)
    compiled = "compiled" in res["summary"]
    lines = [
        "| fleet | cells | attempt s" + (" | compiled s" if compiled else "") + " | r_hat | ESS | draws | outcome |",
        "|---|---:|---:" + ("|---:" if compiled else "") + "|---:|---:|---:|---|",
    ]
    for r in res["rows"]:
        again = f" | {r['seconds_compiled'][-1]:.1f}" if compiled else ""
        at = f" @ {r['level']}" if "level" in r else ""
        lines.append(
            f"| {r['fleet']}{at} | {r['cells']} | {r['seconds']:.1f}{again} | {r['r_hat_max']:.3f} | "
            f"{r['ess_bulk_min']:.0f} | {r['draws']} | {r['status']} |"
        )
    lines.append("")
    groups = res.get("by_level") or {"": res["summary"]}
    for level, top in groups.items():
        for label, sm in (("first attempt", top), ("compiled", top.get("compiled"))):
            if sm is not None:
                ratio = f", {sm['median_ratio']:.2f}× the first rule's median" if "median_ratio" in sm else ""
                lines.append(
                    f"- {label}{f' at {level}' if level else ''}: {sm['attempts']} attempts, median "
                    f"{sm['median_s']:.1f} s, 90th percentile {sm['p90_s']:.1f} s, max {sm['max_s']:.1f} s, "
                    f"{sm['share_within_30s']:.0%} within 30 s{ratio}"
                )
    return "\n".join(lines)


def comparison_table(res: dict[str, Any]) -> str:
    """The markdown table of a ``--baseline`` run: per fleet, both trees' attempt seconds and
    their ratio, then the summaries and the ratios of the medians."""
    base = res["baseline"]["commit"][:10]
    compiled = "compiled" in res["summary"]
    pairs = _pairs(res["rows"])
    head = f"| fleet | cells | `{base}` s | this tree s | ratio"
    rule = "|---|---:|---:|---:|---:"
    if compiled:
        head += f" | `{base}` compiled s | this tree compiled s | ratio"
        rule += "|---:|---:|---:"
    rule_here = "the campaigns' own rule" if res.get("level") is None else f"`slo_attainment = {res['level']}`"
    lines = [f"The same final states timed by commit `{base}` and by this tree ({rule_here}), each fleet in a fresh "
             "process for both, alternating which goes first. Draws: per chain, `" + base + "` / this tree; runs: "
             "this tree's NUTS runs in the attempt (extensions, and runs at smaller steps after divergences, the "
             "last one's step size against the adapted one shown; a windowed fallback marked w); divergences: each "
             "run's, in order; steps: the last run's leapfrog steps a draw at its step size.", "",
             head + " | draws | runs (step scale) | divergences | steps (step size) | outcome (`" + base + "` / this tree) |",
             rule + "|---:|---|---|---|---|"]
    for fleet, p in pairs.items():
        b, h = p["baseline"], p["this tree"]
        row = f"| {fleet} | {h['cells']} | {b['seconds']:.1f} | {h['seconds']:.1f} | {h['seconds'] / b['seconds']:.2f}"
        if compiled:
            bc, hc = b["seconds_compiled"][-1], h["seconds_compiled"][-1]
            row += f" | {bc:.1f} | {hc:.1f} | {hc / bc:.2f}"
        trail = h.get("nuts_runs") or []
        scale = f" (×{trail[-1].get('step_scale', 1.0):.2g})" if trail else ""
        runs = "" if h.get("runs") is None else f"{h['runs']}{scale}{' w' if h.get('windowed_fallback') else ''}"
        divs = ", ".join(str(t["divergences"]) for t in trail)
        steps = f"{trail[-1]['steps_per_draw']:.0f} ({trail[-1]['step_size']:.3g})" if trail else ""
        lines.append(row + f" | {b['draws']} / {h['draws']} | {runs} | {divs} | {steps} | {b['status']} / {h['status']} |")
    lines.append("")
    for key, label in (("first", "first attempt"), ("compiled", "compiled")):
        if f"ratio_{key}" not in res:
            continue
        b, h = res["by_tree"]["baseline"], res["by_tree"]["this tree"]
        if key == "compiled":
            b, h = b["compiled"], h["compiled"]
        r = res[f"ratio_{key}"]
        lines.append(
            f"- {label}: median {h['median_s']:.1f} s against `{base}`'s {b['median_s']:.1f} s, "
            f"{r['median_of_medians']:.2f}× (median of the per-fleet ratios {r['median_paired']:.2f}×); "
            f"90th percentile {h['p90_s']:.1f} s against {b['p90_s']:.1f} s"
        )
    return "\n".join(lines)


def _summary(secs: np.ndarray) -> dict[str, Any]:
    """Median, 90th percentile, max and share within 30 s of ``secs (n_attempts,)``."""
    return {
        "attempts": len(secs),
        "median_s": float(np.median(secs)),
        "p90_s": float(np.quantile(secs, 0.9)),
        "max_s": float(secs.max()),
        "share_within_30s": float(np.mean(secs <= 30.0)),
    }


if __name__ == "__main__":
    raise SystemExit(main())
