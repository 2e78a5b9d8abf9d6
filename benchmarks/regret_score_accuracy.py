"""How accurate the regret-acquisition scores are: importance-sampling estimates against refits.

The acquisition that serves the joint check
(:mod:`fleetsieve_bayes.decision.regret_acquisition`) scores a cell by the
expected reduction of the decision's posterior expected regret, without
refitting: each fantasy measurement of the cell reweights today's posterior
draws by its likelihood (importance sampling). This script checks those
numbers against the expensive truth they stand for: for each scored cell and
each of the same fantasies, the model is *refitted* with the fantasy
measurement added, the joint tables are rebuilt from the new posterior, and
the expected regret of the best action (same action set) is taken on them.

    refit score(e) = min_a E[R_a | today] − mean_f min_a E[R_a | today + fantasy f of e]

with both terms from refits of one preset (the warm ``fast`` refit of a
campaign round), so their Monte-Carlo error is alike. States: the shipped
grid and suite fleets, each after its initial design (where the decision is
still open and the reweighting moves the most). Cells: the top ``--cells`` by
the importance-sampling score and ``--random`` others.

    python benchmarks/regret_score_accuracy.py
    python benchmarks/regret_score_accuracy.py --fleets 14,16 --cells 4 --fantasies 6 --out FILE

Prints one markdown table per state and a summary (rank correlation, mean
absolute error, whether both pick the same best cell) and writes JSON
(default ``benchmarks/results/regret_score_accuracy.json``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fleetsieve_bayes.allocation.batched import make_jax_allocator
from fleetsieve_bayes.allocation.milp import allocate_milp
from fleetsieve_bayes.allocation.problem import (
    grid_from_table,
    values_from_table,
)
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.decision.bounds import conservative_table, rule_bounds
from fleetsieve_bayes.decision.design import initial_design
from fleetsieve_bayes.decision.regret_acquisition import (
    expected_regret,
    regret_scores,
    regret_tables,
)
from fleetsieve_bayes.model.inference import fit
from fleetsieve_bayes.model.priors import card_path, load_card
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import read_table

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "regret_score_accuracy.json"


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if np.std(ra) == 0 or np.std(rb) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def study_state(
    campaign_path: Path, label: str, *, n_top: int, n_random: int, n_fantasies: int, seed: int
) -> dict[str, Any]:
    """Importance-sampling scores against refit scores on one state (the initial design)."""
    c = load_campaign(campaign_path)
    table = read_table(c.measurement.table)
    grid = grid_from_table(table, c.workload_names)
    values = values_from_table(grid, table)
    problem = c.problem()
    card = load_card(card_path(c.family))
    measured = np.zeros(grid.n_cells, bool)
    measured[initial_design(grid)] = True
    observed = np.where(measured[:, None], values, np.nan)
    solve = make_jax_allocator(grid, problem).solve

    # Today's posterior as the campaign's certification attempt sees it (four
    # chains), the candidate A⁻, and the kernel's scores on those draws.
    t0 = time.perf_counter()
    post = fit(grid, observed, measured, card, "certify", seed=seed)
    bounds = rule_bounds(post, observed, measured, c.credible_level, c.repeatability, grid, c.interval_rules)
    cand = allocate_milp(grid, conservative_table(bounds), problem)
    rs = regret_scores(grid, problem, cand, post.latent, post.noise, observed, measured, seed=seed, solve=solve)
    is_s = time.perf_counter() - t0

    # The kernel's fantasies of cell e: its value in systematically chosen draws' tables.
    t = np.asarray(regret_tables(post.latent, post.noise, observed, measured, seed=seed))
    n_draws = t.shape[0]
    d_f = ((np.arange(n_fantasies) + 0.5) / n_fantasies * n_draws).astype(int)

    base = fit(grid, observed, measured, card, "fast", seed=seed)
    now_refit = float(expected_regret(grid, problem, rs.actions, base.latent, base.noise, observed, measured, seed=seed, solve=solve).min())

    free = np.flatnonzero(~measured)
    order = free[np.argsort(-rs.score[free], kind="stable")]
    rng = np.random.default_rng(seed)
    rest = order[n_top:]
    cells = list(order[:n_top]) + list(rng.choice(rest, size=min(n_random, len(rest)), replace=False))
    rows = []
    t1 = time.perf_counter()
    for e in cells:
        after = []
        for f, d in enumerate(d_f):
            obs_f, m_f = observed.copy(), measured.copy()
            obs_f[e], m_f[e] = t[d, e], True
            refit = fit(grid, obs_f, m_f, card, "fast", seed=seed + 1 + f, warm_start=base)
            reg = expected_regret(grid, problem, rs.actions, refit.latent, refit.noise, obs_f, m_f, seed=seed, solve=solve)
            after.append(float(reg.min()))
        rows.append({
            "cell": grid.describe(int(e)),
            "is_score": float(rs.score[e]),
            "refit_score": now_refit - float(np.mean(after)),
            "refit_after_sd": float(np.std(after)),
            "top": bool(e in order[:n_top]),
        })
        print(f"| {label} | {rows[-1]['cell']} | {rows[-1]['is_score']:.4f} | {rows[-1]['refit_score']:.4f} |", flush=True)
    is_v = np.array([r["is_score"] for r in rows])
    rf_v = np.array([r["refit_score"] for r in rows])
    return {
        "state": label,
        "cells_measured": int(measured.sum()),
        "expected_regret_now_is": rs.expected_regret_now,
        "expected_regret_now_refit": now_refit,
        "ess_min": rs.ess_min,
        "n_actions": rs.n_actions,
        "rows": rows,
        "spearman": _spearman(is_v, rf_v),
        "mean_abs_error": float(np.mean(np.abs(is_v - rf_v))),
        "same_best": bool(np.argmax(is_v) == np.argmax(rf_v)),
        "best_is_in_refit_top2": bool(np.argmax(is_v) in np.argsort(-rf_v)[:2]),
        "is_seconds": is_s,
        "refit_seconds": time.perf_counter() - t1,
    }


def published_table(res: dict[str, Any]) -> str:
    """The markdown table of a run's JSON ``res``: one row per state."""
    lines = [
        "| state | regret now (IS / refit) | rank corr. | mean abs. error | same best | IS best in refit top 2 | ESS min |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in res["states"]:
        lines.append(
            f"| {s['state']} | {s['expected_regret_now_is']:.4f} / {s['expected_regret_now_refit']:.4f} | "
            f"{s['spearman']:.2f} | {s['mean_abs_error']:.4f} | {s['same_best']} | {s['best_is_in_refit_top2']} | {s['ess_min']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", default="14,16,21", help="suite fleet numbers (hard suite, suite seed 0)")
    ap.add_argument("--no-shipped", action="store_true", help="skip the shipped grid")
    ap.add_argument("--cells", type=int, default=3, help="top cells by the importance-sampling score")
    ap.add_argument("--random", type=int, default=2, help="further cells drawn at random")
    ap.add_argument("--fantasies", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/regret_score_accuracy.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args(argv)
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from certification_time import suite_fleet  # the suite exactly as profiling_cost.py builds it

    states = []
    print("| state | cell | IS score | refit score |\n| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="fsb-regret-acc-") as tmp:
        todo: list[tuple[Path, str]] = []
        if not args.no_shipped:
            todo.append((data_dir("examples") / "h100_31b_fp8" / "campaign.toml", "shipped"))
        todo += [(suite_fleet(int(k), Path(tmp)), f"c{int(k):03d}") for k in args.fleets.split(",") if k]
        for path, label in todo:
            states.append(
                study_state(path, label, n_top=args.cells, n_random=args.random, n_fantasies=args.fantasies, seed=args.seed)
            )
    res = {"args": {k: str(v) for k, v in vars(args).items()}, "states": states}
    md = published_table(res)
    print("\n" + md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"\nwrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("regret_score_accuracy", res, md, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
